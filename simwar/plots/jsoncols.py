"""JSON text made column by column: numbers as ``json.dumps`` writes them, escaped strings,
concatenation, and the groupings the Perfetto export needs, each a vectorized pass.

- :func:`round_ns`, :func:`rounded`: ``round(x, 3)`` exactly as Python rounds (integer ns);
  :func:`number_text`: the text of a rounded float as ``repr`` writes it;
- :func:`int_text`, :func:`concat`, :func:`escaped`, :func:`json_str`: pyarrow string
  kernels over columns;
- :func:`present`, :func:`dense`, :func:`group_order`: distinct codes, ranks and a stable
  grouping by counting (no comparison sort).

Imports: numpy and pyarrow.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TS_DIGITS = 3  # ns resolution: Perfetto stores integer ns
#: the digits after the point of ``k / 1000`` as ``repr`` writes them ('.0', '.5', '.125')
_FRACTIONS = [("." + f"{r:03d}".rstrip("0")) if r else ".0" for r in range(1000)]


def round_us(x: float) -> float:
    return float(round(x, TS_DIGITS))


# --------------------------------------------------------------------------- numbers
def round_ns(x: np.ndarray) -> np.ndarray:
    """``round(x, 3) * 1000`` as exact integers (Python's correctly rounded ``round``)."""
    x = np.asarray(x, dtype=np.float64)
    y = x * 1000.0
    d = np.rint(y)
    # x * 1000 is within half an ulp of the exact product: only a product near a half can
    # round the other way, and beyond 2**43 the ulp is too coarse to tell
    risky = ~(np.abs(np.abs(y - d) - 0.5) > 1e-3) | ~(np.abs(y) < 2.0 ** 43)
    out = d.astype(np.int64)
    for i in np.flatnonzero(risky).tolist():
        out[i] = int(f"{round(float(x[i]), TS_DIGITS):.3f}".replace(".", ""))
    return out


def rounded(x: np.ndarray) -> np.ndarray:
    """``round(x, 3)`` element-wise, exactly as Python rounds (the value of :func:`round_ns`)."""
    return round_ns(x) / 1000.0


def number_text(ns: np.ndarray, x: np.ndarray, tail: str = "") -> list:
    """The text ``json.dumps`` writes for each ``round(x, 3)`` (``ns``: its :func:`round_ns`),
    followed by ``tail``: join pieces."""
    neg = (ns < 0) | ((ns == 0) & np.signbit(x))
    if neg.any():  # never in a simulated run: written one by one
        vals = (ns / 1000.0).tolist()
        text = [repr(-0.0 if n == 0 and s else v) + tail
                for v, n, s in zip(vals, ns.tolist(), np.signbit(x).tolist())]
        return [pa.array(text, pa.string())]
    q, r = np.divmod(ns, 1000)
    return [pc.cast(pa.array(q), pa.string()), pc.take(fraction_table(tail), pa.array(r))]


_TABLES: dict[str, pa.Array] = {}


def fraction_table(tail: str) -> pa.Array:
    table = _TABLES.get(tail)
    if table is None:
        table = _TABLES[tail] = pa.array([f + tail for f in _FRACTIONS], pa.string())
    return table


def int_text(a) -> pa.Array:
    return pc.cast(pa.array(np.asarray(a, dtype=np.int64)), pa.string())


def concat(*parts) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')


def escaped(strings: list[str]) -> pa.Array:
    """Each string as it sits between the quotes of ``json.dumps`` (ASCII, escaped)."""
    text = "".join(strings)
    if text.isascii() and not _NEEDS_ESCAPE.search(text):  # the usual case: as they are
        data = text.encode()
        offsets = np.zeros(len(strings) + 1, dtype=np.int32)
        np.cumsum(np.fromiter(map(len, strings), dtype=np.int32, count=len(strings)),
                  out=offsets[1:])
        return pa.StringArray.from_buffers(len(strings), pa.py_buffer(offsets),
                                           pa.py_buffer(data))
    return pa.array([json.dumps(s)[1:-1] for s in strings], pa.string())


def json_str(text: str) -> str:
    return json.dumps(text)


def present(codes: np.ndarray) -> np.ndarray:
    """The distinct values of non-negative codes, ascending (a count, not a sort)."""
    return np.flatnonzero(np.bincount(codes)) if len(codes) else np.zeros(0, dtype=np.int64)


def dense(values: np.ndarray) -> np.ndarray:
    """Each non-negative value's rank among the distinct values (0, 1, ...)."""
    if not len(values):
        return np.zeros(0, dtype=np.int64)
    top = int(values.max())
    if top > 8 * len(values) + 65536:  # too sparse for a table
        return np.unique(values, return_inverse=True)[1].ravel()
    rank = np.cumsum(np.bincount(values, minlength=top + 1) > 0) - 1
    return rank[values]


def group_order(codes: np.ndarray) -> np.ndarray:
    """A stable order that groups small non-negative codes (a radix sort when they fit)."""
    if len(codes) and int(codes.max()) < 32768:
        return np.argsort(codes.astype(np.int16), kind="stable")
    return np.argsort(codes, kind="stable")
