"""``simwar harness``, ``simwar calibrate`` and ``simwar compare``.

- ``harness CONFIG... -o DIR``: build each config's program and write it as
  ``DIR/<name>.json`` (``--suite`` adds the committed suite's cases, ``--workloads`` the
  varying-workload cases); with
  ``--replay`` (needs torch and a CUDA device) also replay each one on the GPU
  and write ``DIR/<name>.trace.json.gz`` (the measured Trace); ``--csan`` adds
  the CSAN matrix (all phases eager, 12 steps, simwar's latent races in each
  program's meta) for ``python -m simwar.harness.csan DIR OUT_JSON``;
- ``calibrate MEASURED... -o FILE``: fit ``costs.*`` from measured traces (a
  directory or tar of ``*.trace.json.gz``) or measured-summary JSON files,
  plus ``--bench`` micro-benchmarks; writes a versioned YAML that
  ``simwar run --costs FILE`` reads;
- ``compare MEASURED... [--costs FILE] [--host-speed measured] --csv FILE [--plot FILE]``: simulate
  each measured case (suite case or ``--config``) and write the error table (with each
  varying-workload case's median per-step error); ``--save-measured FILE`` also writes the
  measured summaries (the ``calibration/*.json`` form) of what was read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from simwar.core.files import write_bytes_atomic, write_text_atomic

CALIBRATION_FORMAT = 1


def register(sub) -> None:
    p = sub.add_parser("harness", help="build programs for the GPU harness (and replay them)",
                       description="Write each config's Program as JSON; with --replay, also "
                                   "replay it on CUDA streams and write the measured Trace.")
    p.add_argument("configs", nargs="*", help="YAML configs")
    p.add_argument("--suite", action="store_true", help="add the harness suite's cases")
    p.add_argument("--workloads", action="store_true",
                   help="add the varying-workload cases (bimodal, ramp, uniform batches under "
                        "the fine, coarse and no barrier)")
    p.add_argument("--csan", action="store_true",
                   help="add the CSAN matrix (all-eager cases with simwar's latent races in "
                        "their meta, for python -m simwar.harness.csan)")
    p.add_argument("-o", "--out", required=True, help="output directory")
    p.add_argument("--replay", action="store_true", help="replay on the GPU (needs torch, CUDA)")
    p.set_defaults(func=cmd_harness)

    c = sub.add_parser("calibrate", help="fit costs.* from measured harness runs",
                       description="Fit the config's host and device costs from measured "
                                   "traces or summaries and micro-benchmarks.")
    c.add_argument("measured", nargs="+",
                   help="trace dir/tar/file, or a measured-summary JSON (calibration/*.json)")
    c.add_argument("--bench", help="micro-benchmark JSON (python -m simwar.harness.gpu_main "
                                   "--bench)")
    c.add_argument("-o", "--output", required=True, help="calibration YAML to write")
    c.set_defaults(func=cmd_calibrate)

    m = sub.add_parser("compare", help="simulated vs measured error table",
                       description="Simulate each measured case and write config, metric, "
                                   "simulated, measured, abs and relative error as CSV.")
    m.add_argument("measured", nargs="+", help="as for calibrate")
    m.add_argument("--costs", help="calibration YAML (its costs replace each config's)")
    m.add_argument("--config", help="one YAML config for every measured case (default: the "
                                    "suite case of the same name)")
    m.add_argument("--host-speed", choices=("calibrated", "measured"), default="calibrated",
                   help="'measured' scales the host costs of each case by its own measured "
                        "launch cost over the calibrated one (the host's speed during that "
                        "replay); default: the calibrated costs as they are")
    m.add_argument("--csv", required=True, help="error table to write")
    m.add_argument("--plot", help="PNG of simulated vs measured step time and forward gap")
    m.add_argument("--save-measured", metavar="FILE",
                   help="also write the measured summaries read (a JSON file of the form "
                        "calibration/*.json holds, per-step figures of varying workloads "
                        "included)")
    m.add_argument("--description", default="",
                   help="description written into --save-measured's file")
    m.add_argument("--markdown", metavar="FILE",
                   help="also write a per-case Markdown table (step time, median per-step "
                        "error, forward gap, launch-ahead, races)")
    m.set_defaults(func=cmd_compare)


def _user_error(msg: str):
    from simwar.cli.common import UserError

    return UserError(msg)


# --------------------------------------------------------------------------- harness
def cmd_harness(args) -> int:
    from simwar.build.loop import build_program
    from simwar.config.schema import load_config
    from simwar.harness import suite

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise _user_error(f"-o {out}: exists and is not a directory")
    programs = {}
    for path in args.configs:
        cfg = load_config(path)
        programs[cfg.name] = build_program(cfg)
    if args.suite:
        for name in suite.cases():
            programs[name] = build_program(suite.case_config(name))
    if args.workloads:
        for name in suite.workload_cases():
            programs[name] = build_program(suite.case_config(name))
    if args.csan:
        for name, overrides in suite.csan_cases().items():
            programs[name] = suite.csan_program(name, overrides)
    if not programs:
        raise _user_error("harness: give at least one CONFIG, --suite, --workloads or --csan")
    out.mkdir(parents=True, exist_ok=True)  # only once there is something to write
    for name, program in programs.items():
        (out / f"{name}.json").write_text(program.to_json())
    print(f"wrote {len(programs)} programs to {out}")
    if args.replay:
        try:
            import torch
        except ImportError:
            raise _user_error("harness --replay: torch is not installed "
                              "(pip install simwar[gpu])") from None
        if not torch.cuda.is_available():
            raise _user_error("harness --replay: no CUDA device")
        from simwar.harness import make_plan, replay
        from simwar.harness.cuda import CudaBackend, calibrate_device

        cal = calibrate_device()
        for name, program in programs.items():
            trace = replay(make_plan(program), CudaBackend(cal))
            trace.save(out / f"{name}.trace.json.gz")
            print(f"{name}: measured races {len(trace.meta['measured_races'])}")
    return 0


# --------------------------------------------------------------------------- measured inputs
def load_measured(sources: list[str]) -> dict[str, dict]:
    """Case → measured summary, from traces (dir/tar/file) or summary JSON files."""
    from simwar.fit.replays import load_traces, measured_summary

    out: dict[str, dict] = {}
    for src in sources:
        path = Path(src)
        if not path.exists():
            raise _user_error(f"{src}: file not found")
        if path.suffix == ".json" and not path.name.endswith(".trace.json"):
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise _user_error(f"{src}: invalid JSON ({e.msg}, line {e.lineno})") from None
            cases = data.get("cases") if isinstance(data, dict) else None
            if not isinstance(cases, dict):
                raise _user_error(f"{src}: expected a measured-summary file with a 'cases' "
                                  f"mapping")
            for name, case in cases.items():
                if not isinstance(case, dict) or not isinstance(case.get("summary"), dict):
                    raise _user_error(f"{src}: cases.{name}: expected a measured summary (a "
                                      f"mapping with a 'summary' mapping)")
            out.update(cases)
            continue
        try:
            traces = load_traces(path)
        except (ValueError, OSError) as e:
            raise _user_error(f"{src}: not a simwar trace, trace directory or tar ({e})") \
                from None
        if not traces:
            raise _user_error(f"{src}: no *.trace.json(.gz) found")
        out.update({k: measured_summary(t) for k, t in traces.items()})
    return out


def _case_configs(names, config_path: str | None) -> dict[str, dict]:
    from simwar.config.schema import load_config
    from simwar.harness import suite

    known = suite.all_cases()
    out = {}
    for name in names:
        if config_path:
            out[name] = json.loads(load_config(config_path).model_dump_json())
        elif name in known:
            out[name] = suite.config_mapping(name)
        else:
            raise _user_error(f"{name}: not a suite case; give its config with --config")
    return out


# --------------------------------------------------------------------------- calibrate
def cmd_calibrate(args) -> int:
    import yaml

    from simwar.fit.replays import DEVICE_LATENCIES, fit_costs
    from simwar.harness import suite

    measured = load_measured(args.measured)
    bench = None
    if args.bench:
        try:
            bench = json.loads(Path(args.bench).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise _user_error(f"--bench {args.bench}: cannot read micro-benchmark JSON "
                              f"({e})") from None
        if not isinstance(bench, dict) or not isinstance(bench.get("primitives"), dict):
            raise _user_error(f"--bench {args.bench}: expected a JSON object with a "
                              f"'primitives' mapping (python -m simwar.harness.gpu_main --bench)")
    known = suite.cases()
    cpu_bound = {n: suite.config_mapping(n) for n in measured
                 if n in known and "-cpu" in n}
    costs = fit_costs(measured, bench, cpu_bound)
    unmeasured = [key for key in DEVICE_LATENCIES if key not in costs]
    if unmeasured:
        from simwar.config.schema import Costs

        kept = ", ".join(f"{k} {Costs.model_fields[k].default:g}" for k in unmeasured)
        print(f"simwar: warning: {', '.join(unmeasured)}: not timed by these replays and no "
              f"--bench given; left out of {args.output}, so a config that applies it keeps "
              f"its own figures (the defaults: {kept} µs)", file=sys.stderr)
    device = next((m.get("device") for m in measured.values() if m.get("device")), {})
    doc = {
        "format": "simwar.calibration",
        "version": CALIBRATION_FORMAT,
        "device": {k: device.get(k) for k in ("device", "capability", "driver", "torch", "cuda")},
        "spin": {k: device.get(k) for k in ("sleep_cycles_per_us", "sleep_base_us", "fill_us",
                                            "copy_us") if k in device},
        "fitted_from": {"cases": len(measured), "sources": [str(s) for s in args.measured]},
        "costs": costs,
    }
    if bench:
        doc["primitives"] = {k: round(v, 4) for k, v in bench.get("primitives", {}).items()}
        if "host_drift" in bench:
            doc["host_drift"] = _rounded(bench["host_drift"])
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.output, yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {args.output}: " + ", ".join(f"{k} {v:g}" for k, v in costs.items()))
    return 0


def _rounded(x):
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return round(x, 3) if isinstance(x, float) else x


# --------------------------------------------------------------------------- compare
def cmd_compare(args) -> int:
    from simwar.cli.common import costs_overrides
    from simwar.fit.replays import criteria, error_table, plot_compare, with_host_speed

    measured = load_measured(args.measured)
    configs = _case_configs(measured, args.config)
    costs = {k[len("costs."):]: v for k, v in costs_overrides(args.costs).items()}
    for name, cfg in configs.items():
        if args.host_speed == "measured" and name in measured:
            configs[name] = with_host_speed(cfg, measured[name], costs)
        else:
            cfg["costs"] = dict(cfg.get("costs", {}), **costs)
    table = error_table(configs, measured)
    if args.save_measured:
        doc = {"format": "simwar.measured_summaries", "version": 1,
               "description": args.description, "cases": measured}
        Path(args.save_measured).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.save_measured, json.dumps(doc, indent=1) + "\n")
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(args.csv, table.to_csv(index=False, float_format="%.4f").encode())
    if args.markdown:
        from simwar.fit.replays import markdown_table

        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.markdown, markdown_table(table))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ax_step, _ = plot_compare(table)
        ax_step.figure.tight_layout()
        ax_step.figure.savefig(args.plot, dpi=90)
        plt.close(ax_step.figure)
    c = criteria(table)
    print(f"{c['cases']} cases: step time |error| median {100 * c['step_rel_error_median']:.2f}%"
          f", max {100 * c['step_rel_error_max']:.2f}%; forward gap within max(25 µs, 10%) in "
          f"{c['fwd_gap_within_bound']}; launch-ahead |error| max "
          f"{c['launch_ahead_abs_error_max']:.3f}; race presence mismatches "
          f"{c['race_presence_mismatches']} ({c['racy_cases']} racy cases)")
    if "per_step_cases" in c:
        print(f"{c['per_step_cases']} cases with per-step figures: median per-step step-time "
              f"|error| {100 * c['per_step_rel_error_median_median']:.2f}% (median over cases)"
              f", {100 * c['per_step_rel_error_median_max']:.2f}% (worst case)")
    written = [args.csv] + [f for f in (args.plot, args.save_measured, args.markdown) if f]
    print(f"wrote {', '.join(written)}")
    return 0
