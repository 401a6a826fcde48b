"""``simwar calibrate``: fit ``costs.*`` from measured harness runs into a calibration file.

``calibrate MEASURED... -o FILE`` fits the host and device costs from measured traces (a
directory or tar of ``*.trace.json.gz``) or measured-summary JSON files, plus
``--bench`` micro-benchmarks (:func:`simwar.fit.replays.fit_costs`), and writes a
versioned YAML that ``simwar run --costs FILE`` and ``simwar compare --costs FILE`` read.
A device latency neither the replays nor a benchmark timed is left out, with a warning.

Imports: ``simwar.cli.common`` and ``simwar.core.files`` at the top; yaml, the fit module,
the suite and the config schema inside :func:`command`. Never another command's module.
"""

from __future__ import annotations

import argparse
import sys

from simwar.cli.common import UserError, check_outputs, load_measured, output_path, read_json
from simwar.core.files import write_text_atomic

HELP = "fit costs.* from measured harness runs"
DESCRIPTION = ("Fit the config's host and device costs from measured traces or summaries and "
               "micro-benchmarks.")
#: the ``version`` of the calibration files written
CALIBRATION_FORMAT = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("measured", nargs="+",
                   help="trace dir/tar/file, or a measured-summary JSON (calibration/*.json)")
    p.add_argument("--bench", help="micro-benchmark JSON (python -m simwar.harness.gpu_main "
                                   "--bench)")
    p.add_argument("-o", "--output", required=True, help="calibration YAML to write")


def command(args) -> int:
    # lazy: start-up time of the CLI (yaml, pandas; the suite loads the config schema)
    import yaml

    from simwar.config.schema import Costs  # lazy: start-up time of the CLI
    from simwar.fit.replays import DEVICE_LATENCIES, fit_costs  # lazy: start-up time of the CLI
    from simwar.harness import suite  # lazy: start-up time of the CLI

    output_path(args.output, "-o")
    check_outputs([("measured input", m) for m in args.measured] + [("--bench", args.bench)],
                  [("-o", args.output)])
    measured = load_measured(args.measured)
    bench = None
    if args.bench:
        try:
            bench = read_json(args.bench, "micro-benchmark JSON")
        except UserError as e:
            raise UserError(f"--bench {e}") from None
        if not isinstance(bench, dict) or not isinstance(bench.get("primitives"), dict):
            raise UserError(f"--bench {args.bench}: expected a JSON object with a "
                            f"'primitives' mapping (python -m simwar.harness.gpu_main --bench)")
    known = suite.cases()
    cpu_bound = {n: suite.config_mapping(n) for n in measured
                 if n in known and "-cpu" in n}
    costs = fit_costs(measured, bench, cpu_bound)
    unmeasured = [key for key in DEVICE_LATENCIES if key not in costs]
    if unmeasured:
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
    write_text_atomic(args.output, yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {args.output}: " + ", ".join(f"{k} {v:g}" for k, v in costs.items()))
    return 0


def _rounded(x):
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return round(x, 3) if isinstance(x, float) else x
