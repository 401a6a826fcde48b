"""The rules of simwar.core.rules written out in generated code (simwar.executors.fast.inline)
give the calls' values bit for bit, on ties, signed zeros, infinities and NaN too; what is
not of the inlinable form is refused."""

from __future__ import annotations

import itertools
import math
import struct
from pathlib import Path

import pytest

from simwar.core import rules
from simwar.executors.fast.inline import NotInlinable, inline

ROOT = Path(__file__).resolve().parents[1]
VALUES = [0.0, -0.0, 1.5, 2.0, 1e300, -3.25, math.inf, -math.inf, math.nan]


def _bits(x):
    return x if x is None else struct.pack("<d", x)


def _run(fn, args: dict, same=None):
    """The inlined text of ``fn`` on the names of ``args`` (``same``: a literal same_stream)."""
    names = list(args)
    if same is not None:
        names[-1] = repr(same)
    lines, expr = inline(fn, names, "p_")
    env = dict(args)
    exec("\n".join(lines + [f"OUT = {expr}"]), {}, env)
    return env["OUT"]


def test_begins_and_fires_bit_for_bit():
    for a, b in itertools.product(VALUES, repeat=2):
        for fn in (rules.begins, rules.fires):
            assert _bits(_run(fn, {"a": a, "b": b})) == _bits(fn(a, b))


def test_released_bit_for_bit_with_same_stream_folded_or_not():
    for reach, fired, lat in itertools.product(VALUES, VALUES, (0.0, 0.5, -0.0)):
        for same in (True, False):
            want = _bits(rules.released(reach, fired, lat, same))
            assert _bits(_run(rules.released, {"r": reach, "f": fired, "l": lat, "s": same},
                              same)) == want
            assert _bits(_run(rules.released, {"r": reach, "f": fired, "l": lat,
                                               "s": same})) == want


def test_returns_bit_for_bit_with_none_folded():
    for called, cost, fired in itertools.product(VALUES, (0.0, 2.5), VALUES + [None]):
        want = _bits(rules.returns(called, cost, fired, 7.0))
        assert _bits(_run(rules.returns, {"c": called, "k": cost, "f": fired,
                                          "w": 7.0})) == want
    lines, expr = inline(rules.returns, ["t0", "k1", "None", "k2"], "p_")
    assert "None" not in expr and "k2" not in "\n".join(lines) + expr  # the branch folded


def test_an_expression_read_twice_is_evaluated_once():
    lines, expr = inline(rules.returns, ["t0", "k1", "H1[0]", "k2"], "p_")
    assert lines[0] == "p_fired = H1[0]" and "H1" not in expr
    assert inline(rules.begins, ["T0", "t"], "p_") == ([], "T0 if T0 > t else t")


G = 1.0


def _global(a):
    return a + G


def _loop(a):
    for _ in range(2):
        a += 1
    return a


def test_what_is_not_plain_is_refused():
    for fn in (_global, _loop, max):
        with pytest.raises(NotInlinable):
            inline(fn, ["x"], "p_")



def test_a_rule_without_its_source_is_called_with_the_same_answers(monkeypatch):
    """simwar without its sources (no text to derive): the blocks call the rules instead."""
    from simwar.api import simulate
    from simwar.config import load_config
    from simwar.executors.fast import codegen

    cfg = load_config(ROOT / "configs" / "dspark_fine_bimodal.yaml", {"steps": 300})
    monkeypatch.setattr(codegen, "_CODE", type(codegen._CODE)())  # this run's blocks only
    inlined = simulate(cfg, engine="fast")
    blocks = [fn.source for fn in codegen._CODE.values()]
    assert blocks and not any("begins(" in text for text in blocks)

    def no_source(fn, args, prefix):
        raise NotInlinable(f"{fn.__name__}: no Python source")

    monkeypatch.setattr(codegen, "inline", no_source)
    monkeypatch.setattr(codegen, "_CODE", type(codegen._CODE)())  # a cold cache
    called = simulate(cfg, engine="fast")
    assert any("begins(" in fn.source for fn in codegen._CODE.values())
    assert called.summary == inlined.summary
