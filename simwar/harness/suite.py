"""The harness suite: the cases replayed on the GPU and checked against the simulator.

Each case is a config mapping: a built-in algorithm, a barrier policy and a
regime, from the packaged default config:

- ``gpu``: the algorithm's forward at its built-in lengths with a fast host
  (CPU stages at a tenth of the default): GPU-bound, the host runs ahead, and
  without a barrier the next step's write overtakes the forward's shared
  reads (a racy case for every algorithm that reads late in its forward);
- ``cpu``: the forward at a fifth of its length with the default host work:
  CPU-bound, the GPU waits on the host each step.

Every algorithm × barrier × regime (4 × 4 × 2 = 32 cases), plus variants:
all phases eager (no graphs), the plan stream, the barrier at the loop top,
in-replay publish without external events (post-replay fallback) and the
unsound pre-replay fallback (racy under the fine barrier).

The workload cases (:func:`workload_cases`, :func:`write_workload_programs`) are a third
set, kept apart so that the constant cases' calibration tables stay as measured: DSPARK
under the fine, coarse and no barrier on batches that change every step (a bimodal
sequence alternating 12 small-batch, host-bound steps with 12 large-batch, device-bound
ones; a ramp 1 → 64 → 1; uniform 1..64 drawn per step), with host and device work that
scale with the batch and graphs captured per bucket (8, 16, 32, 64). Graph-phase
durations are a function of the bucket only and nothing is drawn but the batches, so one
captured graph per (phase, bucket) replays every launch of it exactly.

The CSAN matrix (:func:`csan_cases`, :func:`write_csan_programs`) is a
second, smaller set for ``simwar.harness.csan``: every algorithm × barrier
with all phases eager (PyTorch's CUDA sanitizer does not see graph replays),
plus unsafe variants, each written with simwar's own latent races in its
meta so that the GPU machine needs no simulator.

Imports: simwar's config and builder (run where simulation runs; the GPU
machine receives the built programs as JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

from simwar.api import build_program, simulate
from simwar.config import load_config
from simwar.config.algorithms import BUILTIN, builtin_phases
from simwar.core.files import write_text_atomic

BARRIERS = ("none", "coarse", "fine", "host_sync")
REGIMES = ("gpu", "cpu")
#: steps per regime: a host-paced (CPU-bound) step is shorter and its time varies with the
#: host's speed, so it runs longer to average over more of it (both about 1 s on the H200)
STEPS = {"gpu": 170, "cpu": 400}
WARMUP = 20
CPU_KEYS = ("ingest_us", "schedule_us", "prepare_us", "process_result_us")
CPU_DEFAULT = {"ingest_us": 100.0, "schedule_us": 900.0, "prepare_us": 300.0,
               "process_result_us": 800.0}


def _regime(algorithm: str, regime: str) -> dict:
    """Overrides (dotted keys) for a regime."""
    out: dict = {}
    if regime == "gpu":
        for k in CPU_KEYS:
            out[f"cpu.{k}"] = CPU_DEFAULT[k] / 10
    else:
        for k in CPU_KEYS:
            out[f"cpu.{k}"] = CPU_DEFAULT[k]
        for ph in builtin_phases(algorithm):
            for key in ("load_batch_us", "prep_us", "body_us"):
                if ph.get(key):
                    out[f"phases.{ph['name']}.{key}"] = round(ph[key] / 5, 3)
    return out


def case_overrides(algorithm: str, barrier: str, regime: str, **extra) -> dict:
    ov = {"steps": STEPS[regime], "warmup_steps": WARMUP, "algorithm": algorithm,
          "policy.barrier": barrier, "seed": 0}
    ov.update(_regime(algorithm, regime))
    ov.update(extra)
    return ov


def cases() -> dict[str, dict]:
    """Case name → dotted overrides of the packaged default config."""
    out: dict[str, dict] = {}
    for algorithm in BUILTIN:
        for barrier in BARRIERS:
            for regime in REGIMES:
                out[f"{algorithm}-{barrier}-{regime}"] = case_overrides(algorithm, barrier, regime)
    for algorithm in ("dspark", "eagle"):
        eager = {f"phases.{ph['name']}.graph": "eager" for ph in builtin_phases(algorithm)}
        for barrier, regime in (("fine", "gpu"), ("none", "gpu"), ("coarse", "cpu")):
            out[f"{algorithm}-{barrier}-{regime}-eager"] = case_overrides(
                algorithm, barrier, regime, **eager)
    out["dspark-fine-gpu-planstream"] = case_overrides("dspark", "fine", "gpu",
                                                       **{"policy.plan_stream": True})
    out["dspark-coarse-gpu-looptop"] = case_overrides("dspark", "coarse", "gpu",
                                                      **{"policy.placement": "loop_top"})
    out["dspark-fine-gpu-noexternal"] = case_overrides("dspark", "fine", "gpu",
                                                       **{"policy.external_events": False})
    out["dspark-fine-gpu-prereplay"] = case_overrides(
        "dspark", "fine", "gpu", **{"policy.external_events": False,
                                    "policy.in_replay_fallback": "pre_replay"})
    return out


# --------------------------------------------------------------------------- workloads
#: graph buckets of the workload cases (SGLang captures graphs for a list of batch sizes)
BUCKETS = [8, 16, 32, 64]
#: durations that scale with the batch (dotted keys). Small batches are host-bound: about
#: 2.4 ms of host work (plus the host API calls) against a 1.4 ms forward at bucket 8, and still
#: against 2.3 ms at bucket 16; larger ones are device-bound: at most 3.0 ms of host work against
#: 4.1 ms at bucket 32 and 7.8 ms at 64. So each step is clearly one or the other (by 0.4 ms or
#: more at the H200's host costs), and the flips are where the batch crosses 16 -> 17. The draft
#: at bucket 64 (4.5 ms) keeps verify's shared reads far behind the next step's writes, so that
#: without a barrier those writes clearly overtake them (a race, not a near miss)
SCALING = {
    "cpu.ingest_us": 100.0,
    "cpu.schedule_us": {"base": 1100.0, "per_seq": 4.0},
    "cpu.prepare_us": {"base": 500.0, "per_seq": 2.0},
    "cpu.process_result_us": {"base": 700.0, "per_seq": 4.0},
    "gpu.schedule_writes_us": {"base": 40.0, "per_seq": 4.0},
    "gpu.result_writes_us": {"base": 10.0, "per_seq": 1.0},
    "phases.draft.body_us": {"base": 40.0, "per_seq": 70.0},
    "phases.verify.body_us": {"base": 250.0, "per_seq": 43.0},
}
SMALL = [4, 5, 3, 6, 4, 5, 3, 4, 6, 5, 4, 3]
LARGE = [57, 49, 60, 52, 64, 55, 50, 58, 61, 49, 53, 56]
#: batch sources: one bimodal period (12 host-bound steps, 12 device-bound), a ramp
#: 1 -> 64 -> 1 (cycled), and uniform 1..64 drawn per step
SEQUENCES = {
    "bimodal": {"batch_sizes": SMALL + LARGE},
    "ramp": {"batch_sizes": list(range(1, 65)) + list(range(63, 1, -1))},
    "uniform": {"batch_size": {"dist": "uniform", "low": 1, "high": 64}},
}
WORKLOAD_BARRIERS = ("fine", "coarse", "none")
WORKLOAD_STEPS = 400
WORKLOAD_WARMUP = 24


def workload_cases() -> dict[str, dict]:
    """Case name → dotted overrides: DSPARK × (fine, coarse, none) × (bimodal, ramp, uniform)."""
    out: dict[str, dict] = {}
    for seq, source in SEQUENCES.items():
        for barrier in WORKLOAD_BARRIERS:
            ov = {"steps": WORKLOAD_STEPS, "warmup_steps": WORKLOAD_WARMUP,
                  "algorithm": "dspark", "policy.barrier": barrier, "seed": 0,
                  "accept.tokens": 3.2, **SCALING,
                  "workload": {**source, "graph_buckets": list(BUCKETS)}}
            out[f"dspark-{barrier}-{seq}"] = ov
    return out


def all_cases() -> dict[str, dict]:
    """The constant cases and the workload cases."""
    return {**cases(), **workload_cases()}


def write_workload_programs(directory: str | Path, names=None) -> list[Path]:
    """Build each workload case's Program and write ``<case>.json`` into ``directory``."""
    return write_programs(directory, names or list(workload_cases()))


def case_config(name: str, costs: dict | None = None):
    """The validated Config of case ``name`` (``costs``: a ``costs.*`` mapping to apply)."""
    table = all_cases()
    if name not in table:
        raise KeyError(name)
    ov = dict(table[name], name=name)
    for k, v in (costs or {}).items():
        ov[f"costs.{k}"] = v
    return load_config(None, ov)


def write_programs(directory: str | Path, names=None, steps: int | None = None,
                   warmup: int | None = None) -> list[Path]:
    """Build each case's Program and write ``<case>.json`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names or cases():
        cfg = case_config(name)
        if steps is not None:
            cfg = cfg.model_copy(update={"steps": steps, "warmup_steps": warmup or 0})
        program = build_program(cfg)
        path = directory / f"{name}.json"
        write_text_atomic(path, program.to_json())
        written.append(path)
    return written


def config_mapping(name: str) -> dict:
    """The case's full config as a plain mapping (to write next to results)."""
    return json.loads(case_config(name).model_dump_json())


# --------------------------------------------------------------------------- CSAN matrix
#: short runs: the sanitizer runs Python for every operator
CSAN_STEPS = 12
CSAN_WARMUP = 4


def _all_eager(algorithm: str) -> dict:
    return {f"phases.{ph['name']}.graph": "eager" for ph in builtin_phases(algorithm)}


def csan_cases() -> dict[str, dict]:
    """Case name → dotted overrides: every algorithm × barrier with all phases eager, plus
    unsafe variants (early publish, loop-top barrier with result writes, no barrier with the
    plan stream) and a few safe ones (plan stream, host block on the published lengths)."""
    out: dict[str, dict] = {}

    def add(name: str, algorithm: str, barrier: str, **extra) -> None:
        ov = case_overrides(algorithm, barrier, "gpu", **_all_eager(algorithm), **extra)
        ov.update({"steps": CSAN_STEPS, "warmup_steps": CSAN_WARMUP})
        out[name] = ov

    for algorithm in BUILTIN:
        for barrier in BARRIERS:
            add(f"{algorithm}-{barrier}-eager", algorithm, barrier)
    # early publish: the read-done record before the last in-graph-prep read of the table
    add("dspark-fine-eager-verify-pre-replay", "dspark", "fine",
        **{"phases.verify.read_ends": "pre_replay"})
    add("none-fine-eager-decode-pre-replay", "none", "fine",
        **{"phases.decode.read_ends": "pre_replay"})
    # ... or at a phase before the last reader (draft_extend reads after verify)
    add("eagle-fine-eager-publish-verify", "eagle", "fine", **{"policy.publish_phase": "verify"})
    # the barrier at the loop top: result writes of the same iteration are not ordered
    for barrier in ("coarse", "fine"):
        add(f"dspark-{barrier}-eager-loop-top", "dspark", barrier,
            **{"policy.placement": "loop_top", "gpu.result_writes_us": 50.0})
    add("none-coarse-eager-loop-top", "none", "coarse",
        **{"policy.placement": "loop_top", "gpu.result_writes_us": 50.0})
    # the plan stream: no barrier races, the fine barrier does not
    add("dspark-none-eager-planstream", "dspark", "none", **{"policy.plan_stream": True})
    add("dflash-none-eager-planstream", "dflash", "none", **{"policy.plan_stream": True})
    add("dspark-fine-eager-planstream", "dspark", "fine", **{"policy.plan_stream": True})
    # the host block on forward k-1's published lengths (a d2h stream gated on it)
    add("dspark-fine-eager-seqlens", "dspark", "fine", **{"policy.needs_cpu_seq_lens": True})
    return out


def csan_program(name: str, overrides: dict | None = None):
    """Case ``name``'s Program with simwar's latent races after warm-up in its meta:
    ``latent_races`` (access pairs), ``latent_race_buffers`` (sorted names) and
    ``latent_races_all`` (warm-up included)."""
    ov = dict(overrides if overrides is not None else csan_cases()[name], name=name)
    result = simulate(load_config(None, ov))
    warm = result.config.warmup_steps
    latent = result.hazards.since(warm).latent
    program = result.program
    program.meta.update({
        "latent_races": len(latent),
        "latent_race_buffers": sorted({r.buffer for r in latent}),
        "latent_races_all": len(result.hazards.latent),
    })
    return program


def write_csan_programs(directory: str | Path, names=None) -> list[Path]:
    """Write each CSAN case's Program (with simwar's verdict in its meta) as ``<case>.json``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    table = csan_cases()
    written = []
    for name in names or table:
        path = directory / f"{name}.json"
        write_text_atomic(path, csan_program(name, table[name]).to_json())
        written.append(path)
    return written
