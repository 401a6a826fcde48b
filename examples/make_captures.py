"""Write the example captures (examples/README.md) from examples/server.yaml.

    python examples/make_captures.py

Each capture is a simulated run of ``server.yaml`` written as torch.profiler would write a
profile of a real SGLang server (``simwar.capture.synthetic``): ``scheduler.<stage>`` ranges,
a ``decode bs=<B>`` range around each step's forward, one CUDA graph per bucket (its kernels'
launch dims), and CUDA sync events as PyTorch 2.11 writes them (record correlation ids -1, the
event ids only). ``capture.json.gz`` runs the fine barrier, ``capture_coarse.json.gz`` the
coarse one; the run is deterministic, so the files are the same on every machine.
"""

from __future__ import annotations

from pathlib import Path

import simwar
from simwar.capture.synthetic import Style, write_kineto

HERE = Path(__file__).resolve().parent
STYLE = Style(names="sglang", batch_ranges=True, record_ids=False, copies=("result_copy",))


def main() -> None:
    for name, change in (("capture.json.gz", {}),
                         ("capture_coarse.json.gz", {"policy.barrier": "coarse"})):
        run = simwar.simulate(HERE / "server.yaml", change, engine="simpy")
        write_kineto(run.trace, HERE / name, style=STYLE)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
