"""The model itself is built from ``model._target_`` (issue 14, point 2): the default builder gives
the base model or its DMT form; a model that is not in the paper is one builder plus one YAML file
(docs/examples/wide_model.py, docs/examples/conf/model/wide_dlrm.yaml), which dmt trains, and a
bad ``model._target_`` is named before any data is read."""

from __future__ import annotations

import pytest
import torch
from torchrec import KeyedJaggedTensor

from dmt import checkpoint
from dmt.config import validate
from dmt.evaluate import load_model, open_checkpoint
from dmt.models import DMTModel, RecModel, build_model, build_rec_model
from dmt.train import train
from tests.conftest import REPO, compose_config, typed_config

EXAMPLES = REPO / "docs" / "examples"
SEARCH = f"hydra.searchpath=[file://{EXAMPLES / 'conf'}]"
NAMES = [f"cat_{i}" for i in range(26)]
SIZES = {"feature_names": NAMES, "cardinalities": [20] * 26, "num_dense": 13}


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as a user's own package would be importable


def _batch(batch: int = 32) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    g = torch.Generator().manual_seed(1)
    sparse = KeyedJaggedTensor(
        keys=NAMES,
        values=torch.randint(0, 20, (26 * batch,), generator=g),
        lengths=torch.ones(26 * batch, dtype=torch.int32),
    )
    return torch.randn(batch, 13, generator=g), sparse


@pytest.mark.parametrize(
    ("overrides", "kind"),
    [(("model=dlrm",), RecModel), (("experiment=dmt_4t_dlrm",), DMTModel)],
)
def test_the_default_builder_is_the_models_target(overrides, kind):
    conf = typed_config(*overrides)
    assert conf.model._target_ == "dmt.models.factory.build_rec_model"
    torch.manual_seed(0)
    model = build_model(conf.model, **SIZES)
    torch.manual_seed(0)
    direct = build_rec_model(conf.model, **SIZES)
    assert type(model) is kind and type(direct) is kind
    dense, sparse = _batch()
    torch.testing.assert_close(model(dense, sparse), direct(dense, sparse), rtol=0, atol=0)


def test_a_new_model_is_one_builder_and_one_yaml(example):
    from wide_model import WideRecModel  # noqa: PLC0415

    conf = typed_config(SEARCH, "model=wide_dlrm")
    assert conf.model._target_ == "wide_model.build_wide_model"
    assert conf.model.name == "wide_dlrm" and conf.model.bottom_mlp == [64, 16]  # from dlrm.yaml
    model = build_model(conf.model, **SIZES)
    assert isinstance(model, WideRecModel)
    dense, sparse = _batch()
    # the wide term is the only difference from the base model with the same weights
    base = build_rec_model(conf.model, **SIZES)
    base.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("wide.")})
    expected = base(dense, sparse) + model.wide(dense).squeeze(-1)
    torch.testing.assert_close(model(dense, sparse), expected)
    with pytest.raises(ValueError, match=r"^WideRecModel has no DMT form: leave model.partition"):
        build_model(
            typed_config(
                SEARCH, "model=wide_dlrm", "+partition=naive", "model.partition.num_towers=2"
            ).model,
            **SIZES,
        )


def test_dmt_trains_checkpoints_and_reloads_the_new_model(example, tmp_path, one_thread):
    from wide_model import WideRecModel  # noqa: PLC0415

    out = tmp_path / "run"
    overrides = (SEARCH, "model=wide_dlrm", "trainer=smoke", "logger=disabled")
    checkpoints = ("trainer.checkpoint=true", "trainer.checkpoint_every=1")
    metrics = train(compose_config(*overrides, *checkpoints), out)
    assert metrics["num_train_samples"] > 0
    # the wide part trains: its weights moved from step 1 to step 2
    moved = [
        checkpoint.load_model_state(out / "checkpoints" / f"step_{s}")["model.wide.weight"]
        for s in (1, 2)
    ]
    assert not torch.equal(*moved)
    ckpt = open_checkpoint(out / "checkpoints")
    assert ckpt.config.model._target_ == "wide_model.build_wide_model"
    model = load_model(ckpt)  # what dmt-eval scores: rebuilt from the run's config
    assert isinstance(model, WideRecModel)
    state = checkpoint.load_model_state(ckpt.path)  # the wide part was saved, and came back
    torch.testing.assert_close(model.wide.weight, state["model.wide.weight"], rtol=0, atol=0)


def test_a_bad_model_target_is_named_before_any_data_is_read(example):
    with pytest.raises(ValueError, match=r"^model._target_='no_such.builder' cannot be imported"):
        validate(typed_config("model._target_=no_such.builder"))
    conf = typed_config("model._target_=torch.nn.Identity")
    with pytest.raises(
        TypeError,
        match=r"^model._target_='torch.nn.Identity' built a Identity, not a dmt.models.RecModel",
    ):
        build_model(conf.model, **SIZES)
