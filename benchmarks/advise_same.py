"""Whether ``advise`` answers the same in two source trees (a speed change must not move it).

    python benchmarks/advise_same.py --before DIR [--phases 3 12 50] [--configs configs/*.yaml]

For each shipped config (``configs/*.yaml``) and each
custom algorithm of ``bench_advise.py`` (``--phases``), runs :func:`simwar.study.advise.advise`
with its defaults (the screen and the confirming runs) in a fresh process of each tree, and
compares what ``simwar advise`` prints (``--json``'s document, and the text of
:func:`simwar.cli.advise.format_advice` with every candidate listed) byte for byte. Prints
one line per input (``same`` or ``DIFFERENT``, with the first differing line) and exits
non-zero on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_advise import config  # noqa: E402 (the benchmark's algorithms)

ANSWER = """
import json, sys
from simwar.cli.advise import format_advice
from simwar.study.advise import advise
arg = sys.argv[1]
cfg = json.loads(arg) if arg.startswith("{") else arg
a = advise(cfg)
print(json.dumps({"json": a.to_dict(), "text": format_advice(a, "CONFIG", top=10**6)},
                 indent=1, sort_keys=True))
"""


def answer(tree: Path, arg: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", ANSWER, arg], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        return "FAILED:\n" + out.stderr[-2000:]
    return out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the other source tree")
    ap.add_argument("--phases", type=int, nargs="*", default=[3, 12, 50])
    ap.add_argument("--configs", type=Path, nargs="*",
                    default=sorted((ROOT / "configs").glob("*.yaml")))
    args = ap.parse_args()
    inputs = [(str(p.relative_to(ROOT) if p.is_absolute() else p), str(p))
              for p in args.configs]
    inputs += [(f"custom-{n}", json.dumps(config(n))) for n in args.phases]
    differ = 0
    for name, arg in inputs:
        before, now = answer(args.before.resolve(), arg), answer(ROOT, arg)
        if before == now and not now.startswith("FAILED"):
            print(f"{name}: same ({len(json.loads(now)['json']['candidates'])} candidates)",
                  flush=True)
            continue
        differ += 1
        first = next((f"before: {a!r}\n    now:    {b!r}" for a, b in
                      zip(before.splitlines(), now.splitlines()) if a != b),
                     f"{len(before)} against {len(now)} characters")
        print(f"{name}: DIFFERENT\n    {first}", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
