"""``simwar advise``: search the barrier-policy space for the fastest race-free policy.

    simwar advise CONFIG [--objective step_us_mean|tokens_per_s|p99] [--json] [-o FILE]
                         [--jobs N]

Searches the policy space of a config (:mod:`simwar.study.advise`: every barrier policy,
read-done publish point, placement, plan stream and CPU seq_lens choice), and prints a
ranked table and the best policy as ``--set`` items and a config diff; ``-o`` writes the
input config with the best policy applied; ``--jobs`` processes screen the candidates (by
default one per core; the advice is the same for any number). The search is the study
module's; this one parses arguments and prints, with a progress bar over the candidates on
stderr.

Imports: ``simwar.cli.common`` and ``simwar.core.files`` at the top; the config schema,
the search, yaml and tqdm inside the functions that use them. Never another command's
module.
"""

from __future__ import annotations

import argparse
import json
import sys

from simwar.cli.common import UserError, check_outputs, clip_text, output_path
from simwar.core.files import jsonable, write_text_atomic

HELP = "search the barrier-policy space for the fastest race-free policy"
DESCRIPTION = ("Simulate every barrier policy, read-done publish point, barrier placement, "
               "plan-stream and CPU seq_lens choice for this config's workload, check each for "
               "latent races, and print them ranked with the best as a config diff.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", metavar="CONFIG", help="YAML config")
    p.add_argument("--objective", default="step_us_mean", metavar="NAME",
                   help="step_us_mean (default), tokens_per_s or p99")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key of the config before the search (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="race-free candidates listed (default 10; --json lists all)")
    p.add_argument("--screen-steps", type=int, default=None, metavar="N",
                   help="steps each candidate is simulated for (default 200; the best and the "
                        "input are re-run at the config's own length)")
    p.add_argument("-o", "--output", metavar="YAML",
                   help="write the input config with the best policy applied")
    p.add_argument("--jobs", "-j", type=int, default=0, metavar="N",
                   help="processes screening the candidates (default 0: one per core; "
                        "the advice is the same for any number)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def command(args) -> int:
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import ConfigError, load_config, parse_override
    from simwar.config.schema import MIN_MEASURED  # lazy: start-up time of the CLI

    # lazy: start-up time of the CLI (the search runs the simulator)
    from simwar.study.advise import OBJECTIVES, SCREEN_STEPS, AdviseError, advise

    if args.objective not in OBJECTIVES:
        raise UserError(f"--objective {args.objective}: not known (expected one of "
                        f"{', '.join(OBJECTIVES)})")
    if args.screen_steps is not None and args.screen_steps < MIN_MEASURED + 1:
        raise UserError(f"--screen-steps {args.screen_steps}: expected at least "
                        f"{MIN_MEASURED + 1} (a run measures {MIN_MEASURED} steps or more, the "
                        f"last one excluded)")
    if args.top < 0:
        raise UserError(f"--top {args.top}: expected 0 or a positive number")
    if args.jobs < 0:
        raise UserError(f"--jobs {args.jobs}: expected 0 (one per core) or a positive "
                        f"number")
    if args.output is not None:  # given, even empty: checked
        output_path(args.output, "-o")
        check_outputs([("config", args.config)], [("-o", args.output)])
    overrides = dict(parse_override(o) for o in args.overrides)
    cfg = load_config(args.config, overrides)
    bar = _Bar(disabled=args.no_progress)
    try:
        advice = advise(cfg, args.objective, screen_steps=args.screen_steps or SCREEN_STEPS,
                        jobs=args.jobs, progress=bar)
    except (AdviseError, ConfigError) as e:  # ConfigError: found as it runs (the memory check)
        raise UserError(f"{args.config}: {e}") from None
    finally:
        bar.close()
    if args.output and advice.best is not None:
        # lazy: start-up time of the CLI (yaml)
        import yaml

        best = load_config(args.config, {**overrides, **advice.best.overrides})
        write_text_atomic(
            args.output, f"# {args.config} with the policy `simwar advise` found best\n"
            + yaml.safe_dump(best.model_dump(mode="json"), sort_keys=False))
        print(f"simwar: wrote {args.output}", file=sys.stderr)
    if args.json:
        print(json.dumps(jsonable(advice.to_dict()), sort_keys=True))
    else:
        print(format_advice(advice, args.config, args.overrides, args.top))
    return 0


class _Bar:
    """A tqdm bar over the candidates, as a ``progress(done, total)`` callback."""

    def __init__(self, disabled: bool):
        self.disabled = disabled
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            # lazy: start-up time of the CLI (tqdm)
            from tqdm import tqdm

            class Quiet(tqdm):
                # no monitor thread: the screen forks its worker processes after the bar
                # has started, and a fork copies no thread but whatever locks one held
                monitor_interval = 0

            self.bar = Quiet(total=total, unit="policy", desc="simulating", file=sys.stderr,
                            leave=False, disable=True if self.disabled else None)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_advice(advice, config_path: str, input_sets=(), top: int = 10) -> str:
    """What ``simwar advise`` prints: the input, the ranked candidates and the advice."""
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config.policies import publish_point
    from simwar.study.advise import OBJECTIVES  # lazy: start-up time of the CLI

    cfg = advice.config
    pol = cfg.policy
    point = publish_point(cfg.phase_table(), pol.publish_phase, pol.external_events,
                          pol.in_replay_fallback)
    base = advice.baseline
    bf = base.figures()
    key, direction = OBJECTIVES[advice.objective]
    unit = "tokens/s" if key == "tokens_per_s" else "µs"
    lines = [
        f"{cfg.name}: {cfg.algorithm}, barrier {pol.barrier} (applied: "
        f"{bf.get('barrier_effective')}, {pol.placement}); read-done: {point.reason}",
        f"  input               {bf['step_us_mean']:.1f} µs/step (p99 {bf['step_us_p99']:.1f}), "
        f"{bf['tokens_per_s']:.0f} tokens/s, {base.races} latent races"
        + ("  <- RACY" if base.racy else "")
        + (f"  [{cfg.steps} steps]" if base.confirmed is not None else ""),
        f"  searched            {len(advice.candidates)} policies, each simulated for "
        f"{advice.screen_steps} steps (warm-up {advice.screen_warmup}, seed {cfg.seed}) and "
        f"checked for races",
        f"  objective           {advice.objective} ({'larger' if direction > 0 else 'smaller'} "
        f"is better)",
    ]
    safe = [c for c in advice.candidates if not c.racy]
    racy = [c for c in advice.candidates if c.racy]
    w = min(80, max(len(c.description) for c in safe[:top] + racy[:3]))
    lines += ["", f"  {'rank':>4}  {'policy':<{w}} {'step µs':>8} {'saving':>8} {'races':>6}"]
    base_screen = base.summary["step_us_mean"]
    for i, c in enumerate(safe[:top], 1):
        s = c.summary["step_us_mean"]
        mark = "  <- advised" if c is advice.best else ""
        mark += "  (input)" if not c.overrides else ""
        unsafe = "" if c.safe_policy else "  (unsafe policy: never advised)"
        lines.append(f"  {i:>4}  {clip_text(c.description, w):<{w}} {s:>8.1f} "
                     f"{base_screen - s:>8.1f} {c.races:>6}{mark}{unsafe}")
    if len(safe) > top:
        lines.append(f"        ... {len(safe) - top} more race-free policies (--top, --json)")
    if racy:
        lines.append(f"  racy: {len(racy)} policies reported, never advised, e.g.")
        for c in racy[:3]:
            s = c.summary["step_us_mean"]
            lines.append(f"        {clip_text(c.description, w):<{w}} {s:>8.1f} "
                         f"{base_screen - s:>8.1f} {c.races:>6}"
                         + ("  (input)" if not c.overrides else ""))
    lines.append("")
    best = advice.best
    if best is None:
        lines.append("  advised: nothing (no race-free policy found)")
        return "\n".join(lines)
    f = best.figures()
    if not best.overrides:
        lines.append(f"  advised: keep the input policy ({best.description}): no race-free "
                     f"policy does better on {advice.objective}")
        return "\n".join(lines)
    pct = 100 * advice.saving_us / bf["step_us_mean"] if bf["step_us_mean"] else 0.0
    value = f.get(key)
    lines += [
        f"  advised: {best.description}",
        f"    {f['step_us_mean']:.1f} µs/step at {cfg.steps} steps (input {bf['step_us_mean']:.1f})"
        f": saving {advice.saving_us:.1f} µs ({pct:.1f}%), {best.races} races; "
        f"{advice.objective} {value:.1f} {unit if key != 'step_us_p99' else 'µs'}",
        "    changes: " + "; ".join(best.changes),
    ]
    for need in best.needs:
        lines.append(f"    needs: {need}")
    sets = " ".join(f"--set {s}" for s in [*input_sets, *best.set_items()])
    lines.append(f"    run it: simwar run {config_path} {sets}")
    lines.append("    config diff:")
    lines += [f"      {line}" for line in advice.config_diff().splitlines()]
    return "\n".join(lines)
