"""SPTT training end to end on gloo, the way the trainer drives it (``sptt=on``).

Four ranks as two emulated hosts (two towers): the Hydra config of ``experiment=dmt_4t_dlrm``
with two towers, the synthetic data split over the ranks, the model built with its tables on
``meta`` (as ``Trainer`` builds it), :func:`~dmt.sptt.dmt_sharding.shard_dmt` on the
``TrainTask``, then the trainer's step (LR schedule pushed into the fused kernels by
``zero_grad``), evaluation, and a checkpoint round trip through ``dmt.checkpoint``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from sklearn.metrics import roc_auc_score

from dmt import checkpoint
from dmt.data import build_data
from dmt.metrics import click_metrics
from dmt.models import build_model
from dmt.optim import LRSchedule, set_lr
from dmt.runtime import Runtime
from dmt.sptt.dmt_sharding import ShardedDMT, shard_dmt, topology_from
from dmt.train import to_config
from dmt.trainer import TrainTask
from tests.conftest import compose_config
from tests.distributed.distributed_harness import run_on_ranks

OVERRIDES = [
    "logger=disabled",
    "experiment=dmt_4t_dlrm",
    "model.partition.num_towers=2",
    "data.synthetic.num_train=8192",
    "data.synthetic.num_val=2048",
    "data.synthetic.num_test=1024",
    "data.batch_size=256",
    "data.eval_batch_size=512",
    "optim.schedule.warmup_steps=4",
    "optim.sparse_lr=0.05",
]
STEPS = 24


def _build(cfg, rt: Runtime, data):
    plain = build_model(
        cfg.model,
        feature_names=data.feature_names,
        cardinalities=data.cardinalities,
        num_dense=data.num_dense,
        table_device="meta",
        dense_device=rt.device,
    )
    return shard_dmt(
        TrainTask(plain),
        rt,
        topology=topology_from(rt, hosts_per_tower=1),
        optim_cfg=cfg.optim,
        init_seed=cfg.trainer.seed,
    )


@torch.no_grad()
def _evaluate(model, source, world_size: int) -> tuple[dict[str, float], torch.Tensor]:
    model.eval()
    probs, labels = [], []
    for batch in source.batches(0):
        _, logits = model(batch)
        probs.append(torch.sigmoid(logits))
        labels.append(batch.labels)
    model.train()
    p, y = torch.cat(probs), torch.cat(labels)
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, (p, y))
    metrics = click_metrics(
        torch.cat([g[0] for g in gathered]), torch.cat([g[1] for g in gathered])
    )
    return metrics, p


def _worker(rank: int, world_size: int, out_dir: str) -> dict:
    cfg = to_config(compose_config(*OVERRIDES))
    rt = Runtime(rank, world_size, rank % 2, 2, torch.device("cpu"), "gloo")
    torch.manual_seed(cfg.trainer.seed)
    data = build_data(cfg.data, rank=rank, world_size=world_size, seed=cfg.trainer.seed)
    model, optimizer = _build(cfg, rt, data)
    sharded = model.model
    assert isinstance(sharded, ShardedDMT) and sharded.topology.num_towers == 2
    first_shard = sharded.dataflow.shard_parameters()[0][1].detach().clone()

    settings = {k: v for k, v in cfg.optim.schedule.items() if k != "_target_"}
    schedule = LRSchedule(STEPS, **settings)  # optim.schedule's warmup_decay_schedule
    peaks = [g["lr"] for g in optimizer.param_groups]
    losses, fused_lrs = [], []
    for step, batch in zip(range(STEPS), data.train.batches(0)):
        set_lr(optimizer, peaks, schedule(step))
        optimizer.zero_grad()  # pushes the LR into the fused kernels
        loss, _ = model(batch)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        fused_lrs.append(sharded.fused_optimizer.param_groups[0]["lr"])
    val, _ = _evaluate(model, data.val, world_size)

    path = checkpoint.save(
        Path(out_dir),
        model,
        optimizer,
        step=STEPS,
        epoch=0,
        batch_in_epoch=STEPS,
        rank=rank,
        world_size=world_size,
    )
    _, test_probs = _evaluate(model, data.test, world_size)
    torch.manual_seed(123)  # a different initialization, replaced by the checkpoint
    restored, restored_optimizer = _build(cfg, rt, data)
    checkpoint.load(path, restored, restored_optimizer, rank=rank)
    _, restored_probs = _evaluate(restored, data.test, world_size)
    return {
        "losses": losses,
        "fused_lrs": fused_lrs,
        "peak_sparse_lr": cfg.optim.sparse_lr,
        "val_auc": val["auc"],
        "oracle_val_auc": float(roc_auc_score(data.val.labels, data.val.true_probs)),
        "restored_max_diff": float((restored_probs - test_probs).abs().max()),
        "first_shard": first_shard.flatten()[:8].tolist(),
    }


def test_sptt_training_loop_evaluation_and_checkpoint(tmp_path) -> None:
    results = run_on_ranks(_worker, 4, str(tmp_path), timeout_s=240)
    for r in results:
        losses = r["losses"]
        assert np.mean(losses[-6:]) < np.mean(losses[:6]), losses
        # warmup: the fused kernels follow the schedule (step 0 at 1/4 of the peak LR)
        assert r["fused_lrs"][0] == pytest.approx(r["peak_sparse_lr"] / 4)
        assert r["fused_lrs"][-1] == pytest.approx(r["peak_sparse_lr"])
        assert r["restored_max_diff"] == 0.0
    # every rank scores the whole split; 24 steps learn part of the planted structure
    assert len({r["val_auc"] for r in results}) == 1
    # (0.670 against the oracle's 0.748): at least 60% of the oracle's lift over chance
    auc, oracle = results[0]["val_auc"], results[0]["oracle_val_auc"]
    assert auc - 0.5 > 0.6 * (oracle - 0.5), (auc, oracle)
    # shards initialized on meta get decorrelated streams, not the same numbers on every rank
    firsts = [tuple(r["first_shard"]) for r in results]
    assert len(set(firsts)) == len(firsts)
