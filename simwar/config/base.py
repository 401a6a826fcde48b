"""What every config model shares: the strict base model and the one-line error.

A config error a user can cause is a :class:`ConfigError` whose message is one line,
``FILE: dotted.key: what was expected``. Each validator raises a one-line ``ValueError``
naming its key; :func:`first_error` turns pydantic's errors into that line, and
:func:`non_finite` is the one rule of configs, overrides and sweep grids that no number is
infinite or undefined.

Imports: pydantic only (the bottom of :mod:`simwar.config`).
"""

from __future__ import annotations

import math
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

#: the tags pydantic puts in an error's place for a branch of a union (a duration's
#: ``float``, ``Dist`` or ``Affine``; the workload's model of each batch source,
#: :mod:`simwar.config.workload`): not keys a user wrote, so an error's key leaves them out
UNION_TAGS = {"float", "Dist", "Affine", "int", "ConstantBatch", "BatchSizes", "BatchSizesFile",
              "DrawnBatch", "ArrivingRequests", "ClosedLoopRequests"}


class ConfigError(ValueError):
    """One-line, user-facing configuration error (file, key, expectation)."""


def first_error(e: ValidationError, prefix: str = "") -> str:
    """The first error of a pydantic validation as one line: ``dotted.key: message``.

    ``prefix`` is put before the key (the place of a nested model, ``phases.0``). A
    validator's own message that already names its key is kept as it is.
    """
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"]]
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
    if "input" in err and err["type"] not in ("extra_forbidden", "missing", "value_error"):
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
    # second one, for each config that leaves the section out
    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 for a number; `steps: true` is a slip, not one step
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if (field is not None and _takes(field.annotation, (int, float))
                    and not _takes(field.annotation, (bool, Any))):
                raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


def _takes(annotation: Any, types: tuple) -> bool:
    """Whether a field's type admits one of ``types`` (``int | None``, ``float | Dist``...)."""
    if any(annotation is t for t in types):
        return True
    return any(_takes(arg, types) for arg in typing.get_args(annotation))
