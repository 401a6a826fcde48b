"""The fast executor reports its progress as it goes, not once at the end: after each chunk
of its pass, a bounded amount of work (``benchmarks/bench_progress.py`` measures the time
between two reports); ``simwar run`` draws those reports on its bar."""

from __future__ import annotations

import io

import simwar
from simwar.api import resolve_sizes
from simwar.cli import run as cli_run
from simwar.cli.app import main
from simwar.config import load_config
from simwar.executors.fast.execute import CHUNK, CHUNK_OPS, chunk_passes
from simwar.executors.fast.plan import plan_config

LONG = {"steps": 200_000, "warmup_steps": 20}


def test_a_long_fast_run_reports_every_chunk_of_its_pass():
    seen = []
    r = simwar.simulate(None, LONG, engine="fast", progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == LONG["steps"]
    during = [s for s in seen if s < LONG["steps"] - 1]
    assert len(during) >= LONG["steps"] // CHUNK - 1  # one report per chunk of CHUNK steps
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert max(gaps) <= CHUNK
    assert r.summary == simwar.simulate(None, LONG, engine="fast").summary  # reports change nothing


def test_a_large_shape_runs_fewer_passes_per_chunk():
    phases = [{"name": f"p{i}", "graph": "eager", "body_us": 10, "load_batch_us": 2,
               "reads": ["req_to_token"]} for i in range(60)]
    cfg = load_config({"algorithm": "custom", "phases": phases, "steps": 200,
                       "warmup_steps": 5})
    plan = plan_config(cfg, resolve_sizes(cfg))
    big = max(plan.blocks, key=lambda b: len(b.shape.host))
    assert len(big.shape.host) > 40
    assert chunk_passes(big) == CHUNK_OPS // len(big.shape.host) < CHUNK
    small = plan_config(load_config(None), resolve_sizes(load_config(None))).blocks
    assert all(chunk_passes(b) == CHUNK for b in small)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_run_s_bar_moves_during_a_fast_run(monkeypatch, capsys):
    monkeypatch.setattr(cli_run, "PROGRESS_DELAY_S", 0.0)
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["run", "--set", f"steps={LONG['steps']}", "--engine", "fast"]) == 0
    shown = terminal.getvalue()
    capsys.readouterr()
    # the bar was drawn at counts between the start and the end, not only at 100 %
    counts = {int(part.split("/")[0].split()[-1]) for part in shown.split("\r")
              if f"/{LONG['steps']}" in part and part.split("/")[0].split()[-1].isdigit()}
    assert any(0 < c < LONG["steps"] for c in counts), shown[-500:]
