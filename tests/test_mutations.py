"""Random mutations of every shipped config and of a capture (Hypothesis): simwar either
succeeds or exits with one line, never a traceback, never a hang, never a negative duration,
never a file left half-written.

Each example runs the command line in-process (:func:`simwar.cli.app.main`) under a wall
clock alarm (:data:`LIMIT_S`): a hang fails the test instead of stalling it. A config is
checked whole by ``validate`` (its mutated ``steps`` included: the memory estimate refuses
what cannot run) and run with few steps, its Chrome trace written; a capture is imported.
Derandomized and with few examples, so the suite's run is short and the same every time.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import signal
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simwar.cli.app import main
from simwar.core.files import TMP_SUFFIX

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted([*(REPO / "configs").glob("*.yaml"), REPO / "examples" / "overlap.yaml",
                  REPO / "examples" / "server.yaml"])
CAPTURE = REPO / "tests" / "data" / "kineto_synthetic" / "three_steps.json"
#: the wall clock one command may take before it counts as a hang (s)
LIMIT_S = 60
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

#: values a mutation puts in a key's place: each kind of slip a user makes
VALUES = st.sampled_from([
    -1, 0, 1, 2, 3.5, -0.5, 1e12, 10**15, True, False, None, "", "x", "fine", "custom", [],
    [1, 2], ["req_to_tokn"], {}, {"dist": "normal"}, {"dist": "uniform", "low": 5, "high": 1},
    {"base": 1, "per_seq": -9}, "1e3", ".nan", [[[]]], {"a": {"b": {"c": 1}}}])


class Hang(BaseException):
    """The command ran past LIMIT_S."""


@contextlib.contextmanager
def _bounded():
    def alarm(signum, frame):
        raise Hang(f"ran past {LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _simwar(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with _bounded(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code
    return int(code or 0), out.getvalue(), err.getvalue()


def _check_answer(code: int, out: str, err: str) -> None:
    """Success, or one error line; never a traceback; no negative idle, busy, blocked or step
    time printed."""
    assert "Traceback" not in out + err, err
    errors = [line for line in err.splitlines() if line.startswith("simwar: error")
              or ": error: " in line]
    if code == 0:
        assert not errors, err
    else:
        assert len(errors) == 1 and err.rstrip("\n").splitlines()[-1] == errors[0], err
    for line in out.splitlines():
        if re.match(r"\s*(step time|GPU idle|CPU blocked|forward )", line):
            assert not re.search(r"(?<![\w.])-\d", line), line


def _paths(data, prefix=()):
    """Every key path of a YAML mapping (mapping keys and list positions)."""
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


@st.composite
def mutated_configs(draw):
    path = draw(st.sampled_from(CONFIGS))
    text = path.read_text()
    how = draw(st.sampled_from(["value", "drop", "text"]))
    if how == "text":  # a slip of the keyboard: a slice cut out or a character put in
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 40)))
        return path, text[:i] + draw(st.sampled_from(["", ":", "- ", "{", "\t", "&a *a"])) + \
            text[j:]
    data = yaml.safe_load(text)
    paths = list(_paths(data))
    at = draw(st.sampled_from(paths))
    node = data
    for key in at[:-1]:
        node = node[key]
    if how == "drop":
        del node[at[-1]]
    else:
        node[at[-1]] = copy.deepcopy(draw(VALUES))
    return path, yaml.safe_dump(data, sort_keys=False)


@SETTINGS
@given(case=mutated_configs())
def test_a_mutated_config_runs_or_gets_one_line(case, tmp_path_factory):
    source, text = case
    work = tmp_path_factory.mktemp("m")
    cfg = work / source.name
    cfg.write_text(text)
    # relative paths (a workload's CSV) resolve as the original's do
    for extra in source.parent.glob("*.csv"):
        (work / extra.name).write_bytes(extra.read_bytes())
    _check_answer(*_simwar("validate", str(cfg)))
    trace = work / "t.json"
    code, out, err = _simwar("run", str(cfg), "--set", "steps=40", "--set", "warmup_steps=4",
                             "--trace", str(trace), "--quiet")
    _check_answer(code, out, err)
    assert not list(work.glob(f".*{TMP_SUFFIX}")), "a temporary file was left"
    if code != 0:
        assert not trace.exists(), "a failed run wrote its trace"
    else:
        json.loads(trace.read_text())  # whole


EVENT_MUTATIONS = ["twice", "shift", "scale", "drop_key", "negative", "overlap", "delete",
                   "bad_type"]


@st.composite
def mutated_captures(draw):
    doc = json.loads(CAPTURE.read_text())
    events = doc["traceEvents"]
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(EVENT_MUTATIONS))
        i = draw(st.integers(0, len(events) - 1))
        e = events[i]
        if how == "twice":
            events.extend(copy.deepcopy(events))
        elif how == "shift" and "ts" in e:
            e["ts"] = e["ts"] + draw(st.sampled_from([-5000.0, -50.0, 37.0, 1e6]))
        elif how == "scale":
            for ev in events:
                for key in ("ts", "dur"):
                    if isinstance(ev.get(key), (int, float)):
                        ev[key] = ev[key] * 1000
        elif how == "drop_key":
            key = draw(st.sampled_from(["ts", "dur", "args", "name", "pid", "tid", "cat"]))
            e.pop(key, None)
        elif how == "negative" and "dur" in e:
            e["dur"] = -abs(e["dur"]) - 1
        elif how == "overlap":
            kernels = [ev for ev in events if ev.get("cat") == "kernel"]
            if len(kernels) > 1:
                kernels[1]["ts"] = kernels[0]["ts"] + 1
        elif how == "delete":
            del events[i]
        elif how == "bad_type":
            key = draw(st.sampled_from(["ts", "dur", "name", "args"]))
            e[key] = draw(st.sampled_from(["x", None, [], {}, True]))
    return doc


@SETTINGS
@given(doc=mutated_captures())
def test_a_mutated_capture_imports_or_gets_one_line(doc, tmp_path_factory):
    work = tmp_path_factory.mktemp("c")
    path = work / "c.json"
    path.write_text(json.dumps(doc))
    _check_answer(*_simwar("import", str(path), "--no-progress"))
    assert not list(work.glob(f".*{TMP_SUFFIX}"))


def test_the_alarm_bounds_a_hang():
    with pytest.raises(Hang), _bounded():
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # sooner than LIMIT_S
        while True:
            pass
