"""The cost of an eager prefill's launches (``prefill.launches``) to the one-pass executor.

    python benchmarks/bench_prefill.py [--steps 5000] [--repeat 5] [--launches 1 4 8 16 32]

``configs/sglang_default_prefill.yaml`` (SGLang's default scheduling: prefill steps of their
own, most of the run's steps) run by ``simulate(engine="fast")`` end to end, arrivals
realized afresh each time (the sizes cache cleared), once per ``prefill.launches`` value,
**interleaved in one process**, best of ``--repeat``, process CPU time; and the same with
``scheduling.rule: sglang_mixed`` (one shape: every step mixed, the chunk's launches in each
step that prefills). Printed: CPU µs per step of each, each over its ``launches: 1`` run
(``ratio``), and the host ops of one prefill step (each launch adds a host dispatch and a
kernel launch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/sglang_default_prefill.yaml"
CODE = """
import json, time
import simwar.api as api
from simwar.config import load_config
from simwar.core.program import StepMarker
launches = {launches!r}
rules = ("sglang", "sglang_mixed")
cfgs = {{(rule, n): load_config({config!r}, {{"steps": {steps}, "scheduling.rule": rule,
                                             "prefill.launches": n}})
        for rule in rules for n in launches}}
def once(key):
    api._sizes_cache.clear()  # realize the arrivals afresh: that pass is the fast run
    c0 = time.process_time()
    api.simulate(cfgs[key], engine="fast")
    return time.process_time() - c0
def ops_of_a_prefill_step(cfg):
    sz = api.resolve_sizes(cfg)
    k = next(i for i, c in enumerate(sz.shape.tolist()) if c == 1 and i > 2)
    prog = api.build_program(cfg)
    step, n = -1, 0
    for op in prog.ops:
        if isinstance(op, StepMarker):
            step = op.step
        elif step == k:
            n += 1
    return n
for key in cfgs:
    once(key)  # warm-up (compiles, allocators)
best = {{key: float("inf") for key in cfgs}}
for _ in range({repeat}):
    for key in cfgs:  # interleaved: drifts of the machine hit every run alike
        best[key] = min(best[key], once(key))
out = {{}}
for rule in rules:
    for n in launches:
        out[f"{{rule}} launches={{n}}"] = {{
            "us_per_step": best[(rule, n)] / {steps} * 1e6,
            "ratio": best[(rule, n)] / best[(rule, launches[0])]}}
out["host_ops_of_a_prefill_step"] = {{n: ops_of_a_prefill_step(cfgs[("sglang", n)])
                                     for n in launches}}
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--launches", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()}", file=sys.stderr)
    code = CODE.format(config=CONFIG, steps=args.steps, repeat=args.repeat,
                       launches=args.launches)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    print(json.dumps(json.loads(proc.stdout.strip().splitlines()[-1]), indent=1))
    print(f"load average after {os.getloadavg()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
