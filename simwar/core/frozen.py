"""Frozen records written out: a base for small classes of fixed fields, cheaper to define
than a frozen dataclass.

Python 3.11's ``@dataclass(frozen=True)`` compiles each class's generated methods
(``__init__``, ``__eq__``, ``__hash__``, ``__repr__``, ``__setattr__``, ``__delattr__``) from
their text at every import, about 3.5 M instructions a class: for the records on a short
``simwar run``'s path, a twentieth of its start-up. A class on :class:`Frozen` writes its
``__init__`` (setting each field with :data:`set_field`) and lists its fields in
``__slots__``; it is compared, hashed, shown and pickled by its fields' values, and refuses
assignment with :class:`dataclasses.FrozenInstanceError`, as a frozen dataclass is, and all of
it is compiled once into the bytecode cache.

:class:`MutableRecord` is the same for a record whose fields change after it is made (a plan,
the per-step sizes of a run: a plain dataclass's): its fields are named in ``_fields`` and
kept in the instance's ``__dict__`` (a copy may update that directly); it is compared and
shown by their values, and is not hashable, as a dataclass with ``eq`` is.

Imports: the standard library only (:mod:`simwar.core.program` stays importable where simwar's
other dependencies are not).
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError

#: sets a field of a :class:`Frozen` record in its ``__init__`` (its own ``__setattr__``
#: refuses)
set_field = object.__setattr__


class _ByValue:
    """Compared and shown by the values of its fields, in order: what :class:`Frozen` and
    :class:`MutableRecord` share; each names its fields by its ``_names()``."""

    __slots__ = ()

    def _values(self) -> tuple:
        return tuple([getattr(self, name) for name in self._names()])

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._names())
        return f"{type(self).__qualname__}({fields})"


class Frozen(_ByValue):
    """Fields in ``__slots__`` (in order: ``__init__`` takes them in that order), set once by
    ``__init__``; compared, hashed, shown and pickled by their values."""

    __slots__ = ()

    def _names(self) -> tuple[str, ...]:
        return self.__slots__

    def __hash__(self) -> int:
        return hash(self._values())

    def __reduce__(self):
        return type(self), self._values()

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def replace(self, **changes) -> Frozen:
        """A copy with ``changes`` to its fields (as :func:`dataclasses.replace` gives one of
        a frozen dataclass; every ``__init__`` takes its fields by their names)."""
        return type(self)(**{name: changes.pop(name, getattr(self, name))
                             for name in self.__slots__}, **changes)

    def as_dict(self) -> dict:
        """The fields as a mapping, records among them (in tuples and lists too) as mappings
        (as :func:`dataclasses.asdict` gives them)."""
        return {name: _plain(getattr(self, name)) for name in self.__slots__}


def _plain(value):
    if isinstance(value, Frozen):
        return value.as_dict()
    if type(value) in (tuple, list):
        return type(value)(_plain(v) for v in value)
    return value


class MutableRecord(_ByValue):
    """Fields named in ``_fields`` (in order: ``__init__`` takes them in that order), set by
    ``__init__`` and changeable afterwards; compared and shown by their values, unhashable."""

    _fields: tuple[str, ...] = ()
    __hash__ = None  # a mutable record, as a dataclass with eq=True and not frozen

    def _names(self) -> tuple[str, ...]:
        return self._fields
