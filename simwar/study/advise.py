"""Search the barrier-policy space of a config for the fastest race-free policy.

The search keeps the workload's **facts** fixed: the phase table (which
phases read shared buffers, with which kernels: the reads the race detector
judges), the durations, the costs, the seed. It varies only what a scheduler
author controls:

- ``policy.barrier``: every registered policy (:data:`simwar.config.policies.BARRIERS`);
- where read-done is published, for the policies that consume it (all but
  ``none`` and ``coarse``): the publishing phase, any phase that reads
  (``policy.publish_phase``), and its position (``phases.<P>.read_ends``):
  ``pre_replay``, ``in_replay`` (for a graph phase only with
  ``policy.external_events``: the in-graph node; for an eager phase, after its
  prep kernel) or ``post_replay``. Moving the record does not move the reads:
  a record placed before a read is caught as a latent race;
- ``policy.placement``: ``after_launch`` or ``loop_top``;
- ``policy.plan_stream``: off or on;
- ``policy.needs_cpu_seq_lens``: a property of the attention backend. An author
  may remove the CPU mirror (as SGLang #29343 did for fa3) but never needs to
  add it, so it is searched as {as the input, off}.

Every candidate is simulated with fewer steps than the config (``screen_steps``, default
200, warm-up 20, the same seed: deterministic configs reach their steady state within a few
steps, and 180 measured steps put a stochastic config's mean within a few standard errors of
the long run) and checked for latent races (the *screen*, :func:`screen`: ``jobs`` worker
processes, each a share of the candidates; its answers are the same whatever ``jobs`` is).
Racy candidates are reported, never recommended, and neither is a policy the registry marks
unsafe (``none``), except for a workload in which no phase reads a shared buffer: there no
write can overtake a read, every policy is safe, and ``none`` (no barrier at all) is advised
when it is the fastest (a ``fine`` barrier there has nothing published to wait for and falls
back to ``coarse``). Among race-free candidates within ``tie`` (relative, default 0.1 %) of
the best objective, the one with the largest launch lead wins (a policy that blocks the CPU
leaves less margin for host jitter), then the one with the fewest changes to the input, then
one that needs no new in-graph node. The winner and the input are then re-simulated at the
config's own length with the reference executor, so the advised figures are the ones
``simwar run`` prints for the advised config.

**The screen's cost.** A candidate moves a record or changes a barrier, so its program
differs from every other's in structure, not in numbers: no two candidates share a lockstep
group, and each pays for its own plan and race windows. What the screen spares each one:
the validation (a candidate's config is the validated screen config with its overrides
copied in, :func:`candidate_config`, equal to what :func:`~simwar.config.load_config`
gives), :func:`simwar.api.simulate`'s per-run choice of executor and memory check (made
once for the screen by one :class:`simwar.api.Runner`, which runs every candidate: the
overrides change neither), and, for the candidates that differ only in where read-done is
published (a *family*, side by side in the screen's order, :func:`_screen_order`, and run
together, :meth:`simwar.api.Runner.run_family`), the builder's iterations (its members'
are its first's with the read-done record moved, :mod:`simwar.builder.moves`, where that
record is a host record and the costs are numbers), their shaping (a member's segments are
its first's reading of the ops that neither are nor bind to a record, spliced around its
own records, waits and syncs: :class:`simwar.executors.fast.plan.ShapeMemo`) and the
compiled code: each block's code is compiled once for the family, as the union of its
members' shapes (:mod:`simwar.executors.fast.union`); the race windows, every member's
from one pass over the unions, their vector clocks side by side
(:mod:`simwar.executors.fast.famraces`: the happens-before moves with the record, the
accesses compared do not); and, for a family of 24 members or more, the pass over the
screen's steps, the members as the lanes of one lockstep pass over the unions, each on its
own numbers, their race counts taken over the lanes at once
(:mod:`simwar.executors.lockstep.family`). A member whose record is an in-graph node is
moved from the family's first too (the node in its phase's graph launch). What each member
still pays for itself: its share of the union and of the plan's shaping, its table from
its lane, its summary's share.

:func:`screen` runs the candidates, :func:`_full_length` the confirming runs at full
length: no other place simulates.

Imports: simwar's config, policies, api (the executors, numpy, pandas, simpy through it) and
the builder's families (:mod:`simwar.builder.moves`); the standard library's multiprocessing
for ``jobs``.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass, field

import yaml

from simwar.api import Runner, simulate
from simwar.builder.moves import Family
from simwar.config import Config, load_config
from simwar.config.policies import BARRIERS, barrier, publish_point
from simwar.config.schema import MIN_MEASURED
from simwar.core.collector import gc_paused
from simwar.study.pools import process_pool

#: objective name -> (summary key, direction: +1 larger is better, -1 smaller is better)
OBJECTIVES = {
    "step_us_mean": ("step_us_mean", -1),
    "tokens_per_s": ("tokens_per_s", +1),
    "p99": ("step_us_p99", -1),
}
#: policies whose ordering ignores where read-done is published (the search does not move it)
IGNORES_READ_DONE = frozenset({"none", "coarse"})
POSITIONS = ("pre_replay", "in_replay", "post_replay")
SCREEN_STEPS = 200
SCREEN_WARMUP = 20
TIE = 1e-3


class AdviseError(ValueError):
    """A config or an objective the search cannot work with (one line)."""


# --------------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class Knobs:
    """One point of the policy space. ``publish`` None: as the input declares it."""

    barrier: str
    placement: str
    plan_stream: bool
    needs_cpu_seq_lens: bool
    publish: tuple[str, str] | None = None  # (phase, read_ends)


@dataclass
class Candidate:
    knobs: Knobs
    overrides: dict  # dotted key -> value, relative to the input config
    changes: list[str]  # what changed, in words
    needs: list[str]  # what each change needs in the engine
    description: str = ""
    #: no phase reads a shared buffer: no barrier is needed, so every policy is safe
    nothing_to_protect: bool = False
    summary: dict = field(default_factory=dict)  # of the screening run
    confirmed: dict | None = None  # of the full-length run (the best and the input only)
    #: what its program is made of (:func:`_program_key`): candidates of equal keys are one
    key: tuple = ()

    @property
    def races(self) -> int:
        return int((self.confirmed or self.summary).get("races", 0))

    @property
    def racy(self) -> bool:
        return self.races > 0

    @property
    def safe_policy(self) -> bool:
        return self.nothing_to_protect or barrier(self.knobs.barrier).safe

    def figures(self) -> dict:
        """The full-length figures when there are some, else the screening ones."""
        return self.confirmed or self.summary

    def set_items(self) -> list[str]:
        """The change as ``simwar run --set`` items."""
        return [f"{k}={_yaml_scalar(v)}" for k, v in self.overrides.items()]

    def policy(self) -> dict:
        s = self.summary
        return {"barrier": self.knobs.barrier, "applied": s.get("barrier_effective"),
                "placement": self.knobs.placement, "plan_stream": self.knobs.plan_stream,
                "needs_cpu_seq_lens": self.knobs.needs_cpu_seq_lens,
                "publish_phase": s.get("publish_phase"),
                "publish_position": s.get("publish_position")}

    def to_dict(self, objective: str) -> dict:
        f = self.figures()
        return {"policy": self.policy(), "description": self.description,
                "step_us_mean": f.get("step_us_mean"), "step_us_p99": f.get("step_us_p99"),
                "tokens_per_s": f.get("tokens_per_s"), "objective": _value(f, objective),
                "races": self.races, "racy": self.racy, "changes": self.changes,
                "needs": self.needs, "set": self.set_items(),
                "screened": {k: self.summary.get(k) for k in
                             ("step_us_mean", "step_us_p99", "tokens_per_s", "races")},
                "full_length": self.confirmed is not None}


def _yaml_scalar(v) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("\n...").strip()


def readers(cfg: Config) -> list:
    return [p for p in cfg.phase_table() if p.reads]


def positions(phase, external_events: bool) -> list[str]:
    """Where ``phase`` may publish: an in-graph node needs a graph and external events."""
    return [p for p in POSITIONS
            if p != "in_replay" or phase.graph == "eager" or external_events]


def space(cfg: Config) -> list[Candidate]:
    """Every distinct candidate of the policy space of ``cfg`` (the input's own first)."""
    phases = cfg.phase_table()
    reading = [p for p in phases if p.reads]  # none: only the barrier and its placement vary
    pol = cfg.policy
    publish_options: list[tuple[str, str] | None] = [None] + [
        (p.name, pos) for p in reading for pos in positions(p, pol.external_events)]
    seq_options = [pol.needs_cpu_seq_lens] + ([False] if pol.needs_cpu_seq_lens else [])
    plan_options = [pol.plan_stream, not pol.plan_stream]
    names = [pol.barrier] + [b for b in BARRIERS if b != pol.barrier]
    seen: set = set()
    out: list[Candidate] = []
    for name in names:
        pubs = [None] if name in IGNORES_READ_DONE else publish_options
        placements = [pol.placement] + [p for p in ("after_launch", "loop_top")
                                        if p != pol.placement]
        for placement, plan, seq, pub in itertools.product(placements, plan_options,
                                                           seq_options, pubs):
            knobs = Knobs(name, placement, plan, seq, pub)
            cand = _candidate(cfg, phases, knobs)
            if cand is None:
                continue
            key = _program_key(cfg, phases, knobs)
            if key in seen:
                continue
            seen.add(key)
            cand.key = key
            out.append(cand)
    return out


def _effective_publish_phase(cfg: Config, phases) -> str | None:
    pp = cfg.policy.publish_phase
    if pp != "auto":
        return pp
    reading = [p.name for p in phases if p.reads]
    return reading[-1] if reading else None


def _point(cfg: Config, phases, knobs: Knobs):
    pol = cfg.policy
    if knobs.publish is None:
        return publish_point(phases, pol.publish_phase, pol.external_events,
                             pol.in_replay_fallback)
    name, pos = knobs.publish
    table = [p.model_copy(update={"read_ends": pos}) if p.name == name else p for p in phases]
    return publish_point(table, name, pol.external_events, pol.in_replay_fallback)


def _program_key(cfg: Config, phases, knobs: Knobs) -> tuple:
    """Candidates with equal keys build the same program: simulate one of them."""
    point = _point(cfg, phases, knobs)
    placement = knobs.placement if knobs.barrier != "none" else "-"  # none fences nothing
    return (knobs.barrier, placement, knobs.plan_stream, knobs.needs_cpu_seq_lens,
            point.phase, point.position, point.in_graph)


def _candidate(cfg: Config, phases, knobs: Knobs) -> Candidate | None:
    pol = cfg.policy
    over: dict = {}
    changes: list[str] = []
    needs: list[str] = []
    unread = not any(p.reads for p in phases)
    if knobs.barrier != pol.barrier:
        over["policy.barrier"] = knobs.barrier
        changes.append(f"barrier {pol.barrier} -> {knobs.barrier}")
        needs.append(_barrier_needs(pol.barrier, knobs.barrier, unread))
    old = _point(cfg, phases, Knobs(pol.barrier, pol.placement, pol.plan_stream,
                                    pol.needs_cpu_seq_lens))
    if knobs.publish is not None:
        name, pos = knobs.publish
        phase = next(p for p in phases if p.name == name)
        new = _point(cfg, phases, knobs)
        if (new.phase, new.position, new.in_graph) == (old.phase, old.position, old.in_graph):
            return None  # the same as publishing as the input declares: listed once
        if _effective_publish_phase(cfg, phases) != name:
            last = [p.name for p in phases if p.reads][-1]
            over["policy.publish_phase"] = "auto" if name == last else name
        if phase.read_ends != pos:
            over[f"phases.{name}.read_ends"] = pos
        where = _position_words(phase, pos, new.in_graph)
        changes.append(f"read-done published {where}"
                       + (f" (was: {_point_words(phases, old)})" if old.phase else
                          " (was: nothing published)"))
        needs.append(_publish_needs(phase, pos, new.in_graph, old.phase != name))
    if knobs.placement != pol.placement:
        over["policy.placement"] = knobs.placement
        changes.append(f"placement {pol.placement} -> {knobs.placement}")
        needs.append("issue the barrier right after run_batch's launches (SGLang #31687)"
                     if knobs.placement == "after_launch" else
                     "issue the barrier at the top of the next iteration (before #31687)")
    if knobs.plan_stream != pol.plan_stream:
        over["policy.plan_stream"] = knobs.plan_stream
        changes.append(f"plan stream {'on' if knobs.plan_stream else 'off'}")
        needs.append("the shared writes on the plan stream (plan.wait_stream(schedule), the "
                     "writes, schedule.wait_stream(plan))" if knobs.plan_stream else
                     "the shared writes on the schedule stream (no plan stream)")
    if knobs.needs_cpu_seq_lens != pol.needs_cpu_seq_lens:
        over["policy.needs_cpu_seq_lens"] = knobs.needs_cpu_seq_lens
        changes.append("no CPU seq_lens mirror")
        needs.append("an attention backend that builds its page table on the device: no "
                     "resolve_seq_lens_cpu D2H and host block (as SGLang #29343 did for fa3)")
    cand = Candidate(knobs, over, changes, needs, nothing_to_protect=unread)
    cand.description = _describe(cfg, phases, knobs)
    return cand


def _position_words(phase, pos: str, in_graph: bool) -> str:
    if phase.graph == "eager":
        return {"pre_replay": f"after {phase.name}'s load_batch",
                "in_replay": f"after {phase.name}'s prep",
                "post_replay": f"after {phase.name}'s body"}[pos]
    if pos == "in_replay" and in_graph:
        return f"at {phase.name}'s in-graph node"
    return {"pre_replay": f"before {phase.name}'s graph launch",
            "in_replay": f"after {phase.name}'s graph launch",
            "post_replay": f"after {phase.name}'s graph launch"}[pos]


def _point_words(phases, point) -> str:
    phase = next(p for p in phases if p.name == point.phase)
    return _position_words(phase, point.position, point.in_graph)


def _describe(cfg: Config, phases, knobs: Knobs) -> str:
    parts = [knobs.barrier]
    if knobs.barrier not in IGNORES_READ_DONE:
        point = _point(cfg, phases, knobs)
        parts.append(f"read-done {_point_words(phases, point)}" if point.phase
                     else "nothing published")
    if knobs.barrier != "none":
        parts.append(knobs.placement)
    if knobs.plan_stream:
        parts.append("plan stream")
    if knobs.needs_cpu_seq_lens:
        parts.append("CPU seq_lens")
    return ", ".join(parts)


def _barrier_needs(old: str, new: str, unread: bool = False) -> str:
    if new == "fine":
        text = ("the fine barrier: schedule.wait_event(read_done) after each launch, on the "
                "event the publishing phase records")
        if old == "host_sync":
            text = ("drop the host-blocking read-done synchronize (the legacy "
                    "verify_done.synchronize()); " + text + " (SGLang #29541/#29556)")
        return text
    if new == "coarse":
        return ("the coarse barrier: schedule.wait_stream(forward) after each launch "
                "(no read-done needed)")
    if new == "host_sync":
        return "a host synchronize on read-done before the next writes (blocks the CPU)"
    if new == "none" and unread:
        return ("no barrier: no phase reads a shared buffer (every phases.*.reads is empty), "
                "so the next step's writes have no read to wait for")
    if new == "none":
        return "no barrier (unsafe: the next writes are not ordered after the reads)"
    return barrier(new).doc or f"the {new} barrier"


def _publish_needs(phase, pos: str, in_graph: bool, new_phase: bool) -> str:
    who = (f"{phase.name}'s runner publishes read-done (the scheduler reads its mailbox); "
           if new_phase else "")
    if phase.graph == "eager":
        where = _position_words(phase, pos, False)
        return who + f"a read-done record on the forward stream {where}"
    if pos == "in_replay" and in_graph:
        return who + (f"an in-graph event record node in {phase.name}'s graph after its "
                      "in-graph prep (external events in capture)")
    if pos == "pre_replay":
        return who + (f"a host record of read-done after {phase.name}'s load_batch, before "
                      "its graph launch")
    return who + f"a host record of read-done after {phase.name}'s graph launch"


# --------------------------------------------------------------------------- simulation
#: the policy keys a candidate overrides, each value one :func:`space` made from the
#: config's own phases and the registry, so valid there (and phases.<P>.read_ends)
POLICY_KEYS = frozenset({"barrier", "placement", "plan_stream", "needs_cpu_seq_lens",
                         "publish_phase"})


def candidate_config(base: Config, overrides: dict) -> Config:
    """``load_config(base, overrides)`` for a candidate of ``base``, without validating again.

    A candidate's overrides are policy keys (:data:`POLICY_KEYS`) and ``phases.P.read_ends``
    whose values :func:`space` took from what ``base`` allows (a registered barrier, a
    placement, a phase of the table that reads, a position): no rule of the config can refuse
    them (the one across keys, ``publish_phase`` naming a phase, holds by construction), so
    they are copied into the validated config. Any other key, or a config with per-rank
    overrides (each rank's config is validated with them), is validated as usual. The tests
    hold the two equal for every candidate of the shipped configs.
    """
    policy: dict = {}
    ends: dict = {}
    for key, value in overrides.items():
        parts = key.split(".")
        if len(parts) == 2 and parts[0] == "policy" and parts[1] in POLICY_KEYS:
            policy[parts[1]] = value
        elif len(parts) == 3 and parts[0] == "phases" and parts[2] == "read_ends":
            ends[parts[1]] = value
        else:
            return load_config(base, overrides)
    if base.ranks is not None and base.ranks.per_rank:
        return load_config(base, overrides)
    update: dict = {}
    if policy:
        update["policy"] = base.policy.model_copy(update=policy)
    if ends:  # the resolved table: one dict per phase, in order
        update["phases"] = [{**p, "read_ends": ends[p["name"]]} if p["name"] in ends else p
                            for p in base.phases]
    return base.model_copy(update=update) if update else base


class _Screen:
    """Screens candidates of one config: each its summary at the screen's length.

    ``base``: the config at the screen's length, validated. What :func:`simwar.api.simulate`
    decides before a run (the memory check, the executor: ``fast``) is decided once, by one
    :class:`simwar.api.Runner` of ``base``: a candidate's overrides change neither (they
    are the barrier and where records go, not the run's size, ranks or workload), so each
    candidate is a variant the Runner runs.
    """

    def __init__(self, base: Config):
        self.base = base
        self.runner = Runner(base, "fast")
        self.families: dict[tuple, Family] = {}

    def summaries(self, overrides: list[dict]) -> list[dict]:
        """The summary of each candidate (of these overrides), those of one family (the
        candidates that differ only in where read-done is published) run together
        (:meth:`simwar.api.Runner.run_family`: their code compiled once)."""
        cfgs = [candidate_config(self.base, over) for over in overrides]
        out: list[dict] = []
        for key, group in itertools.groupby(cfgs, key=lambda c: _family_key(c.policy)):
            family = self.families.setdefault(key, Family())
            out += [r.summary for r in self.runner.run_family(list(group), family)]
        return out


def _family_key(pol) -> tuple:
    """What a family's members share, of a config's policy or a candidate's knobs (the
    rest is where read-done is published)."""
    return (pol.barrier, pol.placement, pol.plan_stream, pol.needs_cpu_seq_lens)


def _screen_order(cands: list[Candidate]) -> list[int]:
    """The order the candidates are screened in: by their program key, so that a family's
    members (its first four items: the barrier, placement, plan stream and CPU mirror) are
    side by side, and run together (:meth:`_Screen.summaries`)."""
    return sorted(range(len(cands)), key=lambda i: tuple(
        "" if x is None else x for x in cands[i].key))


#: a family's candidates screened together in this process at most (:meth:`_Screen.summaries`)
#: before it hands the rest to worker processes (``jobs`` > 1), so that it looks at the
#: clock often
FAMILY_PART = 16
#: seconds of screening in this process before the rest is handed to worker processes
#: (starting them costs about a tenth of a second: a small space is done sooner alone)
ALONE_S = 0.5


def screen(cfg: Config, cands: list[Candidate], steps: int, warmup: int, *, jobs: int = 1,
           progress=None) -> None:
    """Simulate each candidate at ``steps`` steps (warm-up ``warmup``) into its ``summary``.

    ``jobs``: processes (0: one per core). The screen starts in this process; when
    candidates are left after :data:`ALONE_S` seconds, ``jobs`` worker processes take them,
    each a run of consecutive candidates in the screen's order at a time. Every summary is
    the one a run in this process gives (the same config, the same executor: bit for bit),
    whatever ``jobs`` is. ``progress(done, total)``: called as candidates finish.
    """
    if jobs < 0:
        raise AdviseError(f"jobs: expected 0 (one per core) or a positive number, "
                          f"got {jobs}")
    jobs = jobs or os.cpu_count() or 1  # as a sweep's jobs 0
    base = load_config(cfg, {"steps": steps, "warmup_steps": warmup})
    order = _screen_order(cands)
    total = len(cands)
    runner = _Screen(base)
    done = 0
    start = time.perf_counter()
    with gc_paused():
        while done < total and (jobs == 1 or total - done < 2
                                or time.perf_counter() - start < ALONE_S):
            # the next candidate's family (run together), at most FAMILY_PART of it when
            # workers may take the rest
            fam = _family_key(cands[order[done]].knobs)
            part = list(itertools.takewhile(
                lambda i, fam=fam: _family_key(cands[i].knobs) == fam,
                order[done:done + (FAMILY_PART if jobs > 1 else total)]))
            for i, summary in zip(part, runner.summaries([cands[i].overrides
                                                          for i in part])):
                cands[i].summary = summary
            done += len(part)
            if progress is not None:
                progress(done, total)
    if done == total:
        return
    # a few runs per worker: the load stays balanced, progress moves, and the candidates
    # that share code stay together (they are neighbours in the order)
    rest = order[done:]
    workers = min(jobs, len(rest))
    size = -(-len(rest) // (workers * 4))
    work = [[(i, cands[i].overrides) for i in rest[k:k + size]]
            for k in range(0, len(rest), size)]
    with _pool(workers, base) as pool:
        for results in pool.imap_unordered(_screen_part, work):
            for i, summary in results:
                cands[i].summary = summary
            done += len(results)
            if progress is not None:
                progress(done, total)


_WORKER: _Screen | None = None  # a worker process's screen (set by _start_worker)


def _start_worker(base: Config) -> None:
    global _WORKER
    _WORKER = _Screen(base)


def _screen_part(part: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    with gc_paused():
        return list(zip([i for i, _ in part], _WORKER.summaries([over for _, over in part])))


def _pool(workers: int, base: Config):
    """A pool of ``workers`` screening processes for ``base`` (:mod:`simwar.study.pools`:
    how they start, and end at once on an error or Ctrl-C)."""
    return process_pool(workers, _start_worker, (base,))


def _value(summary: dict, objective: str) -> float:
    key, _ = OBJECTIVES[objective]
    v = summary.get(key)
    return float(v) if v is not None else math.nan


# --------------------------------------------------------------------------- advice
@dataclass
class Advice:
    config: Config
    objective: str
    candidates: list[Candidate]  # ranked: race-free by objective, then racy
    baseline: Candidate
    best: Candidate | None
    screen_steps: int
    screen_warmup: int

    @property
    def saving_us(self) -> float:
        if self.best is None:
            return 0.0
        return (self.baseline.figures()["step_us_mean"]
                - self.best.figures()["step_us_mean"])

    def config_diff(self) -> str:
        """The best candidate's changes as YAML in the config's layout ('' when none)."""
        if self.best is None or not self.best.overrides:
            return ""
        return yaml.safe_dump(diff_tree(self.best.overrides), sort_keys=False,
                              default_flow_style=None).strip()

    def to_dict(self) -> dict:
        base = self.baseline.to_dict(self.objective)
        base["racy"] = self.baseline.racy
        out = {"config": self.config.name, "objective": self.objective,
               "screen": {"steps": self.screen_steps, "warmup_steps": self.screen_warmup,
                          "seed": self.config.seed},
               "baseline": base,
               "candidates": [c.to_dict(self.objective) for c in self.candidates],
               "best": None}
        if self.best is not None:
            best = self.best.to_dict(self.objective)
            best["saving_us"] = self.saving_us
            best["config_diff"] = self.config_diff()
            out["best"] = best
        return out


def diff_tree(overrides: dict) -> dict:
    """Dotted overrides as nested YAML: ``phases.verify.read_ends`` -> a phases entry."""
    tree: dict = {}
    for key, value in overrides.items():
        parts = key.split(".")
        if parts[0] == "phases":
            phases = tree.setdefault("phases", [])
            entry = next((p for p in phases if p["name"] == parts[1]), None)
            if entry is None:
                entry = {"name": parts[1]}
                phases.append(entry)
            entry[parts[2]] = value
            continue
        node = tree
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return tree


def advise(cfg, objective: str = "step_us_mean", *, screen_steps: int = SCREEN_STEPS,
           screen_warmup: int = SCREEN_WARMUP, tie: float = TIE, confirm: bool = True,
           jobs: int = 1, progress=None) -> Advice:
    """Search the policy space of ``cfg`` (a path, mapping or Config) for ``objective``.

    ``jobs``: processes screening the candidates (:func:`screen`; 0: one per core);
    the advice is the same for any. ``progress(done, total)``, if given, is called as
    screened candidates finish.
    """
    if objective not in OBJECTIVES:
        raise AdviseError(f"objective '{objective}' is not known (expected one of "
                          f"{', '.join(OBJECTIVES)})")
    cfg = load_config(cfg)
    cands = space(cfg)
    steps = min(cfg.steps, screen_steps)
    # a screen run measures at least MIN_MEASURED steps after its warm-up, as any run must
    warm = max(0, min(cfg.warmup_steps, screen_warmup, steps - MIN_MEASURED - 1))
    screen(cfg, cands, steps, warm, jobs=jobs, progress=progress)
    _, direction = OBJECTIVES[objective]
    baseline = next(c for c in cands if not c.overrides)

    def order(c: Candidate):
        v = _value(c.summary, objective)
        return (c.racy, math.isnan(v), -direction * v if not math.isnan(v) else 0.0,
                len(c.overrides), c.description)

    ranked = sorted(cands, key=order)
    eligible = [c for c in ranked if not c.racy and c.safe_policy
                and not math.isnan(_value(c.summary, objective))]
    best = None
    while eligible:
        best = _choose(eligible, objective, tie, order)
        if confirm:
            best.confirmed = _full_length(cfg, best)
            if best.racy:  # the long run found a race the short one did not: never advise it
                eligible.remove(best)
                best = None
                continue
        ranked.remove(best)
        ranked.insert(0, best)
        break
    if confirm and baseline.confirmed is None:
        baseline.confirmed = _full_length(cfg, baseline)
    return Advice(cfg, objective, ranked, baseline, best, steps, warm)


def _full_length(cfg: Config, cand: Candidate) -> dict:
    # at full length, on the config's own engine (the fast executor's answers are the same)
    return dict(simulate(load_config(cfg, cand.overrides)).summary)


def _choose(eligible: list[Candidate], objective: str, tie: float, order) -> Candidate:
    """The best of the ranked race-free candidates, ties broken towards robustness, then
    simplicity: within ``tie`` of the best objective, the largest launch lead (the run-ahead
    margin that absorbs host jitter: a policy that blocks the CPU has less), then the fewest
    changes to the input."""
    top = _value(eligible[0].summary, objective)
    close = [c for c in eligible if abs(_value(c.summary, objective) - top) <= tie * abs(top)]

    def lead(c: Candidate) -> float:
        v = c.summary.get("launch_lead_us_mean")
        return float(v) if v is not None and not math.isnan(v) else -math.inf

    most = max(lead(c) for c in close)
    if math.isfinite(most):
        close = [c for c in close if most - lead(c) <= max(1.0, tie * abs(most))]
    return min(close, key=lambda c: (len(c.overrides), _effort(c), order(c)))


def _effort(c: Candidate) -> int:
    """Engine work beyond the number of changes: a new in-graph node needs external events
    in capture, so a host record that does as well is preferred to it."""
    return int(c.knobs.publish is not None and c.summary.get("publish_position") == "in_replay"
               and any("in-graph event record node" in n for n in c.needs))
