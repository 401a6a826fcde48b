"""Golden results of every shipped config: what a refactor must leave bit for bit unchanged.

``python tests/golden.py`` (re)writes ``tests/data/golden/*.json``; run it only on purpose,
when a change of results is intended and explained in its commit. ``tests/test_golden.py``
recomputes every entry and compares: the summary exactly (floats by ``repr``), the per-step
table and the race list by a digest of their bytes (every column's name, dtype and values),
the SimPy engine's Trace likewise, and the text ``simwar run`` prints.

Each config runs as shipped and in a stochastic variant (:data:`NOISY`: lognormal, uniform,
empirical and often-clipped normal durations and host costs), both executors.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "data" / "golden"

NOISY = {"steps": 300, "warmup_steps": 10,
         "cpu.schedule_us": {"dist": "lognormal", "mean": 900, "std": 300},
         "gpu.schedule_writes_us": {"dist": "uniform", "low": 100, "high": 400},
         "cpu.process_result_us": {"dist": "empirical", "values": [600, 800, 1500]},
         "cpu.ingest_us": {"dist": "normal", "mean": 20, "std": 40},
         "costs.host_call_us": {"dist": "normal", "mean": 2, "std": 3},
         "costs.cross_stream_us": {"dist": "uniform", "low": 0, "high": 30}}
#: the SimPy engine's trace is digested on a shorter run (the engine is the slow path)
TRACE_STEPS = {"steps": 120, "warmup_steps": 10}
ARRIVALS = {"steps": 400, "warmup_steps": 10,
            "workload": {"arrivals": {"rate_per_s": 300}, "max_batch": 64, "initial_batch": 4,
                         "output_tokens": {"dist": "uniform", "low": 16, "high": 128},
                         "graph_buckets": [8, 16, 32, 64]},
            "accept.tokens": {"dist": "empirical", "values": [1, 2, 3, 4, 5]}}
VARIANTS = {"shipped": {}, "noisy": NOISY}
#: extra variants for some configs only
EXTRA = {"dspark_fine_bimodal": {"arrivals": ARRIVALS}}
EXPLAIN_STEPS = 200


def _plain(x):
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return _plain(x.item())
    return x


def digest_columns(columns: dict) -> str:
    h = hashlib.sha256()
    for name in columns:
        arr = np.ascontiguousarray(np.asarray(columns[name]))
        h.update(name.encode())
        if arr.dtype == object:
            h.update(repr(arr.tolist()).encode())
        else:
            h.update(str(arr.dtype).encode())
            h.update(arr.tobytes())
    return h.hexdigest()


def digest_frame(frame) -> str:
    return digest_columns({c: frame[c].to_numpy() for c in frame.columns})


def digest_trace(trace) -> str:
    h = hashlib.sha256()
    for name in ("spans", "ops", "accesses", "markers"):
        h.update(digest_columns(getattr(trace, name).columns()).encode())
    h.update(repr(list(trace.strings)).encode())
    h.update(json.dumps(_plain(trace.meta), sort_keys=True).encode())
    return h.hexdigest()


def cli_text(args: list[str]) -> str:
    from simwar.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return f"exit {code}\n{out.getvalue()}"


def entry(path: Path, variant: str) -> dict:
    import simwar

    overrides = {**VARIANTS, **EXTRA.get(path.stem, {})}[variant]
    out = {}
    # tensor-parallel ranks: the fast engine is their one pass (executors/fast/ranks.py)
    for engine in ("fast", "simpy"):
        r = simwar.simulate(str(path), overrides, engine=engine)
        out[engine] = {"summary": _plain(r.summary), "steps": digest_frame(r.steps),
                       "races": digest_frame(r.races), "races_n": len(r.races)}
    short = {**overrides, **TRACE_STEPS}
    r = simwar.simulate(str(path), short, engine="simpy")
    out["trace"] = digest_trace(r.trace)
    sets = [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
    out["cli_run"] = cli_text(["run", str(path.relative_to(ROOT)), "--quiet", *sets])
    if variant == "shipped":
        out["cli_explain"] = cli_text(["explain", str(path.relative_to(ROOT)),
                                       f"--set=steps={EXPLAIN_STEPS}", "--json"])
    return out


def name_of(path: Path, variant: str) -> str:
    return f"{path.stem}.{variant}.json"


def main() -> int:
    import os

    os.chdir(ROOT)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for path in CONFIGS:
        for variant in {**VARIANTS, **EXTRA.get(path.stem, {})}:
            data = entry(path, variant)
            (GOLDEN / name_of(path, variant)).write_text(json.dumps(data, indent=1,
                                                                     sort_keys=True) + "\n")
            print("wrote", name_of(path, variant))
    return 0


if __name__ == "__main__":
    sys.exit(main())
