"""The training step makes no host sync of dmt's own and no collective beyond its all-to-alls.

Counted in the rank processes of the test only: every ``torch.distributed`` collective called
from Python (TorchRec's and dmt's; DDP's gradient all-reduce runs in C++ and is not counted),
and every ``Tensor.item/tolist/__float__/__int__/__bool__`` called from dmt's own code (a
device-to-host copy on a GPU). ``Trainer.run_steps`` is the whole per-step path; the loss is
read back only at logging steps, by ``fit``.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dmt.runtime import Runtime
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer
from tests.distributed.distributed_harness import backends, run_on_ranks

DMT_DIR = str(Path(__file__).resolve().parents[2] / "dmt")
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "all_to_all",
    "all_to_all_single",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
    "barrier",
    "send",
    "recv",
)
SYNCS = ("item", "tolist", "__float__", "__int__", "__bool__")
BASE = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=4096",
    "data.synthetic.num_val=256",
    "data.synthetic.num_test=256",
    "data.batch_size=256",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
]
MODELS = {
    "flat": [],
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


def _count(rank: int, world_size: int, overrides: list[str], backend: str) -> list[dict[str, int]]:
    cfg = to_config(compose_config(*BASE, *overrides))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    rt = Runtime(rank, world_size, rank, world_size, device, backend)
    trainer = Trainer(cfg, rt, Path("/nonexistent"))
    counts: collections.Counter[str] = collections.Counter()

    def counting(name: str, fn: Any, dmt_only: bool) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_code.co_filename
            if not dmt_only or caller.startswith(DMT_DIR):
                counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    originals = {n: getattr(dist, n) for n in COLLECTIVES} | {
        n: getattr(torch.Tensor, n) for n in SYNCS
    }
    try:
        for n in COLLECTIVES:
            setattr(dist, n, counting(n, originals[n], dmt_only=False))
        for n in SYNCS:
            setattr(torch.Tensor, n, counting(n, originals[n], dmt_only=True))
        per_step = []
        steps = trainer.run_steps(iter(trainer.data.train.batches(0)))
        for _, _ in zip(range(6), steps):
            per_step.append(dict(counts))
            counts.clear()
    finally:
        for n in COLLECTIVES:
            setattr(dist, n, originals[n])
        for n in SYNCS:
            setattr(torch.Tensor, n, originals[n])
    return per_step[1:]  # the first step also fills the pipeline


# host syncs dmt's own code may make per step: row-wise SPTT tables need the sizes of their row
# blocks on the host for step a's KJT all-to-all (one sync for all of them; TorchRec's own
# row-wise input dist needs them too)
ALLOWED_SYNCS: dict[str, dict[str, int]] = {
    "flat": {},
    "sptt": {},
    "sptt_row_wise": {"tolist": 1},
}
MODELS["sptt_row_wise"] = [*MODELS["sptt"], "sptt.sharding_type=row_wise"]


@pytest.mark.parametrize("backend", backends(min_gpus=2))
@pytest.mark.parametrize("pipeline", [True, False])
@pytest.mark.parametrize("model", list(ALLOWED_SYNCS))
def test_a_training_step_has_no_host_sync_and_only_its_all_to_alls(
    model: str, pipeline: bool, backend: str
) -> None:
    overrides = [*MODELS[model], f"trainer.pipeline={pipeline}"]
    results = run_on_ranks(_count, 2, overrides, backend, timeout_s=180, backend=backend)
    for per_step in results:
        assert per_step == [per_step[0]] * len(per_step), per_step  # the same every step
        syncs = {k: v for k, v in per_step[0].items() if k in SYNCS}
        assert syncs == ALLOWED_SYNCS[model], per_step[0]  # no other host sync from dmt
        steps = {"all_to_all", "all_to_all_single"}
        if model == "sptt_row_wise":  # step d sums row-wise partial sums, and its backward
            steps |= {"reduce_scatter_tensor", "all_gather_into_tensor"}
        assert set(per_step[0]) - set(SYNCS) <= steps, per_step[0]
        assert per_step[0], "the step's all-to-alls were not seen: is the counting broken?"


REPO = Path(__file__).resolve().parents[2]
TRAINER_FILE = str(Path(DMT_DIR) / "trainer.py")


def _fit_collectives(rank: int, world_size: int, out: str) -> dict[str, int]:
    """The collectives ``dmt/trainer.py`` itself calls in a ``fit`` of 10 steps, logged every 5."""
    cfg = to_config(compose_config(*BASE, "trainer.max_steps=10", "trainer.log_every=5"))
    rt = Runtime(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")
    trainer = Trainer(cfg, rt, Path(out))
    counts: collections.Counter[str] = collections.Counter()
    originals = {n: getattr(dist, n) for n in COLLECTIVES}

    def counting(name: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if sys._getframe(1).f_code.co_filename == TRAINER_FILE:
                counts[name] += 1
            return originals[name](*args, **kwargs)

        return wrapper

    try:
        for n in COLLECTIVES:
            setattr(dist, n, counting(n))
        trainer.fit()
    finally:
        for n in COLLECTIVES:
            setattr(dist, n, originals[n])
    return dict(counts)


def test_the_loss_is_read_back_with_one_all_gather_per_log_step_as_the_readme_says(
    tmp_path: Path,
) -> None:
    """Reproduced: the README said the loss read back at a log step is averaged over the ranks
    with one all-reduce; it is one all-gather (``mean_over_ranks``: summed in rank order)."""
    results = run_on_ranks(_fit_collectives, 2, str(tmp_path), timeout_s=180, backend="gloo")
    # steps 5 and 10, none from the training steps; at the end rank 0's training figures
    assert results == [{"all_gather": 2, "broadcast_object_list": 1}] * 2
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (
        "the loss is read back every `trainer.log_every` steps, averaged over the ranks there "
        "(one all-gather, summed in rank order: `train/loss` is the global batch's at any world "
        "size)"
    ) in readme
