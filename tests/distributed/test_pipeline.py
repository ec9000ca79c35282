"""Pipelined training (``trainer.pipeline=true``, TorchRec's train pipelines) computes exactly
what the plain loop computes: the same losses and the same weights, flat and SPTT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torchrec.distributed.types import ShardedModule

from dmt import checkpoint
from dmt.runtime import Runtime
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer
from tests.distributed.distributed_harness import backends, run_on_ranks

BASE = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=4096",
    "data.synthetic.num_val=512",
    "data.synthetic.num_test=512",
    "data.batch_size=256",
    "trainer.epochs=2",
    "trainer.max_steps=24",  # crosses the epoch boundary at 16
    "trainer.eval_every=10",  # segments end at evaluations and checkpoints too
    "trainer.checkpoint_every=12",
    "trainer.eval_max_batches=3",
    "data.eval_batch_size=64",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
]
MODELS = {
    "dlrm": [],
    "dcn": ["model=dcn", "model.dcn_low_rank=4"],
    "dmt_flat": [
        "experiment=dmt_4t_dlrm",
        "model.bottom_mlp=[16,8]",
        "model.top_mlp=[16,1]",
        "model.embedding_dim=8",
    ],
    "sptt": [
        "experiment=dmt_4t_dlrm",
        "model.partition.num_towers=2",
        "sptt=on",
        "model.bottom_mlp=[16,8]",
        "model.top_mlp=[16,1]",
        "model.embedding_dim=8",
    ],
}

# the sharded modules whose input dist TrainPipelineSparseDist runs a batch ahead (flat DMT models
# train through TrainPipelineBase: their towers read features split out of the batch)
PIPELINED = {
    "dlrm": ("ShardedEmbeddingBagCollection",),
    "dcn": ("ShardedEmbeddingBagCollection",),
    "dmt_flat": (),
    "sptt": ("ShardedTowers",),
}


def _train(rank: int, world_size: int, overrides: list[str], out: str, backend: str) -> list[float]:
    cfg = to_config(compose_config(*BASE, *overrides))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    rt = Runtime(rank, world_size, rank, world_size, device, backend)
    trainer = Trainer(cfg, rt, Path(out))
    assert (trainer.pipeline is not None) == cfg.trainer.pipeline
    losses = trainer.fit(keep_losses=True).losses
    # TorchRec's pipeline marks the sharded modules whose input dist it runs a batch ahead
    sharded = [m for m in trainer.model.modules() if isinstance(m, ShardedModule)]
    return losses, sorted(type(m).__name__ for m in sharded if m.is_pipelined)


@pytest.mark.parametrize("backend", backends(min_gpus=1))
@pytest.mark.parametrize(
    ("model", "world_size"),
    [
        # CI time (2 cores): a world of one (11 s), DLRM at 4 ranks (26 s; SPTT's 4 ranks stay),
        # DCN and flat DMT at 2 (13 s, 22 s; DLRM's and SPTT's stay) and the 8-rank cases (25 s,
        # 23 s) run with -m slow, and in gpu_acceptance.sh on NCCL; so does SPTT at 2 (12 s; its 4
        # ranks stay)
        pytest.param("dlrm", 1, marks=pytest.mark.slow),
        ("dlrm", 2),
        pytest.param("dlrm", 4, marks=pytest.mark.slow),
        pytest.param("dlrm", 8, marks=pytest.mark.slow),
        pytest.param("dcn", 2, marks=pytest.mark.slow),
        pytest.param("dmt_flat", 2, marks=pytest.mark.slow),
        pytest.param("sptt", 2, marks=pytest.mark.slow),
        ("sptt", 4),
        pytest.param("sptt", 8, marks=pytest.mark.slow),
    ],
)
def test_pipelined_training_equals_the_plain_loop(
    tmp_path: Path, model: str, world_size: int, backend: str
) -> None:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < world_size:
        pytest.skip(f"needs {world_size} GPUs, {gpus} here")
    extra = list(MODELS[model])
    if model == "sptt":  # two towers of G/2 ranks
        extra.append(f"sptt.local_world_size={world_size // 2}")
    runs = {}
    for pipeline in (True, False):
        out = tmp_path / f"pipeline_{pipeline}"
        losses = run_on_ranks(
            _train,
            world_size,
            # a world of one runs the plain loop unless told to pipeline it too
            [*extra, f"trainer.pipeline={pipeline}", "trainer.pipeline_world_of_one=true"],
            str(out),
            backend,
            timeout_s=240,
            backend=backend,
        )
        runs[pipeline] = (
            [rank_losses for rank_losses, _ in losses],
            checkpoint.load_model_state(out / "checkpoints" / "step_24"),
            json.loads((out / "metrics.json").read_text()),
        )
        pipelined = {tuple(names) for _, names in losses}
        assert pipelined == {PIPELINED[model] if pipeline else ()}, pipelined
    (piped_losses, piped, piped_metrics), (plain_losses, plain, plain_metrics) = (
        runs[True],
        runs[False],
    )
    assert len(piped_losses[0]) == 24
    # on the CPU the two runs are equal bit for bit; on CUDA two runs of the same kernels may
    # already sum in other orders (atomic additions: FBGEMM's, the metrics' float64
    # histograms'), never yet measured here: a batch a step early or late would move the losses
    # and metrics by far more than this
    exact = backend == "gloo"
    tol = {"rtol": 0.0, "atol": 0.0} if exact else {"rtol": 1e-5, "atol": 1e-6}
    # evaluation (EvalPipelineSparseDist for flat base models) scores the same predictions
    for key in ("val_auc", "val_logloss", "test_auc", "test_logloss", "test_calibration"):
        expected = plain_metrics[key]
        assert piped_metrics[key] == (expected if exact else pytest.approx(expected, 1e-5)), key
    torch.testing.assert_close(
        torch.tensor(piped_losses, dtype=torch.float64),
        torch.tensor(plain_losses, dtype=torch.float64),
        **tol,
    )
    assert sorted(piped) == sorted(plain)
    for key, value in plain.items():
        torch.testing.assert_close(piped[key], value, **tol, msg=key)
