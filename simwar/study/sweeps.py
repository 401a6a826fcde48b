"""Sweeps: expand a sweep spec into runs, execute them locally or on Ray, resume, tabulate.

A sweep spec (YAML file or mapping) names a ``base`` config (a path relative to
the sweep file, or an inline mapping), a ``grid`` of dotted keys whose value
lists are crossed, an optional ``zip`` of equally long lists advanced
together, and ``repeats``. Each run is the base with ``--set`` overrides, then
its grid and zip values, applied as dotted keys (the same rules as
``simwar run --set``), and the seed ``base seed + repeat``. Seeds depend on the
repeat only, not on the grid point, so every policy of a repeat sees the same
random draws (common random numbers): differences between rows come from the
swept keys, not from sampling noise.

Each run is identified by a *run key*: a hash of the resolved config (seed
excluded: that is ``config_hash``), the seed and the simwar version. Each batch of runs that
finishes is written at once, atomically, as one Parquet table of its rows
(:mod:`simwar.study.store`), so a sweep killed at any point loses only the batches in
flight, and a rerun skips every run whose row is stored; per-run files
(``runs/<run key>.json``) are written only on request (``run_files``; the runs whose rows
come from an earlier sweep's files are committed together, a batch per piece of runs handed
out). Runs that share a run key (a grid listing one value twice) are simulated once per
piece, a row for each. The tables
``results.parquet`` and ``results.csv`` are the batches' rows in run-id order, written when
all runs are done; a sweep interrupted (Ctrl-C: :class:`SweepInterrupted`) or failed writes
them with the runs that finished before it stops.

A sweep's runs are counted without being expanded (a grid's size is a product:
``SweepSpec.run_count``) and expanded lazily, one at a time, as they are handed to the
backend (:class:`Sweep`), so memory does not grow with the grid. A run is resolved from its
template (:mod:`simwar.study.expand`: the swept durations that are plain numbers put into
a config validated at the corners of their range) or, without one, validated on its own;
before anything runs, each template met first and the first run of every other swept value
are validated, so a bad value is a one-line error at once.
``max_runs`` (the command line's limit, :data:`MAX_RUNS`, unless ``--yes``) refuses a
larger sweep with its count (:class:`SweepTooLarge`).

One output directory holds one sweep. Its ``sweep.yaml`` is the resolved sweep
(base inlined, ``--set`` overrides applied); a sweep whose resolved form is the
same (comments and the header aside) is the *same sweep*, and running it again
into that directory resumes it. A different sweep, or a directory holding
results tables but no ``sweep.yaml``, is refused with
:class:`SweepConflict` before anything is written, so that no results table
is ever replaced without a word; ``force=True`` (``simwar sweep --force``)
replaces the resolved sweep and the tables and forgets the batches (per-run files are
kept: they are named by run key, so a later sweep reuses those it shares).

A sweep must sweep something: a ``grid`` or ``zip`` given must name at
least one key, and a sweep with neither needs ``repeats`` above 1. The
``name`` column of the table is the base config's name followed by the run's
swept values and ``--set`` overrides, e.g. ``dspark-fine [policy.barrier=coarse]``.

Backends: ``local`` (in-process for one job, else a process pool) and ``ray``
(tasks on a Ray cluster; results come back to the driver, which writes them). Either way
the runs that share their iteration shapes run together, in lockstep
(:func:`simwar.api.simulate_many`, :mod:`simwar.executors.lockstep`): a task is a lockstep
batch, cut so that every worker has one (:func:`lockstep_tasks`), and each run's summary is
the one it has run by itself, bit for bit. In one process the tasks of a piece run at once,
so that structures whose plans come out alike share their lockstep groups, a table per
lockstep batch. The progress (runs/s and the time left) moves
as each task's results come back.

Size: the spec, its expansion and the backends are the steps of one pipeline over the same
:class:`Run` and :class:`Sweep`; the output directory is :mod:`simwar.study.store`'s, the
templates :mod:`simwar.study.expand`'s, the progress report :mod:`simwar.study.progress`'s.

Imports: ray only inside the Ray backend; tqdm only when a progress bar is asked for
(:mod:`simwar.study.progress`); pyarrow through :mod:`simwar.study.store`. Nothing here
prints, but progress when ``progress=True``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simwar import __version__
from simwar.api import (  # imported once, inherited by forked workers
    simulate,
    simulate_batches,
    simulate_many,
)
from simwar.builder.template import structure_key
from simwar.config import (
    ConfigError,
    finite_error,
    first_error,
    load_config,
    non_finite,
    override_list,
    read_yaml,
    resolve_paths,
    set_dotted,
)
from simwar.config.budget import check_memory
from simwar.core.collector import gc_paused
from simwar.core.files import interrupt_handled, jsonable
from simwar.executors.lockstep import batch_size
from simwar.study.expand import Templates
from simwar.study.pools import process_pool
from simwar.study.progress import progress_reporter
from simwar.study.store import (
    ID_COLUMNS,
    RunStore,
    SweepConflict,
    check_out_dir,
    join_tables,
    lock_out_dir,
    rows_table,
    run_name,
    short,
    write_resolved_spec,
    write_tables,
)

BACKENDS = ("local", "ray")


# --------------------------------------------------------------------------- the spec
class SweepSpec(BaseModel):
    """The sweep file schema. ``base`` is a path (relative to the sweep file) or a mapping."""

    model_config = ConfigDict(extra="forbid")

    base: str | dict
    grid: dict[str, list] = Field(default_factory=dict)
    zip: dict[str, list] = Field(default_factory=dict)
    repeats: int = Field(default=1, ge=1)

    @field_validator("grid", "zip")
    @classmethod
    def _non_empty_lists(cls, swept: dict[str, list], info) -> dict[str, list]:
        if not swept:
            raise ValueError(f"expected at least one dotted key, e.g. {info.field_name}: "
                             f"{{policy.barrier: [coarse, fine]}} (leave {info.field_name} out "
                             f"to sweep nothing there)")
        for key, values in swept.items():
            _check_key(key)
            if not values:
                raise ValueError(f"{info.field_name}.{key}: expected a non-empty list of values")
            found = non_finite(values, f"{info.field_name}.{key}")
            if found is not None:
                raise ValueError(finite_error(found))
        return swept

    @field_validator("zip")
    @classmethod
    def _zip_lengths(cls, zipped: dict[str, list]) -> dict[str, list]:
        lengths = {key: len(values) for key, values in zipped.items()}
        if len(set(lengths.values())) > 1:
            described = ", ".join(f"{k} has {n}" for k, n in lengths.items())
            raise ValueError(f"zip: lists must all have the same length ({described})")
        return zipped

    @model_validator(mode="after")
    def _disjoint(self) -> SweepSpec:
        both = [k for k in self.zip if k in self.grid]
        if both:
            raise ValueError(f"{both[0]}: swept in both grid and zip; keep it in one of them")
        if not self.grid and not self.zip and self.repeats == 1:
            raise ValueError("nothing to sweep: expected a grid, a zip or repeats above 1 "
                             "(for one run, use simwar run)")
        return self

    @property
    def swept_keys(self) -> list[str]:
        return list(self.grid) + list(self.zip)

    @property
    def run_count(self) -> int:
        """How many runs the sweep expands to, counted without expanding them."""
        zipped = len(next(iter(self.zip.values()))) if self.zip else 1
        return math.prod(len(v) for v in self.grid.values()) * zipped * self.repeats

    def count_text(self) -> str:
        """How the run count is made, in words: ``grid 10 x 10, zip 3, repeats 5``."""
        parts = []
        if self.grid:
            parts.append("grid " + " x ".join(str(len(v)) for v in self.grid.values()))
        if self.zip:
            parts.append(f"zip {len(next(iter(self.zip.values())))}")
        if self.repeats > 1:
            parts.append(f"repeats {self.repeats}")
        return ", ".join(parts)


def _check_key(key: str) -> None:
    if not key or any(not part for part in key.split(".")):
        raise ValueError(f"'{key}': expected a dotted key such as policy.barrier")
    if key == "seed":
        # the seed column is the derived per-repeat seed; sweeping it would hide that
        raise ValueError("seed: not sweepable; use repeats (seeds are base seed + repeat)")
    if key in ID_COLUMNS:
        raise ValueError(f"{key}: reserved for a result column")


@dataclass(frozen=True)
class Run:
    """One expanded run: its swept values, seed and fully validated config mapping."""

    run_id: int
    repeat: int
    seed: int
    values: dict[str, Any]
    config: dict
    config_hash: str
    run_key: str
    #: the plan's structure key when the run was resolved from a template (its runs share
    #: it), else None (computed from ``config`` when needed)
    group: str | None = field(default=None, compare=False)


@dataclass
class Sweep:
    """A validated sweep: the spec, the base mapping it resolved to, and its runs.

    The runs are expanded lazily, in run-id order: :meth:`iter_runs` yields them one at a
    time (memory does not grow with the grid), :attr:`runs` is the list of all of them
    (expanded once, on first use), :attr:`count` their number, known without expanding.
    Each run's config is validated as it is expanded; :func:`load_sweep` has already
    validated the first run of every swept value.
    """

    spec: SweepSpec
    base: dict
    base_seed: int
    label: str = "<sweep>"
    overrides: dict[str, Any] = field(default_factory=dict)
    _runs: list[Run] | None = field(default=None, repr=False)
    _templates: Templates | None = field(default=None, repr=False)
    #: the swept durations :func:`load_sweep` checked at the ends of their ranges (in the
    #: first template) rather than value by value
    ranged: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return self.spec.run_count

    @property
    def runs(self) -> list[Run]:
        if self._runs is None:
            self._runs = list(self.iter_runs())
        return self._runs

    @property
    def templates(self) -> Templates:
        """The runs' templates (:mod:`simwar.study.expand`), made as runs are expanded."""
        if self._templates is None:
            self._templates = Templates({**self.spec.grid, **self.spec.zip}, self.resolve,
                                        structure_key)
        return self._templates

    def iter_runs(self) -> Iterator[Run]:
        """Every run, expanded and validated one at a time, in run-id order."""
        if self._runs is not None:
            yield from self._runs
            return
        for run_id, (repeat, values) in enumerate(_points(self.spec)):
            yield self.run(run_id, repeat, values)

    def run(self, run_id: int, repeat: int, values: dict[str, Any]) -> Run:
        """Run ``run_id`` (its repeat and swept values): its config validated and hashed,
        from its template (:mod:`simwar.study.expand`) or, without one, on its own."""
        template = self.templates.of(values, repeat)
        if template is not None:
            numbers = {k: float(values[k]) for k in template.paths}
            config = template.config(numbers)
            config_hash = template.config_hash(numbers)
            seed = config["seed"]
            return Run(run_id, repeat, seed, values, config, config_hash,
                       _run_key(config_hash, seed), template.structure)
        return self.validated(run_id, repeat, values)

    def validated(self, run_id: int, repeat: int, values: dict[str, Any]) -> Run:
        """Run ``run_id`` validated on its own; a bad run is a one-line error naming it."""
        try:
            resolved = self.resolve(values, repeat)
        except ConfigError as e:
            where = ", ".join(f"{k}={short(v)}" for k, v in values.items())
            detail = str(e).removeprefix("<config>: ")
            raise ConfigError(f"{self.label}: run {run_id} ({where}): {detail}") from None
        seed = resolved["seed"]
        config_hash = _hash({k: v for k, v in resolved.items() if k != "seed"})
        return Run(run_id, repeat, seed, values, resolved, config_hash,
                   _run_key(config_hash, seed))

    def resolve(self, values: dict[str, Any], repeat: int) -> dict:
        """The resolved config of the base with ``values`` and the repeat's seed (a
        :class:`~simwar.config.ConfigError` for an invalid one)."""
        data = copy.deepcopy(self.base)
        for key, value in values.items():
            _set(data, key, value, self.label)
        data["seed"] = int(data.get("seed", self.base_seed)) + repeat
        cfg = load_config(data)
        check_memory(cfg)  # a run that cannot fit is refused before any runs
        return cfg.model_dump(mode="json")

    def resolved(self) -> dict:
        """A self-contained sweep mapping (base inlined, overrides applied); expands the same."""
        out: dict[str, Any] = {"base": copy.deepcopy(self.base)}
        if self.spec.grid:
            out["grid"] = copy.deepcopy(self.spec.grid)
        if self.spec.zip:
            out["zip"] = copy.deepcopy(self.spec.zip)
        out["repeats"] = self.spec.repeats
        return out


#: the most runs :func:`load_sweep` expands when asked to stay under a limit (``simwar
#: sweep``, ``validate`` and ``show`` without ``--yes``): expanding one costs ~0.15 ms and a
#: few kB, and a grid's size is a product that grows fast
MAX_RUNS = 100_000


class SweepTooLarge(ConfigError):
    """More runs than the limit asked for (see :data:`MAX_RUNS`)."""


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`sweep`: ``finished`` of the ``total`` runs are in the results
    tables written into ``out_dir`` (None: no tables, nothing had finished or no out_dir)."""

    def __init__(self, finished: int, total: int, out_dir: Path | None):
        super().__init__(finished, total, out_dir)
        self.finished = finished
        self.total = total
        self.out_dir = out_dir if finished else None


def is_sweep_mapping(data: dict) -> bool:
    """True when a top-level YAML mapping is a sweep rather than a config."""
    return any(key in data for key in ("base", "grid", "zip", "repeats"))


def load_sweep(spec: str | Path | dict | Sweep,
               overrides: list[str] | dict[str, Any] | None = None,
               max_runs: int | None = None) -> Sweep:
    """Validate a sweep (path, mapping or Sweep); errors are one-line ConfigErrors.

    The runs are not expanded here (see :class:`Sweep`): they are counted, and the first run
    of each swept value (the other keys at their first value, repeat 0) is expanded and
    validated, so that a bad value is reported before anything runs. ``max_runs``: refuse a
    sweep of more runs (:class:`SweepTooLarge`, naming the count and how it is made).
    """
    if isinstance(spec, Sweep) and not overrides:
        _check_size(spec, max_runs)
        return spec
    if isinstance(spec, Sweep):
        spec = spec.resolved()
    if isinstance(spec, dict):
        label, data, root = "<sweep>", copy.deepcopy(spec), Path.cwd()
    else:
        label, data, root = str(spec), read_yaml(spec), Path(spec).parent
    if not is_sweep_mapping(data):
        raise ConfigError(f"{label}: not a sweep (a sweep has base, and grid, zip or repeats; "
                          f"this reads as a config: simwar run {label})")
    try:
        parsed = SweepSpec(**data)
    except ValidationError as e:
        message = first_error(e)
        if e.errors()[0]["type"] == "extra_forbidden":
            message += " (a sweep has base, grid, zip, repeats)"
        raise ConfigError(f"{label}: {message}") from None

    override_items = override_list(overrides)
    for item in override_items:
        if item.key in parsed.swept_keys:
            raise ConfigError(f"--set {item.key}: this key is swept by {label}; "
                              f"change the sweep file instead")
    # validate the base with its overrides on its own first, so its errors name the base
    if isinstance(parsed.base, str):
        base_path = root / parsed.base
        if not base_path.exists():
            raise ConfigError(f"{label}: base: {parsed.base}: file not found "
                              f"(paths are relative to the sweep file)")
        base, base_label = resolve_paths(read_yaml(base_path), base_path.parent), str(base_path)
        base_config = load_config(base_path, override_items)
    else:
        base, base_label = resolve_paths(copy.deepcopy(parsed.base), root), f"{label}: base"
        try:
            base_config = load_config(base, override_items)
        except ConfigError as e:
            raise ConfigError(f"{base_label}: {str(e).removeprefix('<config>: ')}") from None
    for item in override_items:
        _set(base, item.key, item.value, base_label)
    out = Sweep(parsed, base, base_config.seed, label,
                {item.key: item.value for item in override_items})
    _check_size(out, max_runs)
    firsts = _first_of_each_value(parsed, ())
    # the value keys of a template checked at its corners need no run per value
    templated = out.templates.keys and out.templates.of(firsts[0][2], 0) is not None
    out.ranged = list(out.templates.keys) if templated else []
    for run_id, repeat, values in _first_of_each_value(parsed, out.templates.keys
                                                       if templated else ()):
        if out.templates.of(values, repeat) is None:
            out.validated(run_id, repeat, values)
    return out


def _check_size(sweep: Sweep, max_runs: int | None) -> None:
    if max_runs is not None and sweep.count > max_runs:
        raise SweepTooLarge(f"{sweep.label}: {sweep.count} runs ({sweep.spec.count_text()}), "
                            f"more than {max_runs}: give --yes to expand them anyway (each "
                            f"costs time and memory before it runs), or sweep fewer values")


def _first_of_each_value(spec: SweepSpec, skip) -> list[tuple[int, int, dict[str, Any]]]:
    """``(run id, repeat, values)`` of the first run holding each grid value (but those of
    the keys in ``skip``) and each zip row (the other keys at their first value, repeat 0),
    in run-id order, once each."""
    grid = list(spec.grid.items())
    rows = len(next(iter(spec.zip.values()))) if spec.zip else 1
    inner = rows * spec.repeats  # runs per grid point
    strides = []
    stride = inner
    for _, values in reversed(grid):
        strides.append(stride)
        stride *= len(values)
    strides.reverse()

    def point(picks: dict[int, int], row: int) -> tuple[int, int, dict[str, Any]]:
        values = {key: vals[picks.get(i, 0)] for i, (key, vals) in enumerate(grid)}
        values |= {key: vals[row] for key, vals in spec.zip.items()}
        run_id = sum(strides[i] * j for i, j in picks.items()) + row * spec.repeats
        return run_id, 0, values

    found = {p[0]: p for p in [point({}, 0)]
             + [point({i: j}, 0) for i, (key, vals) in enumerate(grid) if key not in skip
                for j in range(len(vals))]
             + [point({}, r) for r in range(rows)]}
    return [found[k] for k in sorted(found)]


def _set(data: dict, key: str, value: Any, label: str) -> None:
    try:
        set_dotted(data, key, copy.deepcopy(value))
    except ConfigError as e:
        raise ConfigError(f"{label}: {e}") from None


def _points(spec: SweepSpec) -> Iterator[tuple[int, dict[str, Any]]]:
    """(repeat, {key: value}) in run-id order: grid outermost, then zip, repeats innermost."""
    grid_keys = list(spec.grid)
    zip_rows = [dict(zip(spec.zip, row)) for row in zip(*spec.zip.values())] or [{}]
    for combo in itertools.product(*spec.grid.values()):
        for zipped in zip_rows:
            for repeat in range(spec.repeats):
                yield repeat, dict(zip(grid_keys, combo)) | zipped


def _hash(obj: Any) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _run_key(config_hash: str, seed: int) -> str:
    """The hash of ``{"config_hash", "seed", "version"}``: :func:`_hash`'s canonical JSON of
    it, written here directly for a hex digest and an int seed (every run's: a sweep makes
    one per run, and the JSON encoder cost more than the digest)."""
    if type(seed) is int and type(config_hash) is str and config_hash.isalnum():
        text = f'{{"config_hash":"{config_hash}","seed":{seed},"version":{_VERSION}}}'
        return hashlib.sha256(text.encode()).hexdigest()[:16]
    return _hash({"config_hash": config_hash, "seed": seed, "version": __version__})


_VERSION = json.dumps(__version__)


# --------------------------------------------------------------------------- one run
def run_one(config: dict) -> dict:
    """Simulate one resolved config and return its JSON-normalised summary.

    Module-level so process pools and Ray can ship it by reference.
    """
    return jsonable(simulate(config).summary)


def run_many(configs: list[dict], groups: list | None = None) -> list[dict]:
    """The JSON-normalised summaries of resolved configs, simulated in lockstep where they
    share their iteration shapes (:func:`simwar.api.simulate_many`; ``groups``: their
    structure keys when known): each equal to :func:`run_one`'s. Module-level so process
    pools and Ray can ship it by reference."""
    return [jsonable(s) for s in simulate_many(configs, keys=groups)]


def _task_of(runs: list[Run]) -> tuple[list[dict], list | None]:
    """What a worker is handed for a task: the runs' configs and structure keys."""
    groups = [run.group for run in runs]
    return [run.config for run in runs], None if None in groups else groups


def lockstep_tasks(runs: list[Run], workers: int = 1) -> list[list[Run]]:
    """Runs gathered by structure (:func:`simwar.builder.template.structure_key`: those that
    can run in lockstep), each group cut into pieces of at most one lockstep batch, and
    into at least ``workers`` pieces when it has that many runs (a piece is one results
    table: a sweep stopped loses those in flight)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group or structure_key(run.config), []).append(run)
    out = []
    for members in groups.values():
        size = min(batch_size(int(members[0].config["steps"])),
                   max(1, -(-len(members) // workers)))
        out += [members[i:i + size] for i in range(0, len(members), size)]
    return out


# --------------------------------------------------------------------------- execution
ProgressCallback = Callable[[int], None]


def sweep(spec: str | Path | dict | Sweep, out_dir: str | Path | None = None, *, jobs: int = 1,
          backend: str = "local", ray_address: str | None = None,
          progress: bool | ProgressCallback = False,
          overrides: list[str] | dict[str, Any] | None = None,
          force: bool = False, max_runs: int | None = None,
          run_files: bool = False) -> pd.DataFrame:
    """Run a sweep and return one row per run, in run-id order: its swept values, the id
    columns and every summary metric (:func:`simwar.study.store.rows_table`).

    ``spec``: a sweep YAML path, a mapping (``base``, ``grid``, ``zip``, ``repeats``) or a
    :class:`Sweep`. ``out_dir``: where to write ``batches/``, ``sweep.yaml`` and the tables;
    runs already stored there are not run again. ``jobs``: local worker processes (0: one per
    core). ``backend``: ``local`` or ``ray`` (``ray_address``: an existing cluster; without
    it, an already initialised Ray is used, else a local one is started and stopped).
    ``progress``: True for a tqdm bar on stderr (runs/s and the time left), or a callable
    given the number of newly finished runs (a batch at a time). ``overrides``:
    ``--set``-style overrides applied to the base. ``force``: replace the results of a
    different sweep in ``out_dir`` (else :class:`SweepConflict`). ``max_runs``: refuse a
    sweep of more runs (:class:`SweepTooLarge`). ``run_files``: also write each run's
    ``runs/<run key>.json`` (its summary and config).

    The runs are expanded as they are handed to the backend, never all at once. The frame's
    ``attrs`` say how many runs were found stored (``runs_stored``) and how many were
    simulated (``runs_simulated``). A sweep interrupted (Ctrl-C) or failed writes the
    results tables of the runs that finished before the error goes on, so they can be read
    at once; rerunning the same sweep finishes it and rewrites them whole.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"backend: '{backend}' is not one of {', '.join(BACKENDS)}")
    if jobs < 0:
        raise ConfigError(f"jobs: expected 0 (one per core) or a positive number, got {jobs}")
    jobs = jobs or os.cpu_count() or 1
    plan = load_sweep(spec, overrides, max_runs=max_runs)
    store = RunStore(out_dir, run_files) if out_dir is not None else None
    made = store is not None and not store.out_dir.exists()
    try:
        with contextlib.ExitStack() as held:
            if store is not None:
                lock_out_dir(held, store.out_dir)
                if force:
                    store.forget_batches()  # another sweep's rows (run files are kept)
                else:
                    check_out_dir(plan, store.out_dir)
                store.remove_stale_temporaries()
            return _run_sweep(plan, store, jobs=jobs, backend=backend,
                              ray_address=ray_address, progress=progress)
    except BaseException:
        if made:  # refused before it wrote anything (a backend that did not start)
            with contextlib.suppress(OSError):
                store.out_dir.rmdir()  # only when empty
        raise


def _run_sweep(plan: Sweep, store: RunStore | None, *, jobs: int, backend: str,
               ray_address: str | None, progress: bool) -> pd.DataFrame:
    """:func:`sweep`'s runs, once its output directory is checked and held."""
    done_rows = store.stored_rows() if store is not None else set()
    kept: list = []  # the batches' tables, without an output directory
    counts = {"stored": len(done_rows), "simulated": 0}

    def commit(runs: list[Run], summaries: dict[str, dict]) -> None:
        table = rows_table(runs, summaries, plan.overrides)
        if store is not None:
            store.save_batch(table, runs, summaries)
        else:
            kept.append(table)

    found: list[tuple[Run, dict]] = []  # rows read from an earlier sweep's ``runs/``

    def commit_found() -> None:
        """The runs found in run files since the last call, committed as one batch."""
        if found:
            commit([run for run, _ in found], {run.run_key: summary for run, summary in found})
            found.clear()

    def pending(report) -> Iterator[Run]:
        """The runs to simulate, expanded lazily; a run with its own file (an earlier
        sweep's ``runs/``) gets its row from it (:func:`commit_found`)."""
        files = store is not None and store.runs_dir.is_dir()
        for run in plan.iter_runs():
            if (run.run_id, run.run_key) in done_rows:
                report.skipped(1)
                continue
            summary = store.load(run) if files else None
            if summary is not None:
                found.append((run, summary))
                counts["stored"] += 1
                report.skipped(1)
                continue
            yield run

    try:
        # the backend starts (worker processes fork) before the progress bar starts its thread
        with _backend(backend, jobs=jobs, pending=plan.count, ray_address=ray_address) \
                as (execute, workers), progress_reporter(progress, total=plan.count) as report:
            if store is not None:  # the backend started: the directory is this sweep's
                write_resolved_spec(plan, store.out_dir)
            todo = pending(report)
            # a piece at a time: a pool or a cluster queues what it is given, so a huge sweep
            # is handed over in pieces, never expanded whole
            while True:
                # the collector paused: a piece's runs, configs and summaries are many small
                # containers without cycles (it walked them all about 300 times a 10,000-run
                # sweep, 3 % of its time)
                with gc_paused():
                    batch = list(itertools.islice(todo, BATCH * workers))
                    commit_found()  # those met while the piece was gathered: one batch
                    if not batch:
                        break
                    # a run whose key an earlier run of the piece has (a grid listing a value
                    # twice) is the same run: simulated once, a row for each
                    again: dict[str, list[Run]] = {}
                    first: dict[str, Run] = {}
                    for run in batch:
                        if run.run_key in first:
                            again.setdefault(run.run_key, []).append(run)
                        else:
                            first[run.run_key] = run
                    for task, summaries in execute(lockstep_tasks(list(first.values()),
                                                                  workers)):
                        rows = task + [r for run in task for r in again.get(run.run_key, ())]
                        commit(rows, {run.run_key: s for run, s in zip(task, summaries)})
                        counts["simulated"] += len(rows)  # finished: in the tables from now on
                        report.done(len(rows))
        # every run done: the results tables (an interrupt while they are written is answered
        # below, as one between batches: they are written, and the sweep says so)
        table = join_tables(store.tables() if store is not None else kept)
        if store is not None:
            write_tables(table, store.out_dir)
    except BaseException as e:
        # interrupted or failed: the tables of what finished, to read before resuming
        done = 0
        if isinstance(e, KeyboardInterrupt):
            interrupt_handled()  # this Ctrl-C is answered here: the tables are meant to commit
        try:
            commit_found()
        except OSError:
            # the same write again, failing as it did (the found runs are read from their
            # files next time): the sweep's own error is the one to report; a sweep stopped
            # otherwise (an interrupt, a run's error) would never have said it
            if not isinstance(e, OSError):
                raise
        if store is not None:
            partial = join_tables(store.tables())
            if partial.num_rows:
                write_tables(partial, store.out_dir)
            done = partial.num_rows
        if isinstance(e, KeyboardInterrupt):
            raise SweepInterrupted(done, plan.count, store.out_dir if store else None) from None
        raise
    frame = table.to_pandas()
    frame.attrs.update(runs_stored=counts["stored"], runs_simulated=counts["simulated"])
    return frame


def results_frame(sweep: Sweep, summaries: dict[str, dict]) -> pd.DataFrame:
    """One row per run of ``sweep`` (in run-id order), from each run's summary by run key,
    as :func:`sweep` returns them (:func:`simwar.study.store.rows_table`)."""
    return join_tables([rows_table(sweep.iter_runs(), summaries, sweep.overrides)]).to_pandas()


#: runs handed to the backend at a time, per worker (see :func:`sweep`)
BATCH = 4096


Task = list[Run]
Executor = Callable[[list[Task]], Iterable[tuple[Task, list[dict]]]]


@contextlib.contextmanager
def _backend(name: str, *, jobs: int, pending: int, ray_address: str | None
             ) -> Iterator[tuple[Executor, int]]:
    """An executor of tasks (yielding ``(task, summaries)`` as each finishes) and its number
    of workers, torn down on exit."""
    if name == "ray":
        with _ray_backend(ray_address) as pair:
            yield pair
    elif jobs == 1 or pending <= 1:
        yield _in_process, 1
    else:
        workers = min(jobs, pending)
        with _process_pool(workers) as execute:
            yield execute, workers


def _in_process(tasks: list[Task]) -> Iterator[tuple[Task, list[dict]]]:
    """The tasks' runs all at once (their structures one after another), so that those whose
    plans come out alike run as one lockstep group (:func:`simwar.api.simulate_batches`),
    each lockstep batch's runs coming back as it finishes (those of a structure that run
    alone: together)."""
    runs = [run for task in tasks for run in task]
    for indices, summaries in simulate_batches(*_task_of(runs)):
        yield [runs[i] for i in indices], [jsonable(s) for s in summaries]


def _run_numbered(item: tuple[int, list[dict], list | None]) -> tuple[int, list[dict]]:
    number, configs, groups = item
    return number, run_many(configs, groups)


@contextlib.contextmanager
def _process_pool(workers: int) -> Iterator[Executor]:
    with process_pool(workers) as pool:
        def execute(tasks: list[Task]) -> Iterator[tuple[Task, list[dict]]]:
            numbered = ((i, *_task_of(task)) for i, task in enumerate(tasks))
            for number, summaries in pool.imap_unordered(_run_numbered, numbered,
                                                         chunksize=1):
                yield tasks[number], summaries

        yield execute


@contextlib.contextmanager
def _ray_backend(ray_address: str | None) -> Iterator[tuple[Executor, int]]:
    try:
        import ray
    except ImportError:
        raise ConfigError("backend ray: Ray is not installed (pip install 'simwar[ray]')") \
            from None
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=ray_address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except Exception as e:  # Ray's own (a missing ray[client], no cluster there): one line
            where = f"--ray-address {ray_address}" if ray_address else "backend ray"
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"{where}: Ray did not start: {text}") from None
    remote_run = ray.remote(num_cpus=1)(run_many)
    workers = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def execute(tasks: list[Task]) -> Iterator[tuple[Task, list[dict]]]:
        # a task per lockstep batch, at least one per worker: each result a table at once
        refs = {remote_run.remote(*_task_of(task)): task for task in tasks}
        waiting = list(refs)
        try:
            while waiting:
                done, waiting = ray.wait(waiting, num_returns=1)
                for ref in done:
                    yield refs[ref], ray.get(ref)
        finally:
            # interrupted (or a run failed): leave no work queued on a shared cluster
            for ref in waiting:
                ray.cancel(ref)

    try:
        yield execute, workers
    finally:
        if started_here:
            ray.shutdown()


__all__ = ["ID_COLUMNS", "MAX_RUNS", "Run", "RunStore", "Sweep", "SweepConflict", "SweepSpec",
           "SweepInterrupted", "SweepTooLarge",
           "check_out_dir", "is_sweep_mapping", "load_sweep", "lockstep_tasks", "results_frame",
           "run_many", "run_name", "run_one", "sweep", "write_tables"]
