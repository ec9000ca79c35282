"""Dropout on several ranks: each rank draws its own masks (a single process on the global batch
draws one per sample, never the same for two samples), reproducibly, and a resume continues
every rank's stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dmt import checkpoint
from dmt.runtime import Runtime
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer
from tests.distributed.distributed_harness import backends, run_on_ranks

P = 0.3  # model.dropout
BASE = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=2048",
    "data.synthetic.num_val=256",
    "data.synthetic.num_test=256",
    "data.batch_size=256",
    "trainer.eval_max_batches=1",
    "trainer.log_every=1",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
    f"model.dropout={P}",
]
MODELS = {
    "dlrm": [],
    "sptt": [
        "experiment=dmt_4t_dlrm",
        "model.partition.num_towers=2",
        "sptt=on",
        "sptt.local_world_size=1",
        "model.bottom_mlp=[16,8]",
        "model.top_mlp=[16,1]",
        "model.embedding_dim=8",
    ],
}


def _trainer(rank: int, world_size: int, overrides: list[str], out: Path, backend: str) -> Trainer:
    cfg = to_config(compose_config(*BASE, *overrides))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    return Trainer(cfg, Runtime(rank, world_size, rank, world_size, device, backend), out)


def _masks(
    rank: int, world_size: int, overrides: list[str], out: str, backend: str
) -> tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The weights of the bottom and top MLPs as built, and every training dropout's ``(input != 0,
    output != 0)``: where the input is not 0, the output is 0 exactly where the mask dropped."""
    trainer = _trainer(rank, world_size, [*overrides, "trainer.max_steps=3"], Path(out), backend)
    mlps = {
        name: value.detach().cpu().clone()
        for name, value in trainer.model.named_parameters()
        if ".bottom." in name or ".top." in name
    }
    drawn: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(module: nn.Module, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
        if module.training:
            drawn.append(((inputs[0] != 0).cpu(), (output != 0).cpu()))

    for module in trainer.model.modules():
        if isinstance(module, nn.Dropout):
            module.register_forward_hook(record)
    trainer.fit()
    return mlps, drawn


@pytest.mark.parametrize("backend", backends(min_gpus=2))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_rank_draws_its_own_dropout_masks(tmp_path: Path, model: str, backend: str) -> None:
    """Reproduced: every rank seeded torch with ``trainer.seed`` and drew the same masks, so
    sample ``i`` of each rank's local batch was dropped alike on both ranks (0 of 4,400 mask
    elements differed). The weights are still built alike; the masks now differ where two
    independent draws do (``2 p (1 - p)`` of them)."""
    (w0, drawn0), (w1, drawn1) = run_on_ranks(
        _masks, 2, MODELS[model], str(tmp_path), backend, timeout_s=240, backend=backend
    )
    assert w0 and w0.keys() == w1.keys()
    for name, value in w0.items():
        torch.testing.assert_close(w1[name], value, rtol=0, atol=0, msg=name)
    assert len(drawn0) == len(drawn1) == 6  # 3 steps, a dropout in each MLP
    same = differ = 0
    for (live0, kept0), (live1, kept1) in zip(drawn0, drawn1, strict=True):
        both = live0 & live1
        same += int((both & (kept0 == kept1)).sum())
        differ += int((both & (kept0 != kept1)).sum())
    n = same + differ
    expected = 2 * P * (1 - P)
    assert n > 2000, n
    assert abs(differ / n - expected) < 5 * (expected * (1 - expected) / n) ** 0.5, (differ, n)


def _resumed(rank: int, world_size: int, out: str, backend: str) -> dict[str, Any]:
    """Losses of 6 steps uninterrupted, and of 3 steps then a resume to 6."""
    root = Path(out)
    losses = {}
    for name, overrides in (
        ("full", ["trainer.max_steps=6"]),
        ("first", ["trainer.max_steps=3"]),
        (
            "second",
            ["trainer.max_steps=6", f"trainer.resume_from={root / 'first' / 'checkpoints'}"],
        ),
    ):
        trainer = _trainer(
            rank, world_size, [*overrides, "trainer.checkpoint=true"], root / name, backend
        )
        losses[name] = trainer.fit(keep_losses=True).losses
    return losses


@pytest.mark.parametrize("backend", backends(min_gpus=2))
def test_a_resume_on_two_ranks_draws_each_ranks_masks_of_an_uninterrupted_run(
    tmp_path: Path, backend: str
) -> None:
    """Each rank's stream is its own (above): the checkpoint holds every rank's and a resume at
    the same world size restores each to its rank, so the resumed run's losses and weights are
    the uninterrupted run's."""
    ranks = run_on_ranks(_resumed, 2, str(tmp_path), backend, timeout_s=240, backend=backend)
    exact = backend == "gloo"
    tol = {"rtol": 0.0, "atol": 0.0} if exact else {"rtol": 1e-5, "atol": 1e-6}
    for losses in ranks:
        assert len(losses["full"]) == 6
        torch.testing.assert_close(
            torch.tensor(losses["first"] + losses["second"]), torch.tensor(losses["full"]), **tol
        )
    full = checkpoint.load_model_state(tmp_path / "full" / "checkpoints" / "step_6")
    resumed = checkpoint.load_model_state(tmp_path / "second" / "checkpoints" / "step_6")
    assert resumed.keys() == full.keys()
    for key, value in full.items():
        torch.testing.assert_close(resumed[key], value, **tol, msg=key)
