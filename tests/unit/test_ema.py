"""``DenseEMA``: the moving average of the dense weights that evaluation reads."""

import pytest
import torch
from torch import nn

from dmt.config import validate
from dmt.ema import DenseEMA
from tests.conftest import typed_config


def _train(model: nn.Module, ema: DenseEMA | None, steps: int) -> list[list[torch.Tensor]]:
    """SGD steps on a fixed regression; the weights after each step."""
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for _ in range(steps):
        x = torch.randn(8, 3, generator=g, dtype=torch.float64)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if ema is not None:
            ema.update()
        seen.append([p.detach().clone() for p in model.parameters()])
    return seen


def test_the_average_is_the_hand_computed_ema_of_the_weights_after_each_step():
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    ema = DenseEMA(model.named_parameters(), decay=0.8)
    seen = _train(model, ema, steps=6)
    expected = seen[0]  # the first update copies
    for weights in seen[1:]:
        expected = [0.8 * e + 0.2 * w for e, w in zip(expected, weights)]
    assert ema.num_updates == 6
    for avg, exp in zip(ema.averages, expected):
        torch.testing.assert_close(avg, exp, rtol=1e-12, atol=1e-12)
    assert not torch.equal(ema.averages[0], seen[-1][0])


def test_applied_swaps_the_averages_in_and_the_raw_weights_back():
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    ema = DenseEMA(model.named_parameters(), decay=0.5)
    initial = [p.detach().clone() for p in model.parameters()]
    with ema.applied():  # no update yet: the weights as they are
        assert all(torch.equal(p, i) for p, i in zip(model.parameters(), initial))
    raw = _train(model, ema, steps=3)[-1]
    x = torch.randn(4, 3, dtype=torch.float64)
    with ema.applied():
        assert all(torch.equal(p, a) for p, a in zip(model.parameters(), ema.averages))
        out = model(x)
    torch.testing.assert_close(out, x @ ema.averages[0].T + ema.averages[1], rtol=0, atol=1e-15)
    assert all(torch.equal(p, r) for p, r in zip(model.parameters(), raw))


def test_state_dict_round_trip():
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    ema = DenseEMA(model.named_parameters(), decay=0.9)
    _train(model, ema, steps=2)
    other = DenseEMA(nn.Linear(3, 2).double().named_parameters(), decay=0.9)
    other.load_state_dict(ema.state_dict())
    assert other.num_updates == 2
    assert all(torch.equal(a, b) for a, b in zip(other.averages, ema.averages))
    with pytest.raises(ValueError, match=r"EMA state of 1 parameters does not fit these 2"):
        other.load_state_dict({"num_updates": 1, "averages": {"weight": ema.averages[0]}})


def test_decay_must_be_in_0_1():
    with pytest.raises(ValueError, match=r"trainer.ema_decay=1.0 must be in \[0, 1\)"):
        DenseEMA(nn.Linear(1, 1).named_parameters(), decay=1.0)
    with pytest.raises(ValueError, match=r"trainer.ema_decay=-0.5 must be in \[0, 1\)"):
        validate(typed_config("trainer.ema_decay=-0.5"))
    assert typed_config("trainer.ema_decay=0.999").trainer.ema_decay == 0.999


def test_load_state_dict_matches_the_averages_by_name():
    """A state is keyed by parameter name: its order does not matter, and one of as many
    parameters under other names is refused, naming them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)).double()
    ema = DenseEMA(model.named_parameters(), decay=0.9)
    shifted = [p.detach().clone() + i for i, p in enumerate(model.parameters())]
    state = {"num_updates": 3, "averages": dict(reversed(list(zip(ema.names, shifted))))}
    ema.load_state_dict(state)
    assert all(torch.equal(a, e) for a, e in zip(ema.averages, shifted))
    renamed = {"num_updates": 3, "averages": {f"x{n}": a for n, a in zip(ema.names, ema.averages)}}
    with pytest.raises(ValueError, match=r"EMA state of 4 parameters does not fit these 4 \(e.g. "):
        ema.load_state_dict(renamed)
