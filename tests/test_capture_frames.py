"""Python frames (``with_stack``) read in the reader's one pass: names for detection, the
engines' own frames as ranges, whatever the decoder the events went through."""

from __future__ import annotations

import json

from simwar.capture.reader import read_capture

FRAMES = [("/w/sglang/srt/managers/scheduler.py(4614): run_batch", 7, 10.0, 5.0),
          ("<built-in function len>", 7, 11.0, 1.0),
          ("/w/sglang/srt/managers/tp_worker.py(622): forward", 7, 12.0, 2.0)]


def _capture(path, extra_args: str = "") -> None:
    ev = [{"ph": "X", "cat": "python_function", "name": n, "pid": 1, "tid": t, "ts": ts,
           "dur": d} for n, t, ts, d in FRAMES]
    ev.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0,
               "dur": 1.0, "args": {"stream": 7, "device": 0, "correlation": 1}})
    text = json.dumps({"traceEvents": ev})
    if extra_args:  # a value msgspec refuses and json.load reads: the events come as dicts
        text = text.replace('"correlation": 1}', f'"correlation": 1, {extra_args}}}')
    path.write_text(text)


def test_frames_come_from_the_one_pass_typed_or_not(tmp_path):
    typed, untyped = tmp_path / "typed.json", tmp_path / "untyped.json"
    _capture(typed)
    _capture(untyped, '"x": NaN')
    for path in (typed, untyped):
        cap = read_capture(path, frames="/sglang/srt/")
        assert cap.frame_names == {n for n, *_ in FRAMES}
        assert [(f.name.rsplit(": ", 1)[1], f.tid, f.ts, f.dur) for f in cap.frames] == \
            [("run_batch", 7, 10.0, 5.0), ("forward", 7, 12.0, 2.0)]
        assert cap.ignored["python_function"] == 3
        # without a pattern the names are read and no frame is kept
        bare = read_capture(path)
        assert bare.frame_names == cap.frame_names and bare.frames == []
        assert len(read_capture(path, frames="").frames) == 3
