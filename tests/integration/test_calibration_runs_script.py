"""``scripts/calibration_runs.sh``: bad arguments are refused with a message naming them, exit
status 2, before anything is made; the temporary directory of a cell goes however the script
ends. (No cell is measured here: a stand-in for Python takes the benchmark's place.)"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "calibration_runs.sh"


def _script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # reproduced: a bash "division by 0" error, then exit status 0
        (
            ["--local-world-size", "0", "--cells", "4:none:512"],
            "--local-world-size must be a positive integer, got '0'",
        ),
        (["--local-world-size", "abc"], "--local-world-size must be a positive integer, got 'abc'"),
        (
            ["--runs", "abc"],
            "--runs must be an integer of at least 3 (a median of fewer is not a "
            "result), got 'abc'",
        ),  # fmt: skip
        (["--iters", "0"], "--iters must be a positive integer, got '0'"),
        (["--warmup", "-1"], "--warmup must be an integer of at least 0, got '-1'"),
        (
            ["--modes", "flat,foo"],
            "--modes must be a comma-separated list of flat, sptt, dmt, got 'flat,foo'",
        ),  # fmt: skip
        (["--cells", " "], "--cells must name at least one G:RATE:BATCH cell"),
        (
            ["--cells", "4:fast:512"],
            "bad cell '4:fast:512': want G:RATE:BATCH with G a multiple "
            "of L=2, BATCH a positive integer and RATE none or tc's rate (1gbit, 2500mbit)",
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
