"""DMT models (issue 4): semantics preservation of pass-through towers, shapes, accounting, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchrec import KeyedJaggedTensor

from dmt.config import (
    CrossInteractionConfig,
    DCNTowerConfig,
    DLRMTowerConfig,
    DotInteractionConfig,
    ModelConfig,
    PartitionConfig,
)
from dmt.models import (
    CrossInteraction,
    DMTModel,
    DotInteraction,
    TowerModule,
    build_dmt_model,
    build_model,
    copy_base_weights,
    embedding_parameters,
    naive_partition,
    resolve_partition,
)
from dmt.models.accounting import (
    compression_ratio,
    count_parameters,
    dense_flops,
    model_stats,
)

NAMES = [f"cat_{i}" for i in range(6)]
CARDS = [7, 11, 3, 20, 5, 9]
NUM_DENSE = 3
GROUPINGS = {
    "per_feature": [[f] for f in NAMES],
    "grouped": [["cat_4", "cat_1"], ["cat_5"], ["cat_0", "cat_3", "cat_2"]],
}


def kjt(batch: int, multi_hot: int = 2, seed: int = 0) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.cat([torch.randint(0, c, (batch * multi_hot,), generator=g) for c in CARDS])
    lengths = torch.full((len(NAMES) * batch,), multi_hot, dtype=torch.int32)
    return KeyedJaggedTensor(keys=NAMES, values=values, lengths=lengths)


INTERACTIONS = {  # what conf/model/{dlrm,dcn}.yaml set
    "dlrm": DotInteractionConfig(),
    "dcn": CrossInteractionConfig(num_layers=2, low_rank=4),
}
TOWERS = {"dlrm": DLRMTowerConfig, "dcn": DCNTowerConfig}


def model_cfg(name: str, **changes) -> ModelConfig:
    cfg = ModelConfig(
        name=name,
        interaction=INTERACTIONS[name],
        embedding_dim=8,
        bottom_mlp=[16, 8],
        top_mlp=[12, 1],
        dcn_num_layers=2,
        dcn_low_rank=4,
    )
    for k, v in changes.items():
        setattr(cfg, k, v)
    return cfg


def build(cfg: ModelConfig, partition=None):
    if partition is None:
        return build_model(cfg, feature_names=NAMES, cardinalities=CARDS, num_dense=NUM_DENSE)
    return build_dmt_model(
        cfg, partition, feature_names=NAMES, cardinalities=CARDS, num_dense=NUM_DENSE
    )


def gradients(model) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, tower prefixes dropped (``towers.2.embedding_bag_collection...``
    reads like the base model's ``embedding_bag_collection...``)."""
    out = {}
    for name, p in model.named_parameters():
        if name.startswith("towers."):
            name = name.split(".", 2)[2]
        assert p.grad is not None, name
        out[name] = p.grad
    return out


@pytest.mark.parametrize("grouping", sorted(GROUPINGS))
@pytest.mark.parametrize("name,cls", [("dlrm", DotInteraction), ("dcn", CrossInteraction)])
def test_passthrough_towers_compute_exactly_the_base_model(name, cls, grouping):
    torch.manual_seed(0)
    base = build(model_cfg(name))
    for p in embedding_parameters(base):  # default tables are tiny near-zero; make them matter
        torch.nn.init.normal_(p)
    torch.manual_seed(1)  # different init, so only copy_base_weights can make them agree
    dmt = build(model_cfg(name), GROUPINGS[grouping])
    assert isinstance(dmt, DMTModel) and isinstance(dmt.interaction, cls)
    copy_base_weights(dmt, base)
    dense, sparse = torch.randn(5, NUM_DENSE), kjt(5)

    out_base, out_dmt = base(dense, sparse), dmt(dense, sparse)
    torch.testing.assert_close(out_dmt, out_base)
    (out_base * torch.arange(5.0)).sum().backward()
    (out_dmt * torch.arange(5.0)).sum().backward()
    base_grads, dmt_grads = gradients(base), gradients(dmt)
    assert sorted(dmt_grads) == sorted(base_grads)
    for k, g in base_grads.items():
        torch.testing.assert_close(dmt_grads[k], g, msg=lambda m, k=k: f"{k}: {m}")
        assert g.abs().sum() > 0, k

    # dense_forward (what accounting counts) agrees too, and so do the counts.
    torch.testing.assert_close(dmt.dense_forward(dense, base.pooled_embeddings(sparse)), out_base)
    assert model_stats(dmt).train_mflops_per_sample == model_stats(base).train_mflops_per_sample
    assert model_stats(dmt).num_parameters == model_stats(base).num_parameters
    assert compression_ratio(dmt) == 1.0


def test_interface_used_by_sptt():
    torch.manual_seed(0)
    cfg = model_cfg("dlrm", bottom_mlp=[16, 4], tower=DLRMTowerConfig(dim=4, c=1, p=1))
    model = build(cfg, GROUPINGS["grouped"])
    assert isinstance(model, DMTModel)
    assert model.feature_names == NAMES and model.partition == GROUPINGS["grouped"]
    dense, sparse = torch.randn(5, NUM_DENSE), kjt(5)
    embs = model.tower_embeddings(sparse)
    outs = model.tower_outputs(sparse)
    for tower, features, e, o in zip(model.towers, model.partition, embs, outs):
        assert tower.feature_names == features
        assert [c.name for c in tower.embedding_bag_collection.embedding_bag_configs()] == [
            f"t_{f}" for f in features
        ]
        assert e.shape == (5, len(features), 8)
        assert o.shape == (5, len(features) + 1, 4)
        torch.testing.assert_close(tower.tower_module(e), o)
    assert model.tower_output_dims == [(3, 4), (2, 4), (4, 4)]
    torch.testing.assert_close(model(dense, sparse), model.interact(dense, outs))
    # The KJT's key order does not matter (towers read their features by name).
    permuted = sparse.permute([5, 3, 1, 0, 2, 4])
    torch.testing.assert_close(model(dense, permuted), model(dense, sparse))


@pytest.mark.parametrize("name", ["dlrm", "dcn"])
@pytest.mark.parametrize("module", ["dlrm", "dcn"])
def test_dmt_models_train_every_parameter(name, module):
    torch.manual_seed(0)
    cfg = model_cfg(name, bottom_mlp=[16, 4], tower=TOWERS[module](dim=4, c=2, p=1))
    model = build(cfg, naive_partition(NAMES, 4))
    out = model(torch.randn(6, NUM_DENSE), kjt(6))
    assert out.shape == (6,)
    out.sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


def test_naive_partition_is_the_papers_strided_assignment():
    names = [f"cat_{i}" for i in range(26)]
    towers = naive_partition(names, 8)
    assert [[int(f[4:]) for f in t] for t in towers] == [
        [0, 8, 16, 24],
        [1, 9, 17, 25],
        [2, 10, 18],
        [3, 11, 19],
        [4, 12, 20],
        [5, 13, 21],
        [6, 14, 22],
        [7, 15, 23],
    ]  # paper §5.2.3
    assert naive_partition(names, 26) == [[f] for f in names]


def test_a_naive_tower_count_out_of_range_names_the_setting():
    with pytest.raises(ValueError) as refused:
        resolve_partition(PartitionConfig(kind="naive", num_towers=27), NAMES)
    assert str(refused.value).startswith("model.partition.num_towers: num_towers=27 must be ")


def test_meta_build_for_accounting_and_tables_on_meta():
    cfg = model_cfg(
        "dcn",
        tower=DCNTowerConfig(dim=4),
        partition=PartitionConfig(kind="naive", num_towers=2),
    )
    model = build_model(
        cfg,
        feature_names=NAMES,
        cardinalities=CARDS,
        num_dense=NUM_DENSE,
        table_device="meta",
        dense_device="cpu",
    )
    assert all(p.is_meta for p in embedding_parameters(model))
    assert not any(p.is_meta for p in model.bottom.parameters())
    assert model_stats(model).compression_ratio == pytest.approx(2.0)


class GatedTowerModule(TowerModule):
    """A user's tower module (by ``_target_``): a learned gate per embedding bag (feature) and an
    embedding of each feature's position added to it, then ``Linear(F_t N -> D)``."""

    def __init__(self, num_features: int, embedding_dim: int, dim: int) -> None:
        super().__init__()
        self.num_features, self.embedding_dim, self.num_vectors, self.dim = (
            num_features,
            embedding_dim,
            1,
            dim,
        )
        self.embedding_bags_gate = nn.Parameter(torch.ones(num_features))
        self.position = nn.Embedding(num_features, embedding_dim)
        self.proj = nn.Linear(num_features * embedding_dim, dim)

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        self._check_input(embs)
        mixed = embs * self.embedding_bags_gate[:, None] + self.position.weight
        return self.proj(mixed.flatten(1))[:, None]


def test_embedding_parameters_are_the_tables_whatever_the_names():
    """Reproduced: parameters were classed by name, so a user tower module's
    ``embedding_bags_gate`` counted as an embedding parameter (dmt-inspect's
    ``num_embedding_parameters``). The tables' parameters (rows x N of every feature) are the
    embedding parameters, in dmt's own models as before and in a user's; the rest is dense."""
    tables = sum(CARDS) * 8
    user = {"_target_": f"{__name__}.GatedTowerModule", "dim": 8}
    models = [build(model_cfg("dlrm")), build(model_cfg("dcn"))]
    for name, tower in [("dlrm", DLRMTowerConfig(dim=8)), ("dcn", DCNTowerConfig(dim=4)),
                        ("dlrm", user), ("dcn", user)]:  # fmt: skip
        models.append(build(model_cfg(name, tower=tower), GROUPINGS["grouped"]))
    for model in models:
        total = sum(p.numel() for p in model.parameters())
        assert count_parameters(model) == (tables, total - tables)
        stats = model_stats(model)
        assert (stats.num_embedding_parameters, stats.num_dense_parameters) == (
            tables,
            total - tables,
        )
        assert stats.num_parameters == total
    for model in (models[0], models[-1]):  # a base and a DMT model: dmt-inspect's FLOPs
        stats = model_stats(model)
        forward, train = dense_flops(model)
        assert stats.forward_mflops_per_sample == pytest.approx(forward / 1e6, rel=1e-12)
        assert stats.train_mflops_per_sample == pytest.approx(train / 1e6, rel=1e-12)
        assert 2 * forward < train  # the backward: about two products per forward one
    gated = models[-2].towers[0].tower_module
    assert isinstance(gated, GatedTowerModule)
    assert count_parameters(gated) == (0, sum(p.numel() for p in gated.parameters()))
