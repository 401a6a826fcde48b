"""HolisticTraceAnalysis is the oracle for simwar's idle and temporal breakdowns.

HTA 0.5.0 (the ``holistictraceanalysis`` dev extra) runs on the project's three
H200 captures, with ``HTA_DISABLE_NS_ROUNDING=1`` (its default ns→µs rounding
gives sub-µs kernels zero or negative length). simwar imports the same capture
as one whole trace (HTA looks at all of it) and must give HTA's numbers per
stream and category within max(1 µs, 0.5 %), the same op count per stream, and
HTA's temporal breakdown within the same tolerance. The definitions, and the one
place they differ (overlapping ops on a stream), are in simwar/analysis/idle.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from simwar.analysis.idle import idle_breakdown, temporal_breakdown
from simwar.capture.to_trace import import_kineto

DATA = Path(__file__).parent / "data" / "kineto"
CAPTURES = ("dspark-fine-gpu", "dspark-none-gpu", "eagle-coarse-cpu")
# HTA 0.5.0 uses pandas keywords that pandas 3 deprecates; that is HTA's business
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning",
                                        "ignore::FutureWarning",
                                        "ignore:.*inplace.*:Warning")


def close(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= max(1.0, 0.005 * abs(theirs))


@pytest.fixture(scope="module")
def hta():
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # read when HTA parses a trace
    pytest.importorskip("psutil")  # HTA imports it without declaring it
    from hta.trace_analysis import TraceAnalysis

    return TraceAnalysis


@pytest.fixture(scope="module", params=CAPTURES)
def capture(request, hta, tmp_path_factory):
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    shutil.copy(DATA / f"{name}.kineto.json.gz", folder / "rank0.json.gz")
    analysis = hta(trace_dir=str(folder))
    idle = analysis.get_idle_time_breakdown(visualize=False)
    idle = idle[0] if isinstance(idle, tuple) else idle  # (breakdown, interval stats or None)
    temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
    trace = import_kineto(DATA / f"{name}.kineto.json.gz").trace  # whole capture: one step
    return name, idle, temporal, trace


def test_idle_breakdown_equals_hta_per_stream(capture):
    name, hta_idle, _, trace = capture
    ours = idle_breakdown(trace)
    theirs: dict[str, dict[str, float]] = {}
    for row in hta_idle.itertuples():
        theirs.setdefault(f"stream{int(row.stream)}", {})[row.idle_category] = row.idle_time
    assert set(ours) == set(theirs), name
    for lane, cats in theirs.items():
        mine = ours[lane]
        other = mine["dependency_us"] + mine["other_us"]
        assert close(mine["host_wait_us"], cats.get("host_wait", 0.0)), (name, lane, mine, cats)
        assert close(mine["kernel_wait_us"], cats.get("kernel_wait", 0.0)), (name, lane, mine, cats)
        assert close(other, cats.get("other", 0.0)), (name, lane, mine, cats)
        assert close(mine["idle_us"], sum(cats.values())), (name, lane, mine, cats)


def test_op_counts_per_stream_equal_hta(capture, hta):
    name, _, _, trace = capture
    import numpy as np

    from simwar.core.trace import OpKind

    ops = trace.ops
    kern = ops.kind == OpKind.KERNEL
    ours = {trace.text(c): int(n) for c, n in zip(*np.unique(ops.lane[kern], return_counts=True))}
    # HTA's own per-stream op count: its kernel-like events with a stream
    theirs = _hta_counts(hta, name)
    assert ours == theirs


def _hta_counts(hta, name: str) -> dict[str, int]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(DATA / f"{name}.kineto.json.gz", Path(d) / "rank0.json.gz")
        t = hta(trace_dir=d).t
        df = t.get_trace(0)
        sym = t.symbol_table.get_sym_id_map()
        cats = [sym[c] for c in ("kernel", "gpu_memcpy", "gpu_memset") if c in sym]
        k = df[df["stream"].ne(-1) & df["cat"].isin(cats)]
        return {f"stream{int(s)}": int(n) for s, n in k.groupby("stream").size().items()}


def test_temporal_breakdown_equals_hta(capture):
    name, _, temporal, trace = capture
    ours = temporal_breakdown(trace)
    for key, hta_key in (("span_us", "kernel_time(us)"), ("idle_us", "idle_time(us)"),
                         ("compute_us", "compute_time(us)")):
        assert close(ours[key], float(temporal[hta_key])), (name, key, ours, dict(temporal))
    # the shares, as HTA reports them (percent, 2 decimals). Non-compute µs is the residual
    # span - compute - idle, where HTA's pooled CUPTI stream-sync markers (which a Trace does
    # not keep as device time) shift a few µs: 89.7 vs 93.8 µs of a 242,740 µs span here
    for key in ("idle", "compute", "non_compute"):
        assert abs(100 * ours[f"{key}_share"] - float(temporal[f"{key}_time_pctg"])) <= 0.011, \
            (name, key, ours, dict(temporal))
