"""docs/tower_modules.md's worked example is real: a tower module that is not in the paper, added
as one class (docs/examples/mlp_tower.py) plus one YAML file (docs/examples/conf/tower/mlp.yaml),
is composed with ``tower=mlp``, built by ``hydra.utils.instantiate`` and trains in a DMT model."""

from __future__ import annotations

import pytest
import torch
from torchrec import KeyedJaggedTensor

from dmt.inspect import inspect_config
from dmt.models import DMTModel, build_model
from tests.conftest import REPO, typed_config

EXAMPLES = REPO / "docs" / "examples"
OVERRIDES = (
    f"hydra.searchpath=[file://{EXAMPLES / 'conf'}]",
    "model=dlrm",  # N = 16, bottom MLP [64, 16]: ends at the towers' D = 16
    "+partition=naive",
    "model.partition.num_towers=4",
    "+tower=mlp",
)


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as a user's own package would be importable


def test_the_yaml_builds_the_example_module(example):
    from mlp_tower import MLPTowerModule  # noqa: PLC0415

    conf = typed_config(*OVERRIDES)
    assert conf.model.tower == {
        "_target_": "mlp_tower.MLPTowerModule",
        "dim": 16,
        "hidden": 64,
        "num_vectors": 1,
    }
    names = [f"cat_{i}" for i in range(26)]
    model = build_model(conf.model, feature_names=names, cardinalities=[20] * 26, num_dense=13)
    assert isinstance(model, DMTModel)
    assert all(isinstance(t.tower_module, MLPTowerModule) for t in model.towers)
    assert model.tower_output_dims == [(1, 16)] * 4
    report = inspect_config(conf)
    assert report["tower_module"] == "MLPTowerModule" and report["tower_output_sizes"] == [16] * 4
    assert report["compression_ratio"] == pytest.approx(26 * 16 / 64)


def test_a_dmt_model_with_the_example_module_trains(example, one_thread):
    conf = typed_config(*OVERRIDES)
    names = [f"cat_{i}" for i in range(26)]
    torch.manual_seed(0)
    model = build_model(conf.model, feature_names=names, cardinalities=[20] * 26, num_dense=13)
    g = torch.Generator().manual_seed(1)
    batch = 64
    dense = torch.randn(batch, 13, generator=g)
    sparse = KeyedJaggedTensor(
        keys=names,
        values=torch.randint(0, 20, (26 * batch,), generator=g),
        lengths=torch.ones(26 * batch, dtype=torch.int32),
    )
    labels = (torch.rand(batch, generator=g) < 0.3).float()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, sparse), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]  # it fits the batch
    for n, p in model.named_parameters():  # the MLP towers train with the rest
        assert not torch.equal(p, before[n]), n


def test_bad_settings_of_the_example_module_are_named(example):
    with pytest.raises(
        ValueError, match=r"model.tower: MLPTowerModule: hidden=0 must be a positive"
    ):
        typed_config(*OVERRIDES, "model.tower.hidden=0")
    with pytest.raises(ValueError, match=r"model.tower: .*unexpected keyword argument 'width'"):
        typed_config(*OVERRIDES, "+model.tower.width=3")
