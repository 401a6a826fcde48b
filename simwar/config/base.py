"""What every config model shares: the strict base model and the one-line error.

A config error a user can cause is a :class:`ConfigError` whose message is one line,
``FILE: dotted.key: what was expected``. Each validator raises a one-line ``ValueError``
naming its key; :func:`first_error` turns pydantic's errors into that line, and
:func:`non_finite` is the one rule of configs, overrides and sweep grids that no number is
infinite or undefined.

Imports: pydantic only (the bottom of :mod:`simwar.config`).
"""

import math
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError
from typing_extensions import TypeAliasType

#: the tags pydantic puts in an error's place for a branch of a union (a duration's
#: ``float``, ``Dist`` or ``Affine``; the workload's model of each batch source,
#: :mod:`simwar.config.workload`): not keys a user wrote, so an error's key leaves them out
UNION_TAGS = {"float", "Dist", "Affine", "int", "ConstantBatch", "BatchSizes", "BatchSizesFile",
              "DrawnBatch", "ArrivingRequests", "ClosedLoopRequests"}


def default_buffers() -> list[str]:
    """The shared buffers a write or a prefill touches when the config names none: the
    request-to-token table. A module's function, not a lambda: the validator's schema holds
    each default factory, and :mod:`simwar.config.cache` pickles that schema."""
    return ["req_to_token"]


class ConfigError(ValueError):
    """One-line, user-facing configuration error (file, key, expectation)."""


def first_error(e: ValidationError, prefix: str = "") -> str:
    """The first error of a pydantic validation as one line: ``dotted.key: message``.

    ``prefix`` is put before the key (the place of a nested model, ``phases.0``). A
    validator's own message that already names its key is kept as it is.
    """
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"]]
    if err["type"] == BOOL_FOR_NUMBER:  # raised by its model, about one of its fields
        loc.append(err["ctx"]["field"])
    # drop union-branch tags pydantic adds ("float", "Dist", "function-after[...]")
    loc = [x for x in loc if not (x in UNION_TAGS or "[" in x)]
    key = ".".join(([prefix] if prefix else []) + loc)
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
        if key and (msg.startswith(key + ".") or msg.startswith(key + ":")):
            key = ""  # the message names the key itself (e.g. grid.policy.barrier: ...)
    if "input" in err and err["type"] not in ("extra_forbidden", "missing", "value_error",
                                              BOOL_FOR_NUMBER):
        got = err["input"]
        if not isinstance(got, (dict, list)):
            msg += f" (got {got!r})"
    return f"{key}: {msg}" if key else msg


def non_finite(data: Any, where: str = "") -> tuple[str, float] | None:
    """The first NaN or infinity in a config-like value (mappings and lists walked), as
    ``(dotted key, value)``; None when every number is finite. The one rule of configs,
    overrides and sweep grids: no duration, count or rate is infinite or undefined."""
    if isinstance(data, float) and not math.isfinite(data):
        return where or "value", data
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, (list, tuple)):
        items = enumerate(data)
    else:
        if hasattr(data, "dtype") and getattr(data, "shape", None) == ():  # a numpy scalar
            return non_finite(float(data), where) if data.dtype.kind == "f" else None
        return None
    for key, value in items:
        found = non_finite(value, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def finite_error(found: tuple[str, float]) -> str:
    """The one line for :func:`non_finite`'s find."""
    return f"{found[0]}: expected a finite number, got {found[1]}"


class StrictModel(BaseModel):
    """A config section: unknown keys are errors, and so are assignments of bad values."""

    # a field's docstring is its description; the configuration reference reads it from the
    # source (simwar.config.reference), not pydantic's use_attribute_docstrings, which
    # parses every model's source at each import (about a third of building the models).
    # defer_build: a model's validator is built at its first use, not at import; validating a
    # config builds the root's one validator (its sections' schemas inlined) rather than one
    # per model, and a command that validates nothing builds none. An empty list's default
    # is a plain `[]` (pydantic copies a mutable default for each model), not
    # default_factory=list: building the validator asks inspect for the factory's
    # signature, and list's is parsed from its text by the tokenizer, whose regex compiles
    # at its first use (~3 ms of a run's start-up). Likewise a section's default is its
    # values as data, validated by the config's validator (validate_default), not
    # default_factory=Section: constructing the section would build its own validator, a
    # second one, for each config that leaves the section out. The modules that define config
    # models (this one, durations, phases, workload, schema) do not postpone their
    # annotations (no `from __future__ import annotations`): pydantic would compile and
    # evaluate each field's annotation text at every import (~12 M instructions a start-up);
    # a method's return type naming its own class is quoted instead
    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        # pydantic reads true as 1 for a number; `steps: true` is a slip, not one step.
        # Checked once per model over the fields that take numbers, not by a validator on
        # each field: that wrapped every field's schema in one more function (~40 M
        # instructions of building the config's validator, an eighth of a first run's).
        # The error names the field (first_error puts it after the model's place), and the
        # first such field in the model's order is the one named
        if isinstance(data, dict):
            for name in _number_fields(cls):
                value = data.get(name)
                if isinstance(value, bool):
                    raise PydanticCustomError(BOOL_FOR_NUMBER, "expected a number, got {got}",
                                              {"field": name, "got": str(value).lower()})
        return data


#: the error type of a boolean given for a number (its ``ctx["field"]``: the field)
BOOL_FOR_NUMBER = "bool_for_a_number"

#: each model's fields that take numbers but not booleans, in the model's order
_NUMBER_FIELDS: dict[type, tuple[str, ...]] = {}


def _number_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``cls`` whose type admits a number but not a boolean (nor Any)."""
    names = _NUMBER_FIELDS.get(cls)
    if names is None:
        names = _NUMBER_FIELDS[cls] = tuple(
            name for name, field in cls.model_fields.items()
            if _takes(field.annotation, (int, float)) and not _takes(field.annotation,
                                                                     (bool, Any)))
    return names


def _takes(annotation: Any, types: tuple) -> bool:
    """Whether a field's type admits one of ``types`` (``int | None``, ``float | Dist``...)."""
    if any(annotation is t for t in types):
        return True
    if isinstance(annotation, TypeAliasType):  # a named type (Duration): what it names
        return _takes(annotation.__value__, types)
    return any(_takes(arg, types) for arg in typing.get_args(annotation))
