"""The capture reader is ``json.load`` on every file: what it keeps, and what it refuses.

The oracle is ``json.load`` of the whole file, its events fed through the reader's own
field rules (:class:`simwar.capture.reader._Classifier`): the block reader
(:mod:`simwar.capture.trace_json`) must keep exactly that, whatever the block size, and
refuse (one line naming the file and, for bad JSON, json's byte offset in the file) exactly
the files ``json.load`` refuses. Hypothesis writes the traces: keys before and after
``traceEvents`` holding lists and strings with ``]``, ``},``, quotes and escapes, unicode,
lone surrogates, NaN and infinities, duplicate keys, events of every used kind and of no
kind, whitespace of every JSON kind, a byte-order mark, gzip; and corrupts some of them.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simwar.capture.reader import (
    CaptureEvents,
    KinetoFormatError,
    _check_plausible,
    _Classifier,
    _meta,
    read_capture,
)

HTA = Path(__file__).parent / "data" / "hta"
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --------------------------------------------------------------------------- the oracle
def expected(raw: bytes):
    """What the reader must give for a file of bytes ``raw`` (decompressed): a
    :class:`CaptureEvents`, or ('refused', byte offset or None) where json.load refuses, or
    ('not a trace', None) where the JSON is not a trace the reader can read."""
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        offset = len(text[:e.pos].encode("utf-8", "surrogatepass"))
        return "refused", offset + (3 if raw.startswith(b"\xef\xbb\xbf") else 0)
    except (UnicodeDecodeError, RecursionError):
        return "refused", None
    if isinstance(doc, list):
        events, meta = doc, {}
    elif isinstance(doc, dict) and type(doc.get("traceEvents")) is list:
        events, meta = doc["traceEvents"], doc
    else:
        return "not a trace", None
    if not events or not any(isinstance(e, dict) for e in events):
        return "not a trace", None
    cap = CaptureEvents()
    classify = _Classifier(cap)
    classify.feed(events)
    classify.finish()
    _meta(cap, meta)
    _check_plausible(cap)
    return cap


def _refused(raw: bytes) -> bool:
    want = expected(raw)
    return isinstance(want, tuple) and want[0] == "refused"


def canon(cap: CaptureEvents) -> dict:
    """A capture's fields in a form where equal means equal (NaN included: by repr)."""
    out = {}
    for name, value in vars(cap).items():
        if isinstance(value, dict):
            value = sorted((repr(k), repr(v)) for k, v in value.items())
        out[name] = repr(value)
    return out


def check(tmp: Path, raw: bytes, block: int, gz: bool = False) -> None:
    """Read ``raw`` written to a file (gzipped or not) with blocks of ``block`` bytes and
    hold the result to :func:`expected`."""
    path = tmp / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    want = expected(raw)
    if isinstance(want, CaptureEvents):
        got = read_capture(path, chunk_bytes=block)
        assert canon(got) == canon(want)
        return
    with pytest.raises(KinetoFormatError) as info:
        read_capture(path, chunk_bytes=block)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    if "empty file" in msg:
        assert not raw.lstrip(b"\xef\xbb\xbf").strip(b" \t\r\n")
    elif want[0] == "refused" and want[1] is not None:
        at = re.search(r"at byte ([\d,]+)", msg)
        assert at and int(at.group(1).replace(",", "")) == want[1], (msg, want)


# --------------------------------------------------------------------------- the regression
def test_hta_multi_stream_event_sync_trace_imports(tmp_path):
    """HTA's multi-stream event-sync capture: its keys after traceEvents hold the profiler's
    log lines, with more ']' than the old reader tried as the array's end."""
    raw = gzip.decompress((HTA / "event_sync_multi_stream.json.gz").read_bytes())
    for block in (1, 5, 64, 4096, 8 << 20):
        check(tmp_path, raw, block)
    cap = read_capture(HTA / "event_sync_multi_stream.json.gz")
    assert cap.counts["cuda_sync"] == 5 and cap.meta["rank"] == 0


def test_keys_after_the_events_with_brackets_and_braces(tmp_path):
    doc = {"schemaVersion": 1,
           "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k]},", "pid": 0, "tid": 7,
                            "ts": 1.0, "dur": 2.0, "args": {"stream": 7, "correlation": 1}}],
           "INFO": [f"line {i}] }}, ]]" for i in range(50)], "deviceProperties": [{"id": 0}],
           "tail": {"a": [[1], [2, {"b": "]"}]], "c": "}, {"}}
    raw = json.dumps(doc).encode()
    for block in (1, 3, 17, 100, 1 << 20):
        check(tmp_path, raw, block)


def test_a_bad_byte_deep_in_a_big_file_is_reported_at_its_offset_in_the_file(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7,
               "ts": float(i), "dur": 0.5, "args": {"stream": 7, "correlation": i}}
              for i in range(20000)]
    raw = bytearray(json.dumps({"traceEvents": events}).encode())
    at = raw.index(b'"k15000"')
    raw[at + 3] = ord("#")  # "k1#000" stays a string: break the structure instead
    raw[at - 1] = ord("#")
    want = expected(bytes(raw))
    assert want[0] == "refused" and want[1] == at - 1
    for block in (997, 64 << 10, 8 << 20):
        with pytest.raises(KinetoFormatError, match=f"at byte {at - 1:,}: Expecting value"):
            read_capture(_write(tmp_path / "bad.json", bytes(raw)), chunk_bytes=block)
    gz = _write(tmp_path / "bad.json.gz", gzip.compress(bytes(raw)))
    with pytest.raises(KinetoFormatError, match=f"at byte {at - 1:,} of its decompressed"):
        read_capture(gz, chunk_bytes=4096)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("text, fragment", [
    (b"", "empty file"),
    (b" \n\t ", "empty file"),
    (b"\x0c{}", "not JSON at byte 0 (starts with b'\\x0c'"),  # form feed: not JSON's space
    (b"\n hello", "not JSON at byte 2 (starts with b'h'"),
    (b"5", "the file is a number in JSON"),
    (b'"trace"', "the file is a string in JSON"),
    (b"[1, 2, 3]", "the file is a JSON list of 3 values and no event object"),
    (b"[]", "'traceEvents' is empty"),
    (b'{"traceEvents": [1, "x"]}', "'traceEvents' is a list of 2 values and no event"),
    (b'{"traceEvents": []}', "'traceEvents' is empty"),
    (b'{"traceEvents": [{"ph": "X"},]}', "not valid JSON at byte 29"),
    (b'{"traceEvents": [{"ph": "X"}], "traceEvents": null}', "'traceEvents' is null"),
    (b'{"traceEvents": [{"ph": "X"}]} x', "not valid JSON at byte 31: Extra data"),
    (b'{"traceEvents": [{"ph": "X"}]', "(the file ends there: truncated?)"),
])
def test_what_is_refused_gets_one_line(tmp_path, text, fragment):
    for block in (1, 8, 1 << 20):
        path = _write(tmp_path / "t.json", text)
        with pytest.raises(KinetoFormatError) as info:
            read_capture(path, chunk_bytes=block)
        assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)
        check(tmp_path, text, block)


@pytest.mark.parametrize("text", [
    # json.load reads all of these: NaN, infinities, lone surrogates (escaped and raw),
    # a number beyond a double, a key written with escapes, the last of two keys
    b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": NaN, "dur": 1}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "\\ud800", "ts": Infinity}]}',
    '{"traceEvents": [{"ph": "X", "cat": "x", "name": "\ud800"}]}'.encode("utf-8",
                                                                          "surrogatepass"),
    b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1e999, "dur": 1}]}',
    b'{"trace\\u0045vents": [{"ph": "X", "cat": "user_annotation", "name": "a", "ts": 1, '
    b'"dur": 2}]}',
    b'{"traceEvents": 5, "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "a", '
    b'"ts": 1, "dur": 2}]}',
    b'{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "a", "ts": 1, "dur": 2}]'
    b', "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "b", "ts": 1, '
    b'"dur": 3}], "distributedInfo": {"rank": 3}}',
    b'{"a": {"traceEvents": [1]}, "traceEvents": [{"ph": "X", "cat": "user_annotation", '
    b'"name": "a", "ts": 1, "dur": 2}]}',
    '{"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, '
    '"args": {"name": "é 😀"}}, {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, '
    '"dur": 1}]}'.encode("utf-16"),
    b'\xef\xbb\xbf{"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "a", '
    b'"ts": 1, "dur": 2}]}',
])
def test_what_json_load_reads_is_read(tmp_path, text):
    for block in (1, 7, 1 << 20):
        check(tmp_path, text, block)


def test_chrome_array_format_may_omit_its_closing_bracket(tmp_path):
    # the one file json.load refuses and the reader reads, on purpose (Chrome's format)
    ev = {"ph": "X", "cat": "user_annotation", "name": "a", "ts": 1, "dur": 2}
    closed = json.dumps([ev, ev]).encode()
    want = read_capture(_write(tmp_path / "a.json", closed))
    for block in (1, 9, 1 << 20):
        got = read_capture(_write(tmp_path / "b.json", closed[:-1] + b"\n"), chunk_bytes=block)
        assert canon(got) == canon(want)


# --------------------------------------------------------------------------- random traces
_TRICKY = st.sampled_from(["]", "},", "}, {", "\"", "\\", "],", "\"traceEvents\": [",
                           "\n", "\u00b5", "\U0001f600", "\ud800", "{", "\\u0041"])
TEXT = st.one_of(st.text(max_size=12), _TRICKY,
                 st.lists(_TRICKY, max_size=4).map("".join))
NUMBER = st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                   st.integers(-2**70, 2**70), st.floats(0, 1e7))
VALUE = st.recursive(st.one_of(st.none(), st.booleans(), NUMBER, TEXT),
                     lambda inner: st.one_of(st.lists(inner, max_size=3),
                                             st.dictionaries(TEXT, inner, max_size=3)),
                     max_leaves=6)
CATS = ["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cuda_sync",
        "user_annotation", "cpu_op", "overhead", "mtia_ccp_events", "python_function", None]
ARGS = st.fixed_dictionaries({}, optional={
    "stream": st.one_of(st.integers(0, 30), VALUE), "device": st.integers(0, 3),
    "correlation": st.one_of(st.integers(0, 10**6), VALUE), "name": TEXT,
    "grid": st.one_of(st.lists(st.integers(1, 1024), min_size=3, max_size=3), VALUE),
    "block": st.lists(st.integers(1, 1024), min_size=3, max_size=3),
    "bytes": st.one_of(st.integers(0, 10**9), VALUE), "cuda_sync_kind": TEXT,
    "wait_on_stream": st.integers(-1, 30), "wait_on_cuda_event_id": st.integers(0, 99),
    "wait_on_cuda_event_record_corr_id": st.integers(-1, 10**6), "extra": VALUE})


@st.composite
def event(draw):
    ph = draw(st.one_of(st.sampled_from(["X", "X", "X", "B", "E", "M", "i", "s", "f"]), VALUE))
    fields = {"ph": ph, "cat": draw(st.one_of(st.sampled_from(CATS), st.sampled_from(CATS),
                                              VALUE)),
              "name": draw(st.one_of(TEXT, st.sampled_from(
                  ["cudaLaunchKernel", "cudaEventRecord", "ProfilerStep#3", "thread_name",
                   "process_name", "Stream Wait Event"]))),
              "pid": draw(st.one_of(st.integers(0, 3), TEXT)),
              "tid": draw(st.one_of(st.integers(0, 30), TEXT)),
              "ts": draw(st.one_of(st.floats(0, 1e7), st.integers(0, 10**7), VALUE)),
              "dur": draw(st.one_of(st.floats(-1, 1e4), st.integers(0, 10**4), VALUE)),
              "args": draw(st.one_of(ARGS, VALUE))}
    keep = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, min_size=3))
    out = {k: fields[k] for k in keep}  # any order: args not always last
    out.update(draw(st.dictionaries(TEXT, VALUE, max_size=2)))
    return out


@st.composite
def trace(draw):
    """A random trace's JSON text (bytes, before any gzip)."""
    events = draw(st.lists(st.one_of(event(), event(), event(), VALUE), max_size=12))
    if draw(st.booleans()) and draw(st.booleans()):
        doc = events  # Chrome's JSON Array Format
    else:
        before = draw(st.dictionaries(TEXT, VALUE, max_size=3))
        after = draw(st.dictionaries(TEXT, VALUE, max_size=3))
        meta = draw(st.fixed_dictionaries({}, optional={
            "deviceProperties": st.lists(st.fixed_dictionaries({"id": st.integers(0, 3)},
                                                               optional={"name": TEXT})),
            "distributedInfo": st.fixed_dictionaries({"rank": st.integers(0, 7)}),
            "baseTimeNanoseconds": st.integers(0, 2**62), "displayTimeUnit": TEXT}))
        where = draw(st.sampled_from(["before", "after"]))
        (before if where == "before" else after).update(meta)
        before.pop("traceEvents", None)
        after.pop("traceEvents", None)
        doc = {**before, "traceEvents": events, **after}
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()),
                      indent=draw(st.sampled_from([None, 0, 1, "\t", " \r\n"])),
                      separators=draw(st.sampled_from([None, (",", ":"), (" , ", " : ")])))
    raw = text.encode("utf-8", "surrogatepass")
    pad = draw(st.sampled_from([b"", b" ", b"\n\t\r "]))
    bom = b"\xef\xbb\xbf" if draw(st.integers(0, 9)) == 0 else b""
    return bom + pad + raw + pad


BLOCK = st.one_of(st.integers(1, 64), st.integers(65, 4096), st.just(8 << 20))


@settings(max_examples=80, **SETTINGS)
@given(raw=trace(), block=BLOCK, gz=st.booleans())
def test_random_traces_read_as_json_load_reads_them(tmp_path_factory, raw, block, gz):
    check(tmp_path_factory.mktemp("t"), raw, block, gz)


@settings(max_examples=80, **SETTINGS)
@given(raw=trace(), block=BLOCK, data=st.data())
def test_random_damage_is_refused_as_json_load_refuses_it(tmp_path_factory, raw, block, data):
    at = data.draw(st.integers(0, max(0, len(raw) - 1)))
    how = data.draw(st.sampled_from(["cut", "byte", "drop"]))
    if how == "cut":
        raw = raw[:at]
    elif how == "byte":
        raw = raw[:at] + data.draw(st.binary(min_size=1, max_size=2)) + raw[at:]
    else:
        raw = raw[:at] + raw[at + 1:]
    body = raw.rstrip(b" \t\r\n")
    if raw.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[") and not body.endswith(b"]") \
            and not _refused(body + b"]"):
        return  # Chrome's format may omit the closing bracket: read on purpose
    check(tmp_path_factory.mktemp("t"), raw, block)
