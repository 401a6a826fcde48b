"""What several ``simwar`` commands share, and nothing else.

- :class:`UserError`, the one error type a command raises for a mistake its user can fix
  (``simwar.cli.app.main`` prints it as one line);
- the costs files that ``run`` and ``compare`` read (:func:`costs_file_overrides`,
  :func:`costs_overrides`);
- the numbers and stall lines that ``run`` and ``import`` print (:func:`num`,
  :func:`run_label`, :func:`stall_lines`, :func:`bucket_lines`), the races line of
  ``import`` and ``races`` (:func:`race_line`), and :func:`clip_text` of ``explain`` and
  ``advise``'s tables;
- the picture options of ``run`` and ``plot``: :func:`parse_window` (``--steps-window``) and
  :func:`save_figure`;
- the output rule of every command that writes a file: :func:`output_path` (a file name
  checked before anything runs: not a directory, not a device, in a directory that exists;
  simwar never creates the directory of an output file, only an output directory such as
  ``sweep --out``) and :func:`check_outputs` (no output is one of the command's inputs or
  another of its outputs);
- :func:`is_sweep_file` (``validate``, ``show``), :func:`load_measured` (``calibrate``,
  ``compare``), and a sweep's results table with its ``--where`` filters
  (:func:`read_results`, :func:`filter_rows`: ``plot``, ``results``);
- :func:`start_up`, the garbage collector's rule for a command's start-up;
- :func:`work_bar`, the progress bar of ``explain``'s and ``import --fit``'s walks over a
  capture's steps (on a terminal only).

A leaf of the command line: the command modules import from here, never from each other.

Imports: the standard library, :mod:`simwar.core.collector` and :mod:`simwar.core.files` at
the top; the config schema, the sweep and fit modules, tqdm and matplotlib inside the
functions that need them, so that ``simwar --help`` and a command's argument checks load
none of them. Never a command's module.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

from simwar.core.collector import gc_off
from simwar.core.files import NotAFileError, write_bytes_atomic, write_target

__all__ = ["UserError", "costs_file_overrides", "costs_overrides", "read_costs_file", "num",
           "run_label", "stall_lines", "bucket_lines", "race_line", "clip_text", "parse_window",
           "output_path",
           "check_outputs", "save_figure", "is_sweep_file", "load_measured", "RESULTS_FILE",
           "results_file", "read_results", "filter_rows", "work_bar", "BAR_DELAY_S"]


class UserError(Exception):
    """An error the user can fix; printed as one line."""


# --------------------------------------------------------------------------- costs files
#: the top-level keys a --costs file may set: host and device costs, and per-phase durations
#: by phase name (what ``simwar import --fit-costs`` writes)
COSTS_FILE_KEYS = ("costs", "phases")
#: keys a ``simwar calibrate`` file carries to describe itself; they set nothing
CALIBRATION_INFO_KEYS = ("format", "version", "device", "spin", "fitted_from", "primitives",
                         "host_drift")


def read_costs_file(path: str, option: str = "--costs") -> tuple[dict, list[dict]]:
    """``(costs, phase entries)`` of a costs file; a key it would not use is an error."""
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import ConfigError, read_yaml

    try:
        data = read_yaml(path)
    except ConfigError as e:
        raise UserError(f"{option} {e}") from None
    where = f"{option} {path}"
    info = CALIBRATION_INFO_KEYS if data.get("format") == "simwar.calibration" else ()
    for key in data:
        if key not in COSTS_FILE_KEYS and key not in info:
            raise UserError(f"{where}: {key}: not used (a costs file sets 'costs' and "
                            f"'phases' only)")
    if not any(key in data for key in COSTS_FILE_KEYS):
        raise UserError(f"{where}: expected a 'costs' mapping or a 'phases' list")
    costs = data.get("costs", {})
    if not isinstance(costs, dict):
        raise UserError(f"{where}: costs: expected a mapping of cost names to µs")
    phases = data.get("phases", [])
    if not isinstance(phases, list):
        raise UserError(f"{where}: phases: expected a list of phases, each with a 'name'")
    for i, entry in enumerate(phases):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise UserError(f"{where}: phases.{i}: expected a mapping with a 'name'")
    return costs, phases


def costs_overrides(path: str | None) -> dict:
    """``{costs.KEY: value}`` of a costs file, for commands that apply costs only."""
    if not path:
        return {}
    costs, phases = read_costs_file(path)
    if phases:
        raise UserError(f"--costs {path}: phases: only costs apply here (each case keeps its "
                        f"own phases)")
    return {f"costs.{k}": v for k, v in costs.items()}


def costs_file_overrides(path: str, phase_names: list[str]) -> list:
    """The overrides of a costs file for a config whose phases are ``phase_names``."""
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import Override

    costs, phases = read_costs_file(path)
    origin = f"--costs {path}"
    items = [Override(f"costs.{k}", v, origin) for k, v in costs.items()]
    for i, entry in enumerate(phases):
        name = entry["name"]
        if name not in phase_names:
            raise UserError(f"{origin}: phases.{i}.name: '{name}' is not a phase of the config "
                            f"({', '.join(phase_names)})")
        items += [Override(f"phases.{name}.{k}", v, origin) for k, v in entry.items()
                  if k != "name"]
    return items


# --------------------------------------------------------------------------- printing
def num(value, spec: str = ".1f") -> str:
    """``format(value, spec)``, never ``-0.0`` (a tiny negative rounds to plain zero)."""
    text = format(value, spec)
    if text.startswith("-") and not any(c in "123456789" for c in text):
        text = text[1:]
    return text


def start_up():
    """A command's start-up (its imports, its config's validation): the cyclic garbage
    collector is off while it runs, and what it made is frozen after it (``gc.freeze``: left
    out of later collections until a run's :func:`~simwar.core.collector.gc_paused`
    unfreezes everything). Nearly everything a start-up makes lives until the exit
    (modules, classes, the config), so a collection during it frees next to nothing.
    :func:`main <simwar.cli.app.main>` freezes everything again before the process exits
    (the interpreter's last collection would walk it all), or, called with its arguments (in
    a process that goes on after it), unfreezes it."""
    return gc_off(freeze_after=True)


def run_label(name: str, overrides: list) -> str:
    """The config's name, followed by what the command line changed in it."""
    changed = list(dict.fromkeys(o.origin for o in overrides if o.key != "name"))
    return f"{name} [{', '.join(changed)}]" if changed else name


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and value == value and abs(value) != float("inf")


def bucket_lines(by_bucket: dict) -> list[str]:
    """The per graph bucket table of ``run`` and ``import`` (a summary's ``by_bucket``): the
    gap before each forward and the GPU idle of the same window, which end with it."""
    f = num
    lines = ["  per graph bucket    bucket  steps  step µs  gap before  GPU idle  CPU blocked"
             "  launch lead"]
    for b, v in by_bucket.items():
        lines.append(f"                      {b:>6}  {v['steps']:>5}  {f(v['step_us_mean']):>7}"
                     f"  {f(v['fwd_gap_us_mean']):>10}  {f(v['gpu_idle_us_mean']):>8}"
                     f"  {f(v['cpu_blocked_us_mean']):>11}  {f(v['launch_lead_us_mean']):>11}")
    return lines


def stall_lines(s: dict) -> list[str]:
    """The stall figures of a summary (simulated or measured), one line each."""
    f = num
    blocked = ", ".join(f"{k[len('cpu_blocked_'):-len('_us_mean')]} {f(v)}"
                        for k, v in s.items()
                        if k.startswith("cpu_blocked_") and k.endswith("_us_mean")
                        and k != "cpu_blocked_us_mean" and v > 0)
    return [
        f"  step time           mean {f(s['step_us_mean'])} µs   p50 {f(s['step_us_p50'])}"
        f"   p99 {f(s['step_us_p99'])}",
        f"  forward             {f(s['fwd_us_mean'])} µs; gap before it "
        f"{f(s['fwd_gap_us_mean'])} µs",
        f"  GPU idle (forward)  {f(s['gpu_idle_us_mean'])} µs/step "
        f"(waiting on a dependency {f(s['gpu_idle_dep_us_mean'])}, "
        f"on the host {f(s['gpu_idle_host_us_mean'])}); busy "
        + (f"{f(100 * s['gpu_busy_fraction'])}%" if _finite(s.get('gpu_busy_fraction'))
           else "n/a (the steps take no time)"),
        f"  CPU blocked         {f(s['cpu_blocked_us_mean'])} µs/step {blocked}".rstrip(),
        f"  launch lead         mean {f(s['launch_lead_us_mean'])} µs; run-ahead fraction "
        f"{f(s['run_ahead_fraction'], '.3f')}",
        f"  launch-ahead depth  mean {f(s['launch_ahead_mean'], '.3f')}; histogram "
        + ", ".join(f"{k}: {f(v, '.2f')}" for k, v in s["launch_ahead_hist"].items()),
    ]


def race_line(s: dict) -> str:
    """A capture's latent races in one line (``simwar import``'s ``races`` line, ``simwar
    races``' first); ``s``: :meth:`simwar.capture.accesses.CaptureRaces.summary`."""
    mapped = ", ".join(s["mapped_buffers"])
    if not s["writes"] or not s["reads"]:
        missing = "writes" if not s["writes"] else "reads"
        return (f"not checked: no device op {missing[:-1]}s a mapped buffer ({missing}: in the "
                f"mapping)")
    where = f"{s['reads']} reads and {s['writes']} writes of {mapped} mapped"
    if not s["latent"]:
        return f"0 latent ({where})"
    return (f"{s['latent']} latent, {s['observed']} also observed overlapping (in {s['steps']} "
            f"steps; {where})")


def clip_text(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, the last one an ellipsis when it was cut."""
    return text if len(text) <= n else text[:n - 1] + "…"


# --------------------------------------------------------------------------- pictures
def parse_window(text: str, steps: int) -> tuple[int, int]:
    """``--steps-window A:B`` -> (A, B), with 0 <= A <= B < steps."""
    parts = text.split(":")
    try:
        a, b = (int(p) for p in parts)
    except ValueError:
        raise UserError(f"--steps-window: expected A:B (two step numbers), got '{text}'") from None
    if not 0 <= a <= b < steps:
        raise UserError(f"--steps-window: expected 0 <= A <= B < {steps} (the run's steps), "
                        f"got '{text}'")
    return a, b


def output_path(path: str, option: str, image: bool = False) -> Path:
    """The file ``option`` writes, checked before anything runs: a new file in a directory
    that exists, a regular file (or a link to one), or a stream (a FIFO, ``/dev/null``, the
    process's own stdout or stderr: :func:`simwar.core.files.write_target`, the rule every
    write follows); for an image, a name whose suffix matplotlib can render. An empty
    path, or one ending in ``/`` (a directory's name), names no file."""
    if not path:
        raise UserError(f"{option}: an empty path (expected the name of a file to write)")
    if path.endswith(("/", os.sep)):
        raise UserError(f"{option} {path}: ends in / (a directory's name; expected the name "
                        f"of a file to write)")
    out = Path(path)
    try:
        write_target(out)
    except IsADirectoryError:
        raise UserError(f"{option} {path}: is a directory (expected the name of a file to "
                        f"write)") from None
    except FileNotFoundError as e:
        raise UserError(f"{option} {path}: directory {e.filename} does not exist") from None
    except NotAFileError as e:
        raise UserError(f"{option} {path}: {e.strerror}") from None
    except OSError as e:  # a link loop, no permission to look
        raise UserError(f"{option} {path}: {e.strerror or e}") from None
    if image:
        # lazy: start-up time of the CLI (matplotlib)
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        kinds = FigureCanvasAgg.get_supported_filetypes()
        if out.suffix.lstrip(".").lower() not in kinds:
            raise UserError(f"{option} {path}: expected an image file name ending in "
                            f"{', '.join('.' + k for k in sorted(kinds))}")
    return out


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (links and spellings resolved; a new path compares by
    where it would be created)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return os.path.realpath(a) == os.path.realpath(b)


def _is_stream(path: str) -> bool:
    try:
        return write_target(path)[1] != "replace"
    except OSError:
        return False


def check_outputs(inputs, outputs) -> None:
    """Refuse, naming both, an output that is one of the command's inputs or another output.

    ``inputs``: ``(what, path)`` pairs (``("config", "cfg.yaml")``), ``outputs``:
    ``(option, path)`` pairs (``("--trace", "t.json")``); a None or empty path is skipped.
    Streams (``/dev/null``, stdout) are never refused: writing one overwrites nothing.
    """
    ins = [(what, str(p)) for what, p in inputs if p]
    outs = [(opt, str(p)) for opt, p in outputs if p and not _is_stream(str(p))]
    for i, (option, out) in enumerate(outs):
        for what, src in ins:
            if _same_file(out, src):
                same = "" if out == src else f" ({out} and {src} are one file)"
                raise UserError(f"{option} {out}: is the {what} {src}{same}; simwar never "
                                f"overwrites its input: write to another file")
        for other, earlier in outs[:i]:
            if _same_file(out, earlier):
                raise UserError(f"{option} {out}: the same file as {other} {earlier}; give "
                                f"each output its own file")


def save_figure(fig, out: Path) -> None:
    """Render ``fig`` (110 dpi, the format of ``out``'s suffix) and write it whole."""
    # lazy: start-up time of the CLI (matplotlib)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    image = io.BytesIO()  # rendered first, then written whole: a failed save leaves nothing
    fig.savefig(image, format=out.suffix.lstrip(".").lower(), dpi=110)
    write_bytes_atomic(out, image.getvalue())


# --------------------------------------------------------------------------- inputs
#: a sweep directory's results table (``simwar plot``, ``simwar results``)
RESULTS_FILE = "results.parquet"


def results_file(path: str) -> Path:
    """The results table ``plot`` and ``results`` read: ``DIR/results.parquet``, or the file."""
    p = Path(path)
    return p / RESULTS_FILE if p.is_dir() else p


def read_results(path: str):
    """A sweep's results table from its directory or the table file itself."""
    # lazy: start-up time of the CLI (pandas)
    import pandas as pd

    p = results_file(path)
    if Path(path).is_dir():
        if not p.exists():
            raise UserError(f"{path}: no {RESULTS_FILE} here (run `simwar sweep SWEEP.yaml "
                            f"--out {path}` first)")
    elif not p.exists():
        raise UserError(f"{path}: no such sweep directory or results file")
    try:
        if p.suffix == ".csv":
            return pd.read_csv(p)
        return pd.read_parquet(p)
    except (OSError, ValueError) as e:  # corrupt or foreign (Arrow errors subclass these)
        raise UserError(f"{p}: cannot read a results table ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else 'unreadable'})") from None


def filter_rows(df, items: list[str]):
    """The rows of ``df`` that every ``--where KEY=VALUE`` item keeps."""
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import parse_override

    for item in items:
        key, value = parse_override(item, "--where")
        if key not in df.columns:
            raise UserError(f"--where {item}: no column '{key}'")
        col = df[key]
        keep = col == value
        if not keep.any():  # tables store some values as text: compare as text too
            keep = col.astype(str) == str(value)
        df = df[keep]
        if df.empty:
            raise UserError(f"--where {item}: no rows match")
    return df


def output_dir(path: str, option: str) -> Path:
    """The directory ``option`` writes into (made if missing), checked before anything
    runs: not empty (``''`` would be the working directory, unasked), not a file."""
    if not path:
        raise UserError(f"{option}: an empty path (expected the name of a directory to "
                        f"write into)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{option} {path}: exists and is not a directory")
    return Path(path)


def is_sweep_file(path: str) -> bool:
    """Whether the YAML file at ``path`` is a sweep (rather than a config)."""
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import read_yaml
    from simwar.study.sweeps import is_sweep_mapping  # lazy: start-up time of the CLI

    return is_sweep_mapping(read_yaml(path))


def read_json(path: str | Path, what: str) -> object:
    """The JSON document at ``path``, or a :class:`UserError` naming it and ``what`` it
    should be: a missing file, a directory, bytes that are not UTF-8 text, invalid JSON and
    JSON nested deeper than Python's parser can follow are each one line."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory (expected {what})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (expected {what})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: invalid JSON ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deep to read (expected {what})") from None


def load_measured(sources: list[str]) -> dict[str, dict]:
    """Case → measured summary, from traces (dir/tar/file) or summary JSON files."""
    # lazy: start-up time of the CLI (pandas and the analysis)
    from simwar.fit.replays import load_traces, measured_summary

    out: dict[str, dict] = {}
    for src in sources:
        path = Path(src)
        if not path.exists():
            raise UserError(f"{src}: file not found")
        if path.suffix == ".json" and not path.name.endswith(".trace.json"):
            data = read_json(path, "a measured-summary JSON file")
            cases = data.get("cases") if isinstance(data, dict) else None
            if not isinstance(cases, dict):
                raise UserError(f"{src}: expected a measured-summary file with a 'cases' "
                                f"mapping")
            for name, case in cases.items():
                if not isinstance(case, dict) or not isinstance(case.get("summary"), dict):
                    raise UserError(f"{src}: cases.{name}: expected a measured summary (a "
                                    f"mapping with a 'summary' mapping)")
            out.update(cases)
            continue
        try:
            traces = load_traces(path)
        except (ValueError, OSError) as e:
            raise UserError(f"{src}: not a simwar trace, trace directory or tar ({e})") \
                from None
        if not traces:
            raise UserError(f"{src}: no *.trace.json(.gz) found")
        out.update({k: measured_summary(t) for k, t in traces.items()})
    return out


#: seconds a long command's work must take before its progress bar shows (short work prints
#: nothing extra)
BAR_DELAY_S = 2.0


@contextlib.contextmanager
def work_bar(desc: str, unit: str, disabled: bool = False):
    """A ``progress(done, total)`` callback drawing a tqdm bar on stderr, or None.

    For the long loops of ``explain`` and ``import --fit`` over a capture's steps: the bar
    shows only when stderr is a terminal (tqdm's own rule) and the work has run
    ``BAR_DELAY_S``; ``disabled`` (``--no-progress``) turns it off. Updates are throttled to a
    few hundred, whatever the number of steps.
    """
    if disabled:
        yield None
        return
    # lazy: start-up time of the CLI (tqdm)
    from tqdm import tqdm

    bar = tqdm(unit=unit, desc=desc, file=sys.stderr, leave=False, delay=BAR_DELAY_S,
               dynamic_ncols=True, disable=None)
    if bar.disable:
        bar.close()
        yield None
        return

    def progress(done: int, total: int) -> None:
        if bar.total != total:
            bar.reset(total=total)
        if done - bar.n >= max(1, total // 500) or done >= total:
            bar.update(done - bar.n)

    try:
        yield progress
    finally:
        bar.close()
