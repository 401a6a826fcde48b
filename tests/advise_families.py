"""The test helper that groups ``advise``'s candidates of a config into families.

A family is the candidates that differ only in where read-done is published: the same
barrier, placement, plan stream and CPU sequence lengths (the key below). The tests of the
family plans, races and lanes (``test_advise_family``, ``test_family_races``,
``test_family_lanes``) take their families from here, each at its own short run.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from simwar.config import load_config
from simwar.study.advise import candidate_config, space

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def families(source, short: dict) -> list[list]:
    """The candidate configs of ``source`` (a shipped config's file name under ``configs/``,
    or a config dict), each at the overrides ``short``, grouped into families."""
    cfg = load_config(source if isinstance(source, dict) else CONFIGS / source)
    base = load_config(cfg, short)
    cfgs = [candidate_config(base, c.overrides) for c in space(cfg)]

    def key(c):
        pol = c.policy
        return (pol.barrier, pol.placement, pol.plan_stream, pol.needs_cpu_seq_lens)

    return [list(g) for _, g in itertools.groupby(sorted(cfgs, key=key), key=key)]
