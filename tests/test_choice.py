"""One place decides the executor (:mod:`simwar.executors.choice`), and says why.

- :func:`~simwar.executors.choice.choose` on every shipped config: the executor each request
  and purpose gets, and the reasons the ones preferred to it were refused;
- each refusal rule, for a config (or plan) that triggers it; the signals found only while
  planning or running (:class:`~simwar.core.refusals.PlanRefused`) fall back, the reason
  recorded in ``Result.refused``;
- an unrelated error raised while planning (a bug) propagates instead of switching
  executors, and no module of simwar catches a bare RuntimeError;
- ``simwar run`` names the executor and the refusals on stderr.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from simwar import api
from simwar.api import choose, explain, simulate, simulate_many
from simwar.builder.sizes import draw_sizes
from simwar.builder.template import NotTraceable
from simwar.cli.app import main
from simwar.config import ConfigError, load_config
from simwar.config.workload import REQUEST_SOURCES
from simwar.core.refusals import PlanRefused
from simwar.executors import fast
from simwar.executors.choice import EXECUTORS, describe
from simwar.executors.fast import ranks as fast_ranks
from simwar.executors.fast.execute import marks_results
from simwar.executors.fast.plan import Unsettled
from simwar.executors.fast.trace import Stream as TraceStream
from simwar.executors.fast.trace import TraceUnsupported
from simwar.executors.lockstep import NotLockstep
from simwar.executors.lockstep import ranks as lanes

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))
SHORT = {"steps": 30, "warmup_steps": 3}
ARRIVALS = {**SHORT, "workload": {"arrivals": {"rate_per_s": 700}, "max_batch": 8,
                                  "output_tokens": 9}}
CLOSED_LOOP = {**SHORT, "workload": {"closed_loop": {"concurrency": 3}, "output_tokens": 4,
                                     "prompt_tokens": 100},
               "prefill": {"chunk_tokens": 64, "forward_us": {"base": 30, "per_token": 2}}}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_choose_on_the_shipped_configs(path):
    cfg = load_config(path, SHORT)
    ranks = cfg.tp > 1
    tp_reason = f"parallel.tp {cfg.tp}: its plans are of one rank"
    # one run: the fast executor (per rank for ranks), nothing refused
    run = choose(cfg)
    assert (run.name, run.refused) == ("fast", ())
    assert run.key == ("lanes" if ranks else "fast")
    assert (choose(cfg, "simpy").name, choose(cfg, "simpy").refused) == ("simpy", ())
    # a trace needed first: one rank's pass keeps none; the ranks' pass keeps every rank's
    timeline = choose(cfg, trace_for="--timeline")
    if ranks:  # the ranks' one pass, not their lockstep
        assert (timeline.name, timeline.refused, timeline.key) == ("fast", (), "ranks")
    else:
        assert timeline.name == "simpy"
        assert timeline.refused == (("fast", "--timeline needs a trace"),)
    # a batch of runs: lockstep, except tensor-parallel ranks
    many = choose(cfg, purpose="many")
    if ranks:
        assert (many.name, many.refused) == ("fast", (("lockstep", tp_reason),))
    elif cfg.workload is not None and cfg.workload.source in REQUEST_SOURCES:
        # each run's batches (and, for sglang, its step shapes) follow its own times
        assert (many.name, many.refused) == ("fast", (("lockstep", f"workload "
                                                       f"{cfg.workload.source}: each run's "
                                                       f"batches depend on its own simulated "
                                                       f"times"),))
    else:
        assert (many.name, many.refused) == ("lockstep", ())
    assert choose(cfg, "simpy", purpose="many").name == "simpy"
    # a Trace streamed (explain): the trace mode, except ranks, whose run keeps theirs
    streamed = choose(cfg, purpose="trace")
    if ranks:
        assert (streamed.name, streamed.refused) == ("fast", (("trace mode", tp_reason),))
    else:
        assert (streamed.name, streamed.refused) == ("trace mode", ())


def test_every_refusal_rule_names_its_reason():
    one = load_config(None, SHORT)
    ranks = load_config(ROOT / "configs" / "tp2_slow_rank.yaml", SHORT)
    reasons = {
        ("fast", "--timeline needs a trace"): EXECUTORS["fast"].refusal(
            one, choose(one, trace_for="--timeline").need),
        ("lockstep", "parallel.tp 2: its plans are of one rank"):
            EXECUTORS["lockstep"].refusal(ranks),
        ("trace mode", "parallel.tp 2: its plans are of one rank"):
            EXECUTORS["trace"].refusal(ranks),
        ("lockstep", "workload arrivals: each run's batches depend on its own simulated "
                     "times"): EXECUTORS["lockstep"].refusal(load_config(None, ARRIVALS)),
    }
    for (name, want), got in reasons.items():
        assert got == want, name
    # nothing refuses the packaged default, and the reference refuses nothing at all
    assert all(e.refusal(one) is None for e in EXECUTORS.values())
    assert EXECUTORS["simpy"].refusal(ranks, choose(ranks, trace_for="x").need) is None
    # as choose reports them
    assert choose(load_config(None, ARRIVALS), purpose="many").refused == (
        ("lockstep", "workload arrivals: each run's batches depend on its own simulated "
                     "times"),)
    closed = choose(load_config(None, CLOSED_LOOP), purpose="many")
    assert closed.name == "fast" and closed.refused[0][0] == "lockstep"
    assert "each run's batches depend on its own simulated times" in closed.refused[0][1]


def test_the_lockstep_executor_has_no_plan_rule_against_result_done_markers():
    # its code generator's array target compiles them (tests/test_lockstep.py runs such
    # runs in lockstep, bit for bit): a plan with them is not refused for them
    cfg = load_config(None, ARRIVALS)
    plan = fast.plan_config(cfg, draw_sizes(cfg), fill=False)  # as the realizing run plans
    assert marks_results(plan)
    assert EXECUTORS["lockstep"].plan_refusal(plan) is None
    plain = load_config(None, SHORT)
    assert EXECUTORS["lockstep"].plan_refusal(fast.plan_config(plain, draw_sizes(plain))) is None


def test_fast_asked_for_with_a_trace_needed_is_refused_with_its_reason():
    cfg = load_config(None, SHORT)
    choice = choose(cfg, "fast", trace_for="--timeline")
    assert choice.name is None and choice.line() == (
        "no executor: fast refused: --timeline needs a trace")
    with pytest.raises(ConfigError, match="engine fast: --timeline needs a trace"):
        simulate(cfg, engine="fast", trace_for="--timeline")
    with pytest.raises(ConfigError, match="engine: 'turbo' is not one of simpy, fast, auto"):
        choose(cfg, "turbo")


def test_the_result_carries_the_executor_and_the_refusals():
    cfg = load_config(None, SHORT)
    plain = simulate(cfg)
    assert (plain.engine, plain.refused, plain.executor_line) == ("fast", (), "executor fast")
    kept = simulate(cfg, trace_for="--timeline")
    assert (kept.engine, kept.refused) == ("simpy", (("fast", "--timeline needs a trace"),))
    assert kept.executor_line == "executor simpy: fast refused: --timeline needs a trace"
    assert kept.has_trace and kept.summary == plain.summary


def test_ranks_one_pass_cannot_follow_fall_back_with_the_reason(monkeypatch):
    cfg = load_config(ROOT / "configs" / "tp2_slow_rank.yaml", SHORT)
    reference = simulate(cfg, engine="simpy")

    def unfollowable(programs, progress=None):
        raise fast_ranks.Unfollowable("2 rank(s) stopped at a collective")

    def apart(cfg, sizes, window=2, progress=None):
        raise lanes.RanksApart("the ranks issue different structures")

    monkeypatch.setattr(fast_ranks, "run_ranks", unfollowable)
    got = simulate(cfg, trace_for="a Trace")
    assert got.engine == "simpy"
    assert got.refused == (("fast", "2 rank(s) stopped at a collective"),)
    assert got.summary == reference.summary
    # the ranks' lockstep refusing: their one pass, then the reference, each reason kept
    monkeypatch.setattr(lanes, "run_ranks", apart)
    got = simulate(cfg)
    assert got.engine == "simpy"
    assert got.refused == (("fast", "the ranks issue different structures"),
                           ("fast", "2 rank(s) stopped at a collective"))
    assert got.summary == reference.summary


def test_iterations_that_never_settle_are_planned_from_the_program(monkeypatch):
    cfg = load_config(None, SHORT)
    want = simulate(cfg).summary

    def unsettled(*args, **kwargs):
        raise Unsettled("the builder's iterations do not settle into one shape")

    monkeypatch.setattr(fast.plan, "plan_template", unsettled)
    assert simulate(cfg).summary == want  # the Program's plan, the same run
    assert simulate_many([cfg]) == [want]  # alone, not in lockstep
    parts, _, _ = api.trace_windows(cfg)
    assert next(iter(parts)) is not None


def test_explain_falls_back_when_the_trace_mode_refuses(monkeypatch):
    cfg = load_config(None, SHORT)
    streamed = explain(cfg).to_dict()
    asked = []

    def refuse(*args, **kwargs):
        raise TraceUnsupported("a name changes with the step without a template")

    def reference(cfg_, *args, engine=None, **kwargs):
        asked.append(engine)
        return real(cfg_, *args, engine=engine, **kwargs)

    real = api.simulate
    monkeypatch.setattr(api, "trace_windows", refuse)
    monkeypatch.setattr(api, "simulate", reference)
    assert explain(cfg).to_dict() == streamed
    assert asked == ["simpy"]


@pytest.mark.parametrize("where", ["fast.plan_config", "fast_ranks.run_ranks",
                                   "lanes.run_ranks", "api.traced", "lockstep.run_group"])
def test_an_unrelated_error_while_planning_propagates(monkeypatch, where):
    """A bug raised while planning is not a refusal: it must not switch executors."""
    from simwar.executors import lockstep

    def bug(*args, **kwargs):
        raise RuntimeError("a bug in the planner")

    owner, name = where.split(".")
    monkeypatch.setattr({"fast": fast, "fast_ranks": fast_ranks, "api": api,
                         "lockstep": lockstep, "lanes": lanes}[owner], name, bug)
    cfg = load_config(ROOT / "configs" / "tp2_slow_rank.yaml", SHORT) \
        if owner in ("fast_ranks", "lanes") else load_config(None, SHORT)
    with pytest.raises(RuntimeError, match="a bug in the planner"):
        if owner in ("api", "lockstep"):
            simulate_many([cfg])
        else:  # the ranks' one pass runs when a Trace is needed
            simulate(cfg, trace_for="a Trace" if owner == "fast_ranks" else None)
    if owner == "fast":
        with pytest.raises(RuntimeError, match="a bug in the planner"):
            api.trace_windows(cfg)


def test_the_planning_signals_are_refusals_not_runtime_errors():
    for signal in (Unsettled, NotTraceable, TraceUnsupported, fast_ranks.Unfollowable,
                   NotLockstep, lanes.RanksApart, lanes.Unplanned):
        assert issubclass(signal, PlanRefused) and not issubclass(signal, RuntimeError)


def _catches_runtime_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    return any(isinstance(n, ast.Name) and n.id == "RuntimeError" for n in names)


def test_no_module_switches_on_a_bare_runtime_error():
    found = []
    for path in sorted((ROOT / "simwar").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and node.type is not None \
                    and _catches_runtime_error(node):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_the_line_names_each_refusal_in_order():
    assert describe("fast", ()) == "executor fast"
    assert describe("simpy", [("fast", "a"), ("lockstep", "b")]) == (
        "executor simpy: fast refused: a; lockstep refused: b")


def test_cli_run_prints_the_refusal_line(tmp_path, capsys):
    out = tmp_path / "t.png"
    assert main(["run", "--set", "steps=20", "--set", "warmup_steps=2",
                 "--timeline", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "simwar: executor simpy: fast refused: --timeline needs a trace" in err
    assert out.exists()
    assert main(["run", "--set", "steps=20", "--set", "warmup_steps=2"]) == 0
    assert capsys.readouterr().err == "simwar: executor fast\n"


def test_cli_trace_export_says_why_the_trace_mode_refused(tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise TraceUnsupported("a name changes with the step without a template")

    # both ways the trace mode makes windows: in the run's pass, and after the run
    monkeypatch.setattr(TraceStream, "__init__", refuse)
    out = tmp_path / "t.json"
    assert main(["run", "--set", "steps=20", "--set", "warmup_steps=2", "--trace",
                 str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "simwar: --trace: trace mode refused: a name changes with the step without a " \
           "template" in err
    assert out.stat().st_size > 0  # the run's Trace, simulated by the reference
