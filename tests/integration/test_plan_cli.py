"""``python -m dmt.planning.app`` (the ``dmt-plan`` console script) writes ``plan.json`` in its
Hydra run directory with the figures the issue names, and prints its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_dmt_plan_writes_plan_json(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dmt.planning.app",
            "data.synthetic.num_sparse=8",
            "data.synthetic.cardinality=100",
            "data.batch_size=64",
            "cluster.hosts=2",
            "cluster.gpus_per_host=2",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((run_dir / "plan.json").read_text())
    for mode in ("flat", "sptt", "dmt"):
        figures = report["modes"][mode]
        assert figures["cross_host_mb"] > 0 and figures["intra_host_mb"] >= 0
        assert 0 < figures["max_rank_memory_gb"] < 80
        line = f"{mode:5s} {figures['intra_host_mb']:14.3f} {figures['cross_host_mb']:14.3f}"
        assert line in result.stdout
    assert f"written to {run_dir / 'plan.json'}" in result.stdout
