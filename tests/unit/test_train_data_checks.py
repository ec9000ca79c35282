"""Training data that holds no full global batch stops before training, naming the setting."""

from __future__ import annotations

import pytest

from dmt.config import DataConfig, SyntheticConfig
from dmt.data import build_data, check_train_rows


def synthetic(num_train: int, batch_size: int) -> DataConfig:
    return DataConfig(
        batch_size=batch_size,
        eval_batch_size=64,
        synthetic=SyntheticConfig(num_train=num_train, num_val=64, num_test=64),
    )


def test_fewer_synthetic_rows_than_one_batch() -> None:
    """Bug: ``data.synthetic.num_train`` below ``data.batch_size`` died in the trainer with a
    ZeroDivisionError (no training step, ``divmod(step, 0)``)."""
    with pytest.raises(ValueError) as err:
        build_data(synthetic(100, 512))
    assert str(err.value) == (
        "data.synthetic.num_train=100 is smaller than one batch (data.batch_size=512): training "
        "drops the last partial batch, so it would run no step; provide at least "
        "data.batch_size training rows or lower data.batch_size"
    )
    with pytest.raises(ValueError, match=r"^data.synthetic.num_train=0 holds no training rows "):
        build_data(synthetic(0, 512))


def test_the_batch_is_global_over_ranks() -> None:
    # 600 rows, global batch 512: one step on every rank (256 rows each), whatever the world size
    for world_size in (1, 2, 4):
        for rank in range(world_size):
            data = build_data(synthetic(600, 512), rank=rank, world_size=world_size)
            assert data.train.num_batches() == 1
            (batch,) = data.train.batches(0)
            assert batch.labels.numel() == 512 // world_size
    # 300 rows would be more than a rank's share (256) but are less than the global batch
    with pytest.raises(ValueError, match=r"num_train=300 is smaller than one batch \(data."
                       r"batch_size=512, the global batch over 2 ranks\)"):  # fmt: skip
        build_data(synthetic(300, 512), rank=1, world_size=2)
    check_train_rows(512, 512, what="exactly one batch")  # enough
