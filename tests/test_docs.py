"""The documentation stays true to the code and to itself.

- ``docs/config-reference.md`` is generated from the config schema
  (:mod:`simwar.config.reference`); the committed file must be what the generator writes today,
  so a key added to the schema without regenerating it fails here.
- Every relative link of README.md and docs/*.md points to a file that exists and, where it
  names an anchor in a Markdown file, to a heading (or an ``id``) of that file, as GitHub
  spells heading anchors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import pytest
from pydantic import BaseModel, Field

from simwar.config import reference

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: ``[text](target)`` and ``![alt](target)``; the target ends at the first blank or ``)``
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_config_reference_is_current():
    committed = (ROOT / "docs" / "config-reference.md").read_text()
    assert committed == reference.render(), (
        "docs/config-reference.md differs from the schema: run "
        "`python -m simwar.config.reference > docs/config-reference.md`")


def test_config_reference_lists_every_top_level_key():
    text = reference.render()
    for key in reference.Config.model_fields:
        assert f"| `{key}` |" in text, key


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (where a bracket is code)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code marks and punctuation dropped, blanks
    to hyphens."""
    heading = heading.strip().lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set(re.findall(r'id="([^"]+)"', text))
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links() -> list[tuple[Path, str]]:
    out = []
    for doc in DOCS:
        for target in LINK.findall(_prose(doc.read_text())):
            if not re.match(r"^[a-z]+:", target):  # http:, https:, mailto: are not checked
                out.append((doc, target))
    return out


def test_the_docs_have_links_to_check():
    assert len(_links()) >= 20


@pytest.mark.parametrize("doc,target", _links(),
                         ids=lambda x: x.name if isinstance(x, Path) else x)
def test_every_relative_link_resolves(doc, target):
    where, _, anchor = target.partition("#")
    path = (doc.parent / where).resolve() if where else doc
    assert path.exists(), f"{doc.relative_to(ROOT)}: {target}: no such file"
    if anchor and path.suffix == ".md":
        assert anchor in _anchors(path), f"{doc.relative_to(ROOT)}: {target}: no such anchor"


def test_the_slug_rule():
    assert _slug("5. Durations, sizes and draws (`simwar/builder/`)") == (
        "5-durations-sizes-and-draws-simwarbuilder")
    assert _slug("Should I turn overlap on?") == "should-i-turn-overlap-on"


# ---------------------------------------------------------------- the generator on any schema
class _Gauge(BaseModel):
    """A gauge."""

    unit: Literal["us", "ms"] = "us"


class _Fixed(BaseModel):
    kind: Literal["fixed"]
    us: float = Field(default=1.0, ge=0, description="the fixed duration")


class _Drawn(BaseModel):
    kind: Literal["drawn"]
    mean: float


class _Root(BaseModel):
    """The root of a made-up schema."""

    #: how many, from a comment
    count: int = Field(default=2, ge=1)
    gauge: _Gauge = Field(default_factory=lambda: _Gauge(unit="ms"))
    gauges: list[_Gauge] = Field(default_factory=list)
    maybe: Optional[_Gauge] = None
    cost: Annotated[Union[_Fixed, _Drawn], Field(discriminator="kind")] = Field(
        default_factory=lambda: _Fixed(kind="fixed"), description="a tagged union")
    size: Union[int, dict[str, int]]


def test_the_generator_walks_any_pydantic_schema():
    text = reference.render((("", _Root),))
    rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines()
            if line.startswith("| `")}
    assert "| `count` | int (>= 1) | `2` | how many, from a comment |" in text
    assert "(#gauge)" in rows["gauge"] and '`{"unit": "ms"}`' in rows["gauge"]
    assert "## `gauge`" in text and "## `gauges[]`" in text and "## `maybe`" in text
    assert rows["gauge.unit"].endswith('| `"ms"` |  |')  # the root's default, not the class's
    assert rows["gauges[].unit"].split(" | ")[2] == '`"us"`'
    assert "[_Fixed](#type-_fixed) \\| [_Drawn](#type-_drawn)" in rows["cost"]
    assert rows["cost"].endswith("| a tagged union |")
    assert '### _Fixed' in text and "| `us` | float (>= 0) | `1.0` | the fixed duration |" in text
    assert rows["size"].split(" | ")[1:3] == ["int \\| dict[str, int]", "required"]
    assert "A gauge." in text and "The root of a made-up schema." in text
