"""A world of one trains its dense part without DDP (``dmt.sharding.WorldOfOneWrapper``), and the
same as TorchRec's DDP-wrapped default: equal names, equal weights after training."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel
from torchrec import KeyedJaggedTensor
from torchrec.distributed.model_parallel import (
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dmt.models import build_model, embedding_parameters
from dmt.optim import apply_sparse_optimizer
from dmt.runtime import close_runtime, init_runtime
from dmt.sharding import (
    WorldOfOneWrapper,
    data_parallel_wrapper,
    flat_sharders,
    shard_model,
)
from tests.conftest import typed_config

NAMES = [f"cat_{i}" for i in range(4)]


def _model():
    cfg = typed_config("logger=disabled", "model.embedding_dim=8", "model.bottom_mlp=[16,8]")
    torch.manual_seed(0)
    model = build_model(
        cfg.model,
        feature_names=NAMES,
        cardinalities=[50] * len(NAMES),
        num_dense=13,
        table_device="meta",
        dense_device=torch.device("cpu"),
    )
    apply_sparse_optimizer(embedding_parameters(model), cfg.optim)
    return model


def _train(dmp: DistributedModelParallel, steps: int = 3) -> dict[str, torch.Tensor]:
    dense = torch.optim.Adagrad(
        [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())], lr=0.1
    )
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        B = 16
        kjt = KeyedJaggedTensor(
            keys=NAMES,
            values=torch.randint(0, 50, (B * len(NAMES),), generator=g),
            lengths=torch.ones(B * len(NAMES), dtype=torch.int32),
        )
        dense.zero_grad()
        dmp(torch.randn(B, 13, generator=g), kjt).square().mean().backward()
        dense.step()
    out = {}
    for k, v in dmp.state_dict().items():
        out[k] = v.local_shards()[0].tensor.clone() if hasattr(v, "local_shards") else v.clone()
    return out


def test_a_world_of_one_trains_without_ddp_as_ddp_does(one_thread):
    assert isinstance(data_parallel_wrapper(1), WorldOfOneWrapper)
    assert isinstance(data_parallel_wrapper(2), DefaultDataParallelWrapper)
    rt = init_runtime("cpu")
    try:
        plain = shard_model(_model(), rt, batch_size=16)
        assert not any(isinstance(m, DistributedDataParallel) for m in plain.modules())
        ddp = DistributedModelParallel(
            _model(),
            device=rt.device,
            plan=plain.plan,
            sharders=flat_sharders("fp32"),
            data_parallel_wrapper=DefaultDataParallelWrapper(),
        )
        assert any(isinstance(m, DistributedDataParallel) for m in ddp.modules())
        assert [n for n, _ in plain.named_parameters()] == [n for n, _ in ddp.named_parameters()]
        trained, reference = _train(plain), _train(ddp)
        assert trained.keys() == reference.keys()
        for k in reference:
            torch.testing.assert_close(trained[k], reference[k], rtol=0, atol=0, msg=k)
        # and training moved them, the dense part (the one the wrapper changes) included: the
        # comparison is not of two untouched models
        untouched = _train(shard_model(_model(), rt, batch_size=16), steps=0)
        still = {k for k in trained if torch.equal(untouched[k], trained[k])}
        dense = {k for k in trained if "embedding_bags" not in k}
        assert dense and len(dense) < len(trained)
        assert not still, f"training left {sorted(still)} untouched"
    finally:
        close_runtime()
