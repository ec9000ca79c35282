"""Why ``optim.sparse.weight_decay`` is refused on CPU: FBGEMM's CPU row-wise Adagrad kernel
(fused by TorchRec into the backward) leaves a row's update unchanged by the weight decay, in
every mode. A canary: when FBGEMM starts applying it, this fails and the guard in
``dmt.optim.check_sparse_weight_decay`` can go."""

from __future__ import annotations

import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from dmt.config import OptimConfig
from dmt.optim import apply_sparse_optimizer
from dmt.runtime import close_runtime, init_runtime
from dmt.sharding import shard_model

LR, EPS, DECAY, STEPS = 0.5, 1e-8, 0.3, 2
W0 = torch.arange(16, dtype=torch.float32).view(4, 4) / 10 + 0.1  # 4 rows of dim 4
C = torch.tensor([1.0, -2.0, 0.5, 3.0])  # the gradient of row 1 at every step


class _Table(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        table = EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=4, feature_names=["f"])
        self.ebc = EmbeddingBagCollection(tables=[table], device=torch.device("meta"))

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return (self.ebc(kjt)["f"] * C).sum()  # d loss / d row = C


def _rowwise_adagrad(decay: float, mode: str) -> torch.Tensor:
    """Row 1 after ``STEPS`` hand-computed row-wise Adagrad steps: L2 adds ``decay * w`` to the
    gradient; decouple subtracts ``lr * decay * w`` from the weight."""
    w, state = W0[1].clone(), torch.zeros(())
    for _ in range(STEPS):
        g = C + decay * w if mode == "l2" else C
        state = state + (g * g).mean()
        w = w - LR * g / (state.sqrt() + EPS) - (LR * decay * w if mode == "decouple" else 0)
    return w


def _fused_update(decay: float, mode: WeightDecayMode, max_norm: float = 0.0) -> torch.Tensor:
    rt = init_runtime("cpu")
    try:
        module = _Table()
        sparse = {"_target_": "torchrec.optim.RowWiseAdagrad", "_partial_": True, "lr": LR,
                  "eps": EPS, "weight_decay": decay, "weight_decay_mode": mode,
                  "max_norm": max_norm}  # fmt: skip
        apply_sparse_optimizer(list(module.ebc.parameters()), OptimConfig(sparse=sparse))
        model = shard_model(module, rt, batch_size=1)
        weight = model.state_dict()["ebc.embedding_bags.t.weight"].local_shards()[0].tensor
        weight.copy_(W0)
        kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1]), lengths=torch.tensor([1]))
        for _ in range(STEPS):
            model.fused_optimizer.zero_grad()
            model(kjt).backward()  # the fused kernel updates row 1 here
        assert torch.equal(weight[[0, 2, 3]], W0[[0, 2, 3]])  # untouched rows stay
        return weight[1].clone()
    finally:
        close_runtime()


@pytest.mark.parametrize("mode", ["l2", "decouple"])
def test_cpu_rowwise_adagrad_ignores_weight_decay(mode):
    without = _rowwise_adagrad(0.0, mode)
    with_decay = _rowwise_adagrad(DECAY, mode)
    assert (with_decay - without).abs().max() > 0.05  # what the decay would change
    fused = _fused_update(DECAY, WeightDecayMode[mode.upper()])
    torch.testing.assert_close(fused, without, rtol=1e-6, atol=1e-6)


def test_cpu_rowwise_adagrad_ignores_max_norm():
    """FBGEMM clips an updated row to ``max_norm`` in its CUDA kernel only: on CPU the row keeps
    the plain update, its norm far above the bound (``dmt.optim.check_sparse_optimizer``
    refuses ``optim.sparse.max_norm`` there)."""
    fused = _fused_update(0.0, WeightDecayMode.NONE, max_norm=0.05)
    torch.testing.assert_close(fused, _rowwise_adagrad(0.0, "l2"), rtol=1e-6, atol=1e-6)
    assert float(fused.norm()) > 1.0
