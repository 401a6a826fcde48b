"""JSON text made column by column: numbers as ``json.dumps`` writes them, escaped strings,
the rows of alike events, and the groupings the Perfetto export needs, each a vectorized pass.

- :func:`round_ns`: ``round(x, 3)`` exactly as Python rounds, as integer ns;
- :func:`rows`: the JSON text of a group of alike events as one block of fixed-width rows
  (a ``uint8`` array, a row per event; :func:`write_rows` hands them to a file a piece at
  a time, :func:`write_rows_into` makes each piece in the file's own buffer), from
  constant texts and columns: :class:`Int`
  (integers), :func:`number_text` (a rounded float as ``repr`` writes it), :class:`Text`
  (strings of a table by code, escaped once per table: :class:`Strings`, :func:`escaped`;
  names made of parts: :func:`compose`, :func:`choose`). Each field of a row takes the
  widest of its column's values and the shorter ones get spaces, placed where JSON allows
  whitespace (before a number, after a string's closing quote), so every row of a block has
  one width and a field is a column of fixed-size cells: the text is made by a few
  whole-column copies (digits four at a time from a table), never event by event, and
  parses to exactly what ``json.dumps`` writes for the same event;
- :func:`json_str`: one string as JSON;
- :func:`present`, :func:`dense`, :func:`group_order`: distinct codes, ranks and a stable
  grouping by counting (no comparison sort).

Hand-written rather than a JSON library's: msgspec and orjson encode Python objects, one
per event (the export writes millions of events a second from columns), and pyarrow's
string kernels (casting numbers, taking names and joining each row's parts: the previous
form of this module) cost more than the copies here.

Imports: numpy.
"""

from __future__ import annotations

import itertools
import json
import re

import numpy as np

TS_DIGITS = 3  # ns resolution: Perfetto stores integer ns
#: the digits after the point of ``k / 1000`` as ``repr`` writes them ('.0', '.5', '.125')
_FRACTIONS = [("." + f"{r:03d}".rstrip("0")) if r else ".0" for r in range(1000)]


# --------------------------------------------------------------------------- numbers
def round_ns(x: np.ndarray) -> np.ndarray:
    """``round(x, 3) * 1000`` as exact integers (Python's correctly rounded ``round``)."""
    x = np.asarray(x, dtype=np.float64)
    y = x * 1000.0
    d = np.rint(y)
    # x * 1000 is within half an ulp of the exact product: only a product near a half can
    # round the other way, and beyond 2**43 the ulp is too coarse to tell (NaN: risky too)
    if len(d) and not (-2.0 ** 43 < d.min() and d.max() < 2.0 ** 43):
        big = ~(np.abs(y) < 2.0 ** 43)
    else:
        big = None
    e = np.subtract(y, d, out=y)  # (y no longer needed: its memory taken)
    np.abs(e, out=e)
    risky = e >= 0.4989
    if big is not None:
        risky |= big
    out = d.astype(np.int64)
    if risky.any():
        for i in np.flatnonzero(risky).tolist():
            out[i] = int(f"{round(float(x[i]), TS_DIGITS):.3f}".replace(".", ""))
    return out


def _cells(texts: list, width: int, right: bool = False) -> np.ndarray:
    """ASCII texts (``str`` or ``bytes``) as a column of fixed-width cells (``V{width}``),
    padded with spaces (none longer than ``width``)."""
    if not width:
        return np.zeros(len(texts), "V0")
    if right:
        data = b"".join(t.rjust(width) for t in texts)
        return np.frombuffer(data, dtype=f"V{width}")
    arr = np.array(texts, dtype=f"S{width}")  # NUL after each text: made spaces
    u = arr.view(np.uint8).reshape(len(texts), width)
    u[u == 0] = 32
    return arr.view(f"V{width}")


#: four decimal digits per entry; entries 0..9999 without their leading zeros (right-aligned,
#: 0 itself blank: a quad before the number's first digit), 10000.. with them
def _quads(last: bool) -> np.ndarray:
    i = np.arange(10000)[:, None]
    power = 10 ** np.arange(3, -1, -1)  # each digit's
    full = (i // power % 10 + ord("0")).astype(np.uint8)
    short = full.copy()
    blank = i < power  # a zero before the first digit (made at import: by arrays, 5x a loop)
    blank[0, 3] = not last
    short[blank] = ord(" ")
    return np.concatenate([short, full]).view(np.uint32).ravel()


_QUADS = _quads(False)
_QUADS_LAST = _quads(True)  # the lowest quad: 0 is "0"
_QUADS_FULL = _QUADS[10000:]  # four digits, zeros and all


#: the integer dtypes an :class:`Int` keeps as they are (others: int64)
_NARROW = (np.dtype(np.int32), np.dtype(np.uint32))


class Int:
    """Integers as ``json.dumps`` writes them (a column of :func:`rows`; right-aligned, the
    spaces before the digits: whitespace after the key's colon)."""

    __slots__ = ("v", "_cells", "_range")

    def __init__(self, values):
        v = np.asarray(values)
        # 32-bit columns (a trace's steps) as they are: Int.cells takes them without a copy
        self.v = v if v.dtype in _NARROW else np.asarray(v, dtype=np.int64)
        self._cells = None
        self._range = None

    @classmethod
    def _of(cls, v: np.ndarray, lo: int, hi: int) -> Int:
        """Non-negative integers ``v`` (any unsigned or 64-bit dtype) whose least and greatest
        values are known."""
        self = cls.__new__(cls)
        self.v, self._cells, self._range = v, None, (lo, hi)
        return self

    def __len__(self) -> int:
        return len(self.v)

    def range(self) -> tuple[int, int]:
        """The least and the greatest value (0, 0 for none), found once."""
        if self._range is None:
            v = self.v
            self._range = (int(v.min()), int(v.max())) if len(v) else (0, 0)
        return self._range

    def single(self) -> str | None:
        """The text of every row, where all rows hold one value (a pid, a tid): :func:`rows`
        writes it into the rows' constant text, no column copied."""
        lo, hi = self.range()
        return str(hi) if len(self.v) and lo == hi else None

    def cells(self) -> np.ndarray:
        """The texts as fixed-width cells (a ``V`` column, maybe a strided view)."""
        if self._cells is not None:
            return self._cells
        v = self.v
        m = len(v)
        lo, hi = self.range()
        if lo < 0:  # never in a simulated run: written one by one
            texts = [str(x).encode() for x in v.tolist()]
            self._cells = _cells(texts, max(map(len, texts)), right=True)
            return self._cells
        width = len(str(hi))
        if lo == hi:  # one value: one cell, repeated without a copy (a stride of 0)
            self._cells = np.ndarray((m,), dtype=f"V{width}", buffer=str(hi).encode(),
                                     strides=(0,))
            return self._cells
        nq = (width + 3) // 4
        quads = np.empty((m, nq), dtype=np.uint32)
        # every value as wide as the widest: each quad below the first is all digits (its
        # zeros too), so no quad needs to know whether digits come before it
        full = lo >= 10 ** (width - 1)
        # unsigned 32-bit arithmetic where the values fit (a division by 10000 three times
        # as fast as int64's)
        # (a 32-bit column's non-negative values are their own unsigned bits: no copy)
        x = v.view(np.uint32) if v.dtype in _NARROW else \
            v.astype(np.uint32) if hi < 2 ** 32 else v
        # (each quad taken straight into its column of ``quads``: a third faster than a
        # gather into a new array copied there; the indices are in the table: no wrap)
        for c in range(nq - 1, 0, -1):  # the lowest four digits first
            rest = x // 10000
            idx = rest * 10000
            np.subtract(x, idx, out=idx)
            if full:
                np.take(_QUADS_FULL, idx, out=quads[:, c], mode="wrap")
            else:
                idx += (rest > 0) * np.uint32(10000)  # digits before it: its zeros are digits
                np.take(_QUADS_LAST if c == nq - 1 else _QUADS, idx, out=quads[:, c],
                        mode="wrap")
            x = rest
        if width % 4 == 1 and (full or nq == 1):
            # one digit in the first quad, never blank: its byte made (no take; the blank
            # bytes before it are not in the cells)
            np.add(x, 48, out=quads.view(np.uint8)[:, 3], casting="unsafe")
        else:  # below 10000: no digits before
            np.take(_QUADS if nq > 1 else _QUADS_LAST, x, out=quads[:, 0], mode="wrap")
        # the last ``width`` bytes of each row (the blank quads' bytes before them dropped)
        self._cells = np.ndarray((m,), dtype=f"V{width}", buffer=quads,
                                 offset=4 * nq - width, strides=(4 * nq,))
        return self._cells


class Strings:
    """A table of strings, escaped as between JSON quotes, whose :class:`Text` columns pick
    entries by code: the table's cells are made once (a row of bytes per entry, padded to
    the longest), and a column takes its rows, as wide as its own longest entry."""

    __slots__ = ("texts", "lens", "_full", "_plain")

    def __init__(self, texts: list[str]):
        self.texts = texts
        self.lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        self._full: dict[tuple, np.ndarray] = {}
        self._plain = None  # the texts as cells, for every table made of them

    def __len__(self) -> int:
        return len(self.texts)

    def _table(self, quoted: bool, pre: str = "", post: str = "") -> np.ndarray:
        """Every entry as a row of 8-byte words (``uint64``), ``pre`` before it and ``post``
        (and the closing quote, if ``quoted``) right after it, spaces after that: a whole
        number of words one byte or more longer than the longest."""
        key = (quoted, pre, post)
        full = self._full.get(key)
        if full is None:
            full = self._full[key] = self._make(quoted, pre, post)
        return full

    def _make(self, quoted: bool, pre: str, post: str) -> np.ndarray:
        head, tail = pre.encode(), (post + '"' * quoted).encode()
        m = len(self.texts)
        longest = len(head) + int(self.lens.max(initial=0)) + len(tail)
        size = (longest + 8) // 8 * 8
        rows = np.full((m, size), 32, dtype=np.uint8)
        rows[:, :len(head)] = np.frombuffer(head, dtype=np.uint8)
        plain = self._plain
        if plain is None:
            plain = self._plain = _cells(self.texts, int(self.lens.max(initial=0)) + 1)
        rows[:, len(head):len(head) + plain.dtype.itemsize] = \
            plain.view(np.uint8).reshape(m, plain.dtype.itemsize)
        if tail:  # right after each text
            at = len(head) + self.lens[:, None] + np.arange(len(tail))
            rows[np.arange(m)[:, None], at] = np.frombuffer(tail, dtype=np.uint8)
        return rows.view(np.uint64)

    def cells(self, codes: np.ndarray, quoted: bool, pre: str = "",
              post: str = "") -> np.ndarray:
        if not len(codes):
            return np.zeros(0, dtype="V1")
        width = int(self.lens.take(codes).max()) + quoted + len(pre) + len(post)
        if not width:
            return np.zeros(len(codes), dtype="V0")
        # rows of words gathered (numpy's take of numbers: a fancy index of ``V`` cells
        # copies byte strings one by one, ten times slower), only the words that hold
        # ``width`` bytes (the table is as wide as its longest entry), then the first
        # ``width`` bytes of each (no entry picked is longer)
        table = self._table(quoted, pre, post)
        words = (width + 7) // 8
        if words < table.shape[1]:
            key = (quoted, pre, post, words)
            narrow = self._full.get(key)
            if narrow is None:
                narrow = self._full[key] = np.ascontiguousarray(table[:, :words])
            table = narrow
        return _first_bytes(table.take(codes, axis=0), width)


def _first_bytes(words: np.ndarray, width: int) -> np.ndarray:
    """The first ``width`` bytes of each row of ``words`` (numbers), as ``V`` cells (a view)."""
    return np.ndarray((len(words),), dtype=f"V{width}", buffer=words,
                      strides=(words.itemsize * (words.shape[1] if words.ndim > 1 else 1),))


class Text:
    """Strings of a :class:`Strings` table by code (a column of :func:`rows`), each between
    the constant texts ``pre`` and ``post`` (ASCII, escaped).
    ``quoted``: the text sits inside a JSON string whose closing quote is the next part's
    first character: that quote is taken into this column, the spaces after it."""

    __slots__ = ("table", "codes", "quoted", "pre", "post", "_cells")

    def __init__(self, table: Strings, codes, quoted: bool = False, pre: str = "",
                 post: str = ""):
        self.table = table
        self.codes = np.asarray(codes, dtype=np.int64)
        self.quoted = quoted
        self.pre, self.post = pre, post
        self._cells = None

    def __len__(self) -> int:
        return len(self.codes)

    def inside(self) -> Text:
        """This text inside a JSON string (see ``quoted``)."""
        return Text(self.table, self.codes, True, self.pre, self.post)

    def cells(self) -> np.ndarray:
        if self._cells is None:  # made once, for each block of rows that takes it
            self._cells = self.table.cells(self.codes, self.quoted, self.pre, self.post)
        return self._cells

    def entries(self) -> list[str]:
        """The table's texts with this column's constants around each."""
        if not (self.pre or self.post):
            return self.table.texts
        return [self.pre + t + self.post for t in self.table.texts]

    def single(self) -> str | None:
        """The one text of every row, where there is one."""
        c = self.codes
        if len(c) and c[0] == c[-1] and int(c.min()) == int(c.max()):
            return self.pre + self.table.texts[int(c[0])] + self.post
        return None


def texts(values: list[str]) -> Text:
    """A column of strings given one by one (escaped already)."""
    table, codes = np.unique(np.asarray(values, dtype=object), return_inverse=True) \
        if values else (np.zeros(0, dtype=object), np.zeros(0, dtype=np.int64))
    return Text(Strings(list(table)), codes.ravel())


def compose(*parts) -> Text:
    """Row by row, the texts of ``parts`` (constants and :class:`Text` columns) one after
    the other. A column of one text is a constant; with one column left, the constants
    around it are its ``pre`` and ``post`` (nothing joined); else each distinct combination
    of codes is joined once."""
    folded: list = []
    for p in parts:
        one = p if isinstance(p, str) else p.single()
        if one is not None and folded and isinstance(folded[-1], str):
            folded[-1] += one
        else:
            folded.append(p if one is None else one)
    cols = [p for p in folded if not isinstance(p, str)]
    if len(cols) == 1:
        i = folded.index(cols[0])
        c = cols[0]
        pre, post = "".join(folded[:i]), "".join(folded[i + 1:])
        return Text(c.table, c.codes, False, pre + c.pre, c.post + post)
    if not cols:  # every row the same text
        n = len(next(p for p in parts if not isinstance(p, str)))
        return constant("".join(folded), n)
    n = len(cols[0])
    if not n:
        return Text(Strings([]), np.zeros(0, dtype=np.int64))
    key = np.zeros(n, dtype=np.int64)
    for c in cols:
        key = key * len(c.table) + c.codes
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    seqs: list = []
    k = 0
    for p in folded:
        if isinstance(p, str):
            seqs.append(itertools.repeat(p, len(uniq)))
        else:
            entries = p.entries()
            seqs.append([entries[i] for i in cols[k].codes[first].tolist()])
            k += 1
    return Text(Strings(list(map("".join, zip(*seqs)))), inverse.ravel())


def choose(mask: np.ndarray, a: Text, b: Text) -> Text:
    """Row by row, ``a`` where ``mask``, else ``b``."""
    if bool(mask.all()):
        return a
    if not mask.any():
        return b
    table = Strings(a.entries() + b.entries())
    return Text(table, np.where(mask, a.codes, b.codes + len(a.table)))


def constant(text: str, n: int) -> Text:
    return Text(Strings([text]), np.zeros(n, dtype=np.int64))


#: the point and the digits after it of ``k / 1000`` (``_FRACTIONS``), by width
_FRACTION_LEN = np.array([len(f) for f in _FRACTIONS])
_FRACTION_WORDS = _cells([f.encode() for f in _FRACTIONS], 4).view(np.uint32)


class _Fraction:
    """The point and the digits after it of rounded floats (see :func:`number_text`)."""

    __slots__ = ("r",)

    def __init__(self, r: np.ndarray):
        self.r = r

    def __len__(self) -> int:
        return len(self.r)

    def single(self) -> str | None:
        """The one text of every row, where there is one (a column of whole µs, of times one
        inset from whole µs: most columns of a run of whole-µs costs)."""
        r = self.r
        if len(r) and r[0] == r[-1] and int(r.min()) == int(r.max()):  # (ends first: cheap)
            return _FRACTIONS[int(r[0])]
        return None

    def cells(self) -> np.ndarray:
        width = int(_FRACTION_LEN.take(self.r).max()) if len(self.r) else 2
        return _first_bytes(_FRACTION_WORDS.take(self.r), width)


def number_text(ns: np.ndarray, x: np.ndarray, tail: str = "") -> list:
    """The text ``json.dumps`` writes for each ``round(x, 3)`` (``ns``: its :func:`round_ns`),
    followed by ``tail``: parts of :func:`rows`."""
    lo = int(ns.min()) if len(ns) else 1
    if lo < 0 or (lo == 0 and bool(np.signbit(x[ns == 0]).any())):  # -0.0 or below: never
        # in a simulated run, written one by one
        vals = (ns / 1000.0).tolist()
        text = [repr(-0.0 if n == 0 and s else v)
                for v, n, s in zip(vals, ns.tolist(), np.signbit(x).tolist())]
        return [texts(text), tail]
    q = ns // 1000
    r = ns - q * 1000
    hi = int(ns.max()) if len(ns) else 0
    # q ascends with ns: its range is theirs divided (no pass over q); 32 bits where they
    # fit, as Int.cells takes them (no copy there)
    return [Int._of(q.astype(np.uint32) if hi < 1000 << 32 else q, lo // 1000, hi // 1000),
            _Fraction(r), tail]


def int_text(a) -> Int:
    return Int(a)


def _constant(part):
    """A column of one text (a pid, a tid, a name, the digits after the point) as that
    text: part of the rows' constant text, no column copied (the same bytes: its cells would
    be as wide as the text)."""
    if isinstance(part, str):
        return part
    one = part.single()
    return part if one is None else one


def _layout(parts) -> tuple[bytearray, list, int]:
    """The rows' constant text (one row), where each column's cells go in it, and the rows'
    count (see :func:`rows`)."""
    n = next((len(p) for p in parts if not isinstance(p, str)), 0)
    parts = [_constant(p) for p in parts]
    template = bytearray()
    fills: list = []  # (offset, cells)
    for i, p in enumerate(parts):
        if isinstance(p, str):
            template += p.encode()
            continue
        if isinstance(p, Text) and p.quoted:  # the closing quote moves into the column
            nxt = parts[i + 1]
            if not (isinstance(nxt, str) and nxt.startswith('"')):
                raise ValueError("a quoted text column must be followed by its quote")
            parts[i + 1] = nxt[1:]
        cells = p.cells()
        if cells.dtype.itemsize:
            fills.append((len(template), cells))
        template += b" " * cells.dtype.itemsize
    return template, fills, n


def _made(template: bytearray, m: int) -> np.ndarray:
    """``m`` rows of the constant text (a bytearray repeated: copies that double, twice as
    fast as numpy's broadcast of a row)."""
    return np.frombuffer(template * m, dtype=np.uint8).reshape(m, len(template))


def _fill(out: np.ndarray, fills: list, a: int, b: int) -> None:
    """Rows ``a..b`` of the columns into the first ``b - a`` rows of ``out``: one copy of
    fixed-size cells into each column of the rows."""
    width = out.shape[1]
    for off, cells in fills:
        np.ndarray((b - a,), dtype=cells.dtype, buffer=out, offset=off,
                   strides=(width,))[...] = cells[a:b]


def rows(*parts) -> np.ndarray:
    """The rows of alike events: ``parts`` are constant texts and columns (:class:`Int`,
    :class:`Text`, :func:`number_text`'s), a value per event; one ``uint8`` row per event,
    all of one width (see the module docstring)."""
    template, fills, n = _layout(parts)
    out = _made(template, n)
    if n:
        _fill(out, fills, 0, n)
    return out


#: the most bytes of rows :func:`write_rows` makes before handing them on: rows made a
#: piece at a time in one buffer stay in the processor's cache while their columns are
#: copied in and while the file takes them (a whole block of megabytes, made at once, is
#: made in new memory and read back from main memory: twice the system time of the file's
#: writing, docs/benchmarks-trace.md)
PIECE_BYTES = 1 << 19


def write_rows(write, *parts, piece: int | None = None) -> None:
    """:func:`rows` of ``parts``, handed to ``write`` a piece of at most ``piece`` bytes
    (:data:`PIECE_BYTES`; a row at least) at a time: a view of one buffer, filled again with
    the next piece's rows once ``write`` returns (``write`` copies what it keeps)."""
    template, fills, n = _layout(parts)
    if not n:
        return
    per = max(1, (PIECE_BYTES if piece is None else piece) // max(1, len(template)))
    out = _made(template, min(n, per))
    for a in range(0, n, per):
        b = min(n, a + per)
        _fill(out, fills, a, b)
        write(memoryview(out[:b - a]).cast("B"))


def write_rows_into(sink, *parts, piece: int | None = None) -> None:
    """:func:`write_rows` made in ``sink``'s own buffer (a
    :class:`~simwar.core.direct_io.DirectWriter`: ``room()``, ``advance(n)``, ``write``):
    each piece of rows is made where the file's bytes are gathered, not copied there (a
    piece at most as large as the room left; a row across the buffer's end is written)."""
    template, fills, n = _layout(parts)
    width = len(template)
    if not (n and width):
        return
    per = max(1, (PIECE_BYTES if piece is None else piece) // width)
    a = 0
    while a < n:
        # (the views on the room are not released by hand: a view still held by a failure's
        # traceback would turn the failure into a BufferError; nothing is made on a room
        # once it is taken)
        room = sink.room()
        k = min(n - a, per, len(room) // width)
        if k:
            out = np.frombuffer(room, dtype=np.uint8, count=k * width).reshape(k, width)
            _repeat(room, template, k * width)
            _fill(out, fills, a, a + k)
            del out, room
            sink.advance(k * width)
        else:  # less than a row of room: this row written (across the buffer's end)
            del room
            one = _made(template, 1)
            _fill(one, fills, a, a + 1)
            sink.write(memoryview(one).cast("B"))
            k = 1
        a += k


def _repeat(room: memoryview, template: bytearray, size: int) -> None:
    """The first ``size`` bytes of ``room`` as ``template`` repeated (copies that double)."""
    room[:len(template)] = template
    done = len(template)
    while done < size:
        step = min(done, size - done)
        room[done:done + step] = room[:step]
        done += step


_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')


def escaped(strings: list[str]) -> Strings:
    """Each string as it sits between the quotes of ``json.dumps`` (ASCII, escaped)."""
    text = "".join(strings)
    if text.isascii() and not _NEEDS_ESCAPE.search(text):  # the usual case: as they are
        return Strings(list(strings))
    return Strings([json.dumps(s)[1:-1] for s in strings])


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
