"""One torchrun worker process initializes and destroys several process groups in turn, as a Hydra
multirun (``dmt-train -m``) under torchrun does: each job's group must meet in the agent's store
under its own keys, not read an earlier job's rendezvous (gloo: "Connection refused")."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import torchrun

WORKER = """
import sys, time
import torch, torch.distributed as dist
from dmt.runtime import close_runtime, init_runtime

for job in range(3):
    runtime = init_runtime("cpu", timeout_s=60)
    if runtime.rank == 1:
        time.sleep(0.5)  # rank 0 meets first: it would find rank 1's old address
    total = torch.tensor([float(runtime.rank + 1)])
    dist.all_reduce(total)
    with open(f"{sys.argv[1]}/rank{runtime.rank}.txt", "a") as out:  # not a shared pipe
        out.write(f"rank {runtime.rank} job {job} sum {total.item():g}\\n")
    close_runtime()
"""


def test_torchrun_workers_run_three_groups_in_turn(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd, env = torchrun(str(script), str(tmp_path))
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for rank in (0, 1):
        lines = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert lines == [f"rank {rank} job {j} sum 3" for j in range(3)], out
