"""The ``simwar`` command line: the only place that chooses file names and prints.

Subcommands live in small ``register(subparsers)`` functions: ``run`` here,
the others in the ``cli_*`` modules listed in ``_COMMAND_MODULES``. Any error a
user can cause is reported as one line on stderr with a non-zero exit.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

#: modules that contribute subcommands: each has ``register(subparsers)``, and may have
#: ``extend_run(run_parser)`` (extra ``run`` options) and ``after_run(args, result)``.
_COMMAND_MODULES: tuple[str, ...] = (
    "simwar.cli_sweep",
    "simwar.cli_plot",
    "simwar.cli_harness",
    "simwar.cli_import",
)


def _command_modules() -> list:
    import importlib.util

    return [importlib.import_module(n) for n in _COMMAND_MODULES
            if importlib.util.find_spec(n) is not None]


class UserError(Exception):
    """An error the user can fix; printed as one line."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .config import ConfigError

    try:
        return int(args.func(args) or 0)
    except (UserError, ConfigError, FileNotFoundError) as e:
        print(f"simwar: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simwar: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="simwar", description="Simulate LLM-serving overlap scheduling and its WAR barriers.")
    parser.add_argument("--version", action="version", version=f"simwar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run_parser = register_run(sub)
    for mod in _command_modules():
        mod.register(sub)
        if hasattr(mod, "extend_run"):
            mod.extend_run(run_parser)
    return parser


# --------------------------------------------------------------------------- run
def register_run(sub) -> None:
    p = sub.add_parser("run", help="simulate one config and print its summary",
                       description="Simulate one config (default: the packaged DSPARK fine "
                                   "barrier config) and print a summary.")
    p.add_argument("config", nargs="?", help="YAML config (default: packaged dspark-fine)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key, e.g. --set policy.barrier=coarse (repeatable)")
    p.add_argument("--costs", help="YAML file whose 'costs' mapping replaces the config's costs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--races", type=int, default=5, metavar="N",
                   help="list up to N races in the text summary (default 5)")
    p.add_argument("--engine", choices=("simpy", "fast", "auto"), default=None,
                   help="executor: simpy (reference, keeps the trace), fast (one pass, no "
                        "trace) or auto (fast unless --trace/--timeline; default: the "
                        "config's engine, auto)")
    p.add_argument("--summary-only", action="store_true",
                   help="keep no per-step table: the summary is computed as the run goes "
                        "(quantiles from a sketch, 1e-4 relative); for very long runs")
    p.set_defaults(func=cmd_run)
    return p


def costs_overrides(path: str | None) -> dict:
    if not path:
        return {}
    from .config import ConfigError, read_yaml

    data = read_yaml(path)
    costs = data.get("costs", data)
    if not isinstance(costs, dict):
        raise ConfigError(f"{path}: costs: expected a mapping")
    return {f"costs.{k}": v for k, v in costs.items()}


def cmd_run(args) -> int:
    from .api import simulate
    from .config import load_config, parse_override

    overrides = costs_overrides(args.costs)
    for item in args.overrides:
        key, value = parse_override(item)
        overrides[key] = value
    cfg = load_config(args.config, overrides)
    want = [flag for flag, attr in (("--trace", "trace"), ("--timeline", "timeline"))
            if getattr(args, attr, None)]
    requested = args.engine or cfg.engine
    if want and requested == "fast":
        raise UserError(f"{want[0]}: the fast engine keeps no trace; use --engine simpy "
                        f"(or auto)")
    if want and args.summary_only:
        raise UserError(f"{want[0]}: not with --summary-only")
    engine = "simpy" if want else requested
    if args.summary_only and engine == "simpy":
        raise UserError("--summary-only: needs the fast engine (--engine fast or auto)")
    result = simulate(cfg, engine=engine, summary_only=args.summary_only)
    print(f"simwar: executor {result.engine}", file=sys.stderr)
    for mod in _command_modules():
        if hasattr(mod, "after_run"):
            mod.after_run(args, result)
    if args.json:
        print(json.dumps(_jsonable(result.summary), sort_keys=True))
    else:
        print(format_summary(result, args.races))
    return 0


def _jsonable(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def format_summary(result, max_races: int = 5) -> str:
    s = result.summary
    cfg = result.config
    m = result.meta
    lines = [
        f"{cfg.name}: {cfg.algorithm}, barrier {s.get('barrier')} "
        f"(applied: {s.get('barrier_effective')}, {s.get('placement')}); "
        f"read-done: {m.get('publish_reason')}",
        f"  steps measured      {s['steps_measured']} (warm-up {cfg.warmup_steps} excluded)",
        f"  step time           mean {s['step_us_mean']:.1f} µs   p50 {s['step_us_p50']:.1f}"
        f"   p99 {s['step_us_p99']:.1f}",
        f"  forward             {s['fwd_us_mean']:.1f} µs; gap before it {s['fwd_gap_us_mean']:.1f}"
        f" µs",
        f"  GPU idle (forward)  {s['gpu_idle_us_mean']:.1f} µs/step "
        f"(waiting on a dependency {s['gpu_idle_dep_us_mean']:.1f}, "
        f"on the host {s['gpu_idle_host_us_mean']:.1f}); busy {100 * s['gpu_busy_fraction']:.1f}%",
        f"  CPU blocked         {s['cpu_blocked_us_mean']:.1f} µs/step "
        + ", ".join(f"{k[len('cpu_blocked_'):-len('_us_mean')]} {v:.1f}" for k, v in s.items()
                    if k.startswith("cpu_blocked_") and k.endswith("_us_mean")
                    and k != "cpu_blocked_us_mean" and v > 0),
        f"  launch lead         mean {s['launch_lead_us_mean']:.1f} µs; run-ahead fraction "
        f"{s['run_ahead_fraction']:.3f}",
        f"  launch-ahead depth  mean {s['launch_ahead_mean']:.3f}; histogram "
        + ", ".join(f"{k}: {v:.2f}" for k, v in s["launch_ahead_hist"].items()),
        f"  throughput          {s['tokens_per_s']:.0f} tokens/s "
        f"(batch {cfg.batch_size} x {cfg.accept.tokens} accepted)",
        f"  races               {s['races']} latent, {s['overlaps']} observed overlaps "
        f"(in {s['race_steps']} steps)",
    ]
    races = result.hazards.since(cfg.warmup_steps)
    shown = (races.observed or races.latent)[:max_races]
    for r in shown:
        what = f"overlapped {r.overlap_us:.1f} µs" if r.observed else "no happens-before path"
        lines.append(f"    {r.kind} on {r.buffer}: {r.first_lane}:{r.first_label} (step "
                     f"{r.first_step}) vs {r.second_lane}:{r.second_label} (step "
                     f"{r.second_step}): {what}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
