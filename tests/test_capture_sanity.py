"""Impossible captures import with a counted warning, never with an impossible figure
(:mod:`simwar.capture.sanity`): every event twice, kernels overlapping on one stream, times
in ns instead of µs."""

from __future__ import annotations

import copy
import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from simwar.analysis.metrics import merged, step_frame
from simwar.capture.reader import read_capture
from simwar.capture.records import CaptureEvents, RuntimeCall
from simwar.capture.sanity import check_capture
from simwar.capture.to_trace import import_kineto

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "examples" / "capture.json.gz"
MAPPING = REPO / "examples" / "mapping.yaml"


def _doc() -> dict:
    return json.loads(gzip.decompress(CAPTURE.read_bytes()))


def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    return path


def _twice(doc):
    doc["traceEvents"] = doc["traceEvents"] + copy.deepcopy(doc["traceEvents"])


def _overlapping(doc):
    lanes = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            lanes[e["args"].get("stream")].append(e)
    for kernels in lanes.values():
        kernels.sort(key=lambda e: e["ts"])
        for a, b in zip(kernels[::2], kernels[1::2]):
            b["ts"] = a["ts"] + a["dur"] / 2  # starts while a runs


def _in_ns(doc):
    for e in doc["traceEvents"]:
        for key in ("ts", "dur"):
            if key in e:
                e[key] = e[key] * 1000


@pytest.mark.parametrize("mutate, warning", [
    (_twice, "appear more than once"),
    (_overlapping, "start before the previous op on their stream ends"),
    (_in_ns, "look like ns, not the µs Kineto writes"),
])
def test_an_impossible_capture_is_warned_and_no_idle_is_negative(tmp_path, mutate, warning):
    doc = _doc()
    mutate(doc)
    imp = import_kineto(_write(tmp_path, doc), MAPPING)
    assert sum(warning in w for w in imp.warnings) == 1, imp.warnings
    df = step_frame(imp.trace)
    for column in ("gpu_idle_us", "gpu_idle_dep_us", "gpu_idle_host_us", "gpu_busy_us"):
        assert (df[column].dropna() >= 0).all(), column


def test_a_capture_recorded_twice_reads_as_once(tmp_path):
    once = import_kineto(CAPTURE, MAPPING)
    doc = _doc()
    _twice(doc)
    twice = import_kineto(_write(tmp_path, doc), MAPPING)
    a, b = step_frame(once.trace), step_frame(twice.trace)
    assert a.equals(b)


def test_a_real_capture_has_no_sanity_warning():
    imp = import_kineto(CAPTURE, MAPPING)
    assert not [w for w in imp.warnings if "more than once" in w or "previous op" in w
                or "look like ns" in w]


def test_merged_keeps_disjoint_intervals_and_unions_overlapping_ones():
    s, e = np.array([0.0, 10.0, 30.0]), np.array([5.0, 20.0, 40.0])
    assert merged(s, e)[0] is s and merged(s, e)[1] is e
    ms, me = merged(np.array([0.0, 2.0, 30.0, 31.0]), np.array([5.0, 8.0, 40.0, 35.0]))
    assert ms.tolist() == [0.0, 30.0] and me.tolist() == [8.0, 40.0]


def test_the_checks_answer_the_same_from_the_readers_columns_or_the_records(tmp_path):
    doc = _doc()
    _overlapping(doc)
    path = _write(tmp_path, doc)
    with_columns, from_records = read_capture(path), read_capture(path)
    assert with_columns.columns
    from_records.columns = None
    warned = check_capture(with_columns)[1]
    assert any("start before the previous op" in w for w in warned)
    assert check_capture(from_records)[1] == warned


def test_the_readers_columns_serve_only_the_list_they_were_taken_of(tmp_path):
    """Another list of as many records (a capture's lists replaced after reading) is checked
    by its own values, not by the columns of the list it replaced."""
    doc = _doc()
    clean = read_capture(_write(tmp_path, doc))
    _overlapping(doc)
    overlapping = read_capture(_write(tmp_path, doc))
    assert len(overlapping.device_events) == len(clean.device_events)
    overlapping.device_events = list(clean.device_events)  # same length, other records
    assert not [w for w in check_capture(overlapping)[1] if "previous op" in w]
    stale = read_capture(_write(tmp_path, doc))
    stale.device_events = list(stale.device_events)  # the same records, another list
    assert stale.columns["device_events"].fit(stale.device_events) is False
    assert any("previous op" in w for w in check_capture(stale)[1])


def test_correlation_ids_beyond_int64_are_grouped_and_those_below_0_left_out():
    big = 2 ** 70
    calls = [RuntimeCall("cudaLaunchKernel", 1, 1, float(ts), 1.0, correlation)
             for ts, correlation in enumerate((big, big, -big, -big, -1, -1, 5, 6))]
    for reordered in (calls, calls[::-1]):
        warned = check_capture(CaptureEvents(runtime_calls=list(reordered)))[1]
        assert [w.split(" runtime calls share")[0] for w in warned if "share" in w] == ["2"]
