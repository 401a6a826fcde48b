"""A Chrome-trace capture's JSON, read in blocks and exactly as ``json.load`` reads it.

A Kineto capture is one JSON object whose ``traceEvents`` array holds nearly all of its
bytes (Chrome's JSON Array Format is a bare array of events). :class:`TraceJSON` reads the
file block by block and hands the events over in batches, so that memory is a block plus
what the caller keeps; msgspec decodes them into the caller's struct (only the fields it
reads are built). Which files are read and what every value is are ``json.load``'s, by
these rules (``tests/test_trace_json.py`` holds them against ``json.load`` on random
traces and random block sizes):

- **Cuts.** A block is cut at its last ``},`` before an event's ``{``, and the text up to
  the cut is decoded as ``[`` + text + ``]``. That succeeds only when the cut falls between
  two events of the array: one inside a string leaves the string open, one inside an event
  leaves the event open, one past the array's ``]`` leaves text after a whole value; a cut
  that fails waits for the next block, so where blocks fall never changes what is read.
- **The end.** What is left after the last cut (the last events, the array's ``]`` and the
  object's remaining keys) is decoded as the tail of the object it is:
  ``{"traceEvents":[`` + text. Nothing searches for the array's ``]``.
- **The key.** A ``"traceEvents":`` in the text is the object's own key (not one nested in
  a value before it) iff the text before it, closed with ``"traceEvents":null}``, decodes.
  When a second top-level ``traceEvents`` follows, the last one wins, as in ``json.load``
  (``on_reset`` forgets the events handed over). A file with no top-level
  ``"traceEvents": [`` (no key, another value, a key written with escapes), one that does
  not start with ``{`` or ``[``, and one not in UTF-8 (``json.load`` reads UTF-16 and
  UTF-32 too) is decoded at once, as ``json.load`` would.
- **Where msgspec and json differ, json decides.** msgspec refuses ``NaN``,
  ``Infinity``, lone UTF-16 surrogates and numbers beyond a double's range, all of which
  ``json.load`` reads: a piece msgspec refuses is decoded by the ``json`` module instead
  (its events then come as dicts). msgspec does not check the UTF-8 of the strings it
  skips, ``json.load`` does: a piece that is not all ASCII is checked.
- **Refusals.** A file ``json.load`` refuses is a :class:`KinetoFormatError` of one line
  with ``json``'s own words and the byte offset in the file (in the decompressed text of a
  gzip). A piece that fails inside the array is first taken for a cut inside a value and
  tried again with more text (after the buffer has doubled, so a bad byte early in a big
  file costs a few decodes, not one per block); at the end of the file, the rest is decoded
  at once and its refusal reported.

One exception, on purpose: a bare array whose closing ``]`` is missing is read (Chrome's
format allows it: a trace cut off by a crash); ``json.load`` refuses it.

Why not a general incremental parser: ijson (yajl) builds every value of every event as a
Python object and ran at less than half the speed of msgspec's typed decode of the same
bytes (``benchmarks/bench_import.py --candidates``); the framing above is the only hand-written
part, and each of its guesses is checked by a full decode.

Imports: msgspec and the standard library only.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from typing import Any

import msgspec

#: JSON's whitespace (``bytes.strip()`` would also take \\x0b and \\x0c, which JSON refuses)
WS = b" \t\n\r"
_KEY = re.compile(rb'"traceEvents"[ \t\n\r]*:[ \t\n\r]*')
_BOM = b"\xef\xbb\xbf"
_ANY = msgspec.json.Decoder()
#: the object's tail is decoded as this text plus the rest of the file
_TAIL = b'{"traceEvents":['
#: how many ``},`` are tried, back from a block's end, for one followed by an event's ``{``
_CUT_TRIES = 8


class KinetoFormatError(ValueError):
    """The file is not a readable Kineto capture; the message is one line."""


class _Refused(Exception):
    """json's refusal of a text: its words and the byte offset in that text (None: none)."""

    def __init__(self, what: str, pos: int | None):
        super().__init__(what)
        self.what, self.pos = what, pos


def decode(text: bytes, typed: msgspec.json.Decoder | None = None) -> Any:
    """``text`` decoded as ``json.loads`` decodes it: by ``typed`` where its type holds the
    value, else untyped (dicts and lists); :class:`_Refused` where ``json`` refuses it."""
    if typed is not None:
        try:
            out = typed.decode(text)
        except msgspec.ValidationError:  # a value of another shape: untyped
            pass
        except msgspec.DecodeError:  # NaN, a lone surrogate, ... or not JSON: json decides
            return _json(text)
        except RecursionError:
            raise _Refused("values nested too deeply", None) from None
        else:
            if not text.isascii():  # the strings msgspec skipped were not checked
                _utf8(text)
            return out
    try:
        return _ANY.decode(text)
    except msgspec.DecodeError:  # also a ValidationError: a number beyond a double's range
        return _json(text)
    except RecursionError:
        raise _Refused("values nested too deeply", None) from None


def _bracketed(buf: bytes, end: int) -> bytearray:
    """``[`` + ``buf[:end]`` + ``]`` in one copy (the sum of bytes copies a block three
    times)."""
    text = bytearray(b"[")
    text += memoryview(buf)[:end]
    text.append(0x5D)  # ]
    return text


def _utf8(text: bytes) -> str:
    """``text`` as ``json.loads`` decodes bytes (surrogates let through)."""
    try:
        return text.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        raise _Refused(f"not UTF-8 ({e.reason})", e.start) from None


def _json(text: bytes) -> Any:
    s = _utf8(text)
    try:
        return json.loads(s)
    except json.JSONDecodeError as e:
        pos = e.pos if s.isascii() else len(s[:e.pos].encode("utf-8", "surrogatepass"))
        raise _Refused(e.msg, pos) from None
    except RecursionError:
        raise _Refused("values nested too deeply", None) from None


def kind_of(value) -> str:
    """A JSON value's kind, in words (``'traceEvents' is a number``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


class TraceJSON:
    """One pass over a capture's JSON (see the module docstring).

    ``on_events(list)`` gets the events in file order, each an ``event_type`` struct, or a
    dict (or any other JSON value) where msgspec's type did not hold it; ``on_reset()``
    means forget them (a later top-level ``traceEvents`` wins). :meth:`read` returns the
    object's top-level ``meta_keys`` that are present. ``tick()`` is called after each
    block. ``name`` names the file in errors; ``compressed`` says offsets are in the
    decompressed text.
    """

    def __init__(self, fh, *, name: str, event_type: type, meta_keys: tuple[str, ...],
                 on_events: Callable[[list], None], on_reset: Callable[[], None],
                 block: int = 8 << 20, tick: Callable[[], None] = lambda: None,
                 compressed: bool = False):
        self.fh, self.name, self.block, self.tick = fh, name, max(1, block), tick
        self.on_events, self.on_reset, self.meta_keys = on_events, on_reset, meta_keys
        self.where = " of its decompressed text" if compressed else ""
        self.events = msgspec.json.Decoder(list[event_type])
        events = list[event_type] | msgspec.UnsetType
        self.Top = top = msgspec.defstruct("Top", [("traceEvents", events, msgspec.UNSET),
                                                   *((k, Any, msgspec.UNSET) for k in meta_keys)])
        self.top = msgspec.json.Decoder(top)
        self.offset = 0  # the offset in the file's text of the buffer's first byte
        self.bare = False  # the file is a bare array of events (Chrome's JSON Array Format)

    # ----------------------------------------------------------------------- helpers
    def fail(self, what: str) -> KinetoFormatError:
        return KinetoFormatError(f"{self.name}: {what}")

    def refused(self, e: _Refused, lead: int, end: int) -> KinetoFormatError:
        """json's refusal of a text of ``lead`` bytes of our own and then the file's bytes
        from :attr:`offset`, up to ``end`` (the file's text ends there)."""
        if e.pos is None:
            return self.fail(f"not valid JSON: {e.what}")
        at = self.offset + max(0, e.pos - lead)
        ends = " (the file ends there: truncated?)" if at >= end else ""
        return self.fail(f"not valid JSON at byte {at:,}{self.where}: {e.what}{ends}")

    def _read(self) -> bytes:
        return self.fh.read(self.block)

    # ----------------------------------------------------------------------- the pass
    def read(self) -> dict:
        buf = self._start()
        first = buf[:1]
        if first == b"{":
            return self._object(buf)
        if first == b"[":
            self.bare = True
            self.offset += 1
            self._array(buf[1:], tail=False)
            return {}
        return self._whole(buf)

    def _start(self) -> bytes:
        """The text from its first value byte (after a byte-order mark and whitespace);
        a file not in UTF-8 is transcoded first, as ``json.load`` decodes it."""
        buf = self._read()
        while 0 < len(buf) < 4:
            more = self._read()
            if not more:
                break
            buf += more
        if buf.startswith(_BOM):
            buf, self.offset = buf[3:], 3
        elif (enc := json.detect_encoding(buf[:4])) != "utf-8":
            data = buf + self.fh.read()
            try:
                text = data.decode(enc, "surrogatepass")
            except UnicodeDecodeError as e:
                raise self.fail(f"not valid JSON at byte {e.start:,}{self.where}: not "
                                f"{enc.upper()} ({e.reason})") from None
            self.fh = io.BytesIO(text.encode("utf-8", "surrogatepass"))
            self.where += " (read as UTF-8)"
            buf = self._read()
        while True:
            stripped = buf.lstrip(WS)
            self.offset += len(buf) - len(stripped)
            if stripped:
                return stripped
            buf = self._read()
            if not buf:
                raise self.fail("empty file (expected a Kineto JSON object)")

    def _object(self, buf: bytes) -> dict:
        """The keys before ``traceEvents`` (the first top-level one whose value is a list),
        then the array and the tail."""
        start = 0
        while True:
            m = _KEY.search(buf, start)
            if m is None or m.end() >= len(buf):
                more = self._read()
                if not more:
                    return self._whole(buf)
                buf += more
                continue
            if buf[m.end():m.end() + 1] == b"[":
                header = self._try(buf[:m.start()] + b'"traceEvents":null}')
                if isinstance(header, dict):  # the key is the object's own
                    meta = {k: header[k] for k in self.meta_keys if k in header}
                    self.offset += m.end() + 1
                    meta.update(self._array(buf[m.end() + 1:], tail=True))
                    return meta
            start = m.end()

    def _try(self, text: bytes):
        try:
            return decode(text)
        except _Refused:
            return None

    def _array(self, buf: bytes, tail: bool) -> dict:
        """The events from just after the array's ``[``, block by block; then the rest of
        the file, the last events and (``tail``) the object's keys after the array."""
        cut_from = 0  # a failed cut is not tried again
        retry_at = 0  # after a failed cut: the buffer length at which to try again
        while True:
            more = self._read()
            if not more:
                break
            buf += more
            self.tick()
            if len(buf) < retry_at:
                continue
            cut = _cut(buf, cut_from)
            if cut < 0:
                continue
            try:
                events = decode(_bracketed(buf, cut + 1), self.events)
            except _Refused:  # the cut is inside a value (or the text is bad): more text
                cut_from, retry_at = cut + 2, 2 * len(buf)
                continue
            if type(events) is not list:  # cannot be: the text is a list
                raise AssertionError(events)
            self.on_events(events)
            buf = buf[cut + 2:]
            self.offset += cut + 2
            cut_from = retry_at = 0
        end = self.offset + len(buf)
        if not tail:
            return self._last_of_array(buf, end)
        try:
            top = decode(_TAIL + buf, self.top)
        except _Refused as e:
            raise self.refused(e, len(_TAIL), end) from None
        if isinstance(top, dict):
            events, meta = top.get("traceEvents"), top
        else:
            events = top.traceEvents
            meta = {k: getattr(top, k) for k in self.meta_keys}
        if self._later_key(buf):
            self.on_reset()
        if type(events) is not list:
            raise self.fail(f"'traceEvents' is {kind_of(events)} (expected a list of events)")
        self.on_events(events)
        return {k: meta[k] for k in self.meta_keys if k in meta and meta[k] is not msgspec.UNSET}

    def _last_of_array(self, buf: bytes, end: int) -> dict:
        try:
            events = decode(b"[" + buf, self.events)
        except _Refused as e:
            body = buf.rstrip(WS)
            if body.endswith(b"]"):
                raise self.refused(e, 1, end) from None
            try:  # Chrome's Array Format may omit the closing bracket
                events = decode(b"[" + body + b"]", self.events)
            except _Refused:
                raise self.refused(e, 1, end) from None
        self.on_events(events)
        return {}

    def _later_key(self, buf: bytes) -> bool:
        """Whether the object has another top-level ``traceEvents`` after the array."""
        for m in _KEY.finditer(buf):
            if isinstance(self._try(_TAIL + buf[:m.start()] + b'"traceEvents":null}'), dict):
                return True
        return False

    def _whole(self, buf: bytes) -> dict:
        """The file decoded at once (no top-level ``"traceEvents": [`` was found, or it is
        not an object or array): the events, or what the file is instead."""
        buf += self.fh.read()
        self.tick()
        try:
            value = decode(buf, self.top if buf[:1] == b"{" else None)
        except _Refused as e:
            if e.pos == 0:  # not even the start of a JSON value
                raise self.fail(f"not JSON at byte {self.offset:,}{self.where} (starts with "
                                f"{buf[:1]!r}; expected a Kineto trace object)") from None
            raise self.refused(e, 0, self.offset + len(buf)) from None
        if type(value) is self.Top:
            value = {k: getattr(value, k) for k in ("traceEvents", *self.meta_keys)
                     if getattr(value, k) is not msgspec.UNSET}
        if not isinstance(value, dict):
            raise self.fail(f"the file is {kind_of(value)} in JSON, not a Kineto trace "
                            f"(expected an object with 'traceEvents')")
        if "traceEvents" not in value:
            raise self.fail("no 'traceEvents' array (not a Kineto/Chrome trace)")
        events = value["traceEvents"]
        if type(events) is not list:
            raise self.fail(f"'traceEvents' is {kind_of(events)} (expected a list of events)")
        self.on_events(events)
        return {k: value[k] for k in self.meta_keys if k in value}


def _cut(buf: bytes, lo: int) -> int:
    """Where to cut ``buf``: the last ``},`` after ``lo`` followed by an event's ``{``
    (a ``},`` of a value inside an event seldom is), else the last one followed by anything
    but ``]``; -1 when there is none. What follows must be in the buffer and must not be
    ``]``: the rest is decoded after a ``[``, where ``]`` would close an empty array, but
    after the comma it is a trailing comma, which JSON refuses. The decode, not this
    guess, decides whether the cut is between two events."""
    end, last = len(buf), -1
    for _ in range(_CUT_TRIES):
        cut = buf.rfind(b"},", lo, end)
        if cut < 0:
            break
        end = cut
        j = cut + 2
        while j < len(buf) and buf[j] in WS:
            j += 1
        follows = buf[j:j + 1]
        if follows == b"{":
            return cut
        if last < 0 and follows and follows != b"]":
            last = cut
    return last
