"""Barrier policies are registered classes: a new one is one subclass, from outside the package."""

from __future__ import annotations

import pytest

import simwar
from simwar.config import ConfigError
from simwar.config.policies import BARRIERS, Barrier, register_barrier


@pytest.fixture
def stream_sync_policy():
    """A toy policy defined here, not in simwar: the CPU blocks on the forward's tail."""

    @register_barrier
    class ForwardTailSync(Barrier):
        name = "forward_tail_sync"
        doc = "the CPU blocks until the whole forward ends (a test policy)"

        def after_phases(self, b, k):
            b.record(f"fwd_tail[{k}]", "forward", k)

        def fence(self, b, k):
            b.sync(f"fwd_tail[{k}]", k, "barrier")

    yield ForwardTailSync
    del BARRIERS["forward_tail_sync"]


def test_builtin_policies_are_registered():
    assert list(BARRIERS) == ["none", "coarse", "fine", "host_sync"]
    assert not BARRIERS["none"].safe and BARRIERS["fine"].safe


def test_a_policy_registered_outside_the_package_runs(stream_sync_policy):
    result = simwar.simulate(None, {"policy.barrier": "forward_tail_sync", "steps": 60})
    s = result.summary
    assert s["barrier"] == s["barrier_effective"] == "forward_tail_sync"
    # the host blocks each step until the forward ends: nothing runs ahead, no race
    assert s["cpu_blocked_barrier_us_mean"] > 1000
    assert s["launch_ahead_mean"] == 0.0
    assert s["races"] == 0
    # and it is slower than the fine barrier it replaces
    fine = simwar.simulate(None, {"steps": 60}).summary
    assert s["step_us_mean"] > fine["step_us_mean"]


def test_an_unregistered_policy_is_a_one_line_error():
    with pytest.raises(ConfigError, match="'forward_tail_sync' is not a barrier policy "
                                          r"\(none, coarse, fine, host_sync\)"):
        simwar.load_config(None, {"policy.barrier": "forward_tail_sync"})


def test_a_policy_needs_an_identifier_name():
    with pytest.raises(ValueError, match="name must be an identifier"):
        @register_barrier
        class Nameless(Barrier):
            pass
