"""The garbage collector's one rule (:mod:`simwar.core.collector`): off for a block, back as
it was after it, and frozen or not as each use asks (a run, an import, a command's
start-up)."""

from __future__ import annotations

import gc

import pytest

from simwar.capture.reader import read_capture
from simwar.cli.common import start_up
from simwar.core.collector import gc_off, gc_paused


@pytest.fixture(autouse=True)
def collector_as_found():
    assert gc.isenabled() and gc.get_freeze_count() == 0
    yield
    gc.unfreeze()
    gc.enable()


def test_gc_off_restores_and_nests_and_freezes_nothing():
    with gc_off():
        assert not gc.isenabled()
        with gc_off():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block leaves it off for the outer
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    with gc_off():
        pass
    assert not gc.isenabled()  # off before, off after


def test_gc_off_as_a_decorator_restores_after_an_error():
    seen = []

    @gc_off()
    def fails():
        seen.append(gc.isenabled())
        raise ValueError("x")

    for _ in range(2):  # a fresh block each call
        with pytest.raises(ValueError):
            fails()
        assert gc.isenabled()
    assert seen == [False, False]


def test_a_capture_is_read_with_the_collector_off(tmp_path):
    path = tmp_path / "cap.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
                    '"tid": 7, "ts": 1.0, "dur": 2.0, "args": {"stream": 7, "device": 0, '
                    '"correlation": 1}}]}')
    seen = []
    read_capture(path, progress=lambda done, total: seen.append(gc.isenabled()))
    assert seen and not any(seen)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_start_up_freezes_what_exists_after_it():
    with start_up():
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    assert gc.isenabled() and gc.get_freeze_count() > 0
    gc.unfreeze()
    with pytest.raises(RuntimeError), start_up():
        raise RuntimeError("start-up failed")
    assert gc.isenabled() and gc.get_freeze_count() > 0  # frozen all the same


def test_gc_paused_hides_what_exists_for_the_block_only():
    with gc_paused():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
