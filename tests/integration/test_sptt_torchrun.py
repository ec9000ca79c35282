"""``dmt-train sptt=on`` under ``torchrun``, one host and two emulated hosts (issue 5, point 5).

Four ranks in two towers (``L = 2`` ranks per host). The same job is launched

- once as ``torchrun --nproc-per-node=4`` with ``sptt.local_world_size=2`` (the topology from the
  config) and Figure 7's step (c) (``sptt.peer_permute=output``);
- once as two ``torchrun --nnodes=2 --nproc-per-node=2 --node-rank={0,1}`` launches that meet
  through a c10d rendezvous on loopback (the topology from torchrun's ``LOCAL_WORLD_SIZE``),
  with step (c) skipped through the peer-ordered all-to-all (``sptt.peer_permute=skip``).

Both compute the same numbers (the variants are exact), so the metrics must agree; and the flat
TorchRec baseline runs through the same entry point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TRAIN = [
    "-m",
    "dmt.train",
    "logger=disabled",
    "trainer.progress_bar=false",
    "experiment=dmt_4t_dlrm",
    "model.partition.num_towers=2",
    "data.synthetic.num_sparse=8",
    "data.synthetic.num_groups=2",
    "data.synthetic.num_train=16384",
    "data.synthetic.num_val=2048",
    "data.synthetic.num_test=2048",
    "data.batch_size=512",
    "data.eval_batch_size=1024",
]
COMPARED = ("val_auc", "test_auc", "test_logloss", "train_loss_last", "num_steps")


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def _metrics(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "metrics.json").read_text())


def _check(procs: list[subprocess.Popen], timeout: float = 300) -> None:
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]


@pytest.mark.slow  # 35 s on 2 cores: in `-m slow`, out of CI's 15 minutes
def test_sptt_training_one_host_and_two_emulated_hosts_agree(tmp_path) -> None:
    one = tmp_path / "one_host"
    _check(
        [
            subprocess.Popen(
                [
                    *TORCHRUN,
                    "--standalone",
                    "--nproc-per-node=4",
                    *TRAIN,
                    "sptt=on",
                    "sptt.local_world_size=2",
                    "sptt.peer_permute=output",
                    f"hydra.run.dir={one}",
                ],
                cwd=REPO,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        ]
    )
    two = tmp_path / "two_hosts"
    endpoint = f"127.0.0.1:{free_port()}"
    _check(
        [
            subprocess.Popen(
                [
                    *TORCHRUN,
                    "--nnodes=2",
                    "--nproc-per-node=2",
                    f"--node-rank={node}",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={endpoint}",
                    "--rdzv-id=dmt-test",
                    *TRAIN,
                    "sptt=on",
                    "sptt.peer_permute=skip",
                    f"hydra.run.dir={two}",
                ],
                cwd=REPO,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for node in (0, 1)
        ]
    )
    a, b = _metrics(one), _metrics(two)
    assert a["num_steps"] == 16384 // 512
    assert a["test_auc"] > 0.6, a  # it learned
    for key in COMPARED:
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (key, a[key], b[key])
    plan = (one / "sharding_plan.txt").read_text()  # rank 0's, the same topology either way
    assert plan.startswith("SPTT plan: G=4 ranks, L=2 per host, K=1 hosts per tower, T=2 towers")
    assert (two / "sharding_plan.txt").read_text() == plan


@pytest.mark.slow  # 19 s: CI time; torchrun runs in the suite through test_runtime_reinit.py
def test_flat_baseline_runs_through_the_same_entry_point(tmp_path) -> None:
    run_dir = tmp_path / "flat"
    _check(
        [
            subprocess.Popen(
                [
                    *TORCHRUN,
                    "--standalone",
                    "--nproc-per-node=2",
                    *TRAIN,
                    f"hydra.run.dir={run_dir}",
                ],
                cwd=REPO,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        ]
    )
    metrics = _metrics(run_dir)
    assert metrics["num_steps"] == 16384 // 512 and metrics["test_auc"] > 0.6, metrics
    plan = (run_dir / "sharding_plan.txt").read_text()
    assert plan.startswith("flat TorchRec plan (EmbeddingShardingPlanner)\nmemory budget: cpu:")
    assert all(f"t_cat_{i} " in plan for i in range(8)), plan
