"""One worker process initializes and destroys several process groups in turn, as a Hydra multirun
(``dmt-train -m``) does in the same processes: each job's group must meet under its own keys, not
read an earlier job's rendezvous (gloo: "Connection refused"), whether the workers meet in
torchrun's agent store or in a store of dmt's own (SLURM's ``srun``, or ``RANK``/``WORLD_SIZE``/
``MASTER_ADDR``/``MASTER_PORT`` set by hand)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port, torchrun, two_rank_env

WORKER = """
import logging, sys, time
import torch, torch.distributed as dist
from dmt.runtime import close_runtime, init_runtime, world_number

slow = int(sys.argv[2]) if len(sys.argv) > 2 else 1
logging.basicConfig(level=logging.INFO, format="%(message)s")  # init_runtime's "rank r of n" line
for job in range(3):
    runtime = init_runtime("cpu", timeout_s=60)
    if runtime.rank == slow:
        time.sleep(0.5)  # the other rank meets first: it would find the slow rank's old address
    total = torch.tensor([float(runtime.rank + 1)])
    dist.all_reduce(total)
    with open(f"{sys.argv[1]}/rank{runtime.rank}.txt", "a") as out:  # not a shared pipe
        out.write(f"rank {runtime.rank} job {job} sum {total.item():g} world {world_number()}\\n")
    if runtime.rank == slow:
        time.sleep(0.5)  # and leaves last: the other rank starts the next job first
    close_runtime()
"""


def _check(tmp_path: Path, out: str) -> None:
    for rank in (0, 1):
        lines = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert lines == [f"rank {rank} job {j} sum 3 world {j + 1}" for j in range(3)], out


# CI time (2 cores): torchrun's agent store (7 s) runs with -m slow, with the CLI multirun
# under torchrun; one srun step's workers stay
@pytest.mark.slow
def test_torchrun_workers_run_three_groups_in_turn(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd, env = torchrun(str(script), str(tmp_path))
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    _check(tmp_path, out)


def _start_pair(tmp_path: Path, script: Path, launcher: str, *args: str) -> list[str]:
    """Runs ``script`` as ranks 0 and 1 of one ``srun`` step (``launcher="srun"``) or of a world
    given torchrun's variables by hand (``"env"``); returns each rank's output after checking
    that both exited with 0."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = two_rank_env(launcher, rank, port)
        cmd = [sys.executable, str(script), str(tmp_path), *args]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
        )
    try:  # a rank that waits for its peers' timeout fails the test here
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    return outs


@pytest.mark.parametrize(
    "launcher", ["srun", pytest.param("env", marks=pytest.mark.slow)]
)  # the same store either way: the hand-set variables' case runs with -m slow
def test_workers_of_one_step_run_three_groups_in_turn(tmp_path: Path, launcher: str) -> None:
    """Two tasks of one ``srun`` step (or two processes given the torchrun variables by hand)
    run three jobs in turn; rank 0, which serves the rendezvous, is the slow one: rank 1 starts
    the next job while rank 0 still holds the previous one's group."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    outs = _start_pair(tmp_path, script, launcher, "0")
    _check(tmp_path, "\n".join(outs))
    name = {"srun": "slurm", "env": "torchrun"}[launcher]  # torchrun's variables, set by hand
    for rank, rank_out in enumerate(outs):
        seen = re.findall(
            rf"rank {rank} of 2 \(local rank {rank} of 2, launcher ([\w ]+),", rank_out
        )
        # not "torchrun" from dmt's own exported variables
        want = name if launcher == "env" else f"slurm task {rank} on node 0"
        assert seen == [want] * 3, rank_out


SKIPPER = """
import sys
import torch, torch.distributed as dist
from dmt.runtime import close_runtime, init_runtime, world_from_env
import os

rank = world_from_env(os.environ).rank
for job in range(3):
    if rank == 1 and job == 0:
        continue  # e.g. failed before its group (a missing file, a GPU short on one node)
    try:
        # job 0 (rank 0 alone) times out in 2 s; rank 1, already in job 1, waits longer for it
        runtime = init_runtime("cpu", timeout_s=2 if job == 0 else 20, job=f"job_{job}")
    except Exception as e:  # no peer in the same job
        line = f"rank {rank} job {job} alone: {type(e).__name__}"
    else:
        total = torch.tensor([float(10 ** job)])
        dist.all_reduce(total)
        line = f"rank {rank} job {job} sum {total.item():g}"
        close_runtime()
    with open(f"{sys.argv[1]}/rank{rank}.txt", "a") as out:
        out.write(line + "\\n")
"""


@pytest.mark.slow  # 2 s of rendezvous timeout
def test_ranks_never_train_together_on_different_jobs(tmp_path: Path) -> None:
    """Ranks meet only within the same job (``init_runtime(job=...)``: Hydra's job number and
    overrides). Rank 1 fails job 0 before its group; rank 0 waits for it in job 0 alone and times
    out. With a bare count of groups, rank 0's job 0 met rank 1's job 1 and they trained as one
    world on different sweep points, silently. Now no job pairs with another, and the later jobs
    train together: rank 0 times out while the ranks compare their backends through the store,
    before torch's ``init_process_group`` (whose failure would leave torch's own group count one
    ahead, with no reset, and every later job timing out)."""
    script = tmp_path / "skipper.py"
    script.write_text(SKIPPER)
    out = "\n".join(_start_pair(tmp_path, script, "srun"))
    got = [(tmp_path / f"rank{r}.txt").read_text().splitlines() for r in (0, 1)]
    assert got[0] == [
        "rank 0 job 0 alone: DistStoreError",
        "rank 0 job 1 sum 20",
        "rank 0 job 2 sum 200",
    ], out
    assert got[1] == ["rank 1 job 1 sum 20", "rank 1 job 2 sum 200"], out


DEVICELESS = """
import sys, time
from dmt.runtime import init_runtime, world_from_env
import os

rank = world_from_env(os.environ).rank
start = time.monotonic()
try:
    # rank 1 asks for a GPU it does not have (e.g. SLURM binding too few GPUs to some tasks);
    # a timeout beyond the test's wait for the processes: a rank that waited for it fails the test
    init_runtime("cuda" if rank == 1 else "cpu", timeout_s=900, job="job")
except ValueError as e:
    line = str(e)
else:
    line = "started"
with open(f"{sys.argv[1]}/rank{rank}.txt", "w") as out:
    out.write(line)
"""


# the same, where rank 1 sees two GPUs and its own is busy (exclusive mode, another process)
DEVICE_BUSY = DEVICELESS.replace(
    "start = time.monotonic()",
    """import torch
if rank == 1:
    torch.cuda.device_count = lambda: 2
    def busy(device):
        raise RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable")
    torch.cuda.set_device = busy
start = time.monotonic()""",
)


def test_a_rank_whose_gpu_fails_to_start_fails_every_rank_at_once(tmp_path: Path) -> None:
    """A reproduced bug: a GPU that failed when selected (torch.cuda.set_device raising a
    RuntimeError: busy, ECC, no memory) failed its rank alone, and the other ranks waited for it
    until the timeout (600 s by default) with a store timeout naming neither the rank nor the
    error. Now it goes through the rendezvous store like a missing device."""
    script = tmp_path / "busy.py"
    script.write_text(DEVICE_BUSY)
    out = "\n".join(_start_pair(tmp_path, script, "srun"))
    message = (
        "ranks [1] have no device to run on; rank 1: cuda:1 (local rank 1) cannot be used: "
        "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable"
    )
    for line in ((tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)):
        assert line == message, out


def test_a_rank_without_its_device_fails_every_rank_at_once(tmp_path: Path) -> None:
    """A rank that cannot take its device (``trainer.device=cuda`` without one, a local rank
    beyond the GPUs it sees) says so through the rendezvous store, and every rank raises its
    message at once. Before, it raised alone before the rendezvous and the others waited for it
    until the timeout (600 s by default) and then failed with a bare store timeout."""
    script = tmp_path / "deviceless.py"
    script.write_text(DEVICELESS)
    out = "\n".join(_start_pair(tmp_path, script, "srun"))
    got = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    message = (
        "ranks [1] have no device to run on; rank 1: trainer.device=cuda but no CUDA device is "
        "available"
    )
    for line in got:
        assert line == message, out


VERDICT = """
import os, sys
import torch, torch.distributed as dist
from dmt.run_dir import share_verdict
from dmt.runtime import close_runtime, init_runtime, world_from_env

world = world_from_env(os.environ)
refused = sys.argv[2] == "refused"
error = "refused by rank 0" if refused and world.rank == 0 else None
print(f"rank {world.rank} verdict {share_verdict(world, error, timeout_s=30)}", flush=True)
if not refused:  # the job's group meets in the store that rank 0 served for the verdict
    init_runtime("cpu", timeout_s=30)
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    print(f"rank {world.rank} sum {total.item():g}", flush=True)
    close_runtime()
"""


@pytest.mark.parametrize("verdict", ["refused", "held"])
def test_the_tasks_of_a_step_learn_rank_0s_verdict_on_the_run_directory(
    tmp_path: Path, verdict: str
) -> None:
    """Before Hydra writes into the run directory (dmt.run_dir.RunDirGuard), the tasks of an
    ``srun`` step learn rank 0's verdict on it in the store rank 0 serves, which it keeps
    serving until they have read a refusal, and which their process group then reuses."""
    script = tmp_path / "verdict.py"
    script.write_text(VERDICT)
    outs = _start_pair(tmp_path, script, "srun", verdict)
    for rank, out in enumerate(outs):
        if verdict == "refused":
            assert out.splitlines() == [f"rank {rank} verdict refused by rank 0"], out
        else:
            assert out.splitlines() == [f"rank {rank} verdict None", f"rank {rank} sum 2"], out
