"""The skeleton both mini-server checkers share: the data, the sweep's fit, the verdict.

:mod:`lab.server_check` (decode loads and barriers) and :mod:`lab.prefill_check` (prompts,
overlap on and off) read the folder ``python -m lab.server OUT`` wrote on the GPU machine
(committed under ``tests/data/server``), predict from the same fit of its sweeping-load
capture (:func:`sweep`), measure each repeat's host speed against the sweep's
(:func:`host_speed`: :mod:`lab.server_check` judges only the repeats that ran at it,
:func:`judged_repeats`, as ``lab.prefill_check --as-captured`` does; by default
:mod:`lab.prefill_check` predicts each repeat at its own, :mod:`lab.host_speed`), ask the
fit each case as a what-if (:func:`what_if`) and hold each figure, measured against
predicted, to a bound (:func:`row`), in a Markdown table or JSON from one command line
(:func:`command`). Which cases, the what-if of each, the figures and
their bounds are each checker's.

Runs where simulation runs (simwar's full stack), not on the GPU machine: it reads the
captures through :mod:`simwar.capture`, never through :mod:`simwar.harness`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simwar.capture.open import open_capture
from simwar.fit.from_capture import ModelFit, fit_model

#: the committed captures and measurements (a source checkout's; elsewhere pass the folder)
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "server"
FIT_CAPTURE = "fit_ramp_profiled.kineto.json.gz"
FIT_TIMED = "fit_ramp.metrics.json"
#: the mini-server's admission cap
MAX_BATCH = 64
#: how simwar reads the mini-server's captures: SGLang's preset, each step's decode batch and
#: shape from the range around its forward (``lab.server.step_range``): ``decode bs=<B>``,
#: ``prefill bs=<N> toks=<T>`` (no decode batch: N requests in the chunk), ``mixed bs=<B>
#: toks=<T> reqs=<N>`` (B decoding; N requests in the chunk, read as the shape's ``context``
#: requests, as vLLM's names count them; captures before ``reqs`` do not name N). Captures
#: written before the shapes named a mixed step ``decode bs=<B>`` with
#: a ``prefill`` range inside: they read as decode steps, as the preset read them. The
#: ``prefill`` range's kernels are a phase of their own (``chunk``), not the preset's default
#: phase (``forward``, where load_batch's copy is): a step that prefills then has another
#: structure than a decode step, and the fit's phase table is the decode steps' alone (with
#: the default phase, a mixed step's prefill became ``forward``'s 175 µs per request). The
#: receive's range (``recv reqs=<N> toks=<T>``, ``lab.server_requests.receive_range``:
#: ``cpu.receive_us``, :mod:`simwar.fit.receive`) is read by the preset's ``receive``
#: pattern, not named here: a preset's entry that matches nothing is dropped, so the runs
#: written before the range (up to ``shapes/run9``) fit as before, where a key of this mapping
#: that matched nothing would refuse them
SERVER_MAPPING = {
    "preset": "sglang",
    "phases": {"^draft$": "draft", "^verify$": "verify", "^sample$": "sample",
               "^prefill$": "prefill"},
    "batch": r"^(?:decode|mixed) bs=(\d+)(?: toks=\d+)?(?: reqs=\d+)?$",
    "shape": (r"^(?P<mode>decode|prefill|mixed) bs=(?P<batch>\d+)(?: toks=(?P<tokens>\d+))?"
              r"(?: reqs=(?P<context>\d+))?$")}
#: a repeat whose host ran this much slower than the sweep's (its unpadded host work per step
#: against the sweep's at the same batch) is reported, not judged: the fit knows one host speed
HOST_SPEED_MAX = 1.15


class ServerDataError(ValueError):
    """The folder lacks what the comparison needs; the message says what."""


def read_metrics(path: Path) -> dict:
    """A metrics file, ``.json`` or gzipped ``.json.gz`` (as the server's run is committed)."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def metrics_file(folder: Path, name: str) -> Path | None:
    """``folder/name`` or its gzipped ``name.gz``, whichever exists (None: neither)."""
    for path in (folder / name, folder / f"{name}.gz"):
        if path.exists():
            return path
    return None


def load_repeats(folder: Path, pattern: re.Pattern, keys: tuple[str, ...]
                 ) -> dict[tuple[str, ...], list[dict]]:
    """The metrics files whose names match ``pattern`` (its groups ``keys`` name the case, its
    group ``r`` the repeat): case -> the repeats' metrics, in repeat order."""
    out: dict[tuple[str, ...], list[tuple[int, dict]]] = {}
    for path in sorted(folder.glob("*.metrics.json*")):
        m = pattern.match(path.name)
        if m is not None:
            out.setdefault(tuple(m[k] for k in keys), []).append((int(m["r"]),
                                                                  read_metrics(path)))
    return {k: [m for _, m in sorted(v, key=lambda x: x[0])] for k, v in sorted(out.items())}


def output_tokens(text: str):
    """A case's ``output_tokens`` (``"16..128"`` or ``"64"``) as a workload length."""
    lo, _, hi = str(text).partition("..")
    lo, hi = int(lo), int(hi or lo)
    return lo if lo == hi else {"dist": "uniform", "low": lo, "high": hi}


def unprofiled_step_us(timed: dict) -> dict[int, float] | float:
    """The un-profiled sweep's step time per graph bucket (its mean without per-bucket
    figures): what ``--unprofiled-step-us`` rescales the fit's device and host time to."""
    per = {int(b): float(v["step_us_mean"]) for b, v in (timed.get("per_bucket") or {}).items()
           if v.get("step_us_mean") is not None and v.get("steps", 0) > 0}
    return dict(sorted(per.items())) if per else float(timed["step_us_mean"])


def _capture(folder: Path) -> Path:
    capture = folder / FIT_CAPTURE
    if not capture.exists():
        raise ServerDataError(f"{capture}: not found (the mini-server's sweeping-load capture: "
                              f"python -m lab.server OUT --suite fit,loads)")
    return capture


def fit_sweep(folder: Path, keep_profiler_cost: bool = False
              ) -> tuple[ModelFit, Path | None, dict[int, float] | float | None]:
    """``(fit, timed, unprofiled)``: the sweeping capture's fit
    (:class:`simwar.fit.from_capture.ModelFit`: the profiler's host cost subtracted by the
    capture's event counts unless ``keep_profiler_cost``), rescaled to the un-profiled
    sweep's step time per bucket; the un-profiled sweep's path (None if absent); the step
    times used."""
    capture = _capture(folder)
    cap = open_capture(capture, preset="sglang")
    timed = metrics_file(folder, FIT_TIMED)
    unprofiled = None
    if timed is not None:
        unprofiled = unprofiled_step_us(read_metrics(timed)["summary"])
    fit = fit_model(cap, capture=capture.name, unprofiled_step_us=unprofiled,
                    profiler_cost=not keep_profiler_cost)
    return fit, timed, unprofiled


@dataclass(frozen=True)
class Sweep:
    """What a checker predicts from: the measured cases and the sweep's fit."""

    cases: dict[tuple[str, ...], list[dict]]
    fit: ModelFit
    #: the un-profiled sweep's step times the fit was rescaled to (None: not rescaled)
    unprofiled: dict[int, float] | float | None
    #: the sweep's unpadded host work per step against the batch (:func:`host_line`)
    line: tuple[float, float] | None


def sweep(folder: Path, pattern: re.Pattern, keys: tuple[str, ...], what: str,
          keep_profiler_cost: bool = False) -> Sweep:
    """The cases of ``folder`` whose files match ``pattern`` (``what`` says what they are,
    in the error when there is none) and the sweeping capture's fit (:func:`fit_sweep`)."""
    _capture(folder)
    cases = load_repeats(folder, pattern, keys)
    if not cases:
        raise ServerDataError(f"{folder}: no {what}")
    fit, timed, unprofiled = fit_sweep(folder, keep_profiler_cost)
    line = host_line(read_metrics(timed)) if timed is not None else None
    return Sweep(cases, fit, unprofiled, line)


def measured_steps(metrics: dict) -> slice:
    """A run's measured steps: from its warm-up to the second-last (a step time needs a
    successor), as the server's summary and the simulator take them."""
    s = metrics.get("summary", {})
    n = s["steps"] if "steps" in s else len(metrics["steps"]["batch"])
    return slice(int(s.get("warmup", 0)), int(n) - 1)


def finished_requests(metrics: dict) -> np.ndarray:
    """Per request: whether the step of its last token is a measured one (the simulator's
    rule for the requests its figures take)."""
    steps = measured_steps(metrics)
    fin = np.asarray(metrics["requests"]["finish_step"], dtype=np.int64)
    return (fin >= steps.start) & (fin < steps.stop)


def _unpadded(metrics: dict, decode_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per measured step with a batch: ``(batch, host work the server does not pad)``; with
    ``decode_only``, only the steps that prefill nothing (a prefill's launch lengthens
    them)."""
    st = metrics.get("steps")
    if not st or "t_barrier_us" not in st:
        return np.zeros(0), np.zeros(0)
    steps = measured_steps(metrics)
    batch = np.asarray(st["batch"], dtype=float)[steps]
    other = (np.asarray(st["t_barrier_us"], dtype=float)
             - np.asarray(st["t_batch_us"], dtype=float))[steps]
    ok = np.isfinite(other) & (batch > 0)
    if decode_only:
        ok &= np.asarray(st["prefill_tokens"])[steps] == 0
    return batch[ok], other[ok]


def rising_line(x, y) -> tuple[float, float]:
    """``(a, b)``: ``y = a + b x`` by least squares, or the mean and 0 where that line falls:
    no host work shrinks as the step holds more requests, so a falling line says the host's
    speed moved with the batch during the run (the tenth shapes run's capture: 1.5-2x slower
    for the 40 steps whose batch was 1-3), and extrapolated to larger batches it makes every
    repeat's host look several times slower (the rule of simwar's fit,
    :func:`simwar.fit.affine.fit_sized`)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    b, a = np.polyfit(x, y, 1) if np.ptp(x) else (0.0, float(np.mean(y)))
    if b < 0:
        return float(np.mean(y)), 0.0
    return float(a), float(b)


def host_line(timed: dict) -> tuple[float, float] | None:
    """``(a, b)``: the sweep's unpadded host work per step (prepare, launch and barrier: the
    host work the server does not pad to a time target) as ``a + b x batch``, least squares
    over its measured steps; None without per-step arrays."""
    x, y = _unpadded(timed)
    if len(x) < 3 or np.ptp(x) == 0:
        return None
    return rising_line(x, y)


def host_speed(metrics: dict, line: tuple[float, float] | None,
               decode_only: bool = False) -> float:
    """How much slower the repeat's host ran than the sweep's (1: the same; NaN: unknown):
    its unpadded host work over the sweep's line at the same batches (``decode_only``: on
    the steps that prefill nothing)."""
    x, y = _unpadded(metrics, decode_only)
    if line is None or not len(x):
        return math.nan
    return float(y.sum() / (line[0] + line[1] * x).sum())


def judged_repeats(repeats: list[dict], line: tuple[float, float] | None,
                   decode_only: bool = False) -> tuple[list[float], list[dict]]:
    """``(speeds, judged)``: each repeat's :func:`host_speed`, and the repeats judged (those
    at most :data:`HOST_SPEED_MAX` times slower, or all of them when none is)."""
    speeds = [host_speed(r, line, decode_only) for r in repeats]
    judged = [r for r, v in zip(repeats, speeds) if not v > HOST_SPEED_MAX] or repeats
    return speeds, judged


def what_if(fit_config: dict, metrics: dict, workload: dict, default_steps: int,
            prefill: dict | None = None, overlap: bool | None = None) -> dict:
    """The overrides that turn the fitted config into one measured case: its ``workload``
    (with the fit's graph buckets), its ``prefill`` section and loop (``overlap``) where
    given, its barrier, accepted tokens and length (``default_steps`` where the case does not
    say; the warm-up a tenth of it where the case does not say)."""
    case = metrics["case"]
    buckets = (fit_config.get("workload") or {}).get("graph_buckets")
    if buckets:
        workload["graph_buckets"] = list(buckets)
    out = {"workload": workload}
    if prefill is not None:
        out["prefill"] = prefill
    out["policy.barrier"] = case.get("barrier", "fine")
    if overlap is not None:
        out["policy.overlap"] = overlap
    steps = int(case.get("steps", default_steps))
    warm = case.get("warmup")
    return {**out, "accept.tokens": float(metrics.get("accept_tokens", 1.0)),
            "steps": steps, "warmup_steps": steps // 10 if warm is None else int(warm)}


def mean_spread(values: list[float]) -> tuple[float, float]:
    """The repeats' mean (NaN: none) and spread, max - min (0 for one repeat)."""
    return (float(np.mean(values)) if values else math.nan,
            float(np.ptp(values)) if len(values) > 1 else 0.0)


def row(measured: float, predicted: float, error: float, bound: float | None,
        spread: float = 0.0) -> dict:
    """One figure: measured (the repeats' mean, and their ``spread``), predicted, the error,
    and whether it is within ``bound`` (None: reported, not judged)."""
    return {"measured": measured, "spread": spread, "predicted": predicted, "error": error,
            "bound": bound,
            "ok": None if bound is None else bool(math.isfinite(error) and abs(error) <= bound)}


def relative_row(measured: float, predicted: float, bound: float | None,
                 spread: float = 0.0) -> dict:
    """:func:`row` with the error relative to the measured figure."""
    error = (predicted - measured) / measured if measured else math.nan
    return row(measured, predicted, error, bound, spread)


def pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:+.1f}%"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def command(argv: list[str] | None, prog: str, description: str,
            evaluate: Callable[..., dict], markdown: Callable[[dict], str],
            status_is_verdict: bool, flags: dict[str, tuple[str, str]] | None = None) -> int:
    """A checker's command line: ``[FOLDER] [--json] [--keep-profiler-cost]`` and the
    checker's own ``flags`` (``--flag``: (``evaluate``'s keyword it sets True, its help));
    exit status 2 when the folder lacks something, else (``status_is_verdict``) 1 when a
    figure misses its target, 3 when none misses but some were not predicted (the result's
    ``not_predicted``: the verdict is incomplete), or 0."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("folder", type=Path, nargs="?", default=DEFAULT_DIR)
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument("--keep-profiler-cost", action="store_true",
                    help="fit the capture's host times with the profiler's own cost kept "
                         "(simwar import --fit --keep-profiler-cost; the tables before it "
                         "was subtracted)")
    for flag, (key, text) in (flags or {}).items():
        ap.add_argument(flag, dest=key, action="store_true", help=text)
    args = ap.parse_args(argv)
    extra = {key: getattr(args, key) for key, _ in (flags or {}).values()}
    try:
        result = evaluate(args.folder, keep_profiler_cost=args.keep_profiler_cost, **extra)
    except ServerDataError as e:
        print(f"simwar: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1, default=str) if args.json else markdown(result))
    if status_is_verdict and not result["ok"]:
        return 1
    return 3 if status_is_verdict and result.get("not_predicted") else 0
