"""Small multi-threaded, multi-stream torch.profiler captures of a training-like step.

``python -m simwar.harness.threads OUT_DIR`` runs, on one CUDA GPU, a few variants of
a training-like step and writes each one's capture, ``OUT_DIR/<variant>.kineto.json.gz``
(gzipped ``export_chrome_trace``, a few hundred kB), plus ``OUT_DIR/threads_log.txt``.
The captures are what the importer's launch rule is checked on against HolisticTrace
Analysis (``tests/test_hta_oracle.py`` picks up every ``*.kineto.json.gz`` under
``tests/data/threads/``): kernels launched from several CPU threads of one process.

One step (profiled with a schedule and ``prof.step()``, so every iteration is a
``ProfilerStep#k`` range on the main thread):

- **forward** on the main thread (a small MLP, ``record_function("forward")``);
- **backward**: ``loss.backward()``; autograd runs the CUDA backward on its own
  device thread, so those kernels are launched from a second thread;
- an **optimizer step** (SGD with momentum, foreach kernels) on the main thread;
- a **side-stream copy**: ``side.wait_stream(main)``, a device-to-host copy of the
  loss into pinned memory and an elementwise kernel on ``side``, ``done.record(side)``;
  the main stream waits on ``done`` at the start of the next step (``wait_event``)
  and the host syncs the previous step's ``done`` (``synchronize``);
- an **extra thread** (variant ``worker``/``all``) that launches its own kernels on
  its own stream while the step runs (a matmul chain), joined at the step's end.

Variants: ``backward`` (forward, backward and optimizer only), ``side`` (+ the side
stream), ``worker`` (+ the extra thread, no side stream), ``all`` (everything). No
NCCL, nothing downloaded, random weights; profiled with CPU and CUDA activities and
CUDA sync events where this torch has them. The whole run takes well under a minute.

Imports: torch and the standard library (the GPU machine has no simwar dependencies).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import threading
import time
from pathlib import Path

from simwar.core.files import write_bytes_atomic, write_text_atomic

VARIANTS = {"backward": (False, False), "side": (True, False), "worker": (False, True),
            "all": (True, True)}


def _profile_kwargs(torch) -> dict:
    exp = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    if exp is None:
        return {}
    try:
        return {"experimental_config": exp(enable_cuda_sync_events=True)}
    except TypeError:
        return {}


class Step:
    """The model, optimizer, streams and buffers of one variant (see the module docstring)."""

    def __init__(self, torch, side: bool, worker: bool, width: int = 512, depth: int = 4):
        self.torch = torch
        nn = torch.nn
        dev = torch.device("cuda")
        self.model = nn.Sequential(*[m for _ in range(depth)
                                     for m in (nn.Linear(width, width), nn.GELU())]).to(dev)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9,
                                   foreach=True)
        self.x = torch.randn(256, width, device=dev)
        self.side = torch.cuda.Stream() if side else None
        self.worker_stream = torch.cuda.Stream() if worker else None
        self.w = torch.randn(256, 256, device=dev)
        self.host = torch.empty(1, pin_memory=True)
        self.done = [torch.cuda.Event(), torch.cuda.Event()]  # a ring: synced a step later
        self.pending: torch.cuda.Event | None = None
        self.n = 0  # steps run: which event of the ring a step records

    def _worker(self) -> None:
        torch = self.torch
        torch.cuda.set_device(0)  # a new thread has no current device (cuBLAS warns)
        with torch.cuda.stream(self.worker_stream), torch.profiler.record_function("worker"):
            y = self.w
            for _ in range(6):
                y = torch.tanh(y @ self.w)
            self.worker_out = y.sum()

    def run(self) -> None:
        torch = self.torch
        k = self.n
        self.n += 1
        rf = torch.profiler.record_function
        t = None
        if self.worker_stream is not None:
            t = threading.Thread(target=self._worker, name="worker")
            t.start()
        main = torch.cuda.current_stream()
        if self.pending is not None:
            main.wait_event(self.pending)  # the previous step's side work
        with rf("forward"):
            loss = self.model(self.x).pow(2).mean()
        with rf("backward"):
            loss.backward()  # CUDA backward runs on autograd's device thread
        with rf("optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        if self.side is not None:
            with rf("side_copy"):
                self.side.wait_stream(main)
                with torch.cuda.stream(self.side):
                    self.host.copy_(loss.detach().reshape(1), non_blocking=True)
                    (loss.detach() * 2).add_(1)
                    ev = self.done[k % 2]
                    ev.record(self.side)
            if self.pending is not None:
                with rf("sync_previous"):
                    self.pending.synchronize()
            self.pending = ev
        if t is not None:
            t.join()


def run_variant(torch, name: str, out: Path, steps: int, log) -> Path:
    side, worker = VARIANTS[name]
    step = Step(torch, side, worker)
    for _ in range(3):  # warm up: cuBLAS handles, autograd's thread, the allocator
        step.run()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile, schedule

    raw = b""

    def ready(prof) -> None:
        nonlocal raw
        with tempfile.TemporaryDirectory() as tmp:
            raw_path = Path(tmp) / "k.json"
            prof.export_chrome_trace(str(raw_path))
            raw = raw_path.read_bytes()

    # a schedule makes prof.step() write each step's ProfilerStep#k range
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=0, warmup=1, active=steps), on_trace_ready=ready,
                 **_profile_kwargs(torch)) as prof:
        for _ in range(steps + 1):
            step.run()
            prof.step()
        torch.cuda.synchronize()
    path = out / f"{name}.kineto.json.gz"
    write_bytes_atomic(path, gzip.compress(raw, compresslevel=9))
    log(f"{name}: {steps} steps, {path.stat().st_size / 1e3:.0f} kB gz "
        f"({len(raw) / 1e6:.2f} MB raw)")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simwar.harness.threads",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=8, help="profiled steps per variant")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant {bad[0]} ({', '.join(VARIANTS)})")
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    log(f"device {props.name}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    for name in names:
        run_variant(torch, name, args.out, args.steps, log)
    log(f"total {time.time() - t0:.1f}s")
    write_text_atomic(args.out / "threads_log.txt", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
