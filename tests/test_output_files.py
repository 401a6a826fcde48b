"""Nothing a command writes destroys a file it was not asked to replace.

- the writer (:func:`simwar.core.files.atomic_file`) follows a symbolic link (the file it
  points to is replaced, the link kept), writes a stream in place (a FIFO, ``/dev/null``, the
  process's own stdout), and refuses a device or a socket before writing anything;
- no command writes over one of its inputs, or one output over another: it refuses,
  naming both (:func:`simwar.cli.common.check_outputs`);
- every command that writes a file wants its directory to exist (none creates it).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from simwar.cli.app import main
from simwar.core.files import NotAFileError, atomic_file, write_target, write_text_atomic

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "dspark_fine.yaml"
CAPTURE = REPO / "tests" / "data" / "kineto_synthetic" / "three_steps.json"
MEASURED = REPO / "calibration" / "h200_suite_run1.json"
SHORT = ["--set", "steps=60", "--set", "warmup_steps=5"]


# --------------------------------------------------------------------------- the writer
def test_a_symlink_is_followed_its_target_replaced_and_the_link_kept(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_text_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"


def test_a_dangling_symlink_creates_the_file_it_names(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "made.json")
    write_text_atomic(link, "x")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "x"


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_text_atomic(fifo, "through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_null_is_written_in_place_and_stays_a_device():
    write_text_atomic(os.devnull, "discarded")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_is_refused_and_left_as_it_is(tmp_path):
    full = tmp_path / "full"  # a node of /dev/full's device: the real one stays out of reach
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    with pytest.raises(NotAFileError, match="character device"):
        with atomic_file(full) as handle:
            handle.write(b"x" * 1000)
    assert stat.S_ISCHR(os.lstat(full).st_mode)
    assert os.listdir(tmp_path) == ["full"]  # no temporary left behind


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        with pytest.raises(NotAFileError, match="socket"):
            write_target(path)
    finally:
        server.close()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def _writer(path: str) -> str:
    return ("import sys; from simwar.core.files import write_text_atomic; "
            f"print('before', flush=True); write_text_atomic({path!r}, 'payload\\n'); "
            "print('after')")


@pytest.mark.parametrize("path", ["/proc/self/fd/1", "/dev/stdout"])
def test_our_own_stdout_is_written_in_place_as_a_pipe(path):
    out = subprocess.run([sys.executable, "-c", _writer(path)], capture_output=True,
                         text=True, check=True, cwd=REPO)
    assert out.stdout == "before\npayload\nafter\n"


def test_our_own_stdout_redirected_to_a_file_is_appended_not_replaced(tmp_path):
    log = tmp_path / "out.txt"
    with open(log, "w") as fh:
        inode = os.fstat(fh.fileno()).st_ino
        subprocess.run([sys.executable, "-c", _writer("/dev/stdout")], stdout=fh, check=True,
                       cwd=REPO)
    assert os.stat(log).st_ino == inode  # the same file, not one renamed over it
    assert log.read_text() == "before\npayload\nafter\n"


def test_cli_trace_to_a_symlink_and_to_dev_null(tmp_path, capsys):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "t.json"
    link.symlink_to(real)
    assert main(["run", *SHORT, "--quiet", "--trace", str(link)]) == 0
    assert link.is_symlink() and '"traceEvents"' in real.read_text()
    assert main(["run", *SHORT, "--quiet", "--trace", os.devnull]) == 0
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    capsys.readouterr()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_cli_refuses_a_device_before_simulating(tmp_path, capsys):
    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    assert main(["run", *SHORT, "--trace", str(full)]) == 2
    err = capsys.readouterr().err
    assert err == (f"simwar: error: --trace {full}: a character device, not a regular file "
                   f"(simwar writes regular files, FIFOs, /dev/null and its own stdout or "
                   f"stderr)\n")
    assert stat.S_ISCHR(os.lstat(full).st_mode)


# --------------------------------------------------------------------------- outputs = inputs
def _copies(tmp_path: Path, *sources: Path) -> list[Path]:
    out = []
    for src in sources:
        dst = tmp_path / src.name
        shutil.copy(src, dst)
        out.append(dst)
    return out


def _refused(capsys, args, *named) -> str:
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("simwar: error: "), err
    for path in named:
        assert str(path) in err, err
    return err


def test_run_trace_over_its_config_is_refused(tmp_path, capsys):
    cfg, = _copies(tmp_path, CONFIG)
    before = cfg.read_bytes()
    err = _refused(capsys, ["run", cfg, *SHORT, "--trace", cfg], cfg)
    assert err == (f"simwar: error: --trace {cfg}: is the config {cfg}; simwar never "
                   f"overwrites its input: write to another file\n")
    assert cfg.read_bytes() == before


def test_the_same_file_by_another_name_is_refused(tmp_path, capsys, monkeypatch):
    cfg, = _copies(tmp_path, CONFIG)
    monkeypatch.chdir(tmp_path)
    link = tmp_path / "alias.yaml"
    link.symlink_to(cfg)
    before = cfg.read_bytes()
    err = _refused(capsys, ["run", "dspark_fine.yaml", *SHORT, "--trace", "./alias.yaml"])
    assert "are one file" in err and "alias.yaml" in err and "dspark_fine.yaml" in err
    assert cfg.read_bytes() == before and link.is_symlink()


@pytest.mark.parametrize("option", ["--steps-csv", "--save-trace"])
def test_import_outputs_over_the_capture_are_refused(tmp_path, capsys, option):
    cap, = _copies(tmp_path, CAPTURE)
    before = cap.read_bytes()
    _refused(capsys, ["import", cap, option, cap, "--no-progress"], cap)
    assert cap.read_bytes() == before


def test_import_fit_over_the_mapping_is_refused(tmp_path, capsys):
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("steps: '^ProfilerStep#\\d+$'\n")
    before = mapping.read_bytes()
    _refused(capsys, ["import", CAPTURE, "--mapping", mapping, "--fit", "-o", mapping,
                      "--no-progress"], mapping)
    assert mapping.read_bytes() == before


def test_import_two_outputs_in_one_file_are_refused(tmp_path, capsys):
    out = tmp_path / "x.json"
    err = _refused(capsys, ["import", CAPTURE, "--save-trace", out, "--steps-csv", out,
                            "--no-progress"], out)
    assert "the same file as --save-trace" in err
    assert not out.exists()


def test_calibrate_over_its_measured_file_is_refused(tmp_path, capsys):
    run1, = _copies(tmp_path, MEASURED)
    before = run1.read_bytes()
    _refused(capsys, ["calibrate", run1, "-o", run1], run1)
    assert run1.read_bytes() == before


def test_compare_over_its_measured_file_is_refused(tmp_path, capsys):
    run2, = _copies(tmp_path, MEASURED)
    before = run2.read_bytes()
    _refused(capsys, ["compare", run2, "--csv", run2], run2)
    assert run2.read_bytes() == before


def test_advise_over_its_config_is_refused(tmp_path, capsys):
    cfg, = _copies(tmp_path, CONFIG)
    before = cfg.read_bytes()
    _refused(capsys, ["advise", cfg, "-o", cfg, "--no-progress"], cfg)
    assert cfg.read_bytes() == before


def test_explain_timeline_over_its_input_is_refused(tmp_path, capsys):
    import simwar

    png = tmp_path / "t.png"  # a saved trace that happens to be named like an image
    simwar.simulate(str(CONFIG), {"steps": 60, "warmup_steps": 5}, engine="simpy").trace.save(png)
    before = png.read_bytes()
    _refused(capsys, ["explain", png, "--timeline", png], png)
    assert png.read_bytes() == before


def test_plot_over_its_results_table_is_refused(tmp_path, capsys):
    import pandas as pd

    table = tmp_path / "results.pdf"  # a results table named like an image
    pd.DataFrame({"policy.barrier": ["fine"], "run_id": [0], "step_us_mean": [1.0]}) \
        .to_parquet(table)
    before = table.read_bytes()
    _refused(capsys, ["plot", table, "--x", "policy.barrier", "--y", "step_us_mean",
                      "-o", table], table)
    assert table.read_bytes() == before


def test_sweep_out_holding_the_sweep_file_is_refused(tmp_path, capsys):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"base: {CONFIG}\ngrid: {{policy.barrier: [coarse, fine]}}\n")
    before = spec.read_bytes()
    err = _refused(capsys, ["sweep", spec, "--out", tmp_path, "--no-progress"], spec)
    assert "is the sweep file" in err
    assert spec.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["sweep.yaml"]


def test_sweep_out_holding_the_base_config_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    base = out / "results.csv"  # a base config that a results table would replace
    base.write_text(CONFIG.read_text())
    spec = tmp_path / "s.yaml"
    spec.write_text("base: out/results.csv\ngrid: {policy.barrier: [coarse, fine]}\n")
    err = _refused(capsys, ["sweep", spec, "--out", out, "--no-progress"], base)
    assert "is the base config" in err
    assert base.read_text() == CONFIG.read_text()


# --------------------------------------------------------------------------- one rule
@pytest.mark.parametrize("args", [
    ["calibrate", str(MEASURED), "-o", "{tmp}/no/cal.yaml"],
    ["compare", str(MEASURED), "--csv", "{tmp}/no/t.csv"],
    ["compare", str(MEASURED), "--csv", "{tmp}/t.csv", "--markdown", "{tmp}/no/t.md"],
    ["run", *SHORT, "--trace", "{tmp}/no/t.json"],
    ["advise", str(CONFIG), "-o", "{tmp}/no/a.yaml", "--no-progress"],
    ["import", str(CAPTURE), "--steps-csv", "{tmp}/no/s.csv", "--no-progress"],
], ids=lambda a: f"{a[0]}:{a[-1] if 'no/' in a[-1] else a[-2]}")
def test_no_command_creates_the_directory_of_an_output_file(tmp_path, capsys, args):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"directory {tmp_path}/no does not exist\n"), err
    assert os.listdir(tmp_path) == []


def test_compare_writes_its_plot_whole(tmp_path, capsys):
    out = tmp_path / "c.png"
    assert main(["compare", str(MEASURED), "--csv", str(tmp_path / "t.csv"),
                 "--plot", str(out)]) == 0
    capsys.readouterr()
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == ["c.png", "t.csv"]


def test_cli_trace_to_its_own_stdout_streams_it_before_the_summary(tmp_path):
    out = subprocess.run([sys.executable, "-m", "simwar", "run", *SHORT, "--quiet",
                          "--trace", "/proc/self/fd/1"], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    trace, summary = out.stdout.split("dspark-fine [--set steps=60, --set warmup_steps=5]: ")
    assert json.loads(trace)["traceEvents"] and summary.startswith("dspark, barrier fine")
    assert os.listdir(tmp_path) == []
