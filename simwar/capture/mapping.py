"""The import mapping: how a real capture's names map onto simwar's vocabulary.

A mapping is a small YAML file (every key optional)::

    name: sglang-dspark-h200
    preset: sglang                   # start from a preset (simwar.capture.presets)
    streams: {7: forward, 13: schedule, 20: copy}   # CUDA stream id -> lane
    forward_stream: forward          # lane (or stream id) whose kernels make a step's forward
    host_thread: 31337               # tid of the scheduler thread (default: the one with the
                                     #   step ranges, else the one with the most launches)
    process: 4242                    # pid of the rank analysed when a capture holds several
                                     #   processes (default: the one with the step ranges)
    steps: '^ProfilerStep#\\d+$'     # annotation regex that delimits decode steps
    run_batch: '^run_batch$'         # annotation whose start is the run_batch marker
    batch: '^decode bs=(\\d+)$'      # one group: each step's batch, from a range in it
    shape: '^step\\[(?P<mode>[A-Z]+) bs=(?P<batch>\\d+)'   # named groups: a step's shape
                                     #   (mode, batch, tokens, context, generation, ...:
                                     #   simwar.capture.step_shapes; the fit reads each
                                     #   step's decode/prefill/mixed: simwar.fit.shapes)
    idle: '^wait_requests$'          # ranges where the loop waits for requests (left out)
    receive: '^recv reqs=(?P<requests>\\d+) toks=(?P<tokens>\\d+)$'   # a range around the
                                     #   host's work of receiving requests: its requests and
                                     #   their prompt tokens (cpu.receive_us: simwar.fit.receive)
    graph_buckets: [8, 16, 32, 64]   # the captured graphs' batch sizes (simwar.capture.sizes)
    phases:                          # regex -> phase, tried in order on the kernel name,
      'draft': draft                 #   then on the annotations enclosing its launch
      'verify|target': verify
    default_phase: ''                # phase of kernels no regex matches
    sites: {'copy_done|process_result': result_copy}   # annotation regex -> sync site
    cpu:                             # host annotation regex -> the config's CPU work
      '^get_next_batch_to_run$': schedule  #   (ingest, schedule, prepare, process_result)
      '^process_batch_result$': process_result
    reads: {verify: [req_to_token]}  # phase -> shared buffers it reads (a capture cannot
                                     #   show reads; used by --fit and simwar races); a key
                                     #   that is no phase is a regex, as for writes
    writes: {'index_put': [req_to_token]}   # kernel or range regex -> buffers it writes
                                     #   (simwar races: simwar.capture.accesses)
    gpu_clock_offset_us: 0           # added to device times; 'auto' aligns kernels with launches
    warmup_steps: 2
    batch_size: 32
    accept_tokens: 3.2

Stream keys are CUDA stream ids, or ``"DEVICE:STREAM"`` when a capture holds
several GPUs; the lanes ``forward``, ``schedule``, ``plan`` and ``copy`` are
the builder's streams (``simwar import --fit`` detects the forward, schedule and
copy streams when they are not named). ``batch`` and ``graph_buckets`` give each step its
batch and bucket (:mod:`simwar.capture.sizes`). A mapping may start from a preset
(:mod:`simwar.capture.presets`; ``preset:`` in the file, or ``--preset``): its keys
replace the preset's, and the preset's own entries that match nothing in a capture are
dropped there (:attr:`Mapping.soft`). Errors are
:class:`simwar.config.schema.ConfigError` with one line naming the file and key; a
regex that matches nothing in a capture is checked where the capture is read
(:func:`unmatched_keys`).

Imports: pydantic and yaml (through :mod:`simwar.config.schema`); no pandas, and never the
simulator (api, executors, build).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)

from simwar.config import ConfigError, first_error, read_yaml

#: ProfilerStep ranges that torch.profiler's ``prof.step()`` writes.
PROFILER_STEP = r"^ProfilerStep#\d+$"
#: the config's CPU work a ``cpu`` rule may name (``simwar.config.schema.Cpu``)
CPU_ITEMS = ("ingest", "schedule", "prepare", "process_result")
#: the named groups of a ``receive`` pattern: the range's requests and their prompt tokens
RECEIVE_GROUPS = ("requests", "tokens")
RECEIVE_EXAMPLE = r"^recv reqs=(?P<requests>\d+) toks=(?P<tokens>\d+)$"


class FirstMatch(dict):
    """``rules[name]``: the value of the first ``(regex, value)`` rule whose regex finds
    ``name`` (``default`` where none does), searched once a name and kept: most names (kernels,
    ranges) recur every step, so a lookup is a dict's. The one memo of a mapping's name rules
    (:meth:`Mapping.step_test`, :meth:`Mapping.phase_of`, :meth:`Mapping.site_of`,
    :meth:`Mapping.cpu_item_of`)."""

    __slots__ = ("default", "rules")

    def __init__(self, rules: list[tuple[re.Pattern, Any]], default: Any = None):
        super().__init__()
        self.rules = rules
        self.default = default

    def __missing__(self, name: str) -> Any:
        value = self[name] = next((v for rx, v in self.rules if rx.search(name)), self.default)
        return value


class Mapping(BaseModel):
    """Validated import mapping (see the module docstring for the YAML form)."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    #: the preset a mapping file starts from (``--preset`` names it on the command line)
    preset: str | None = None
    streams: dict[str, str] = Field(default_factory=dict)
    forward_stream: str | None = None
    host_thread: int | None = None
    process: int | None = None
    steps: str = PROFILER_STEP
    run_batch: str | None = None
    batch: str | None = None
    shape: str | None = None
    idle: str | None = None
    receive: str | None = None
    graph_buckets: list[int] | None = None
    phases: dict[str, str] = Field(default_factory=dict)
    default_phase: str | None = None
    sites: dict[str, str] = Field(default_factory=dict)
    cpu: dict[str, str] = Field(default_factory=dict)
    reads: dict[str, list[str]] = Field(default_factory=dict)
    writes: dict[str, list[str]] = Field(default_factory=dict)
    gpu_clock_offset_us: float | Literal["auto"] = 0.0
    warmup_steps: int = Field(default=0, ge=0)
    batch_size: int = Field(default=1, ge=1)
    accept_tokens: float = Field(default=1.0, gt=0)
    #: the preset's entries, by key: ``{"cpu": {pattern, ...}, "batch": {pattern}, ...}``;
    #: what matches nothing of a capture is dropped from it (not an error)
    _soft: dict = PrivateAttr(default_factory=dict)
    #: the preset this mapping starts from ('' none) and why (``--preset``, detected)
    _origin: tuple = PrivateAttr(default=("", ""))
    #: the preset's entries that matched nothing in the capture, by key (the import lists them)
    _dropped: dict = PrivateAttr(default_factory=dict)

    @property
    def soft(self) -> dict:
        return self._soft

    @property
    def origin(self) -> tuple[str, str]:
        """``(name, how)``: the preset this mapping starts from ('' none) and why."""
        return self._origin

    @field_validator("batch")
    @classmethod
    def _batch(cls, v: str | None) -> str | None:
        if v is not None:
            groups = _compile(v).groups
            if groups != 1:
                raise ValueError(f"'{v}' has {groups} capture groups; expected exactly one, "
                                 f"the batch, e.g. '^decode bs=(\\d+)$'")
        return v

    @field_validator("shape")
    @classmethod
    def _shape(cls, v: str | None) -> str | None:
        if v is not None and not _compile(v).groupindex:
            raise ValueError(f"'{v}' has no named group; expected groups such as (?P<mode>...), "
                             f"(?P<batch>\\d+), (?P<tokens>\\d+)")
        return v

    @field_validator("receive")
    @classmethod
    def _receive(cls, v: str | None) -> str | None:
        if v is not None:
            groups = set(_compile(v).groupindex)
            if "requests" not in groups or groups - set(RECEIVE_GROUPS):
                named = ", ".join(sorted(groups)) or "no group"
                raise ValueError(f"'{v}' names {named}; expected the named groups "
                                 f"(?P<requests>\\d+) and optionally (?P<tokens>\\d+), "
                                 f"e.g. '{RECEIVE_EXAMPLE}'")
        return v

    @field_validator("graph_buckets", mode="before")
    @classmethod
    def _buckets(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, list) or not v:
            raise ValueError("expected a non-empty list of batch sizes, e.g. [8, 16, 32, 64]")
        for i, b in enumerate(v):
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise ValueError(f"{i}: a bucket is a positive whole batch size, got {b!r}")
        if len(set(v)) != len(v):
            raise ValueError("duplicate buckets")
        return sorted(v)

    @field_validator("streams", mode="before")
    @classmethod
    def _stream_keys(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for key, lane in v.items():
            text = str(key).strip()
            if not re.fullmatch(r"(\d+:)?\d+", text):
                raise ValueError(f"stream key {key!r} must be a stream id or DEVICE:STREAM")
            if not isinstance(lane, str) or not lane:
                raise ValueError(f"stream {key}: lane name must be a non-empty string")
            out[text] = lane
        return out

    @field_validator("forward_stream", mode="before")
    @classmethod
    def _forward(cls, v: Any) -> Any:
        return None if v is None else str(v)

    @field_validator("steps", "run_batch", "idle")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            _compile(v)
        return v

    @field_validator("phases", "sites", "cpu")
    @classmethod
    def _regex_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for pattern in v:
            _compile(pattern)
        return v

    @field_validator("cpu")
    @classmethod
    def _cpu_items(cls, v: dict[str, str]) -> dict[str, str]:
        for pattern, item in v.items():
            if item not in CPU_ITEMS:
                raise ValueError(f"'{pattern}': '{item}' is not CPU work of the config "
                                 f"({', '.join(CPU_ITEMS)})")
        return v

    @field_validator("reads", "writes", mode="before")
    @classmethod
    def _buffers(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for phase, buffers in v.items():
            if isinstance(buffers, str):
                buffers = [buffers]
            if not isinstance(buffers, list) or not buffers or not all(
                    isinstance(b, str) and b for b in buffers):
                raise ValueError(f"{phase}: expected a list of buffer names, e.g. "
                                 f"[req_to_token]")
            out[str(phase)] = list(buffers)
        return out

    @field_validator("writes")
    @classmethod
    def _write_keys(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for pattern in v:
            _compile(pattern)
        return v

    # ---- compiled views used by the importer: each a FirstMatch (its regexes searched once a
    # name), made once per import
    def phase_of(self) -> FirstMatch:
        """A name's phase by the ``phases`` rules (None: no rule matches): the importer's,
        for a kernel's name and for the ranges around its launch."""
        return FirstMatch([(re.compile(p), name) for p, name in self.phases.items()])

    def site_of(self) -> FirstMatch:
        """A range name's sync site by the ``sites`` rules (None: no rule matches)."""
        return FirstMatch([(re.compile(p), name) for p, name in self.sites.items()])

    def cpu_item_of(self) -> FirstMatch:
        """A range name's CPU work item by the ``cpu`` rules (None: no rule matches)."""
        return FirstMatch([(re.compile(p), item) for p, item in self.cpu.items()])

    def step_test(self) -> Callable[[str], bool]:
        """The one test of whether a range is a step's: its name matches ``steps``; the
        importer's and the choice of the primary rank's
        (:func:`simwar.capture.ranks.primary_rank`)."""
        return FirstMatch([(re.compile(self.steps), True)], False).__getitem__

    def lane_of_role(self, role: str) -> str | None:
        """The lane the mapping gives the builder's stream ``role`` (None: not named)."""
        return role if role in self.streams.values() else None

    def unmatched_phase(self) -> str:
        """Phase of kernels no rule matches: '' with rules (not forward work), else 'forward'."""
        if self.default_phase is not None:
            return self.default_phase
        return "" if self.phases else "forward"

    def lane_for(self, device: int, stream: int, multi_device: bool) -> str:
        lane = self.streams.get(f"{device}:{stream}") or self.streams.get(str(stream))
        if lane:
            return lane
        return f"gpu{device}.stream{stream}" if multi_device else f"stream{stream}"


def unmatched_keys(mapping: Mapping, kernel_names, annotation_names) -> list[str]:
    """The mapping's regexes that match nothing in a capture, one sentence each.

    ``phases`` rules are tried on kernel names and annotation names (as the
    importer does), ``sites``, ``cpu``, ``steps``, ``run_batch``, ``batch``, ``idle``,
    ``shape`` and ``receive`` on annotation names. Each sentence names the key and how many
    candidates there were. A preset's entries (:attr:`Mapping.soft`) are optional and never listed.
    """
    kernels = sorted(set(kernel_names))
    notes = sorted(set(annotation_names))
    out = []

    def check(key: str, pattern: str, names: list[str], what: str) -> None:
        if pattern in mapping.soft.get(key, ()):  # a preset's entry: optional
            return
        rx = re.compile(pattern)
        if not any(rx.search(n) for n in names):
            shapes = sorted({re.sub(r"\d+", "N", n) for n in names})
            some = ", ".join(shapes[:5]) + (", ..." if len(shapes) > 5 else "")
            out.append(f"{key} '{pattern}' matches none of the capture's {len(names)} {what}"
                       + (f" ({some})" if some else ""))

    for pattern in mapping.phases:
        check("phases", pattern, kernels + notes, "kernel and annotation names")
    for key in ("sites", "cpu"):
        for pattern in getattr(mapping, key):
            check(key, pattern, notes, "annotation names")
    check("steps", mapping.steps, notes, "annotation names")
    if mapping.run_batch is not None:
        check("run_batch", mapping.run_batch, notes, "annotation names")
    for key in ("batch", "idle", "shape", "receive"):
        if getattr(mapping, key) is not None:
            check(key, getattr(mapping, key), notes, "annotation names")
    return out


def _compile(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid regex '{pattern}': {e}") from None


def load_mapping(source: str | Path | dict | Mapping | None) -> Mapping:
    """A Mapping from a YAML path, a dict, a Mapping, or None (all defaults)."""
    if isinstance(source, Mapping):
        return source
    label = "<mapping>"
    if source is None:
        data: dict = {}
    elif isinstance(source, dict):
        data = source
    else:
        label = str(source)
        data = read_yaml(source)
    try:
        return Mapping(**data)
    except ValidationError as e:
        raise ConfigError(f"{label}: {first_error(e)}") from None
