"""``simwar harness``: build programs for the GPU harness, and replay them there.

``harness CONFIG... -o DIR`` builds each config's program and writes it as
``DIR/<name>.json`` (``--suite`` adds the committed suite's cases, ``--workloads`` the
varying-workload cases); with ``--replay`` (needs torch and a CUDA device) it also
replays each one on the GPU and writes ``DIR/<name>.trace.json.gz`` (the measured
Trace); ``--csan`` adds the CSAN matrix (all phases eager, 12 steps, simwar's latent
races in each program's meta) for ``python -m simwar.harness.csan DIR OUT_JSON``.

Imports: ``simwar.cli.common`` at the top; the builder, the config schema and the
harness inside :func:`command`, torch only with ``--replay``. Never another command's
module.
"""

from __future__ import annotations

import argparse

from simwar.cli.common import UserError, output_dir
from simwar.core.files import write_text_atomic

HELP = "build programs for the GPU harness (and replay them)"
DESCRIPTION = ("Write each config's Program as JSON; with --replay, also replay it on CUDA "
               "streams and write the measured Trace.")


def add_arguments(p: argparse.ArgumentParser) -> None:
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


def command(args) -> int:
    # lazy: start-up time of the CLI (the builder; the config schema loads pydantic)
    from simwar.api import build_program
    from simwar.config import load_config  # lazy: start-up time of the CLI
    from simwar.harness import suite  # lazy: start-up time of the CLI

    out = output_dir(args.out, "-o")
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
        raise UserError("harness: give at least one CONFIG, --suite, --workloads or --csan")
    out.mkdir(parents=True, exist_ok=True)  # only once there is something to write
    for name, program in programs.items():
        write_text_atomic(out / f"{name}.json", program.to_json())
    print(f"wrote {len(programs)} programs to {out}")
    if args.replay:
        try:
            # lazy: an optional dependency (simwar[gpu]), needed by --replay only
            import torch
        except ImportError:
            raise UserError("harness --replay: torch is not installed "
                            "(pip install simwar[gpu])") from None
        if not torch.cuda.is_available():
            raise UserError("harness --replay: no CUDA device")
        # lazy: the GPU side, for --replay only (the CUDA backend imports torch)
        from simwar.harness import make_plan, replay
        from simwar.harness.cuda import CudaBackend, calibrate_device  # lazy: the GPU side

        cal = calibrate_device()
        for name, program in programs.items():
            trace = replay(make_plan(program), CudaBackend(cal))
            trace.save(out / f"{name}.trace.json.gz")
            print(f"{name}: measured races {len(trace.meta['measured_races'])}")
    return 0
