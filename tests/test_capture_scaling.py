"""The long walks over a capture's steps (``explain``, ``import --fit``): their linear forms
give the answers of the plain rules they replace, they show progress on a terminal, and
Ctrl-C stops them promptly (exit 130, nothing written). Their speed is measured in
benchmarks/bench_capture_scaling.py, never here."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import random
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import simwar
import simwar.cli.common as common
from simwar.analysis.host_ranges import HostRanges
from simwar.capture.mapping import FirstMatch
from simwar.capture.synthetic import Style, write_kineto
from simwar.cli import main
from simwar.fit.samples import _MappedRanges

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "capture.json.gz"


def _innermost(ranges, x):
    """The plain rule: the latest-starting (then shortest) range open at ``x``."""
    rs = sorted(((float(a), float(b), n) for n, a, b in ranges if b > a),
                key=lambda r: (r[0], -r[1]))
    open_ = [r for r in rs if r[0] <= x < r[1]]
    return open_[-1][2] if open_ else None


def test_host_ranges_name_each_piece_by_its_innermost_open_range():
    rng = random.Random(7)
    for _ in range(50):
        ranges = []
        for i in range(40):  # nested on one thread and, as captures can, not always
            a = rng.randrange(0, 200)
            ranges.append((f"r{i}", a, a + rng.randrange(0, 60)))
        hr = HostRanges(ranges)
        for x, y, name in hr.pieces:
            assert name == _innermost(ranges, x)
            assert name == _innermost(ranges, (x + y) / 2)
        # a range that ends under a longer one left open on top of it still ends there
    hr = HostRanges([("outer", 0, 100), ("a", 10, 50), ("b", 10, 20)])
    assert [p[2] for p in hr.split(0, 100)] == ["outer", "b", "a", "outer"]


def test_mapped_ranges_of_a_window_are_the_scans_in_the_captures_order():
    rng = random.Random(3)
    rules = [(re.compile(r"^sched"), "schedule"), (re.compile(r"^prep"), "prepare")]
    names = ["sched.x", "prep.y", "other"]
    anns = []
    for _ in range(400):
        a = rng.uniform(0, 1000)
        anns.append((rng.choice(names), a, a + rng.choice([0.0, rng.uniform(0, 30),
                                                          rng.uniform(0, 400)])))
    ranges = _MappedRanges(anns, FirstMatch(rules))
    for _ in range(200):
        lo = rng.uniform(-50, 1050)
        hi = lo + rng.uniform(0, 80)
        scan = [(a, b, next(it for rx, it in rules if rx.search(n))) for n, a, b in anns
                if not (b <= lo or a >= hi) and any(rx.search(n) for rx, _ in rules)]
        assert ranges.overlapping(lo, hi) == scan
    assert _MappedRanges(anns, FirstMatch([])).overlapping(0, 1000) == []


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("argv, shown", [
    (["explain", str(EXAMPLE), "--json"], "explaining"),
    (["import", str(EXAMPLE), "--fit", "-o", "{tmp}/fit.yaml"], "fitting"),
])
def test_a_terminal_shows_the_walks_progress(tmp_path, monkeypatch, capsys, argv, shown):
    monkeypatch.setattr(common, "BAR_DELAY_S", 0)
    argv = [a.format(tmp=tmp_path) for a in argv]
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert main(argv) == 0
    assert shown in sys.stderr.getvalue()
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert main([*argv, "--no-progress"]) == 0
    assert shown not in sys.stderr.getvalue()
    capsys.readouterr()


@pytest.fixture(scope="module")
def long_capture(tmp_path_factory):
    """A capture long enough that its walks last seconds after their bars show."""
    path = tmp_path_factory.mktemp("long") / "capture.json.gz"
    run = simwar.simulate(ROOT / "examples" / "server.yaml", {"steps": 2500}, engine="simpy")
    write_kineto(run.trace, path, style=Style(names="sglang", batch_ranges=True,
                                              record_ids=False, copies=("result_copy",)))
    return path


CODE = ("import sys\nimport simwar.cli.common as c\nc.BAR_DELAY_S = 0\n"
        "from simwar.cli import main\nsys.exit(main(sys.argv[1:]))")


@pytest.mark.slow
@pytest.mark.parametrize("command, shown", [("explain", "explaining"), ("fit", "fitting")])
def test_ctrl_c_in_the_walk_exits_130_promptly_and_writes_nothing(long_capture, tmp_path,
                                                                 command, shown):
    out = tmp_path / "fit.yaml"
    argv = (["explain", str(long_capture), "--json"] if command == "explain"
            else ["import", str(long_capture), "--fit", "-o", str(out)])
    primary, secondary = pty.openpty()  # stderr a terminal: the bar shows once the walk runs
    # of 80 columns (a new pty has none, and a bar of no width is not drawn)
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CODE, *argv], stdout=subprocess.PIPE,
                            stderr=secondary, stdin=subprocess.DEVNULL, env=env)
    os.close(secondary)
    seen = b""
    try:
        deadline = time.monotonic() + 300
        while shown.encode() not in seen:
            assert time.monotonic() < deadline and proc.poll() is None, seen[-500:]
            if select.select([primary], [], [], 1.0)[0]:
                try:
                    seen += os.read(primary, 4096)
                except OSError:  # the command ended and closed the terminal
                    pass
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        os.close(primary)
    assert proc.returncode == 130
    assert took < 10, took
    assert stdout == b""
    assert not out.exists() and not list(tmp_path.glob("fit*"))


def _cross_stream_scan(trace, lays, s) -> None:
    """The plain rule of :func:`simwar.fit.samples._cross_stream` (every op per step, every
    later op per wait), kept here to hold the linear walk to its answers."""
    import numpy as np

    from simwar.core.trace import Call, OpKind

    ops = trace.ops
    found = False
    kernel = ops.kind == OpKind.KERNEL
    for k in lays:
        for w in np.flatnonzero((ops.step == k) & (ops.kind == OpKind.WAIT)
                                & (ops.bound >= 0)).tolist():
            b = int(ops.bound[w])
            c = int(ops.call[b])
            if ops.lane[b] == ops.lane[w] or (c >= 0 and trace.spans.call[c]
                                              == Call.GRAPH_LAUNCH):
                continue
            fired, reach = float(ops.end_us[b]), float(ops.start_us[w])
            nxt = np.flatnonzero(kernel[w + 1:] & (ops.lane[w + 1:] == ops.lane[w]))
            if not len(nxt) or fired <= reach:
                continue
            n = w + 1 + int(nxt[0])
            if ops.issue_us[n] <= fired and ops.start_us[n] >= fired:
                s.add("costs.cross_stream_us", float(ops.start_us[n]) - fired, k)
                found = True
    if found:
        return
    for k in sorted(lays):
        lay, prev = lays[k], lays.get(k - 1)
        if not lay.sched_ops or not lay.units[0].ops or prev is None or not prev.units[-1].ops:
            continue
        w_end = float(ops.end_us[lay.sched_ops[-1]])
        f = lay.units[0].ops[0]
        prev_end = float(ops.end_us[prev.units[-1].ops[-1]])
        if ops.issue_us[f] < w_end and prev_end < w_end:
            s.add("costs.cross_stream_us", float(ops.start_us[f]) - w_end, k)
        held = [o for o in prev.result_ops + lay.sched_ops
                if ops.issue_us[o] < prev_end < ops.start_us[o]]
        if held:
            w0 = min(held, key=lambda o: float(ops.start_us[o]))
            s.add("costs.cross_stream_us", float(ops.start_us[w0]) - prev_end, k)


def test_the_cross_stream_walk_gives_the_plain_scans_samples():
    """Bound waits' next kernel by binary search per stream: the same samples, to the last bit
    and in the same order, as the plain scan (each of these captures has bound waits)."""
    from simwar.capture.open import open_capture
    from simwar.fit.layout import step_layouts
    from simwar.fit.policy import detect_roles
    from simwar.fit.samples import Samples, _cross_stream

    cases = [(EXAMPLE, ROOT / "examples/mapping.yaml", None),
             (ROOT / "examples/capture_coarse.json.gz", ROOT / "examples/mapping.yaml", None),
             (ROOT / "tests/data/server/fit_ramp_profiled.kineto.json.gz", None, "sglang"),
             (ROOT / "tests/data/kineto/dspark-fine-gpu.kineto.json.gz", None, "sglang")]
    sampled = 0
    for path, mapping, preset in cases:
        cap = open_capture(path, str(mapping) if mapping else None, preset)
        trace = cap.bound.trace
        lays = step_layouts(trace, detect_roles(trace, cap.mapping)[0])
        fast, scan = Samples(), Samples()
        _cross_stream(trace, lays, fast)
        _cross_stream_scan(trace, lays, scan)
        assert fast == scan and fast.steps_of("costs.cross_stream_us") == \
            scan.steps_of("costs.cross_stream_us"), path
        sampled += len(scan.get("costs.cross_stream_us", []))
    assert sampled > 0
