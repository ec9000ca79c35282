"""DCP checkpoints resume at another world size with the training of an uninterrupted run.

Every world size sees the same global batches (rank ``r`` gets slice ``r`` of each), so a run of
``G`` ranks saved at step 4 and resumed at ``G'`` ranks must end at step 8 with the weights of
the uninterrupted ``G``-rank run, to fp32 round-off (the sharded kernels sum in other orders).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor

from dmt import checkpoint
from dmt.data import build_data
from dmt.models import build_model
from dmt.runtime import Runtime
from dmt.sharding import COLUMN_SPLIT_TYPES, memory_budget, plan_tables
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer, TrainTask
from tests.distributed.distributed_harness import backends, run_on_ranks

BASE = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=4096",
    "data.synthetic.num_val=256",
    "data.synthetic.num_test=256",
    "data.batch_size=256",
    "trainer.max_steps=8",
    "trainer.eval_max_batches=1",
]
FLAT = ["model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]"]
SPTT = [
    "experiment=dmt_4t_dlrm",
    "model.partition.num_towers=2",
    "sptt=on",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
]


def _train(
    rank: int, world_size: int, overrides: list[str], out: str, local_world_size: int, backend: str
) -> tuple[float, list[float]]:
    cfg = to_config(compose_config(*BASE, *overrides))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    rt = Runtime(rank, world_size, rank % local_world_size, local_world_size, device, backend)
    result = Trainer(cfg, rt, Path(out)).fit(keep_losses=True)
    return result.metrics["num_steps"], result.losses


def _run(
    world_size: int,
    overrides: list[str],
    out: Path,
    local_world_size: int | None = None,
    backend: str = "gloo",
) -> list[list[float]]:
    """Train on ``world_size`` ranks; every rank's logged losses (those of the global batch)."""
    results = run_on_ranks(
        _train,
        world_size,
        overrides,
        str(out),
        local_world_size or world_size,
        backend,
        timeout_s=240,
        backend=backend,
    )
    assert [steps for steps, _ in results] == [8.0] * world_size
    return [losses for _, losses in results]


def _same_fused_step(want: Path, got: Path, counts: bool = True) -> None:
    """Both final checkpoints carry FBGEMM's fused-optimizer step (Adam's bias correction on
    GPUs), equal after the resume; row-wise Adagrad's kernels count it on CPU too (exact
    Adagrad's do not: 0)."""
    step = checkpoint.read_meta(want)["fused_optimizer_step"]
    assert checkpoint.read_meta(got)["fused_optimizer_step"] == step
    assert step >= 8 if counts else step == 0


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("backend", backends(min_gpus=4))
# CI time (2 cores): the resume at 4 ranks (9 s) runs with -m slow; SPTT's resumes grow to 4
@pytest.mark.parametrize("resume_world", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_flat_resume_at_another_world_size_matches_uninterrupted(
    tmp_path: Path, resume_world: int, backend: str
) -> None:
    ref = tmp_path / "ref"
    # the reference writes asynchronously (DCP async_save), the resumed run synchronously
    ref_losses = _run(
        2,
        [*FLAT, "trainer.checkpoint_every=4", "trainer.checkpoint_async=true"],
        ref,
        backend=backend,
    )
    resumed = tmp_path / f"resumed_{resume_world}"
    resumed_losses = _run(
        resume_world,
        [*FLAT, "trainer.checkpoint=true", f"trainer.resume_from={ref / 'checkpoints' / 'step_4'}"],
        resumed,
        backend=backend,
    )
    want = checkpoint.load_model_state(ref / "checkpoints" / "step_8")
    got = checkpoint.load_model_state(resumed / "checkpoints")
    assert checkpoint.read_meta(resumed / "checkpoints" / "step_8")["world_size"] == resume_world
    assert _max_diff(got, want) < 1e-5
    # every rank logs the loss of the global batch, whatever the world size (a reproduced bug:
    # each logged its own share's)
    assert len(ref_losses[0]) == 8 and ref_losses[1] == ref_losses[0]
    for losses in resumed_losses:
        torch.testing.assert_close(losses, ref_losses[0][4:], rtol=0, atol=1e-5)
    _same_fused_step(ref / "checkpoints" / "step_8", resumed / "checkpoints" / "step_8")
    # the checkpoint at step 4 differs from the final one: the resumed run did train
    assert _max_diff(checkpoint.load_model_state(ref / "checkpoints" / "step_4"), want) > 1e-3


@pytest.mark.parametrize("backend", backends(min_gpus=4))
@pytest.mark.parametrize(
    ("resume_world", "resume_local", "sharding", "ema"),
    [
        (4, 2, "table_wise", False),
        (4, 2, "row_wise", False),
        # CI time (2 cores): column-wise (6 s; its blocks are resharded as in the flat
        # column-wise resume of the suite) runs with -m slow
        pytest.param(4, 2, "column_wise", False, marks=pytest.mark.slow),
        # CI time: the moving average through an SPTT resume (13 s) runs with -m slow; the
        # suite resumes it in one process (tests/integration/test_train_ema.py)
        pytest.param(4, 2, "table_wise", True, marks=pytest.mark.slow),
    ],
)
def test_sptt_resume_on_another_topology_matches_uninterrupted(
    tmp_path: Path, resume_world: int, resume_local: int, sharding: str, ema: bool, backend: str
) -> None:
    """Two towers: G=2 (one rank per tower) resumed at G=4 (two ranks per tower, tables split).
    With ``ema``, the moving average of the tower modules and dense arch (what
    ``load_model_state`` gives) continues too."""
    ref = tmp_path / "ref"
    sptt = [*SPTT, f"sptt.sharding_type={sharding}"]
    if ema:
        sptt.append("trainer.ema_decay=0.5")
    if sharding == "column_wise":
        # 1 -> 2 column blocks per table: Adagrad's (rows, cols) state reshards like the table
        # (row-wise Adagrad keeps one state per block, see the next test)
        sptt.append("optim.sparse._target_=torch.optim.Adagrad")
    _run(2, [*sptt, "sptt.local_world_size=1", "trainer.checkpoint_every=4"], ref, backend=backend)
    resumed = tmp_path / "resumed"
    _run(
        resume_world,
        [
            *sptt,
            f"sptt.local_world_size={resume_local}",
            "trainer.checkpoint=true",
            f"trainer.resume_from={ref / 'checkpoints'}/step_4",
        ],
        resumed,
        backend=backend,
    )
    want = checkpoint.load_model_state(ref / "checkpoints" / "step_8")
    got = checkpoint.load_model_state(resumed / "checkpoints")
    assert _max_diff(got, want) < 1e-5
    assert _max_diff(checkpoint.load_model_state(ref / "checkpoints" / "step_4"), want) > 1e-3
    _same_fused_step(
        ref / "checkpoints" / "step_8",
        resumed / "checkpoints" / "step_8",
        counts=sharding != "column_wise",
    )
    if ema:  # the averages are not the raw weights
        raw = checkpoint.load_model_state(resumed / "checkpoints", ema=False)
        assert _max_diff(raw, got) > 1e-4


@pytest.mark.parametrize("sptt", [True, False])
def test_resume_with_a_rank_that_holds_no_optimizer_state(tmp_path: Path, sptt: bool) -> None:
    """One table on two ranks and plain SGD on the dense part: rank 1 holds no table shard and
    its dense optimizer no state, so it has no optimizer state to load. It resumes all the same,
    and the run ends where the uninterrupted one does (before, DCP took its empty state for a
    saved key: "Missing key in checkpoint state_dict: optim")."""
    one_table = [
        *(SPTT if sptt else FLAT),
        "data.synthetic.num_sparse=1",
        "data.synthetic.num_groups=1",
        "optim.dense._target_=torch.optim.SGD",
        "~optim.dense.eps",
    ]
    if sptt:  # one tower of two ranks
        one_table = [*one_table, "model.partition.num_towers=1", "sptt.local_world_size=2"]
    ref = tmp_path / "ref"
    _run(2, [*one_table, "trainer.checkpoint_every=4"], ref)
    resumed = tmp_path / "resumed"
    _run(
        2,
        [
            *one_table,
            "trainer.checkpoint=true",
            f"trainer.resume_from={ref / 'checkpoints' / 'step_4'}",
        ],
        resumed,
    )
    want = checkpoint.load_model_state(ref / "checkpoints" / "step_8")
    assert _max_diff(checkpoint.load_model_state(resumed / "checkpoints"), want) < 1e-5
    assert _max_diff(checkpoint.load_model_state(ref / "checkpoints" / "step_4"), want) > 1e-3


# 3 ranks: gloo's all-reduce adds an element's 3 values in an order set by its offset in the
# tensor (2 values add alike in either order); the batch splits into 3
THREE = [*FLAT, "data.batch_size=258"]


def test_three_ranks_log_a_steps_loss_whatever_the_losses_read_back_with_it(
    tmp_path: Path,
) -> None:
    """A reproduced bug: the losses of the steps since the last log step were all-reduced as one
    tensor, so at 3 ranks a step's logged loss depended on its place among them: on
    ``trainer.log_every`` (step 8 here, 1 ulp apart) and, after a resume, on where the resume
    started (the reviewer's 1 ulp at G = 3). Every rank's losses are now summed in rank order."""
    each = _run(3, [*THREE, "trainer.log_every=1"], tmp_path / "each")
    together = _run(3, THREE, tmp_path / "together")  # all 8 read back at the end
    assert together == each
    assert len(each[0]) == 8 and each[1] == each[2] == each[0]


@pytest.mark.slow  # CI time: two 3-rank runs (15-20 s on 2 shared cores); it pins a bound
def test_a_mid_epoch_resume_at_three_ranks_differs_only_by_ddps_first_all_reduces(
    tmp_path: Path,
) -> None:
    """A resume restores every state exactly, yet at 3+ ranks (not 1 or 2) it is not bit for bit
    the uninterrupted run: DDP all-reduces the dense gradients of a process's first steps (1; 2
    under TorchRec's ``static_graph=True``, the flat runs') in its initial bucket layout
    (parameters in registration order) and later steps in the layout it rebuilds from the first
    backward's gradient order, and gloo's all-reduce of 3 ranks adds each element's values in an
    order set by its offset in the bucket. So the resumed step 5 (step 1 of its process) has the
    loss and the tables of the uninterrupted run's step 5 bit for bit, and dense weights within
    1e-8 or 2 ulp of each weight (3e-6 of Adam's learning rate, 0.003; measured: 3.7e-9 with
    torch's looping Adam, 1.5e-8 = 1 ulp of a weight of 0.127 with the fused one, the default
    since optim.dense_fused); the steps after drift at fp32 round-off (1.2e-7 at step 8). Two uninterrupted runs are bit-identical, and with DDP's
    rebuild off (``find_unused_parameters=True``) the resume is too, flat and SPTT: DDP has no
    public way to start in the rebuilt layout."""
    ref = tmp_path / "ref"
    ref_losses = _run(3, [*THREE, "trainer.checkpoint_every=1"], ref)
    ckpt = ref / "checkpoints"
    resumed = tmp_path / "resumed"
    resume = [*THREE, "trainer.checkpoint_every=1", f"trainer.resume_from={ckpt / 'step_4'}"]
    resumed_losses = _run(3, resume, resumed)
    for losses in resumed_losses:  # 15 steps per epoch: mid-epoch
        assert losses[0] == ref_losses[0][4]  # the loss of the restored weights
        torch.testing.assert_close(losses, ref_losses[0][4:], rtol=1e-6, atol=0)
    want = checkpoint.load_model_state(ckpt / "step_5")
    got = checkpoint.load_model_state(resumed / "checkpoints" / "step_5")
    assert sorted(got) == sorted(want)
    for k in want:
        if ".embedding_bags." in k:  # their updates saw no DDP all-reduce
            assert torch.equal(got[k], want[k]), k
        else:
            torch.testing.assert_close(got[k], want[k], rtol=2.4e-7, atol=1e-8, msg=k)
    step_8 = checkpoint.load_model_state(resumed / "checkpoints" / "step_8")
    assert _max_diff(step_8, checkpoint.load_model_state(ckpt / "step_8")) < 1e-6


def test_sptt_rowwise_state_of_column_blocks_needs_the_same_split(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    sptt = [*SPTT, "sptt.sharding_type=column_wise"]  # row-wise Adagrad: state per column block
    _run(2, [*sptt, "sptt.local_world_size=1", "trainer.checkpoint_every=4"], ref)
    with pytest.raises(Exception) as e:
        _run(
            4,
            [
                *sptt,
                "sptt.local_world_size=2",
                "trainer.checkpoint=true",
                f"trainer.resume_from={ref / 'checkpoints'}/step_4",
            ],
            tmp_path / "resumed",
        )
    assert "(row-wise optimizer state of a column-wise table) was saved for column blocks " in str(
        e.value
    )
    assert "resume with the same sptt.sharding_type and ranks per tower" in str(e.value)


# 26 tables of 100 rows x 256 columns: TorchRec's planner splits two of them column-wise (2
# blocks of 128) at 4 ranks of 2 per host, and none at 2 ranks
WIDE = ["model.embedding_dim=256", "model.bottom_mlp=[16,256]", "model.top_mlp=[16,1]"]


def _column_split(world_size: int, local_world_size: int) -> list[str]:
    """The tables the planner alone splits column-wise for ``WIDE`` at this world size."""
    cfg = to_config(compose_config(*BASE, *WIDE))
    data = build_data(cfg.data, rank=0, world_size=1, seed=0)
    model = build_model(
        cfg.model,
        feature_names=data.feature_names,
        cardinalities=data.cardinalities,
        num_dense=data.num_dense,
        table_device="meta",
        dense_device="cpu",
    )
    plan = plan_tables(
        TrainTask(model),
        memory_budget(cfg.sharding, "cpu"),
        world_size=world_size,
        local_world_size=local_world_size,
        batch_size=cfg.data.batch_size,
    )
    return sorted(
        table
        for tables in plan.plan.values()
        for table, option in tables.items()  # type: ignore[attr-defined]
        if option.sharding_type in COLUMN_SPLIT_TYPES
    )


@pytest.mark.parametrize(
    ("save", "resume"),
    # CI time (2 cores): saving at 2 ranks and resuming at 4 (14 s), and at 4 resuming at 2
    # (12 s), run with -m slow; the suite keeps 4 resuming at 1
    [
        pytest.param((4, 2), (2, 2), marks=pytest.mark.slow),
        pytest.param((2, 2), (4, 2), marks=pytest.mark.slow),
        ((4, 2), (1, 1)),
    ],
)
def test_flat_resume_keeps_the_column_blocks_of_row_wise_state(
    tmp_path: Path, save: tuple[int, int], resume: tuple[int, int]
) -> None:
    """Row-wise Adagrad keeps one state per row and column block of a table TorchRec split
    column-wise: ``rows x 2`` values for the two tables split at 4 ranks, ``rows`` otherwise,
    which DCP cannot reshard into each other. The resumed run keeps the saved blocks whatever
    its planner alone would choose, and ends where the uninterrupted run does."""
    saved_split, resume_split = _column_split(*save), _column_split(*resume)
    assert len(saved_split + resume_split) == 2 and saved_split != resume_split  # the planted case
    ref = tmp_path / "ref"
    _run(save[0], [*WIDE, "trainer.checkpoint_every=4"], ref, local_world_size=save[1])
    blocks = checkpoint.row_wise_state_blocks(ref / "checkpoints" / "step_4")
    assert len(blocks) == 26
    assert sorted(t for t, k in blocks.items() if k > 1) == saved_split
    assert all(k == 2 for t, k in blocks.items() if t in saved_split)
    resumed = tmp_path / "resumed"
    _run(
        resume[0],
        [*WIDE, "trainer.checkpoint=true", f"trainer.resume_from={ref / 'checkpoints' / 'step_4'}"],
        resumed,
        local_world_size=resume[1],
    )
    assert checkpoint.row_wise_state_blocks(resumed / "checkpoints" / "step_8") == blocks
    want = checkpoint.load_model_state(ref / "checkpoints" / "step_8")
    assert _max_diff(checkpoint.load_model_state(resumed / "checkpoints"), want) < 1e-5


def _resume_missing(rank: int, world_size: int, out: str) -> str:
    cfg = to_config(compose_config(*BASE, *FLAT, f"trainer.resume_from={out}/nowhere"))
    rt = Runtime(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")
    try:
        Trainer(cfg, rt, Path(out)).fit()
    except ValueError as e:
        return str(e)
    return "no error"


def test_a_bad_resume_path_fails_every_rank_with_rank_0s_message(tmp_path: Path) -> None:
    messages = run_on_ranks(_resume_missing, 2, str(tmp_path), timeout_s=120)
    assert messages[0] == messages[1]
    assert messages[0] == (
        f"trainer.resume_from={str(tmp_path / 'nowhere')!r}: no complete checkpoint "
        "(step_N/meta.json) there"
    )


def _trained_with_inf_on_rank_1(
    rank: int, world_size: int, out: str
) -> tuple[Trainer, Runtime, list[str], str | None]:
    """Train 8 steps (checkpoints at 4 and 8), remove step_8, then put inf in one of rank 1's
    table shards only: the trainer, its runtime, its overrides and the key rank 1 poisoned."""
    args = [*BASE, *FLAT, "trainer.checkpoint_every=4"]
    rt = Runtime(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")
    trainer = Trainer(to_config(compose_config(*args)), rt, Path(out))
    trainer.fit()
    if rank == 0:
        shutil.rmtree(Path(out) / "checkpoints" / "step_8")
    dist.barrier()
    poisoned = None
    if rank == 1:
        state = checkpoint.checkpoint_state(trainer.model, trainer.optimizer, rank=rank)
        poisoned, table = next(
            (k, v)
            for k, v in checkpoint.flatten_keys(state).items()
            if isinstance(v, ShardedTensor) and k.startswith("model.") and v.local_shards()
        )
        with torch.no_grad():
            table.local_shards()[0].tensor.view(-1)[0] = math.inf
    return trainer, rt, args, poisoned


def _resume_nan_on_rank_1(rank: int, world_size: int, out: str) -> tuple[str, str | None]:
    """Train 8 steps, save step_8 again with a NaN in one of rank 1's table shards only, then
    resume it: every rank's error (and the key rank 1 poisoned)."""
    trainer, rt, args, poisoned = _trained_with_inf_on_rank_1(rank, world_size, out)
    trainer.save(0, 8)
    resume = to_config(compose_config(*args, "trainer.resume_from=auto"))
    try:
        Trainer(resume, rt, Path(out)).fit()
    except ValueError as e:
        return str(e), poisoned
    return "no error", poisoned


def test_a_value_that_is_not_finite_in_one_ranks_shard_fails_every_rank_alike(
    tmp_path: Path,
) -> None:
    """Resuming a checkpoint that holds inf in a table shard only rank 1 loads: rank 0, whose
    tensors are finite, raises rank 1's error too (a rank that trained on would wait for its
    peer in its first collective)."""
    (m0, _), (m1, key) = run_on_ranks(_resume_nan_on_rank_1, 2, str(tmp_path), timeout_s=180)
    assert key is not None and m0 == m1
    assert m0.startswith(
        f"checkpoint {tmp_path / 'checkpoints' / 'step_8'} (step 8) holds values that are not "
        f"finite (NaN or inf), first in {key}: the run that saved it had diverged"
    )
    assert f"trainer.resume_from={str(tmp_path / 'checkpoints' / 'step_4')!r}" in m0


def _save_with_nan_on_rank_1(rank: int, world_size: int, out: str) -> tuple[bool, str | None]:
    """Train 8 steps, then ask for step_8 again with inf in one of rank 1's table shards only:
    whether step_8 is there afterwards, and the key rank 1 poisoned."""
    trainer, _, _, poisoned = _trained_with_inf_on_rank_1(rank, world_size, out)
    assert trainer.save_unless_diverged(0, 8) is None
    dist.barrier()
    return (Path(out) / "checkpoints" / "step_8").exists(), poisoned


@pytest.mark.slow  # 2 ranks; the load side's one-rank case stays in the suite (same check)
def test_a_diverged_state_in_one_ranks_shard_is_not_saved_by_any_rank(tmp_path: Path) -> None:
    """A value that is not finite in a table shard only rank 1 holds: no rank writes the
    checkpoint (rank 0, whose tensors are finite, would otherwise wait in DCP's save for its
    peer), and no directory of it is left."""
    (there0, _), (there1, key) = run_on_ranks(
        _save_with_nan_on_rank_1, 2, str(tmp_path), timeout_s=180
    )
    assert key is not None and not there0 and not there1
    assert [p.name for _, p in checkpoint.step_dirs(tmp_path / "checkpoints")] == ["step_4"]
