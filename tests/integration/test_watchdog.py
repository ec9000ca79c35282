"""A frozen rank ends the whole ``torchrun`` job, naming the rank (issue 10, point 4).

Two ranks train under ``torchrun`` with ``trainer.collective_timeout_s=20``; rank 1 gets SIGSTOP
mid-training. The job must exit non-zero within the timeout plus a margin, say which rank stopped
answering, and leave no process behind. The run uses the default run directory, so the test also
checks that both ranks settled on one directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import torchrun

TIMEOUT_S = 20
MARGIN_S = 40


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [int(v.split(b"=", 1)[1]) for v in env if v.startswith(b"RANK=")]
    return ranks[0] if ranks else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_stopped_rank_ends_the_job_within_the_timeout(tmp_path) -> None:
    log_path = tmp_path / "torchrun.log"
    cmd, env = torchrun(
        "-m",
        "dmt.train",
        "logger=disabled",
        "trainer.progress_bar=true",
        "trainer.epochs=1000",
        "data.synthetic.num_train=20000",
        "data.batch_size=256",
        f"trainer.collective_timeout_s={TIMEOUT_S}",
    )
    with log_path.open("w") as log:
        job = subprocess.Popen(
            cmd,
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while "train:" not in log_path.read_text():  # rank 0's progress bar: training is on
            assert job.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(2)
        workers = _children(job.pid)
        stopped = next(p for p in workers if _rank_of(p) == 1)
        os.kill(stopped, signal.SIGSTOP)
        # a hang fails here: the watchdog's timeout and a margin
        returncode = job.wait(timeout=TIMEOUT_S + MARGIN_S)
        out = log_path.read_text()
        assert returncode != 0
        assert "rank 0: rank 1 stopped answering (no heartbeat for" in out, out[-3000:]
        assert not [p for p in workers if _alive(p)]
        run_dirs = list((tmp_path / "outputs").glob("*/*"))
        assert len(run_dirs) == 1, run_dirs  # the ranks agreed on one default directory
    finally:
        for pid in [*workers, job.pid]:
            if _alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        job.wait()
