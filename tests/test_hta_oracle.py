"""HolisticTraceAnalysis is the oracle for simwar's idle and temporal breakdowns.

HTA 0.5.0 (the ``holistictraceanalysis`` dev extra) runs, with
``HTA_DISABLE_NS_ROUNDING=1`` (its default ns→µs rounding gives sub-µs kernels zero or
negative length) and ``include_last_profiler_step=True`` (by default HTA drops the last
``ProfilerStep``), on every project capture:

- the four real engine captures of ``tests/data/real`` (SGLang and vLLM on an MI300X, CUDA
  graphs FULL and PIECEWISE, one graph launch fanning out to 544 kernels);
- the seven H200 captures of the server harness (``tests/data/server``);
- the three H200 harness replays (``tests/data/kineto``), the probe's four captures
  (``tests/data/probe``, PyTorch 2.11), every ``*.kineto.json.gz`` under
  ``tests/data/threads`` (multi-threaded, multi-stream H200 captures of
  ``simwar.harness.threads``: kernels launched by the main thread, autograd's backward
  thread and a worker thread);
- synthetic multi-threaded captures: simulated runs written with some phases launched
  from other threads (``simwar.capture.synthetic.as_captured``), with the record ids
  named and as PyTorch 2.11 writes them (-1: ``simwar.capture.synthetic.Style``).

simwar imports each capture whole and must give HTA's numbers per stream and category
within max(1 µs, 0.5 %), the same op count per stream, and HTA's temporal breakdown
within the same tolerance on the capture without the events HTA pools that are not
device work. The definitions, and each place they differ, are in
simwar/analysis/idle.py.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from simwar.analysis.idle import idle_breakdown, temporal_breakdown
from simwar.capture.synthetic import Style
from simwar.capture.to_trace import import_kineto
from simwar.core.trace import OpKind

DATA = Path(__file__).parent / "data"
CAPTURES = (sorted((DATA / "kineto").glob("*.kineto.json.gz"))
            + sorted((DATA / "probe").glob("*.kineto.json.gz")))
#: real engine captures with CUDA graphs (one launch fanning out to many kernels) and eager
REAL = sorted((DATA / "real").glob("*.json.gz"))
#: the server harness's H200 captures (SGLang-style loop, three streams each)
SERVER = sorted((DATA / "server").glob("*.kineto.json.gz"))
THREADS = sorted((DATA / "threads").glob("*.kineto.json.gz"))
#: synthetic captures: (name, simulator overrides, write_kineto options)
SYNTHETIC = {
    "threads-fine": ({"policy.barrier": "fine"}, {"launch_threads": {"verify": 5555}}),
    "threads-coarse-211": ({"policy.barrier": "coarse", "phases.draft.graph": "eager"},
                           {"launch_threads": {"draft": 5555, "result": 6666},
                            "style": Style(record_ids=False, fresh_events=("copy_done",),
                                           copies=("result_copy",))}),
}
# HTA 0.5.0 uses pandas keywords that pandas 3 deprecates; that is HTA's business
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning",
                                        "ignore::FutureWarning",
                                        "ignore:.*inplace.*:Warning", "ignore::UserWarning")


def close(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= max(1.0, 0.005 * abs(theirs))


@pytest.fixture(scope="module")
def hta():
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"  # read when HTA parses a trace
    pytest.importorskip("psutil")  # HTA imports it without declaring it
    from hta.trace_analysis import TraceAnalysis

    def run(path: Path, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / ("rank0.json.gz" if path.suffix == ".gz" else "rank0.json"))
        with contextlib.redirect_stdout(io.StringIO()):
            analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
            idle = analysis.get_idle_time_breakdown(visualize=False)
            temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        idle = idle[0] if isinstance(idle, tuple) else idle  # (breakdown, stats or None)
        t = analysis.t
        df = t.get_trace(0)
        sym = t.symbol_table.get_sym_id_map()
        cats = [sym[c] for c in ("kernel", "gpu_memcpy", "gpu_memset") if c in sym]
        k = df[df["stream"].ne(-1) & df["cat"].isin(cats)]
        counts = {int(s): int(n) for s, n in k.groupby("stream").size().items()}
        return idle, temporal, counts

    return run


def _synthetic(name: str, folder: Path) -> Path:
    from simwar.api import simulate
    from simwar.capture.synthetic import write_kineto

    overrides, captured = SYNTHETIC[name]
    sim = simulate(None, {"steps": 24, "warmup_steps": 2, **overrides}, engine="simpy")
    return write_kineto(sim.trace, folder / f"{name}.json", **captured)


def _all_captures():
    return [pytest.param(("file", p), id=p.name.removesuffix(".kineto.json.gz"))
            for p in CAPTURES + THREADS + REAL + SERVER] + \
        [pytest.param(("synthetic", n), id=n) for n in SYNTHETIC]


@pytest.fixture(scope="module", params=_all_captures())
def capture(request, hta, tmp_path_factory):
    kind, what = request.param
    folder = tmp_path_factory.mktemp("hta")
    path = what if kind == "file" else _synthetic(what, folder)
    idle, temporal, counts = hta(path, folder / "hta")
    # the whole capture as one step, as HTA reads it (it keeps what the steps launched and
    # what came before them; nothing is launched after the last step in these captures)
    imp = import_kineto(path, {"steps": "(?!)"})
    return path, idle, temporal, counts, imp


def _stream_lane(imp) -> dict[int, str]:
    return {int(v.split(":")[-1]): lane for lane, v in imp.trace.meta["lanes"].items()}


def test_idle_breakdown_equals_hta_per_stream(capture):
    path, hta_idle, _, _, imp = capture
    ours = idle_breakdown(imp.trace)
    lane_of = _stream_lane(imp)
    theirs: dict[str, dict[str, float]] = {}
    for row in hta_idle.itertuples():
        theirs.setdefault(lane_of[int(row.stream)], {})[row.idle_category] = row.idle_time
    assert set(ours) == set(theirs), path.name
    for lane, cats in theirs.items():
        mine = ours[lane]
        other = mine["dependency_us"] + mine["other_us"]
        assert close(mine["host_wait_us"], cats.get("host_wait", 0.0)), (path.name, lane, mine,
                                                                         cats)
        assert close(mine["kernel_wait_us"], cats.get("kernel_wait", 0.0)), (path.name, lane,
                                                                             mine, cats)
        assert close(other, cats.get("other", 0.0)), (path.name, lane, mine, cats)
        assert close(mine["idle_us"], sum(cats.values())), (path.name, lane, mine, cats)


def test_op_counts_per_stream_equal_hta(capture):
    path, _, _, counts, imp = capture
    t = imp.trace
    kern = t.ops.kind == OpKind.KERNEL
    ours = {t.text(c): int(n) for c, n in zip(*np.unique(t.ops.lane[kern], return_counts=True))}
    lane_of = _stream_lane(imp)
    assert ours == {lane_of[s]: n for s, n in counts.items()}, path.name


def test_kernels_are_tied_to_launches_on_every_thread(capture):
    path, _, _, _, imp = capture
    t = imp.trace
    kern = np.flatnonzero(t.ops.kind == OpKind.KERNEL)
    assert (t.ops.call[kern] >= 0).all(), path.name  # every launch is in these captures
    lanes = set(t.spans.decoded("lane")[t.ops.call[kern]].tolist())
    threads = imp.primary.launch_threads
    assert len(lanes) == len(threads), (path.name, lanes, threads)
    if path.parent == DATA / "threads" and path.name != "backward.kineto.json.gz":
        assert len(threads) >= 2 and any(n == "pt_autograd_0" for n, _, _ in threads)


def test_temporal_breakdown_equals_hta_on_device_work(capture, hta, tmp_path):
    """HTA pools every event with a stream: device work, and also cuda_sync markers and
    cpu_ops carrying ``args.stream``, which are not device work (idle.py says why simwar
    does not). On the capture without those, HTA's temporal breakdown is simwar's."""
    path, _, temporal_all, _, imp = capture
    data = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz"
                      else path.read_bytes())
    kept = [e for e in data["traceEvents"] if e.get("cat") != "cuda_sync"
            and not (e.get("cat") == "cpu_op" and "stream" in (e.get("args") or {}))]
    dropped = len(data["traceEvents"]) - len(kept)
    data["traceEvents"] = kept
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(data))
    _, temporal, _ = hta(clean, tmp_path / "hta")
    ours = temporal_breakdown(imp.trace)
    for key, hta_key in (("span_us", "kernel_time(us)"), ("idle_us", "idle_time(us)"),
                         ("compute_us", "compute_time(us)"),
                         ("non_compute_us", "non_compute_time(us)")):
        assert close(ours[key], float(temporal[hta_key])), (path.name, key, ours, dict(temporal))
    # with the markers pooled, HTA's span can only be as long or longer
    assert float(temporal_all["kernel_time(us)"]) >= ours["span_us"] - 1.0
    if not dropped:
        assert close(ours["span_us"], float(temporal_all["kernel_time(us)"]))


def test_the_threads_folder_is_picked_up():
    # the H200 captures of python -m simwar.harness.threads are committed: never skipped
    assert THREADS
    assert {p.name for p in THREADS} >= {"backward.kineto.json.gz", "all.kineto.json.gz"}


def _two_hta_bugs(path: Path) -> Path:
    """A capture on which HTA is wrong twice (simwar/analysis/idle.py says how): kernel k1
    starts 5 µs before k0 ends on the same stream (a negative gap HTA sums into kernel-wait),
    and k2's launch is not in the capture (HTA joins the file's first event, the ``step``
    range at 127 µs, as its launch: after k1's end, so its 5 µs gap becomes host-wait)."""
    t0 = 1_000_000.0

    def ev(cat, name, ts, dur, **args):
        pid, tid = (0, 7) if cat == "kernel" else (100, 100)
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": t0 + ts,
                "dur": dur, "args": args}

    events = [ev("user_annotation", "step", 127, 200),
              *(ev("cuda_runtime", "cudaLaunchKernel", 30 + 10 * c, 3, correlation=c)
                for c in (1, 2, 3)),
              ev("kernel", "k0", 100, 10, device=0, stream=7, correlation=1),
              ev("kernel", "k1", 105, 20, device=0, stream=7, correlation=2),
              ev("kernel", "k2", 130, 5, device=0, stream=7, correlation=99),
              ev("kernel", "k3", 200, 5, device=0, stream=7, correlation=3)]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_htas_number_under_the_hta_rule_where_hta_is_wrong(hta, tmp_path):
    path = _two_hta_bugs(tmp_path / "two_bugs.json")
    idle, _, _ = hta(path, tmp_path / "hta")
    theirs = {row.idle_category: row.idle_time for row in idle.itertuples()}
    t = import_kineto(path, {"steps": "(?!)"}).trace
    # simwar: no negative idle time; an op with no launch in the trace is never host-wait
    (ours,) = idle_breakdown(t).values()
    assert (ours["host_wait_us"], ours["kernel_wait_us"], ours["other_us"]) == (0.0, 5.0, 65.0)
    assert (theirs.get("host_wait"), theirs.get("kernel_wait"), theirs.get("other")) == \
        (5.0, -5.0, 65.0)
    # HTA's rule: its gaps, and the first event's start (on the trace's clock: k0 is
    # op 0 at 100 µs of the file) as the launch of an op with no launch
    first_event = 127.0 - (100.0 - float(t.ops.start_us[0]))
    (rule,) = idle_breakdown(t, rule="hta", no_launch_us=first_event).values()
    for ours_key, key in (("host_wait_us", "host_wait"), ("kernel_wait_us", "kernel_wait"),
                          ("other_us", "other")):
        assert close(rule[ours_key], theirs[key]), (rule, theirs)
    with pytest.raises(ValueError, match="idle rule 'htaa'"):
        idle_breakdown(t, rule="htaa")
