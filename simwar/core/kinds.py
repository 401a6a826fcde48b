"""The kinds of a Trace's rows: what a span, a host call, an op and a buffer access are.

The typed columns of :mod:`simwar.core.trace` (``SpanKind``, ``Call``, ``OpKind``,
``Mode``) and their names, apart from the Trace itself: the fast executor plans and runs
with them (an op's kind, an access's mode) without a Trace, so a run that keeps none does
not import the Trace's module (its tables, row types and file format: about 16 M
instructions of a short ``simwar run``'s start-up). :mod:`simwar.core.trace` re-exports
every name here.

Imports: the standard library only.
"""

from __future__ import annotations

from enum import IntEnum

HOST = "cpu"  # the lane of the scheduler thread


class SpanKind(IntEnum):
    CPU = 0  # host work
    API = 1  # a host API call
    BLOCKED = 2  # host inside a synchronize
    KERNEL = 3  # device work
    WAIT = 4  # a stream held by a cross-stream dependency


class Call(IntEnum):
    """What a host span is: the typed host call (device spans: NONE)."""

    NONE = 0
    CPU = 1
    LAUNCH = 2
    GRAPH_LAUNCH = 3
    RECORD = 4
    WAIT_EVENT = 5
    WAIT_STREAM = 6
    SYNCHRONIZE = 7
    OTHER = 8  # an imported runtime call of no kind above


class OpKind(IntEnum):
    KERNEL = 0
    RECORD = 1
    WAIT = 2
    SYNC = 3


class Mode(IntEnum):
    READ = 0
    WRITE = 1


SPAN_KINDS = tuple(k.name.lower() for k in SpanKind)
CALLS = tuple("" if k is Call.NONE else k.name.lower() for k in Call)
OP_KINDS = tuple(k.name.lower() for k in OpKind)
MODES = tuple(k.name.lower() for k in Mode)
