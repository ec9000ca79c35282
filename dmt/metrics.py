"""Click-prediction metrics: AUC, logloss, normalized entropy (NE), calibration."""

from __future__ import annotations

import math

import torch
from torchmetrics.functional.classification import binary_auroc

_EPS = 1e-7


def binary_entropy(p: float) -> float:
    """Entropy (nats) of a Bernoulli(p)."""
    p = min(max(p, _EPS), 1 - _EPS)
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def click_metrics(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``auc``, ``logloss``, ``ne`` (logloss / entropy of the empirical click rate, He et al.
    2014), ``calibration`` (mean predicted / observed click rate) and ``num_samples``."""
    probs = probs.double().clamp(_EPS, 1 - _EPS)
    labels = labels.double()
    logloss = float(torch.nn.functional.binary_cross_entropy(probs, labels))
    ctr = float(labels.mean())
    auc = float(binary_auroc(probs, labels.long())) if 0 < ctr < 1 else float("nan")
    return {
        "auc": auc,
        "logloss": logloss,
        "ne": logloss / binary_entropy(ctr),
        "calibration": float(probs.mean()) / max(ctr, _EPS),
        "num_samples": float(labels.numel()),
    }
