"""dmt's SLURM launch paths on a real local SLURM cluster (``cluster``).

``scripts/slurm_smoke.sh`` installs SLURM from Debian's packages if needed, starts munged,
slurmctld and two slurmd nodes in a temp directory, and runs ``scripts/slurm_acceptance.sh`` on
them (CPU): ``dmt-train -m hydra/launcher=slurm`` over 2 sweep points of 2 tasks each, then
``srun -N 2 dmt-train -m`` over 3 points in turn in one job step, checking that every point
trained as one world of 2; ``srun --distribution=cyclic`` with 2 tasks per node, whose ranks
must be numbered node by node; then a preempted job (SIGUSR2 after its first checkpoint) that must be
requeued, resume and end as the uninterrupted run. It stops its daemons. Needs root:
``pytest -m cluster``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster


@pytest.mark.skipif(os.geteuid() != 0, reason="starts slurmd/slurmctld/munged as root")
def test_slurm_sweep_points_are_worlds_of_two() -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm_smoke.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "OK: 2 sweep points, each one world of 2 ranks" in proc.stdout
    assert "OK: 3 points in turn in one srun step, each one world of 2 ranks" in proc.stdout
    assert "ended as the uninterrupted run" in proc.stdout  # preempted, requeued, resumed
    assert "OK: cyclic placement, ranks numbered node by node in one world of 4" in proc.stdout
    assert "OK: all checks passed on SLURM nodes 127.0.0.1 127.0.0.2" in proc.stdout
    for point in (0, 1):
        for rank in (0, 1):
            line = (
                rf"^\[point {point}\] .*\brank {rank} of 2 \(local rank 0 of 1, "
                rf"launcher slurm task {rank} on node {rank}, "
            )
            assert re.search(line, proc.stdout, re.MULTILINE), (point, rank, proc.stdout[-3000:])
