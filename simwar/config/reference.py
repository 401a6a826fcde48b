"""The configuration reference (docs/config-reference.md), generated from the config schema.

A hand-kept list of keys drifts from the schema the day a key is added; this one is written
from the pydantic models themselves. It walks :class:`simwar.config.Config` (and the phase
table's :class:`simwar.config.Phase`, whose entries the config holds as plain mappings)
through pydantic's own description of each model: ``model_fields`` in declaration order,
each field's annotation, default (or default factory) and ``Field(description=...)`` or the
docstring below the field (read from the source here, not by pydantic at every import), and
the model's docstring for its section. Nothing here knows the schema's modules or keys, so the
reference follows the schema wherever its models live:

- a field whose type is one model (or one model or None, or a list of one model) is a
  section of its own, under its dotted path (``policy``, ``workload.arrivals``,
  ``phases[].collectives[]``);
- a model that appears as one choice among several (a duration: a number, a ``Dist`` or an
  ``Affine``; a discriminated union) is a *type*, described once at the end and linked;
- ``Annotated`` metadata that constrains a value (``ge``, ``gt``, ``le``, ``lt``,
  ``min_length``, ``max_length``) is written beside the type.

``python -m simwar.config.reference > docs/config-reference.md`` rewrites the file;
``tests/test_docs.py`` fails when the committed file differs from what this writes.

Imports: pydantic and :mod:`simwar.config` only (its layer).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

from pydantic import BaseModel
from pydantic_core import PydanticUndefined
from typing_extensions import TypeAliasType

from simwar.config import Config, Phase

#: (dotted path, model) of each root the reference starts from: the config, and one entry of
#: its phase table (``phases`` holds mappings, validated as phases by the builder's rules)
ROOTS: tuple[tuple[str, type[BaseModel]], ...] = (("", Config), ("phases[]", Phase))

#: ``annotated_types`` constraint attribute -> how the reference writes it
CONSTRAINTS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=",
               "min_length": "length >=", "max_length": "length <="}

HEADER = """\
# Configuration reference

Generated from the config schema by `python -m simwar.config.reference > \
docs/config-reference.md`
(`simwar/config/reference.py`); `tests/test_docs.py` fails when this file and the schema differ.
Do not edit it by hand: describe a key with `Field(description=...)` in the schema instead.

Every key below can be given in a config file, as `--set KEY=VALUE` on the command line, or in
the mapping given to `simwar.simulate`; a sweep's `grid` and `zip` take the same dotted keys.
`simwar show CONFIG` prints a config with every default resolved. Durations are in µs. How a
config becomes a run: [Durations, sizes and draws]\
(design.md#5-durations-sizes-and-draws-simwarbuilder).
"""


@dataclass
class _Section:
    path: str
    model: type[BaseModel]
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _strip(tp: Any) -> tuple[Any, list[Any]]:
    """``(type, metadata)`` with every ``Annotated`` layer removed, its metadata kept, and a
    named type (``Duration``) read as what it names."""
    meta: list[Any] = []
    while True:
        if isinstance(tp, TypeAliasType):
            tp = tp.__value__
        elif typing.get_origin(tp) is typing.Annotated:
            meta.extend(tp.__metadata__)
            tp = typing.get_args(tp)[0]
        else:
            return tp, meta


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return typing.get_args(tp)
    return None


def _section_model(tp: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field opens a section for, and the path suffix (``""`` or ``"[]"``): one
    model, one model or None, or a list of one model."""
    tp, _ = _strip(tp)
    args = _union_args(tp)
    if args is not None:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return None
        tp, _ = _strip(rest[0])
    if _is_model(tp):
        return tp, ""
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (Any,)
        item, _ = _strip(item)
        if _is_model(item):
            return item, "[]"
    return None


def _anchor(name: str) -> str:
    return "type-" + name.lower()


def _type_name(tp: Any, named: dict[str, type[BaseModel]]) -> str:
    """How a type reads in the reference; models met inside unions go into ``named``."""
    tp, meta = _strip(tp)
    text = _bare_type_name(tp, named)
    limits = _constraints(meta)
    return f"{text} ({limits})" if limits else text


def _bare_type_name(tp: Any, named: dict[str, type[BaseModel]]) -> str:
    if tp is Any:
        return "any"
    if tp is type(None):
        return "null"
    args = _union_args(tp)
    if args is not None:
        return " \\| ".join(_type_name(a, named) for a in args)
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(v) for v in typing.get_args(tp))
    if origin is not None:
        inner = ", ".join(_type_name(a, named) for a in typing.get_args(tp))
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{inner}]" if inner else name
    if _is_model(tp):
        named.setdefault(tp.__name__, tp)
        return f"[{tp.__name__}](#{_anchor(tp.__name__)})"
    return getattr(tp, "__name__", str(tp))


def _constraints(meta: list[Any]) -> str:
    out = []
    for m in meta:
        for attr, word in CONSTRAINTS.items():
            value = getattr(m, attr, None)
            if value is not None and not callable(value):
                out.append(f"{word} {value}")
    return ", ".join(out)


def _value(v: Any) -> str:
    if isinstance(v, BaseModel):
        v = v.model_dump(exclude_defaults=True)
        return f"`{json.dumps(v)}`" if v else "(its defaults)"
    if isinstance(v, str):
        return f'`"{v}"`'
    return f"`{json.dumps(v)}`"


def _doc(model: type[BaseModel]) -> str:
    """A model's own docstring (not inherited), its lines joined into paragraphs."""
    doc = model.__dict__.get("__doc__")
    if not doc:
        return ""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(_markdown(" ".join(p.split())) for p in paragraphs)


def _markdown(text: str) -> str:
    """reStructuredText's inline code and roles, as Markdown reads them."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """The docstring below each of a model's fields (a string literal right after the
    field's annotated assignment, cleaned as pydantic's ``use_attribute_docstrings`` would
    clean it), by field name; a field inherited from a base model has its base's. Read here
    rather than by pydantic at every import of the config: building the models is on every
    command's start-up path, the reference is not."""
    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):  # a subclass's docstring replaces its base's
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        if not isinstance(body, ast.ClassDef):
            continue
        for node, after in zip(body.body, body.body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                out[node.target.id] = inspect.cleandoc(after.value.value)
    return out


def _field_comments(model: type[BaseModel]) -> dict[str, str]:
    """The ``#:`` comments above a model's fields (the Sphinx convention the schema uses
    where a field has no ``Field(description=...)``), by field name."""
    try:
        source = inspect.getsource(model)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    block: list[str] = []
    for line in source.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            block.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+)\s*:", stripped)
        if block and match and match.group(1) in model.model_fields:
            out[match.group(1)] = " ".join(block)
        block = []
    return out


def field_descriptions(model: type[BaseModel]) -> dict[str, str]:
    """Each of a model's fields' description, by field name ("" where it has none): its
    ``Field(description=...)``, else the docstring below it, else the ``#:`` comment above."""
    docstrings, comments = _field_docstrings(model), _field_comments(model)
    return {name: info.description or docstrings.get(name) or comments.get(name, "")
            for name, info in model.model_fields.items()}


def _cell(text: str) -> str:
    # a table cell is one line, and a bare | would end it
    text = " ".join(text.split())
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def _walk(path: str, model: type[BaseModel], defaults: BaseModel | None,
          sections: list[_Section], named: dict[str, type[BaseModel]],
          nest: bool = True) -> None:
    """Append ``model``'s section (and, with ``nest``, its sub-models' sections) to
    ``sections``; without ``nest`` (a type's own fields) a sub-model is linked as a type."""
    section = _Section(path, model)
    sections.append(section)
    nested: list[tuple[str, type[BaseModel], BaseModel | None]] = []
    descriptions = field_descriptions(model)
    for name, info in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        if defaults is not None:
            default: Any = getattr(defaults, name)
        elif info.default is not PydanticUndefined:
            default = info.default
        elif info.default_factory is not None:
            default = _factory_default(info.default_factory)
        else:
            default = PydanticUndefined
        annotation = info.rebuild_annotation()
        sub = _section_model(annotation) if nest else None
        if sub is not None and info.validate_default and isinstance(default, dict):
            default = sub[0].model_validate(default)  # a section's default, its values as data
        if sub is not None:
            sub_model, suffix = sub
            text = f"[{sub_model.__name__}](#{_path_anchor(key + suffix)})"
            if typing.get_origin(_strip(annotation)[0]) is list:
                text = f"list[{text}]"
            elif _union_args(_strip(annotation)[0]) is not None:
                text += " \\| null"
            nested.append((key + suffix, sub_model,
                           default if isinstance(default, BaseModel) else None))
        else:
            text = _type_name(annotation, named)  # its constraints included
        shown = "required" if default is PydanticUndefined else _value(default)
        section.rows.append((f"`{key}`", text, shown, _markdown(descriptions[name])))
    for key, sub_model, sub_defaults in nested:
        _walk(key, sub_model, sub_defaults, sections, named)


def _factory_default(factory: Any) -> Any:
    """A default factory's value; one that reads the other fields' data has none to show."""
    try:
        return factory()
    except TypeError:
        return PydanticUndefined


def _path_anchor(path: str) -> str:
    """GitHub's anchor of the heading ``## `path```."""
    return re.sub(r"[^a-z0-9_ -]", "", path.lower()).replace(" ", "-")


def render(roots: tuple[tuple[str, type[BaseModel]], ...] = ROOTS) -> str:
    """The whole reference, as Markdown: a section per model reached from ``roots``."""
    sections: list[_Section] = []
    named: dict[str, type[BaseModel]] = {}
    for path, model in roots:
        _walk(path, model, None, sections, named)
    out = [HEADER]
    for section in sections:
        title = section.path or "top level"
        out.append(f"## {title if not section.path else f'`{title}`'}\n")
        if section.path:
            out.append(f"Model `{section.model.__name__}`.\n")
        doc = _doc(section.model)
        if doc:
            out.append(doc + "\n")
        out.append(_table(section.rows))
    out.append("## Types\n")
    out.append("Values that take one of several forms; where a key's type names one of these, "
               "it may be given in that form.\n")
    done: set[str] = set()
    while len(done) < len(named):  # describing a type can name more types
        for name in sorted(set(named) - done):
            done.add(name)
            model = named[name]
            sub: list[_Section] = []
            _walk("", model, None, sub, named, nest=False)
            out.append(f'<a id="{_anchor(name)}"></a>\n\n### {name}\n')
            doc = _doc(model)
            if doc:
                out.append(doc + "\n")
            out.append(_table(sub[0].rows))
    return "\n".join(out).rstrip("\n") + "\n"


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
