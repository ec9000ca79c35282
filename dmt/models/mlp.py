"""Multi-layer perceptrons for the dense (bottom) and over (top) arches."""

from __future__ import annotations

from torch import nn


def mlp(in_features: int, layer_sizes: list[int], *, final_activation: bool) -> nn.Sequential:
    """Linear layers with ReLU between them; ReLU after the last one only if ``final_activation``.

    TorchRec's ``MLP`` always ends in a ReLU. For the bottom MLP that can zero every dense output
    for good (the "dead dense arch" failure of the reference DLRM), so dmt makes it a setting.
    """
    layers: list[nn.Module] = []
    sizes = [in_features, *layer_sizes]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(layer_sizes) - 1 or final_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
