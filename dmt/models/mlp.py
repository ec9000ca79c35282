"""Multi-layer perceptrons for the dense (bottom) and over (top) arches."""

from __future__ import annotations

from torch import nn


def mlp(
    in_features: int, layer_sizes: list[int], *, final_activation: bool, dropout: float = 0.0
) -> nn.Sequential:
    """Linear layers with ReLU between them; ReLU after the last one only if ``final_activation``.

    TorchRec's ``MLP`` always ends in a ReLU. For the bottom MLP that can zero every dense output
    for good (the "dead dense arch" failure of the reference DLRM), so dmt makes it a setting.

    ``dropout``: probability of ``nn.Dropout`` after every ReLU (0: no dropout module). Dropout
    shares the ReLU's slot of the ``Sequential`` (``Sequential(ReLU, Dropout)``), so the linear
    layers keep their indices, and a state dict of a model trained with dropout loads into the
    same model without it.
    """
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout={dropout!r} must be in [0, 1) (the probability of zeroing)")
    layers: list[nn.Module] = []
    sizes = [in_features, *layer_sizes]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(layer_sizes) - 1 or final_activation:
            layers.append(nn.Sequential(nn.ReLU(), nn.Dropout(dropout)) if dropout else nn.ReLU())
    return nn.Sequential(*layers)
