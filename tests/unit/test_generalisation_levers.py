"""The generalisation levers set from the command line, and the guard on a sparse weight decay
that FBGEMM's kernels would ignore (its CPU kernels: tests/integration/test_sparse_weight_decay.py)."""

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode
from torch import nn

from dmt.optim import (
    LRSchedule,
    check_sparse_optimizer,
    dense_optimizer,
    sparse_optimizer_spec,
)
from tests.conftest import typed_config


def test_every_lever_is_a_command_line_override():
    """Dropout, EMA, missing id, threshold, hashing, embedding dim, dense weight decay (AdamW)
    and the LR schedule: overrides of existing settings, no code."""
    cfg = typed_config(
        "data=criteo_sample",
        "data.criteo.frequency_threshold=5",
        "data.criteo.missing_id=distinct",
        "model.embedding_dim=32",
        "model.bottom_mlp=[64,32]",
        "model.dropout=0.2",
        "trainer.ema_decay=0.99",
        "optim.dense._target_=torch.optim.AdamW",
        "optim.dense.weight_decay=0.01",
        "optim.schedule.warmup_steps=10",
        "optim.schedule.decay=cosine",
    )
    assert cfg.data.criteo is not None
    assert (cfg.data.criteo.frequency_threshold, cfg.data.criteo.missing_id) == (5, "distinct")
    assert cfg.data.criteo.preprocessed_dir.endswith("_t5")  # one directory per threshold
    assert (cfg.model.embedding_dim, cfg.model.dropout, cfg.trainer.ema_decay) == (32, 0.2, 0.99)
    opt = dense_optimizer([nn.Parameter(torch.zeros(2))], cfg.optim)
    assert type(opt) is torch.optim.AdamW and opt.param_groups[0]["weight_decay"] == 0.01
    assert cfg.optim.schedule["decay"] == "cosine" and cfg.optim.schedule["warmup_steps"] == 10
    assert LRSchedule(100, warmup_steps=10, decay="cosine")(55) == pytest.approx(0.5)
    hashed = typed_config(
        "data=criteo_sample", "data.criteo.categorical_mode=hash", "data.criteo.hash_sizes=[1000]"
    )
    assert hashed.data.criteo is not None and hashed.data.criteo.table_hash_sizes() == [1000] * 26


def test_sparse_weight_decay_is_refused_where_the_kernels_ignore_it():
    cfg = typed_config("+optim.sparse.weight_decay=0.01").optim
    with pytest.raises(
        ValueError,
        match=r"optim.sparse.weight_decay=0.01 would do nothing: FBGEMM's CPU embedding kernels "
        r"ignore weight decay",
    ):
        check_sparse_optimizer(cfg, "cpu")
    with pytest.raises(ValueError, match=r"needs \+optim.sparse.weight_decay_mode=l2 or decouple"):
        check_sparse_optimizer(cfg, "cuda")
    with_mode = typed_config(
        "+optim.sparse.weight_decay=0.01", "+optim.sparse.weight_decay_mode=l2"
    ).optim
    check_sparse_optimizer(with_mode, "cuda")
    _, kwargs = sparse_optimizer_spec(with_mode)
    assert kwargs["weight_decay_mode"] is WeightDecayMode.L2 and kwargs["weight_decay"] == 0.01
    check_sparse_optimizer(typed_config("+optim.sparse.weight_decay=0.0").optim, "cpu")  # off
    with pytest.raises(ValueError, match=r"weight_decay_mode='lasso' is not one of \['none'"):
        typed_config("+optim.sparse.weight_decay_mode=lasso")  # checked with the config
