"""The CSAN check on the CPU: the case matrix, per-stream scratch slots, pointer
classification, tallies and the verdict; and, where torch is installed (a CPU build is
enough), CSAN's own event handler driven with the accesses the CUDA backend makes, over the
whole matrix. The replay on a GPU is tests/test_harness_csan_gpu.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simwar.core.program import (
    GraphLaunch,
    GraphRecord,
    Kernel,
    Launch,
    Program,
    Record,
    StepMarker,
    WaitEvent,
)
from simwar.harness import make_plan
from simwar.harness.csan import (
    INTERNAL,
    SHARED,
    UNKNOWN,
    PointerMap,
    Region,
    format_table,
    harness_regions,
    tally,
    verdict,
)
from simwar.harness.fake import FakeBackend
from simwar.harness.plan import KernelStep
from simwar.harness.replay import replay

B, S = 0x10000, 0x200000  # fake base pointers of the buffer and snapshot arrays


@pytest.fixture(scope="module")
def matrix():
    from simwar.harness import suite

    return {name: suite.csan_program(name, ov) for name, ov in suite.csan_cases().items()}


def _plain_program() -> Program:
    ops = [StepMarker(0), Launch("a", Kernel("w", 1.0, writes=("x",)), 0),
           Launch("a", Kernel("pa", 1.0), 0), Launch("b", Kernel("pb", 1.0), 0),
           Record("e", "a", 0), WaitEvent("b", "e", 0),
           Launch("b", Kernel("r", 1.0, reads=("x", "y")), 0),
           GraphLaunch("b", "g", (Kernel("gw", 1.0, writes=("y",)), GraphRecord("n"),
                                  Kernel("gr", 1.0, reads=("x",))), 0)]
    return Program(ops, streams=("a", "b"))


# --------------------------------------------------------------------------- the matrix
def test_case_matrix_is_all_eager_with_simwars_verdict(matrix):
    from simwar.config.algorithms import BUILTIN
    from simwar.harness.suite import BARRIERS, CSAN_STEPS, CSAN_WARMUP

    for algorithm in BUILTIN:
        for barrier in BARRIERS:
            assert f"{algorithm}-{barrier}-eager" in matrix
    for name, program in matrix.items():
        assert not any(type(op) is GraphLaunch for op in program.ops), name
        assert program.steps() == CSAN_STEPS + 1  # the drain is a step of its own
        assert program.meta["warmup_steps"] == CSAN_WARMUP
        latent = program.meta["latent_races"]
        assert (latent > 0) == (program.meta["latent_race_buffers"] == ["req_to_token"])
        # the JSON the GPU machine reads carries the verdict
        assert Program.from_json(program.to_json()).meta["latent_races"] == latent
    racy = {n for n, p in matrix.items() if p.meta["latent_races"]}
    safe = set(matrix) - racy
    assert {n for n in matrix if n.split("-")[1] == "none"} <= racy
    assert {f"{a}-{b}-eager" for a in BUILTIN for b in ("coarse", "fine", "host_sync")} <= safe
    for unsafe in ("pre-replay", "publish-verify", "loop-top"):
        assert any(unsafe in n for n in racy)
    assert "dspark-fine-eager-planstream" in safe and "dspark-none-eager-planstream" in racy


def test_write_csan_programs_and_cli(tmp_path):
    from simwar.cli.app import main
    from simwar.harness import suite

    names = ["dspark-none-eager", "dspark-fine-eager"]
    paths = suite.write_csan_programs(tmp_path / "a", names)
    assert [p.name for p in paths] == [f"{n}.json" for n in names]
    meta = Program.from_json(paths[0].read_text()).meta
    assert meta["latent_races"] > 0 and meta["name"] == "dspark-none-eager"
    assert main(["harness", "--csan", "-o", str(tmp_path / "b")]) == 0
    assert len(list((tmp_path / "b").glob("*.json"))) == len(suite.csan_cases())


# --------------------------------------------------------------------------- layout
def test_scratch_slots_are_per_stream_and_clear_of_everything_else():
    plan = make_plan(_plain_program())
    assert set(plan.streams) >= {"a", "b"}
    bufs = [plan.scratch_buffer(s) for s in plan.streams]
    slots = [plan.scratch_slot(s) for s in plan.streams]
    assert len(set(bufs)) == len(set(slots)) == len(plan.streams)
    assert min(bufs) == len(plan.buffers) and max(bufs) == plan.buffer_slots - 1
    assert min(slots) == plan.snapshot_slots and max(slots) == plan.snap_slots - 1
    assert all(r.slot < plan.snapshot_slots for r in plan.reads)


def test_pointer_classification_with_fake_pointers():
    plan = make_plan(_plain_program())
    assert plan.buffers == ("x", "y")
    regions = harness_regions(plan, B, S, stamp_ptrs=[0x900000],
                              counter_ptrs={"g": 0x910000})
    pmap = PointerMap(regions)
    assert pmap.classify(B) == (SHARED, "x")
    assert pmap.classify(B + 8) == (SHARED, "y")
    assert pmap.classify(B + 3) == (SHARED, "x")  # inside the slot
    assert pmap.classify(B + 8 * plan.scratch_buffer("b")) == (INTERNAL, "scratch[b]")
    assert pmap.classify(S + 8 * plan.scratch_slot("a")) == (INTERNAL, "scratch_snap[a]")
    eager = next(st for st in plan.steps if type(st) is KernelStep and st.reads)
    assert pmap.classify(S + 8 * eager.reads[1].slot) == (INTERNAL, "snapshot[y]")
    graph_read = next(r for r in plan.reads if r.node >= 0)
    assert pmap.classify(S + 8 * graph_read.slot) == (INTERNAL, "snapshot[x]")
    assert pmap.classify(0x900000) == (INTERNAL, "stamps[0]")
    assert pmap.classify(0x910000) == (INTERNAL, "counter[g]")
    assert pmap.classify(B - 8)[0] == UNKNOWN
    assert pmap.classify(S + 8 * plan.snap_slots)[0] == UNKNOWN
    assert pmap.classify(0x910008) == (UNKNOWN, hex(0x910008))
    with pytest.raises(ValueError, match="overlap"):
        PointerMap([Region(0, 16, SHARED, "a"), Region(8, 8, INTERNAL, "b")])


def test_tally_verdict_and_table():
    reports = [{"step": 1, "kind": SHARED, "name": "x"}, {"step": 5, "kind": SHARED, "name": "x"},
               {"step": 6, "kind": INTERNAL, "name": "scratch_snap[a]"}]
    counts = tally(reports, warmup=4)
    assert counts["all"][SHARED] == {"x": 2} and counts["after_warmup"][SHARED] == {"x": 1}
    assert counts["all"][INTERNAL] == {"scratch_snap[a]": 1}
    assert verdict(3, counts) == {"csan_shared": 1, "csan_internal": 1, "agree": False}
    clean = tally(reports[:2], warmup=4)
    assert verdict(3, clean)["agree"] is True and verdict(0, clean)["agree"] is False
    assert verdict(0, tally(reports[:1], warmup=4))["agree"] is True  # only in warm-up
    assert verdict(None, clean)["agree"] is None and verdict(3, clean, 2)["agree"] is None
    table = format_table({"c": dict(latent_races=3, graph_launches=0, **verdict(3, counts))})
    lines = table.splitlines()
    assert lines[0].split(" | ") == ["case", "simwar latent races", "CSAN shared",
                                     "CSAN internal", "agree"]
    assert [c.strip() for c in lines[2].split("|")] == ["c", "3", "1", "1", "NO"]


def test_csan_module_imports_without_torch_or_simwar_dependencies():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch','simpy','pydantic','pandas','yaml'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import simwar.harness.csan\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# --------------------------------------------------------------------------- CSAN's handler
class CsanModelBackend(FakeBackend):
    """The fake backend, also telling CSAN's event handler what the CUDA backend launches.

    Each kernel makes the operators ``CudaBackend.kernel`` makes (``fill_`` of each written
    buffer slot, ``copy_`` of each read slot into its snapshot slot, and in uniform mode the
    stream's scratch copy), with fake pointers; records, waits, ``wait_stream`` (a fresh
    event) and synchronizes are the handler's event calls. Graph replays are invisible to
    CSAN, as on the GPU.
    """

    def __init__(self, collector, **kw):
        super().__init__(**kw)
        self.collector = collector

    def setup(self, plan):
        super().setup(plan)
        self.sid = {s: 1000 + i for i, s in enumerate(plan.streams)}
        self.eid: dict = {}
        self.stream_names = {v: k for k, v in self.sid.items()}
        self.pointer_map = PointerMap(harness_regions(plan, B, S))
        self.collector.begin(enter_mode=False)

    def _event_id(self, key) -> int:
        return self.eid.setdefault(key, 5000 + len(self.eid))

    def _launch(self, stream, reads, writes, op):
        ptrs = set(reads) | set(writes)
        self.collector.handler._handle_kernel_launch(
            self.sid[stream], set(reads) - set(writes), set(writes), set(), op,
            {p: [] for p in ptrs})

    def kernel(self, step):
        plan = self.plan
        for w in step.writes:
            self._launch(step.stream, (), (B + 8 * w.buffer,), "aten::fill_.Scalar")
        for r in step.reads:
            self._launch(step.stream, (B + 8 * r.buffer,), (S + 8 * r.slot,), "aten::copy_")
        if not (step.writes or step.reads):
            self._launch(step.stream, (B + 8 * plan.scratch_buffer(step.stream),),
                         (S + 8 * plan.scratch_slot(step.stream),), "aten::copy_")
        return super().kernel(step)

    def record(self, event, stream):
        self.collector.handler._handle_event_record(self._event_id(("host", event)),
                                                    self.sid[stream])
        super().record(event, stream)

    def wait_event(self, stream, key):
        if key is not None:
            self.collector.handler._handle_event_wait(self._event_id(key), self.sid[stream])
        super().wait_event(stream, key)

    def wait_stream(self, stream, other):
        h = self.collector.handler
        fresh = 9000 + len(self.eid)
        self.eid[("fresh", fresh)] = fresh
        h._handle_event_creation(fresh)
        h._handle_event_record(fresh, self.sid[other])
        h._handle_event_wait(fresh, self.sid[stream])
        super().wait_stream(stream, other)

    def synchronize(self, key):
        if key is not None:
            self.collector.handler._handle_event_synchronization(self._event_id(key))
        super().synchronize(key)


@pytest.fixture(scope="module")
def collector():
    pytest.importorskip("torch")
    from simwar.harness.csan import CsanCollector

    return CsanCollector()


def _model_run(program, collector):
    from simwar.harness.csan import describe

    backend = CsanModelBackend(collector)
    replay(make_plan(program), backend, step_hook=collector.set_step)
    collector.end()
    return [describe(step, e, backend.pointer_map, backend.stream_names)
            for step, e in collector.raw]


def test_collector_collects_every_error_instead_of_raising(collector):
    ops = [StepMarker(0), Launch("a", Kernel("r", 1.0, reads=("x",)), 0),
           StepMarker(1), Launch("b", Kernel("w1", 1.0, writes=("x",)), 1),
           Launch("b", Kernel("w2", 1.0, writes=("x",)), 1),
           StepMarker(2), Launch("a", Kernel("r2", 1.0, reads=("x",)), 2)]
    reports = _model_run(Program(ops, streams=("a", "b")), collector)
    # w1 after r (WAR), and r2 after w2 (RAW): both reported, no exception
    assert [(r["step"], r["kind"], r["name"], r["current"]["access"], r["previous"]["access"])
            for r in reports] == [(1, SHARED, "x", "write", "read"),
                                  (2, SHARED, "x", "read", "write")]
    assert reports[0]["current"]["stream"] == "b" and reports[0]["previous"]["stream"] == "a"
    # a second run starts from a clean state
    assert _model_run(Program(ops[:2], streams=("a", "b")), collector) == []


def test_csan_handler_agrees_with_simwar_on_the_matrix(matrix, collector):
    """CSAN's own happens-before logic, fed the CUDA backend's operators, reports a shared
    buffer iff simwar has latent races, and never the harness's own tensors."""
    from simwar.harness.csan import sanitize

    for name, program in matrix.items():
        r = sanitize(program, None, collector, backend=CsanModelBackend(collector))
        counts = r["csan"]
        assert r["agree"] is True, (name, program.meta["latent_races"], counts)
        assert r["csan_internal"] == 0 and not collector.active
        if program.meta["latent_races"]:
            assert set(counts["after_warmup"][SHARED]) == set(
                program.meta["latent_race_buffers"])
            assert r["examples"][0]["current"]["op"].startswith("aten::")


def test_shared_scratch_slot_would_be_reported(collector):
    """The check has teeth: one scratch snapshot slot for every stream is a CSAN race."""
    ops = [StepMarker(0), Launch("a", Kernel("pa", 1.0), 0), Launch("b", Kernel("pb", 1.0), 0)]
    program = Program(ops, streams=("a", "b"))

    class OneScratch(CsanModelBackend):
        def kernel(self, step):
            self._launch(step.stream, (B + 8 * len(self.plan.buffers),),
                         (S + 8 * self.plan.snapshot_slots,), "aten::copy_")
            return FakeBackend.kernel(self, step)

    from simwar.harness.csan import describe

    backend = OneScratch(collector)
    replay(make_plan(program), backend, step_hook=collector.set_step)
    collector.end()
    reports = [describe(s, e, backend.pointer_map, backend.stream_names)
               for s, e in collector.raw]
    assert [(r["kind"], r["name"]) for r in reports] == [(INTERNAL, "scratch_snap[a]")]
    assert _model_run(program, collector) == []


def test_csan_handler_agrees_with_simwar_on_random_eager_programs(collector):
    """On random all-eager programs (tests/programs.py), CSAN's logic fed the CUDA backend's
    operators reports a shared buffer iff simwar finds a latent race (any step distance),
    on the same buffers, and never the harness's own tensors."""
    from hypothesis import given, settings
    from programs import programs

    from simwar.analysis.hazards import detect
    from simwar.executors.engine import run
    from simwar.harness.csan import sanitize

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(programs(graphs=False))
    def check(program):
        r = sanitize(program, None, collector, backend=CsanModelBackend(collector))
        latent = {x.buffer for x in detect(run(program), window=10**6).latent}
        assert set(r["csan"]["all"][SHARED]) == latent
        assert r["csan_internal"] == 0

    check()
