"""The presets read SGLang and vLLM as their sources write them (docs/engines.md): step names
and their shapes, detection without flags, and the scheduler's stages named by its Python
frames where a ``with_stack`` capture has no stage ranges."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from simwar.api import simulate
from simwar.capture.open import open_capture
from simwar.capture.presets import detect_preset, load_preset
from simwar.capture.reader import read_capture
from simwar.capture.step_shapes import shape_of, shape_summary
from simwar.capture.synthetic import Style, write_kineto
from simwar.cli.explain import load_source

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHORT = {"steps": 100, "warmup_steps": 6}

SGLANG = re.compile(load_preset("sglang")["shape"])
VLLM = re.compile(load_preset("vllm")["shape"])


@pytest.mark.parametrize("name, rx, shape", [
    # SGLang's build_step_span_name: the forward mode, the batch, an extend's tokens, and with
    # detailed annotations a suffix before the bracket
    ("step[DECODE bs=32]", SGLANG, ("decode", 32, 32)),
    ("step[EXTEND bs=15 toks=15360]", SGLANG, ("extend", 15, 15360)),
    ("step[EXTEND bs=8 toks=4096 forward_id=3]", SGLANG, ("extend", 8, 4096)),
    ("step[VERIFY bs=4]", SGLANG, ("verify", 4, -1)),
    ("step[MIXED bs=6]", SGLANG, ("mixed", 6, -1)),
    # vLLM's annotate_profile, plain and detailed: requests in prefill and decode, tokens
    ("execute_context_0(0)_generation_32(32)", VLLM, ("decode", 32, 32)),
    ("execute_context_9(8155)_generation_37(37)", VLLM, ("mixed", 46, 8192)),
    ("execute_context_2(300)_generation_0(0)", VLLM, ("extend", 2, 300)),
    ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)", VLLM,
     ("decode", 32, 32)),
    ("execute_context_0(0)_generation_0(0)", VLLM, ("idle", 0, 0)),
])
def test_step_names_give_their_shapes(name, rx, shape):
    assert tuple(shape_of(name, rx))[:3] == shape


def test_a_name_the_regex_does_not_read_has_no_shape_and_shapes_are_summed_by_kind():
    assert shape_of("ProfilerStep#3", SGLANG) is None
    shapes = [shape_of(n, SGLANG) for n in ("step[DECODE bs=32]", "step[DECODE bs=32]",
                                             "step[EXTEND bs=2 toks=64]")]
    assert shape_summary(shapes) == "decode bs=32 (2 steps), extend bs=2 toks=64 (1 step)"


def test_the_preset_is_detected_from_ranges_and_frames():
    sg_frames = ["/w/python/sglang/srt/managers/scheduler.py(4614): run_batch",
                 "/w/python/sglang/srt/managers/tp_worker.py(622): forward_batch_generation"]
    vl_frames = ["vllm/v1/worker/gpu_model_runner.py(3906): execute_model",
                 "vllm/v1/worker/gpu_model_runner.py(1924): _prepare_inputs"]
    assert detect_preset(["step[DECODE bs=32]"], sg_frames)[0] == "sglang"
    assert detect_preset(["execute_context_0(0)_generation_32(32)"], vl_frames)[0] == "vllm"
    assert detect_preset(["scheduler.recv_requests", "scheduler.run_batch"])[0] == "sglang"
    assert detect_preset(["gpu_model_runner: preprocess", "gpu_model_runner: forward"])[0] \
        == "vllm"
    # a name of each (a step span SGLang writes inside a vLLM-style annotation a tool added):
    # the frames decide
    assert detect_preset(["step[DECODE bs=32]", "execute_32_context_0(x)_generation_32(y)"],
                         sg_frames)[0] == "sglang"
    assert detect_preset(["step[DECODE bs=32]"]) is None  # one name is not enough
    assert detect_preset(["forward", "sample"], ["a.py(1): f"]) is None


def _as_frames(src, out, path_of: dict) -> None:
    """The capture at ``src`` with its stage ranges written as the Python frames of a
    ``with_stack`` capture (the functions' own frames, no ranges) and its batch ranges as
    SGLang's step spans (``decode bs=8`` -> ``step[DECODE bs=8]``), to ``out``."""
    with gzip.open(src, "rt") as fh:
        doc = json.load(fh)
    for e in doc["traceEvents"]:
        if e.get("cat") == "user_annotation" and e.get("name") in path_of:
            e["cat"], e["name"] = "python_function", path_of[e["name"]]
        elif e.get("cat") == "user_annotation" and e.get("name", "").startswith("decode bs="):
            e["name"] = f"step[DECODE {e['name'][len('decode '):]}]"
    with gzip.open(out, "wt") as fh:
        json.dump(doc, fh)


def test_a_with_stack_capture_without_stage_ranges_names_its_stages_by_frames(tmp_path):
    sim = simulate(CONFIGS / "dspark_fine_bimodal.yaml", SHORT, engine="simpy")
    ranges = write_kineto(sim.trace, tmp_path / "ranges.json.gz",
                          style=Style(names="sglang", batch_ranges=True))
    where = "/w/python/sglang/srt/managers/"
    frames = tmp_path / "frames.json.gz"
    _as_frames(ranges, frames, {
        "scheduler.recv_requests": f"{where}scheduler_components/request_receiver.py(80): "
                                   "recv_requests",
        "scheduler.get_next_batch_to_run": f"{where}scheduler.py(3894): get_next_batch_to_run",
        "scheduler.process_batch_result": f"{where}scheduler.py(5074): process_batch_result",
        "scheduler.prepare_for_decode": f"{where}schedule_batch.py(2100): prepare_for_decode",
        "scheduler.run_batch": f"{where}scheduler.py(4614): run_batch"})
    cap = open_capture(frames)
    assert cap.preset == "sglang" and "Python frames" in cap.mapping.origin[1]
    assert cap.n_frames > 0
    cpu = cap.mapping.soft["cpu"]
    assert {"/managers/scheduler\\.py\\(\\d+\\): get_next_batch_to_run$",
            "/managers/scheduler\\.py\\(\\d+\\): process_batch_result$"} <= cpu
    assert not any(p.startswith("^(scheduler") for p in cpu)  # no stage ranges in it
    assert cap.mapping.run_batch is not None  # Scheduler.run_batch's frame marks it
    # the same steps as the capture with ranges, and explain names host time by frame
    with_ranges = open_capture(ranges)
    assert len(cap.trace.meta["step_names"]) == len(with_ranges.trace.meta["step_names"])
    src = load_source(str(frames))
    names = {n for n, _, _ in src.host_ranges}
    assert "scheduler.py(3894): get_next_batch_to_run (schedule)" in names
    # each step's shape, from its step span, in the step it lies in: the batch the sizes read
    sizes = cap.sized()
    assert len(cap.shapes) > 50
    assert all(s.mode == "decode" and s.tokens == s.batch for s in cap.shapes)
    assert [s.batch for s in cap.shapes] == [int(sizes.batch[s.step]) for s in cap.shapes]
    assert [s.step for s in cap.shapes] == sorted({s.step for s in cap.shapes})


def test_frames_every_name_for_detection_records_only_for_the_kept_ones(tmp_path):
    ev = [{"ph": "X", "cat": "python_function", "name": n, "pid": 1, "tid": t, "ts": ts,
           "dur": 5.0} for n, t, ts in [
               ("/w/sglang/srt/managers/scheduler.py(4614): run_batch", 7, 10.0),
               ("<built-in function len>", 7, 11.0),
               ("/w/sglang/srt/managers/tp_worker.py(622): forward", "main", 12.0),
               ("/w/sglang/srt/managers/scheduler.py(1): bad_time", 7, True)]]
    ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0})
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    cap = read_capture(path, frames="/sglang/srt/")
    names, kept = cap.frame_names, cap.frames
    assert names == {e["name"] for e in ev[:4]}
    # a time that is no number (a bool) is no frame; a tid that is no integer reads as 0
    assert [(f.name.rsplit(": ", 1)[1], f.tid, f.ts) for f in kept] == \
        [("run_batch", 7, 10.0), ("forward", 0, 12.0)]
    assert len(read_capture(path, frames="").frames) == 3
