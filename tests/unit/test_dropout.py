"""``model.dropout``: dropout after every ReLU of the bottom and top MLPs, off in evaluation."""

import pytest
import torch
from torch import nn

from dmt.config import validate
from dmt.models import build_model
from dmt.models.mlp import mlp
from dmt.trainer import seed_rank_stream
from tests.conftest import typed_config
from tests.unit.test_models import CARDS, NAMES, kjt

#: the tiny base and DMT models of these tests
SIZES = ["model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[12,6,1]"]
DMT = ["experiment=dmt_4t_dlrm", "model.partition.num_towers=2"]  # DLRM towers, D=8


def build(*overrides: str) -> nn.Module:
    cfg = typed_config(*SIZES, *overrides)
    validate(cfg)
    return build_model(cfg.model, feature_names=NAMES, cardinalities=CARDS, num_dense=3)


def test_train_mode_drops_at_the_rate_and_scales_the_survivors():
    """After a ReLU whose outputs are all ``h > 0``, each element is 0 with probability ``p``
    and ``h / (1 - p)`` otherwise."""
    p, h = 0.25, 3.0
    layers = mlp(1, [1000, 1], final_activation=False, dropout=p)
    hidden = layers[:2]  # Linear, then ReLU + Dropout in one slot
    with torch.no_grad():
        layers[0].weight.fill_(1.0)
        layers[0].bias.fill_(h - 1.0)
    torch.manual_seed(0)
    out = hidden(torch.ones(200, 1))  # (200, 1000): 200k draws
    zeros = out == 0
    torch.testing.assert_close(out[~zeros], torch.full_like(out[~zeros], h / (1 - p)))
    rate, sd = zeros.float().mean().item(), (p * (1 - p) / out.numel()) ** 0.5
    assert abs(rate - p) < 5 * sd, (rate, p)
    hidden.eval()
    torch.testing.assert_close(hidden(torch.ones(4, 1)), torch.full((4, 1000), h))


@pytest.mark.parametrize("model", [[], DMT], ids=["dlrm", "dmt"])
def test_eval_mode_computes_the_model_without_dropout(model):
    """Same state-dict keys as without dropout; loaded with the same weights, evaluation gives
    exactly the outputs of the model without dropout, training gives others."""
    torch.manual_seed(0)
    plain = build(*model)
    with_dropout = build(*model, "model.dropout=0.5")
    assert with_dropout.state_dict().keys() == plain.state_dict().keys()
    with_dropout.load_state_dict(plain.state_dict())
    dense, sparse = torch.randn(64, 3), kjt(64)
    plain.eval()
    with_dropout.eval()
    torch.testing.assert_close(with_dropout(dense, sparse), plain(dense, sparse), rtol=0, atol=0)
    with_dropout.train()
    assert not torch.equal(with_dropout(dense, sparse), plain(dense, sparse))


@pytest.mark.parametrize("model", [[], DMT], ids=["dlrm", "dmt"])
def test_dropout_follows_every_relu_of_both_mlps(model):
    m = build(*model, "model.dropout=0.1")
    for arch, relus in ((m.bottom, 1), (m.top, 2)):  # bottom [16, 8]: 1 ReLU; top [12, 6, 1]: 2
        drops = [d for d in arch.modules() if isinstance(d, nn.Dropout)]
        assert [d.p for d in drops] == [0.1] * relus
        assert sum(isinstance(r, nn.ReLU) for r in arch.modules()) == relus
    default = build(*model)
    assert not any(isinstance(d, nn.Dropout) for d in default.modules())


def test_dropout_must_be_a_probability():
    with pytest.raises(ValueError, match=r"model.dropout=1.0 must be in \[0, 1\)"):
        validate(typed_config(*SIZES, "model.dropout=1.0"))
    with pytest.raises(ValueError, match=r"dropout=-0.1 must be in \[0, 1\)"):
        mlp(3, [4, 1], final_activation=False, dropout=-0.1)


def test_a_world_of_one_keeps_the_seeds_stream_and_ranks_get_their_own():
    """A world of one draws the masks it drew before (``trainer.seed``'s stream, left as the
    model's build left it); with 2+ ranks each rank's stream is its own, the same every run."""

    def draws(seed: int, rank: int, world_size: int) -> torch.Tensor:
        torch.manual_seed(seed)
        torch.rand(7)  # building the model draws from the stream
        seed_rank_stream(seed, rank=rank, world_size=world_size)
        return torch.rand(1000)

    torch.manual_seed(3)
    torch.rand(7)
    expected = torch.rand(1000)
    torch.testing.assert_close(draws(3, 0, 1), expected, rtol=0, atol=0)
    ranks = [draws(3, rank, 2) for rank in (0, 1)]
    assert not torch.equal(ranks[0], ranks[1])
    torch.testing.assert_close(draws(3, 1, 2), ranks[1], rtol=0, atol=0)
    assert not torch.equal(draws(4, 1, 2), ranks[1])  # another seed, another stream
