"""Built-in speculative-decoding algorithms, as phase tables (plain data).

Each entry is one phase of a decode step, in forward-stream order, with the
schema of :class:`simwar.config.schema.Phase`. The tables follow SGLang 0.5.23 as
described in docs/design.md:

- ``none``: one decode graph; its in-graph metadata prep re-gathers the live
  page table, so the backend declares IN_REPLAY (planted node).
- ``eagle``: draft → target verify → sample/accept (FutureMap publish) →
  draft_extend. draft_extend reads ``req_to_token`` for the accepted
  positions and its backend declaration is UNKNOWN in 0.5.23, so the
  last-reading phase publishes nothing and EAGLE falls back to coarse.
- ``dflash``: draft block (TARGET_VERIFY mode, reads the table) → target
  verify (IN_REPLAY marker, #29541) → accept/publish → materialize target
  hidden states into the draft KV using precomputed locations (no shared
  reads), so verify is the last reader.
- ``dspark``: draft proposal → target verify (full, non-breakable graph,
  IN_REPLAY since #34816) → publish. No draft_extend.

Durations are representative (µs per TP rank); override them per config.
Imports: nothing from simwar (tables are data).
"""

from __future__ import annotations

import copy

R2T = ["req_to_token"]

_TABLES: dict[str, list[dict]] = {
    "none": [
        dict(name="decode", runner="target", graph="full", read_ends="in_replay",
             load_batch_us=30.0, prep_us=20.0, body_us=7000.0, host_us=60.0, reads=R2T),
        dict(name="sample", runner="target", graph="eager", read_ends="unknown",
             body_us=80.0, host_us=20.0, future_publish=True),
    ],
    "eagle": [
        dict(name="draft", runner="draft", graph="full", read_ends="in_replay",
             load_batch_us=20.0, prep_us=20.0, body_us=600.0, host_us=40.0, reads=R2T),
        dict(name="verify", runner="target", graph="full", read_ends="in_replay",
             load_batch_us=40.0, prep_us=40.0, body_us=5000.0, host_us=40.0, reads=R2T),
        dict(name="sample", runner="target", graph="eager", read_ends="unknown",
             body_us=100.0, host_us=20.0, future_publish=True),
        dict(name="draft_extend", runner="draft", graph="full", read_ends="unknown",
             load_batch_us=30.0, prep_us=20.0, body_us=900.0, host_us=40.0, reads=R2T),
    ],
    "dflash": [
        dict(name="draft", runner="draft", graph="full", read_ends="in_replay",
             load_batch_us=30.0, prep_us=20.0, body_us=800.0, host_us=40.0, reads=R2T),
        dict(name="verify", runner="target", graph="full", read_ends="in_replay",
             load_batch_us=40.0, prep_us=40.0, body_us=5000.0, host_us=40.0, reads=R2T),
        dict(name="sample", runner="target", graph="eager", read_ends="unknown",
             body_us=100.0, host_us=20.0, future_publish=True),
        dict(name="materialize", runner="draft", graph="eager", read_ends="unknown",
             body_us=200.0, host_us=20.0),
    ],
    "dspark": [
        dict(name="draft", runner="draft", graph="full", read_ends="in_replay",
             load_batch_us=20.0, prep_us=20.0, body_us=500.0, host_us=40.0, reads=R2T),
        dict(name="verify", runner="target", graph="full", read_ends="in_replay",
             load_batch_us=40.0, prep_us=60.0, body_us=5100.0, host_us=30.0, reads=R2T),
        dict(name="sample", runner="target", graph="eager", read_ends="unknown",
             body_us=100.0, host_us=20.0, future_publish=True),
    ],
}

BUILTIN = tuple(_TABLES)


def builtin_phases(algorithm: str) -> list[dict]:
    """A fresh copy of a built-in table (callers may mutate it)."""
    if algorithm not in _TABLES:
        raise ValueError(f"algorithm: '{algorithm}' is not built in ({', '.join(BUILTIN)}, "
                         f"or custom)")
    return copy.deepcopy(_TABLES[algorithm])
