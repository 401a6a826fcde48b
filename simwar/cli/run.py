"""``simwar run``: simulate one config and print its summary (or its JSON).

Here: the command (:func:`add_arguments`, :func:`command`), the progress bar the run
shows on a terminal (:func:`run_progress`: the executors only call a callback) and the
summary it prints (:func:`format_summary`, which notebooks use too). The picture and
trace options (``--timeline``, ``--steps-window``, ``--trace``) live in
:mod:`simwar.cli.outputs`, called here to add them, to check them before simulating and
to write them after.

Imports: ``simwar.cli.common``, ``simwar.cli.outputs``, the executor names of
``simwar.config.schema`` and ``simwar.core.files`` at the top; the simulator, the analysis
and tqdm inside the functions that use them (start-up time of the CLI). Never another
command's module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from simwar.cli import outputs
from simwar.cli.common import (
    UserError,
    bucket_lines,
    costs_file_overrides,
    num,
    run_label,
    stall_lines,
    start_up,
)
from simwar.config.schema import ENGINES
from simwar.core.files import jsonable

HELP = "simulate one config and print its summary"
DESCRIPTION = ("Simulate one config (default: the packaged DSPARK fine barrier config) and "
               "print a summary. Runs longer than a couple of seconds show a progress bar on "
               "stderr (when it is a terminal).")
#: seconds a run must take before its progress bar shows (short runs print nothing extra)
PROGRESS_DELAY_S = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML config (default: packaged dspark-fine)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key, e.g. --set policy.barrier=coarse (repeatable; "
                        "applied after --costs)")
    p.add_argument("--costs", metavar="FILE",
                   help="YAML file (from simwar calibrate or simwar import --fit) whose "
                        "'costs' mapping overrides the config's costs and whose 'phases' list "
                        "overrides the durations of the config's phases of the same names; any "
                        "other top-level key is an error (a calibration file's own "
                        "description, format to host_drift, excepted)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--races", type=int, default=5, metavar="N",
                   help="list up to N races in the text summary (default 5)")
    p.add_argument("--fail-on-race", action="store_true",
                   help="exit 1 when the run has latent races in the steps measured (for CI: "
                        "the summary is printed as usual)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar and no notes on stderr (errors still print)")
    p.add_argument("--engine", choices=ENGINES, default=None,
                   help="executor: simpy (reference, keeps the trace), fast (one pass, no "
                        "trace but a tensor-parallel run's) or auto (fast, simpy where fast "
                        "refuses, e.g. --timeline; stderr says why; default: the config's "
                        "engine, auto)")
    p.add_argument("--slo", metavar="METRIC=BOUND,...",
                   help="service-level objectives per request, e.g. ttft=200ms,tpot=30ms "
                        "(metrics: ttft, ttft_forward, tpot, itl, latency; units us, ms, s; "
                        "a bare number is ms): adds the goodput, the requests/s meeting them "
                        "(the config's slo: section)")
    p.add_argument("--summary-only", action="store_true",
                   help="keep no per-step table: the summary is computed as the run goes "
                        "(quantiles from a sketch, 1e-4 relative); for very long runs")
    outputs.add_arguments(p)


def command(args) -> int:
    with start_up():  # the imports and the config: objects that live until the exit
        # lazy: start-up time of the CLI (the simulator; the config schema loads pydantic)
        from simwar.api import Runner, choose
        from simwar.config import (  # lazy: start-up time of the CLI
            ConfigError,
            Override,
            load_config,
            override_list,
            parse_slo,
        )
        from simwar.config.cache import load_cached  # lazy: start-up time of the CLI

        outputs.check_paths(args)  # a wrong output path costs nothing, and overwrites no input
        if args.races < 0:
            raise UserError(f"--races {args.races}: expected 0 or a positive number")

        def overrides() -> list[Override]:  # --set, then --slo
            items = override_list(args.overrides)
            if args.slo is not None:
                items.append(Override("slo", parse_slo(args.slo), f"--slo {args.slo}"))
            return items

        if args.costs:
            items = overrides()
            phases = [p.name for p in load_config(args.config, items).phase_table()]
            items = costs_file_overrides(args.costs, phases) + items  # --set wins
            cfg = load_config(args.config, items)
        else:  # a config run before with these options comes from the cache
            options = [f"--set {item}" for item in args.overrides]
            options += [f"--slo {args.slo}"] if args.slo is not None else []
            cfg, items = load_cached(args.config, options, overrides)
    want = outputs.trace_options(args)
    trace_for = want[0] if want else None
    if args.trace and cfg.tp > 1 and trace_for is None:  # the ranks' Traces, side by side
        trace_for = "--trace"
    choice = choose(cfg, args.engine, trace_for=trace_for)  # the run's, checked before it
    if choice.name is None:
        raise UserError(f"{choice.line()}; use --engine simpy (or auto)")
    if want and args.summary_only:
        raise UserError(f"{want[0]}: not with --summary-only")
    if args.summary_only and choice.name == "simpy":
        raise UserError("--summary-only: needs the fast executor (--engine fast or auto)")
    outputs.check(args, cfg)
    try:
        runner = Runner(cfg, args.engine, summary_only=args.summary_only, trace_for=trace_for)
        stream = outputs.trace_stream(args, runner)  # --trace made by the run's own pass
        what = "simulating" if stream is None else \
            f"simulating, writing {Path(args.trace).name}"
        with run_progress(cfg.steps, quiet=args.quiet, desc=what) as progress:
            result = runner.run(progress=progress) if stream is None else \
                outputs.traced_run(args, runner, stream, progress)
    except ConfigError as e:  # found only as it runs (the memory check, a trace that runs out)
        raise ConfigError(f"{args.config}: {e}" if args.config else str(e)) from None
    if not args.quiet:  # which executor ran, and why each one preferred to it refused
        print(f"simwar: {result.executor_line}", file=sys.stderr)
    for warning in result.warnings:  # printed even with --quiet: the results may mislead
        print(f"simwar: warning: {warning}", file=sys.stderr)
    result.summary["name"] = run_label(cfg.name, items)
    outputs.write(args, result, traced=stream is not None)
    if args.json:
        print(json.dumps(jsonable(result.summary), sort_keys=True))
    else:
        print(format_summary(result, args.races))
    races = result.summary.get("races", 0)
    if args.fail_on_race and races:
        print(f"simwar: {races} latent race{'s' if races != 1 else ''} in the steps measured "
              f"(--fail-on-race)", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def run_progress(steps: int, quiet: bool = False, desc: str = "simulating"):
    """A progress callback for ``simulate``: a tqdm bar on stderr (``desc`` before it), or
    None.

    The bar shows only after ``PROGRESS_DELAY_S`` seconds and only when stderr is a
    terminal (tqdm's own rule); ``quiet`` turns it off.
    """
    if quiet:
        yield None
        return
    # lazy: start-up time of the CLI (tqdm)
    from tqdm import tqdm

    bar = tqdm(total=steps, unit="step", desc=desc, file=sys.stderr, leave=False,
               delay=PROGRESS_DELAY_S, dynamic_ncols=True, disable=None)
    if bar.disable:
        bar.close()
        yield None
        return
    stride = max(1, steps // 500)  # a few hundred updates at most, whatever the run's length

    def progress(step: int) -> None:  # each step (SimPy) or each chunk of steps (fast)
        if step + 1 - bar.n >= stride or step >= steps - 1:
            bar.update(min(step + 1, steps) - bar.n)
            if step >= steps - 1:  # the rest is draining the streams and the analysis
                bar.set_description_str("analysing")

    try:
        yield progress
    finally:
        bar.close()


def measured_steps(columns: dict | None, warmup: int) -> list[int]:
    """The steps a summary counts; with no table kept (``--summary-only``), none."""
    if columns is None:
        return []
    # lazy: start-up time of the CLI (the analysis loads numpy and pandas)
    from simwar.analysis.metrics import measured_rows

    return columns["step"][measured_rows(columns, warmup)].tolist()


def workload_lines(s: dict) -> list[str]:
    """Per graph bucket, and the requests, of a run whose steps differ."""
    if "by_bucket" not in s:
        return []
    f = num
    lines = bucket_lines(s["by_bucket"])
    shares = s.get("shape_steps", {})
    if len(shares) > 1:  # the scheduler picked more than one step shape
        time = s["shape_time"]
        lines.append("  step shapes         " + "; ".join(
            f"{name} {100 * share:.1f}% of steps, {100 * time[name]:.1f}% of time"
            for name, share in shares.items()))
    if "requests_completed" in s:
        lines.append(
            f"  requests            {s['requests_completed']} completed, "
            f"{f(s['requests_per_s'])}/s; decode latency mean "
            f"{f(s['request_latency_us_mean'], '.0f')} µs, p50 "
            f"{f(s['request_latency_us_p50'], '.0f')}, p99 {f(s['request_latency_us_p99'], '.0f')}"
            f"; queued {f(s['request_queue_us_mean'], '.0f')} µs before joining")
        lines.append(
            f"  first token         TTFT mean {f(s['request_ttft_us_mean'], '.0f')} µs, p50 "
            f"{f(s['request_ttft_us_p50'], '.0f')}, p99 {f(s['request_ttft_us_p99'], '.0f')} "
            f"(result processed); forward end mean "
            f"{f(s['request_ttft_forward_us_mean'], '.0f')} µs")
        lines.append(
            f"  per output token    TPOT mean {f(s['request_tpot_us_mean'], '.0f')} µs, p99 "
            f"{f(s['request_tpot_us_p99'], '.0f')}; ITL mean "
            f"{f(s['request_itl_us_mean'], '.0f')} µs, p99 {f(s['request_itl_us_p99'], '.0f')}")
    if "goodput_per_s" in s:
        lines.append(f"  goodput             {f(s['goodput_per_s'])}/s meeting the SLO "
                     f"({100 * s['slo_attainment']:.1f}% of the requests completed)")
    return lines


def rank_lines(s: dict) -> list[str]:
    """Of a tensor-parallel run: per-rank step time and collective waits, the straggler."""
    tp = s.get("tp", 1)
    if tp < 2 or "tp_step_us_mean" not in s:
        return []
    f = num
    lines = [f"  ranks               tp {tp}; step {f(s['tp_step_us_mean'])} µs mean, p99 "
             f"{f(s['tp_step_us_p99'])} (the slowest rank's per step); the figures above "
             f"are rank 0's"]
    for r in range(tp):
        lines.append(f"    rank {r}            step {f(s[f'rank{r}_step_us_mean'])} µs; waits "
                     f"{f(s[f'rank{r}_collective_wait_us_mean'])} µs/step for the slowest "
                     f"(host {f(s[f'rank{r}_host_wait_us_mean'])}, device "
                     f"{f(s[f'rank{r}_device_wait_us_mean'])}); {s[f'rank{r}_races']} races")
    if "straggler_rank" in s:
        lines.append(f"  straggler           rank {s['straggler_rank']} in "
                     f"{100 * s['straggler_share']:.0f}% of the steps, holding the others "
                     f"{f(s['straggler_lead_us_mean'])} µs (mean of those steps)")
    if "skew_us_p50" in s:
        lines.append(f"  arrival skew        {f(s['skew_us_p50'])} µs p50, "
                     f"{f(s['skew_us_p90'])} p90, {f(s['skew_us_max'])} max (per step, its "
                     f"most skewed collective)")
    return lines


def format_summary(result, max_races: int = 5) -> str:
    """What ``simwar run`` prints for a Result: the config, the stall figures of the steps
    measured, the throughput, per-bucket lines of a varying workload, and up to
    ``max_races`` races (observed overlaps first)."""
    s = result.summary
    cfg = result.config
    from simwar.core.run_meta import RunMeta  # lazy: loaded with the run's trace, not before

    run = RunMeta.from_meta(result.meta)
    header = (f"{s.get('name') or cfg.name}: {cfg.algorithm}, barrier {s.get('barrier')} "
              f"(applied: {s.get('barrier_effective')}, {s.get('placement')}); "
              f"read-done: {run.publish_reason}"
              + ("; overlap off (the normal loop)" if run.overlap is False else ""))
    measured_line = (f"  steps measured      {s['steps_measured']} (warm-up {cfg.warmup_steps} "
                     f"and the last step excluded)")
    if not s.get("steps_measured"):
        return "\n".join([header, measured_line])
    f = num
    lines = [
        header,
        measured_line,
        *stall_lines(s),
        "  throughput          " + (
            f"{f(s['tokens_per_s'], '.0f')} tokens/s " if s['tokens_per_s'] == s['tokens_per_s']
            else "n/a: the steps take no time ") + (
            f"(batch mean {f(s['batch_size_mean'])} x {f(s['accepted_tokens_mean'], '.2f')} "
            f"accepted, per step)" if "batch_size_mean" in s
            else f"(batch {cfg.batch_size} x {cfg.accept.tokens} accepted)"),
        *workload_lines(s),
        *rank_lines(s),
        f"  races               {s['races']} latent, {s['overlaps']} observed overlaps "
        f"(in {s['race_steps']} of the {s['steps_measured']} steps measured)",
    ]
    # the same steps as every figure above: after the warm-up, without the last step
    steps = measured_steps(result.columns, cfg.warmup_steps)
    races = (result.hazards.within(steps) if steps  # --summary-only keeps no table
             else result.hazards.since(cfg.warmup_steps))
    shown = (races.observed or races.latent)[:max_races]
    for r in shown:
        what = (f"overlapped {f(r.overlap_us)} µs" if r.observed
                else "no happens-before path")
        lines.append(f"    {r.kind} on {r.buffer}: {r.first_lane}:{r.first_label} (step "
                     f"{r.first_step}) vs {r.second_lane}:{r.second_label} (step "
                     f"{r.second_step}): {what}")
    return "\n".join(lines)
