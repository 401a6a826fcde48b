"""The profiler's own host cost, taken out of a capture's host times by its event counts.

A simulated run written as a capture marked profiled (``write_kineto(..., profiled=True)``)
has known events on its host thread: the fit with a cost table must subtract exactly
count × cost from each host duration it reads, a zero table must give the fit of the
capture as it stands bit for bit, and so must ``--keep-profiler-cost``. A capture the
synthetic writer marks unprofiled (its default) has nothing subtracted. On the mini-server's
committed sweep, the subtraction must bring the fitted host time toward the un-profiled
run's (``docs/profiler-cost.md``), and ``--check`` must add the cost back to the fitted
(unprofiled) config before comparing it with the profiled capture.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from simwar.api import simulate
from simwar.capture.mapping import load_mapping
from simwar.capture.open import open_capture
from simwar.capture.synthetic import SGLANG_CPU_MAPPING, Style, write_kineto
from simwar.cli.app import main
from simwar.fit.from_capture import fit_model
from simwar.fit.layout import regions, step_layouts
from simwar.fit.policy import detect_roles
from simwar.fit.profiler import left_out_steps
from simwar.fit.profiler_cost import DATA, CostTable, ProfilerCost, for_capture, load_table
from simwar.fit.samples import Samples, sample_device_and_costs

ROOT = Path(__file__).resolve().parents[1]
FINE = ROOT / "configs" / "dspark_fine.yaml"
SERVER = ROOT / "tests" / "data" / "server"


def mapping_for(sim) -> dict:
    table = sim.config.phase_table()
    return {"streams": {7: "forward", 13: "schedule", 20: "copy"},
            "phases": {rf"^{p.name}\.": p.name for p in table}, "run_batch": "^run_batch$",
            "warmup_steps": 5, "cpu": dict(SGLANG_CPU_MAPPING),
            "reads": {p.name: list(p.reads) for p in table if p.reads},
            "sites": {"^result_copy$": "result_copy"}}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A profiled-looking capture of dspark fine and one the writer marks unprofiled."""
    tmp = tmp_path_factory.mktemp("profcost")
    sim = simulate(FINE, {"steps": 40, "warmup_steps": 5})
    mapping = mapping_for(sim)
    prof = open_capture(write_kineto(sim.trace, tmp / "prof.json.gz", profiled=True),
                        load_mapping(mapping))
    plain = open_capture(write_kineto(sim.trace, tmp / "plain.json.gz"), load_mapping(mapping))
    return {"prof": prof, "plain": plain, "mapping": mapping, "tmp": tmp}


def test_counts_and_cost_of_an_interval():
    pc = ProfilerCost({"cpu_op": [1.0, 2.0, 3.0], "kernel": [2.5]},
                      CostTable({"cpu_op": 1.5, "kernel": 0.25, "user_annotation": 9.0}))
    assert pc.counts(1.0, 3.0) == {"cpu_op": 2, "kernel": 1}  # [a, b): 3.0 is out
    assert pc.us(1.0, 3.0) == 2 * 1.5 + 0.25
    assert pc.us(3.0, 1.0) == 0.0
    assert pc.less(10.0, 0.0, 4.0) == 10.0 - (3 * 1.5 + 0.25)
    assert pc.less(2.0, 0.0, 4.0) == 0.0  # never below zero
    assert not pc.zero and ProfilerCost({"cpu_op": [1.0]}, CostTable({})).zero


def test_the_shipped_table_says_where_it_came_from():
    raw = yaml.safe_load(DATA.read_text())
    for key in ("gpu", "torch", "date", "host_speed_us", "repeats", "command"):
        assert raw["source"].get(key), key
    for setting, stack in (("without_stack", False), ("with_stack", True)):
        table = load_table(with_stack=stack)
        assert table.setting == setting and table.us
        assert all(v >= 0 for v in table.us.values())
        assert set(table.us) == set(raw["settings"][setting])
    assert "python_function" in load_table(with_stack=True).us


def test_import_keeps_the_host_threads_events_per_kind(synthetic):
    imp = synthetic["prof"].bound
    ev = imp.profiler_events
    # every host call, every range and every device op (at its call) is counted once; the
    # writer puts one cpu_op in each step (one ProfilerStep range each)
    assert len(ev["cuda_runtime"]) == imp.counts["host_runtime_calls"] == imp.counts["runtime"]
    assert len(ev["user_annotation"]) == len(imp.annotations) == imp.counts["annotation"]
    assert len(ev["kernel"]) == imp.counts["kernel"] > 0
    assert len(ev["cuda_sync"]) == imp.counts["cuda_sync"]
    assert len(ev["cpu_op"]) == sum(1 for a in imp.annotations
                                    if a[0].startswith("ProfilerStep#"))
    assert "python_function" not in ev
    assert all(np.all(np.diff(v) >= 0) for v in ev.values())
    # the writer's own default: a simulation's capture holds no profiler's cost
    assert synthetic["plain"].bound.profiler_events == {}
    assert for_capture(synthetic["plain"].bound).zero


def test_call_costs_lose_exactly_their_own_events(synthetic):
    cap = synthetic["prof"]
    imp = cap.bound
    trace = imp.trace
    roles, _ = detect_roles(trace, cap.mapping)
    lays = {k: v for k, v in step_layouts(trace, roles).items() if k >= 5}
    names = [u.phase for u in next(iter(lays.values())).units]
    runtime, kernel = 0.5, 0.125
    pc = ProfilerCost(imp.profiler_events, CostTable({"cuda_runtime": runtime,
                                                      "kernel": kernel}))
    before, after = Samples(), Samples()
    g0 = sample_device_and_costs(trace, lays, names, cap.mapping, before)
    g1 = sample_device_and_costs(trace, lays, names, cap.mapping, after, pc)
    checked = 0
    for key in before:
        if not key.startswith("costs.") or key in ("costs.sync_wake_us",
                                                    "costs.cross_stream_us"):
            assert before[key] == after[key], key  # device times and latencies: kept
            continue
        # a call is one runtime event (a wait_stream sample: a record and a wait), and a
        # launch's kernel is charged to it
        n = 2 if key == "costs.wait_stream_us" else 1
        k = 1 if key == "costs.launch_us" else 0
        for b, a in zip(before[key], after[key]):
            assert a == pytest.approx(max(0.0, b - n * runtime - k * kernel), abs=1e-9), key
            checked += 1
    assert checked > 0
    # a graph launch: its call and every kernel of the graph, charged at the launch
    for unit, costs in g0["cost"].items():
        for b, a, nodes in zip(costs, g1["cost"][unit], g0["nodes"][unit]):
            assert a == pytest.approx(max(0.0, b - runtime - nodes * kernel), abs=1e-9)


def test_regions_lose_the_ranges_recorded_in_them(synthetic):
    cap = synthetic["prof"]
    imp = cap.bound
    trace = imp.trace
    roles, _ = detect_roles(trace, cap.mapping)
    lays = {k: v for k, v in step_layouts(trace, roles).items() if k >= 5}
    cost = 0.75
    pc = ProfilerCost(imp.profiler_events, CostTable({"user_annotation": cost}))
    spans = trace.spans
    for lay in lays.values():
        before, after = regions(trace, lay), regions(trace, lay, pc)
        syncs = [(float(spans.start_us[s]), float(spans.end_us[s])) for s in lay.syncs
                 if s not in (lay.top_sync, lay.post_sync)]
        # the ranges that start in the step, outside the syncs the regions leave out
        starts = [a for _, a, _ in imp.annotations if lay.start <= a < lay.end
                  and not any(x <= a < y for x, y in syncs)]
        expected = cost * len(starts)
        assert sum(before.values()) - sum(after.values()) == pytest.approx(expected, abs=1e-6)
        assert all(after[r] >= 0 for r in after)


def test_zero_cost_and_keep_give_the_fit_as_before(synthetic):
    cap = synthetic["prof"]
    kept = fit_model(cap, capture="c", profiler_cost=False)
    zero = fit_model(cap, capture="c", profiler_cost=CostTable({k: 0.0 for k in
                                                                 load_table().us}))
    assert zero.config == kept.config
    assert [h for h in zero.header if "rofiler cost" not in h] == \
        [h for h in kept.header if "rofiler cost" not in h]
    default = fit_model(cap, capture="c")
    assert default.config != kept.config  # the shipped table subtracts something here
    line = next(h for h in default.header if h.startswith("Profiler cost subtracted"))
    assert "user_annotation" in line and "µs" in line
    assert any(h.startswith("Profiler cost kept") for h in kept.header)
    # an unprofiled capture: the default subtracts nothing
    plain = synthetic["plain"]
    assert fit_model(plain, capture="c").config == fit_model(plain, capture="c",
                                                             profiler_cost=False).config


def test_cli_keep_profiler_cost(synthetic, tmp_path):
    cap = synthetic["prof"]
    path, mfile = str(cap.paths[0]), tmp_path / "map.yaml"
    mfile.write_text(yaml.safe_dump(synthetic["mapping"]))
    out_keep, out_sub = tmp_path / "keep.yaml", tmp_path / "sub.yaml"
    assert main(["import", path, "--mapping", str(mfile), "--fit", "-o", str(out_keep),
                 "--keep-profiler-cost", "--no-progress"]) == 0
    assert main(["import", path, "--mapping", str(mfile), "--fit", "-o", str(out_sub),
                 "--no-progress"]) == 0
    keep, sub = yaml.safe_load(out_keep.read_text()), yaml.safe_load(out_sub.read_text())
    assert keep == yaml.safe_load(yaml.safe_dump(fit_model(cap, profiler_cost=False).config))
    assert keep != sub
    assert "Profiler cost subtracted" in out_sub.read_text()
    assert main(["import", path, "--keep-profiler-cost", "--no-progress"]) == 2


def test_the_mini_servers_host_time_moves_toward_the_unprofiled_run():
    from lab.check import read_metrics

    cap = open_capture(SERVER / "fit_ramp_profiled.kineto.json.gz", preset="sglang")
    imp = cap.bound
    roles, _ = detect_roles(imp.trace, cap.mapping)
    lays = step_layouts(imp.trace, roles)
    left = left_out_steps(imp, cap.mapping)
    warm = int(imp.trace.meta.get("warmup_steps", 0))
    ks = [k for k in lays if k >= warm and k - 1 in lays and k not in left]
    pc = for_capture(imp)
    assert pc.table.setting == "without_stack"  # the mini-server profiles without stacks

    def busy(prof) -> float:  # the host's time per step outside its syncs, as the fit reads it
        return float(np.mean([sum(regions(imp.trace, lays[k], prof).values()) for k in ks]))

    unprofiled = read_metrics(SERVER / "fit_ramp.metrics.json.gz")["summary"]["host_us"]["busy"]
    before, after = busy(None) / unprofiled, busy(pc) / unprofiled
    assert before > 1.1  # the profiler's slowdown, as captured
    assert abs(after - 1) < abs(before - 1) and abs(after - 1) < 0.06


def test_check_adds_the_profilers_cost_back(synthetic):
    """The default fit is the unprofiled loop; ``--check`` compares it with the profiled
    capture by adding the profiler's cost back (the keep fit's host times less the default
    fit's, per key), which brings the check to the fit that kept it; ``profiler_cost=False``
    (``--keep-profiler-cost``) checks a config that holds it as it stands."""
    from simwar.capture.stalls import import_report
    from simwar.config import load_config
    from simwar.fit.check import check_fit, profiler_back

    cap = synthetic["prof"]
    steps, _ = import_report(cap.bound)
    default = load_config(fit_model(cap, capture="c").config)
    kept = load_config(fit_model(cap, capture="c", profiler_cost=False).config)
    back = profiler_back(cap, default)
    assert back and all(v > 0 for v in back.values())
    assert back["cpu.schedule_us"] == pytest.approx(
        kept.cpu.schedule_us - default.cpu.schedule_us, abs=1e-3)

    def lead_error(cfg, **kw) -> float:  # the loop is device-bound: the host shows in the lead
        got = check_fit(cap, cfg, "c", steps, "c", **kw)
        return next(r["error"] for r in got["rows"] if r["key"] == "launch_lead_us_mean")

    added, bare = lead_error(default), lead_error(default, profiler_cost=False)
    as_kept = lead_error(kept, profiler_cost=False)
    assert abs(bare) > 5.0 and added == pytest.approx(as_kept, abs=0.5)
    plain = synthetic["plain"]
    assert profiler_back(plain, fit_model(plain).config) == {}  # nothing recorded, none added


def test_check_adds_back_the_cost_of_a_fit_made_alike(tmp_path, capsys):
    """The profiler's cost ``--check`` adds back is the fit that keeps it less the checked
    fit, the two made with the same arguments: here ``--unprofiled-step-us`` per bucket (which
    scales the host times too), given to ``--fit`` and ``--check`` in one command, or to
    ``--check`` alone; a fit with the defaults would add back a cost ~2-5x as large."""
    from simwar.capture.stalls import import_report
    from simwar.config import load_config
    from simwar.fit.check import check_fit, profiler_back, with_profiler
    from simwar.fit.from_capture import duration_mean
    from simwar.fit.profiler import scale_device

    sweep = {"batch_sizes": [1, 3, 6, 8, 11, 16, 20, 27, 32, 40, 52, 64, 58, 44, 31, 24, 16,
                             12, 8, 5, 2], "graph_buckets": [8, 16, 32, 64]}
    sim = simulate(ROOT / "configs" / "dspark_fine.yaml",
                   {"steps": 100, "warmup_steps": 6, "workload": sweep,
                    "phases.verify.body_us": {"base": 1200, "per_seq": 45}})
    path = write_kineto(sim.trace, tmp_path / "prof.json.gz", profiled=True,
                        style=Style(names="sglang", batch_ranges=True,
                                    copies=("result_copy",)))
    cap = open_capture(path)
    truth = simulate(scale_device(fit_model(cap).config, 0.96, 0.9)).summary["by_bucket"]
    targets = {b: v["step_us_mean"] for b, v in truth.items()}
    args = {"unprofiled_step_us": targets}
    net = fit_model(cap, **args).config
    kept = fit_model(cap, **args, profiler_cost=False).config
    by_hand = {k: round(duration_mean(kept["cpu"][k]) - duration_mean(net["cpu"][k]), 3)
               for k in net["cpu"]}
    steps, _ = import_report(cap.bound)
    got = check_fit(cap, load_config(net), "c", steps, "c", fit_args=args)
    for key, us in got["profiler_back"].items():
        if key.startswith("cpu."):
            assert us == pytest.approx(by_hand[key[4:]], abs=2e-3), key
    # the check of the same config with that cost added back by hand: the same figures
    alike = check_fit(cap, with_profiler(load_config(net), got["profiler_back"]), "c", steps,
                      "c", profiler_cost=False)
    assert alike["rows"] == got["rows"]
    default = profiler_back(cap, net)  # a fit with other arguments: another cost
    assert default["cpu.ingest_us"] > 2 * got["profiler_back"]["cpu.ingest_us"]
    # the command line: the fit's own arguments, in the command that fits it or given again
    given = ",".join(f"{b}={us:.3f}" for b, us in targets.items())
    out = tmp_path / "fitted.yaml"
    for extra in (["--fit", "-o", str(out)], []):
        main(["import", str(path), *extra, "--check", str(out), "--unprofiled-step-us", given,
              "--json", "--no-progress"])
        back = json.loads(capsys.readouterr().out)["check"]["profiler_back"]
        assert back == pytest.approx(profiler_back(cap, load_config(out), args), abs=2e-3)
        assert back["cpu.ingest_us"] < default["cpu.ingest_us"] / 2

