"""A sweep's output directory: its lock, its resolved spec, the results of each batch, the tables.

``OUT/sweep.yaml`` is the resolved sweep (:func:`write_resolved_spec`); a directory holding
another sweep's results is refused (:func:`check_out_dir`, :class:`SweepConflict`).
Each batch of runs that finishes is written at once, atomically, as one Parquet table of its
rows (``OUT/batches/<first run id>-<batch hash>.parquet``, :meth:`RunStore.save_batch`): a
sweep killed at any point loses the batch in flight and nothing else, and a rerun skips
every run whose row a batch file holds (by run id and run key,
:meth:`RunStore.stored_rows`). Per-run files
(``OUT/runs/<run key>.json``: the run's summary and config) are written only on request
(``run_files=True``, ``simwar sweep --run-files``); those of an earlier sweep are read back
all the same, so a sweep resumes from either. ``results.parquet`` and ``results.csv`` are
the batches' rows, in run-id order (:func:`read_results`, :func:`write_tables`).

A table is built column by column (:func:`rows_table`), never a row at a time through pandas:
a value that is a mapping or a list (a swept distribution, ``launch_ahead_hist``) becomes its
JSON text, and so does every value of a column that mixes strings and numbers (Parquet holds
one type per column). The rule is applied again to the columns whose types differ between
batches when the batches are joined, so the final table does not depend on where batches
were cut (a sweep interrupted and resumed gives the table of one run straight through).

Imports: pyarrow (the tables), pandas (the frame returned), yaml, simwar.core.files and the
config's error type; nothing of the sweep itself (it hands in its runs and their values).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute: sorting the rows)
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import yaml

from simwar import __version__
from simwar.config import ConfigError
from simwar.core.files import (
    DirectoryBusy,
    atomic_file,
    directory_lock,
    stale_temporaries,
    write_bytes_atomic,
)

#: columns every result row carries besides the swept keys and the summary metrics
ID_COLUMNS = ("run_id", "repeat", "seed", "config_hash", "run_key")
RUNS_DIR = "runs"
BATCHES_DIR = "batches"
TABLES = ("results.parquet", "results.csv")


#: libyaml's safe dumper and loader where PyYAML has them (a sweep's spec holds every swept
#: value: 10,000 of them took the pure-Python dumper 0.4 s)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SweepConflict(ConfigError):
    """The output directory holds another sweep's results (see the module docstring)."""


# --------------------------------------------------------------------------- rows
def run_name(name: str, values: dict[str, Any], overrides: dict[str, Any]) -> str:
    """The base config's name, then what the sweep changed in it: ``--set`` and swept values."""
    changed = [f"--set {k}={short(v)}" for k, v in overrides.items() if k != "name"]
    changed += [f"{k}={short(v)}" for k, v in values.items()]
    return f"{name} [{', '.join(changed)}]" if changed else name


#: ``json.dumps(value, sort_keys=True)``: one encoder kept (``json.dumps`` makes one per call
#: when given an option, a few µs: a histogram per run of a large sweep)
_JSON_SORTED = json.JSONEncoder(sort_keys=True).encode


def short(value: Any) -> str:
    return _JSON_SORTED(value) if isinstance(value, (dict, list)) else str(value)


def _as_json_text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else _JSON_SORTED(value)


def normalised(values: list) -> list:
    """A column's values as one Parquet type can hold them (see the module docstring)."""
    kinds = set(map(type, values))
    if kinds & {dict, list} or (str in kinds and kinds - {str, type(None)}):
        return [_as_json_text(v) for v in values]
    return values


def rows_table(runs: Iterable, summaries: dict[str, dict],
               overrides: dict[str, Any]) -> pa.Table:
    """One row per run of ``runs`` that has a summary (in the order given): its swept
    values, the id columns and every summary metric (a metric named like a swept key or an
    id column is ``summary.<metric>``; ``name`` is :func:`run_name`'s). Built a column at a
    time: a run without a metric has None there."""
    runs = [run for run in runs if run.run_key in summaries]
    got = [summaries[run.run_key] for run in runs]
    columns: dict[str, list] = {}
    for key in dict.fromkeys(k for run in runs for k in run.values):
        columns[key] = [run.values.get(key) for run in runs]
    for key in ID_COLUMNS:
        columns[key] = [getattr(run, key) for run in runs]
    order = list(got[0]) if got else []
    if all(list(s) == order for s in got):  # the same metrics in the same order: transposed
        by_metric = dict(zip(order, zip(*(s.values() for s in got))))
    else:
        by_metric = {k: [s.get(k) for s in got] for k in dict.fromkeys(k for s in got for k in s)}
    for metric, values in by_metric.items():
        values = list(values)
        if metric == "name" and metric not in columns:
            values = [run_name(v, run.values, overrides) for v, run in zip(values, runs)]
        columns[f"summary.{metric}" if metric in columns else metric] = values
    return pa.table({k: pa.array(normalised(v)) for k, v in columns.items()})


def join_tables(tables: list[pa.Table]) -> pa.Table:
    """The batches' rows as one table in run-id order; a column whose types differ between
    batches is normalised again over all its values (see the module docstring)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pa.table({})
    names = list(dict.fromkeys(name for t in tables for name in t.column_names))
    joined = {}
    for name in names:
        parts = [t.column(name) if name in t.column_names else pa.nulls(t.num_rows)
                 for t in tables]
        kinds = {p.type for p in parts} - {pa.null()}
        if len(kinds) <= 1:
            kind = kinds.pop() if kinds else pa.null()
            joined[name] = _joined([p.cast(kind) if p.type != kind else p for p in parts], kind)
        elif all(pa.types.is_integer(k) or pa.types.is_floating(k) for k in kinds):
            joined[name] = _joined([p.cast(pa.float64()) for p in parts], pa.float64())
        else:
            values = [v for p in parts for v in p.to_pylist()]
            joined[name] = pa.chunked_array([pa.array(normalised(values))])
    table = pa.table(joined)
    ids = table.column("run_id").to_numpy()
    if len(ids) > 1 and (ids[1:] < ids[:-1]).any():  # batches finished out of order
        table = table.take(pa.compute.sort_indices(table, [("run_id", "ascending")]))
    return table


def _joined(parts: list, kind: pa.DataType) -> pa.ChunkedArray:
    """The columns ``parts`` (arrays or chunked arrays, of type ``kind``) as one chunked
    array of their chunks: ``pa.chunked_array`` takes a chunked array in its list as a
    sequence of Python values (about 3 ms per column of 10,000 rows)."""
    return pa.chunked_array([c for p in parts
                             for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])],
                            type=kind)


# --------------------------------------------------------------------------- storage
class RunStore:
    """A sweep's results as it goes: a Parquet table per finished batch, and per-run JSON
    files when asked for (``run_files``)."""

    def __init__(self, out_dir: str | Path, run_files: bool = False):
        self.out_dir = Path(out_dir)
        self.runs_dir = self.out_dir / RUNS_DIR
        self.batches_dir = self.out_dir / BATCHES_DIR
        self.run_files = run_files

    def path(self, run) -> Path:
        return self.runs_dir / f"{run.run_key}.json"

    def stored_rows(self) -> set[tuple[int, str]]:
        """``(run id, run key)`` of every row the batch tables hold (a rerun of the same
        sweep skips those runs: the directory's ``sweep.yaml`` says it is the same)."""
        out: set[tuple[int, str]] = set()
        for part in self.batch_files():
            ids = pq.read_table(part, columns=["run_id", "run_key"])
            out.update(zip(ids.column("run_id").to_pylist(), ids.column("run_key").to_pylist()))
        return out

    def load(self, run) -> dict | None:
        """The summary of a run's own file (``runs/<run key>.json``), or None if there is
        none (or it is foreign)."""
        try:
            record = json.loads(self.path(run).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if not isinstance(record, dict) or record.get("run_key") != run.run_key:
            return None
        return record.get("summary")

    def tables(self) -> list[pa.Table]:
        """Every batch's table."""
        return [pq.read_table(part) for part in self.batch_files()]

    def batch_files(self) -> list[Path]:
        return sorted(self.batches_dir.glob("*.parquet")) if self.batches_dir.is_dir() else []

    def save_batch(self, table: pa.Table, runs: list, summaries: dict[str, dict]) -> None:
        """Commit a finished batch: its table (named by its first run id and its run keys:
        two batches never share a name), then, when asked for, each run's file."""
        if table.num_rows:
            digest = hashlib.sha256("".join(table.column("run_key").to_pylist())
                                    .encode()).hexdigest()[:12]
            first = table.column("run_id")[0].as_py()
            self.batches_dir.mkdir(parents=True, exist_ok=True)
            with atomic_file(self.batches_dir / f"{first:09d}-{digest}.parquet") as handle:
                pq.write_table(table, handle)
        if self.run_files:
            for run in runs:
                self.save(run, summaries[run.run_key])

    def save(self, run, summary: dict) -> None:
        record = {"run_key": run.run_key, "config_hash": run.config_hash, "seed": run.seed,
                  "simwar_version": __version__, "summary": summary, "config": run.config}
        # key order kept: the summary's metric order becomes the table's column order
        payload = json.dumps(record, indent=1, allow_nan=False).encode()
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(self.path(run), payload)

    def forget_batches(self) -> None:
        """Remove the batch tables (``--force``: they are another sweep's rows)."""
        for part in self.batch_files():
            with contextlib.suppress(FileNotFoundError):
                part.unlink()

    def remove_stale_temporaries(self) -> None:
        """Delete half-written temporaries left by a killed sweep (the real files are intact)."""
        for directory in (self.runs_dir, self.batches_dir):
            for stale in stale_temporaries(directory):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()


def write_tables(table: pa.Table, out_dir: str | Path) -> None:
    """``results.parquet`` and ``results.csv``, each written atomically."""
    out_dir = Path(out_dir)
    with atomic_file(out_dir / "results.parquet") as handle:
        pq.write_table(table, handle)
    with atomic_file(out_dir / "results.csv") as handle:
        pa_csv.write_csv(table, handle)


# --------------------------------------------------------------------------- the directory
def lock_out_dir(held: contextlib.ExitStack, out_dir: Path) -> None:
    """Hold ``out_dir``'s lock until the sweep ends: two sweeps started into one directory
    at once would each write a ``sweep.yaml`` and tables, leaving one's spec over the
    other's results (the second is refused at once, before it writes anything)."""
    existed = out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        held.enter_context(directory_lock(out_dir))
    except DirectoryBusy:
        raise SweepConflict(f"{out_dir}: another sweep is writing into it now; wait for it to "
                            f"finish, or use another output directory") from None
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise


def check_out_dir(sweep, out_dir: str | Path) -> None:
    """Raise :class:`SweepConflict` if ``out_dir`` holds the results of another sweep
    (``sweep``: a :class:`~simwar.study.sweeps.Sweep`)."""
    out_dir = Path(out_dir)
    stored = out_dir / "sweep.yaml"
    tables = [name for name in TABLES if (out_dir / name).exists()]
    if (out_dir / BATCHES_DIR).is_dir() and any((out_dir / BATCHES_DIR).iterdir()):
        tables.append(f"{BATCHES_DIR}/")
    if stored.exists():
        try:
            previous = yaml.load(stored.read_text(), Loader=_LOADER)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            previous = None
        # compared through a YAML round trip: the form the file holds
        if previous == yaml.load(yaml.dump(sweep.resolved(), Dumper=_DUMPER, sort_keys=False),
                                 Loader=_LOADER):
            return
        raise SweepConflict(f"{out_dir}: holds the results of a different sweep ({stored} "
                            f"differs from {sweep.label}); use another output directory, or "
                            f"--force to replace its results table")
    if tables:
        raise SweepConflict(f"{out_dir}: holds {' and '.join(tables)} but no sweep.yaml (not "
                            f"this sweep's); use another output directory, or --force to "
                            f"replace them")


def write_resolved_spec(sweep, out_dir: str | Path) -> None:
    header = (f"# resolved from {sweep.label} by simwar {__version__}: base inlined, "
              f"--set overrides applied; {sweep.count} runs\n")
    body = yaml.dump(sweep.resolved(), Dumper=_DUMPER, sort_keys=False)
    write_bytes_atomic(Path(out_dir) / "sweep.yaml", (header + body).encode())


__all__ = ["BATCHES_DIR", "ID_COLUMNS", "RUNS_DIR", "RunStore", "SweepConflict",
           "check_out_dir", "join_tables", "lock_out_dir", "normalised", "rows_table",
           "run_name", "short", "write_resolved_spec", "write_tables"]
