"""The rules of simwar.core.rules written out in generated code (simwar.executors.fast.inline)
give the calls' values bit for bit, on ties, signed zeros, infinities and NaN too; what is
not of the inlinable form is refused."""

from __future__ import annotations

import itertools
import math
import struct

import pytest

from simwar.core import rules
from simwar.executors.fast.inline import NotInlinable, inline

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
