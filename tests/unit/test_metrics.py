import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from dmt.config import OptimConfig
from dmt.metrics import click_metrics
from dmt.optim import LRSchedule


def test_metrics_match_sklearn_and_ne_definition():
    rng = np.random.default_rng(0)
    y = (rng.random(5000) < 0.3).astype(np.float32)
    p = np.clip(0.3 + 0.2 * (y - 0.3) + 0.1 * rng.standard_normal(5000), 0.01, 0.99)
    m = click_metrics(torch.from_numpy(p), torch.from_numpy(y))
    assert m["auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-6)
    assert m["logloss"] == pytest.approx(log_loss(y, p), rel=1e-6)
    ctr = y.mean()
    assert m["ne"] == pytest.approx(
        log_loss(y, p) / -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr)), rel=1e-5
    )
    assert m["calibration"] == pytest.approx(p.mean() / ctr, rel=1e-6)


def test_predicting_the_click_rate_has_ne_one():
    y = torch.tensor([0, 0, 1, 0, 1, 0, 0, 0.0])
    assert click_metrics(torch.full((8,), 0.25), y)["ne"] == pytest.approx(1.0, abs=1e-6)


def test_lr_schedule_warmup_and_decays():
    s = LRSchedule(
        OptimConfig(warmup_steps=4, decay="linear", decay_start=4, decay_steps=4, min_lr_ratio=0.5),
        100,
    )
    assert [s(i) for i in range(10)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.5]
    )
    c = LRSchedule(OptimConfig(decay="cosine"), total_steps=10)
    assert c(0) == 1.0 and c(5) == pytest.approx(0.5) and c(10) == pytest.approx(0.0)
