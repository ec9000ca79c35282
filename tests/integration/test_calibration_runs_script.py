"""``scripts/calibration_runs.sh``: bad arguments are refused with a message naming them, exit
status 2, before anything is made; the temporary directory of a cell and the directories of
--out the script made go however the script ends, and a signal to the script stops the cell's
command too. (No cell is measured here: a stand-in for Python takes the benchmark's place.)"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import default_sigint

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "calibration_runs.sh"


@pytest.fixture(autouse=True)
def _stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing Python (unless a test gives its own) and failing ip and tc: a cell that the
    script should have refused neither measures nor makes a namespace. (A failing ``ip netns
    list`` after a cell, as where iproute2 is missing, ended the script before its record.)"""
    bin_ = tmp_path / "stand-in bin"
    bin_.mkdir()
    for tool in ("ip", "tc"):
        (bin_ / tool).write_text("#!/bin/sh\nexit 1\n")
        (bin_ / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHON", "/bin/false")


def _script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
        preexec_fn=default_sigint,  # a test stops it with SIGINT
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # reproduced: a bash "division by 0" error, then exit status 0
        (
            ["--local-world-size", "0", "--cells", "4:none:512"],
            "--local-world-size must be an integer from 1 to 1024, got '0'",
        ),
        (
            ["--local-world-size", "abc"],
            "--local-world-size must be an integer from 1 to 1024, got 'abc'",
        ),  # fmt: skip
        (
            ["--runs", "abc"],
            "--runs must be an integer from 3 (a median of fewer is not a result) to 1000, "
            "got 'abc'",
        ),  # fmt: skip
        # reproduced: accepted (bash's arithmetic wraps round)
        (
            ["--runs", "99999999999999999999"],
            "--runs must be an integer from 3 (a median of fewer is not a result) to 1000, "
            "got '99999999999999999999'",
        ),  # fmt: skip
        (["--iters", "0"], "--iters must be an integer from 1 to 1000000, got '0'"),
        (
            ["--iters", "18446744073709551626"],
            "--iters must be an integer from 1 to 1000000, got '18446744073709551626'",
        ),  # fmt: skip
        (["--warmup", "-1"], "--warmup must be an integer from 0 to 1000000, got '-1'"),
        (
            ["--modes", "flat,foo"],
            "--modes must be a comma-separated list of flat, sptt, dmt, got 'flat,foo'",
        ),  # fmt: skip
        (["--cells", " "], "--cells must name at least one G:RATE:BATCH cell"),
        (
            ["--cells", "4:fast:512"],
            "bad cell '4:fast:512': want G:RATE:BATCH with G a multiple of L=2 up to 4096, "
            "BATCH an integer from 1 to 10000000 and RATE none or tc's rate (1gbit, 2500mbit)",
        ),  # fmt: skip
        (
            ["--cells", "4:none:18446744073709551617"],
            "bad cell '4:none:18446744073709551617': want G:RATE:BATCH with G a multiple of L=2 "
            "up to 4096, BATCH an integer from 1 to 10000000 and RATE none or tc's rate (1gbit, "
            "2500mbit)",
        ),  # fmt: skip
        (
            ["--cells", "802:1gbit:512"],
            "bad cell '802:1gbit:512': G/L = 401 hosts; a throttled cell emulates at most 200",
        ),  # fmt: skip
        (["--out", ""], "--out must name a directory, got ''"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_made(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "cal"
    result = _script("--out", str(out), *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"calibration_runs.sh: {message}\n"
    assert not out.exists()


def test_an_option_without_its_value_is_named(tmp_path: Path) -> None:
    """Reproduced: ``--out`` last gave bash's "$2: unbound variable"."""
    result = _script("--out")
    assert result.returncode == 2
    assert result.stderr == "calibration_runs.sh: --out needs a value\n"


def test_a_killed_run_leaves_no_temporary_directory(tmp_path: Path) -> None:
    """Reproduced: a run killed during a cell left its /tmp/calib.XXXX directory behind."""
    stub = tmp_path / "python"  # stands in for the benchmark: the script is killed meanwhile
    stub.write_text("#!/bin/sh\nkill -TERM $PPID\nsleep 1\nexit 1\n")
    stub.chmod(0o755)
    temp, out = tmp_path / "tmp", tmp_path / "cal"
    temp.mkdir()
    result = _script(
        "--out", str(out), "--cells", "4:none:512", env={"PYTHON": str(stub), "TMPDIR": str(temp)}
    )
    assert result.returncode == -signal.SIGTERM, result.stderr  # ended by the signal
    assert "G4_none_B512: load" in result.stderr  # the cell had started
    assert list(temp.iterdir()) == []
    assert not out.exists()  # made by this run, and left empty


def test_a_record_that_cannot_be_written_keeps_the_measurements(tmp_path: Path) -> None:
    """The benchmark ran (minutes of measuring), then making its record failed: the cell's
    directory (bench.json, log) stays, named, for the figures; the other cells go on."""
    stub = tmp_path / "python"  # the benchmark writes its --json; the record step fails
    stub.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = - ]; then cat >/dev/null; exit 1; fi\n'
        'while [ "$#" -gt 0 ]; do [ "$1" = --json ] && echo "[]" >"$2"; shift; done\n'
    )
    stub.chmod(0o755)
    temp, out = tmp_path / "tmp", tmp_path / "cal"
    temp.mkdir()
    result = _script(
        "--out", str(out), "--cells", "4:none:512", env={"PYTHON": str(stub), "TMPDIR": str(temp)}
    )
    assert result.returncode == 1, result.stderr
    (kept,) = temp.iterdir()
    assert (kept / "bench.json").read_text() == "[]\n"
    assert result.stderr.endswith(
        f"G4_none_B512: measured, but its record {out}/G4_none_B512.json could not be written; "
        f"the measurements are kept in {kept} (bench.json, log)\n"
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_cells_command_before_the_script_ends(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Reproduced: SIGTERM to the script ended it (its temporary directory removed) while the
    benchmark ran on, orphaned (a throttled cell's sudo netns_throttle.sh too). The stand-in
    benchmark signals the script, then would sleep 20 s: the script stops it and waits for it."""
    stub, pid_file = tmp_path / "python", tmp_path / "pid"
    stub.write_text(
        f'#!/bin/sh\necho $$ >"{pid_file}"\nkill -{sig.name[3:]} $PPID\nexec sleep 20\n'
    )
    stub.chmod(0o755)
    temp, out = tmp_path / "tmp", tmp_path / "cal"
    temp.mkdir()
    try:
        result = _script(
            "--out", str(out), "--cells", "4:none:512",
            env={"PYTHON": str(stub), "TMPDIR": str(temp)},
        )  # fmt: skip
        assert result.returncode == -sig, result.stderr  # ended by the signal
        pid = int(pid_file.read_text())
        with pytest.raises(ProcessLookupError):  # stopped, and reaped by the script
            os.kill(pid, 0)
        assert list(temp.iterdir()) == [] and not out.exists()
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_failed_run_removes_every_directory_of_out_it_made(tmp_path: Path) -> None:
    """Reproduced: ``--out "nest/b c/d"`` left ``nest/b c/`` (only the last directory went).
    Every directory it made goes, if empty; never one that was there."""
    (tmp_path / "nest").mkdir()
    result = subprocess.run(
        ["bash", str(SCRIPT), "--out", "nest/b c/d", "--cells", "4:none:512"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHON": "/bin/false", "TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 1, result.stderr
    assert "G4_none_B512 failed (exit status 1)" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nest", "stand-in bin"]
    assert list((tmp_path / "nest").iterdir()) == []
