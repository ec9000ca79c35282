"""What TP hands to the rest of dmt and to people: a partition YAML, a heatmap and a summary.

Partition YAML (``partition.yaml``), read back by :func:`load_partition`::

    towers:                 # feature names of each tower, in canonical order
    - [cat_0, cat_3]
    - [cat_1, cat_2]
    num_towers: 2
    num_features: 4
    strategy: coherent
    seed: 0
    stress: 0.12
    max_size_ratio: 1.0
    embed_dim: 2
    affinity_source: path/to/affinity.npy
    pre_groups: null        # or the feature names of each pre-group
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dmt.partitioner.partition import PartitionResult

__all__ = [
    "format_summary",
    "load_partition",
    "plot_affinity_heatmap",
    "save_partition",
    "tower_affinities",
]

# Heatmaps larger than this many features per side are subsampled evenly.
_MAX_HEATMAP_FEATURES = 1024
# Feature names are written on the axes up to this many features.
_MAX_TICK_LABELS = 64


def save_partition(
    path: str | Path,
    result: PartitionResult,
    feature_names: Sequence[str],
    *,
    affinity_source: str | None = None,
) -> Path:
    """Write the partition YAML (see the module docstring) and return its path."""
    # plain Python values: yaml.safe_dump cannot write NumPy scalars (np.str_ names, np.int64 seed)
    names = [str(name) for name in feature_names]
    if len(names) != result.num_features:
        raise ValueError(
            f"got {len(names)} feature names for a partition of {result.num_features} features"
        )
    document: dict[str, Any] = {
        "towers": [[names[i] for i in tower] for tower in result.towers],
        "num_towers": result.num_towers,
        "num_features": result.num_features,
        "strategy": str(result.strategy),
        "seed": int(result.seed),
        "stress": float(result.stress),
        "max_size_ratio": float(result.max_size_ratio),
        "embed_dim": int(result.embed_dim),
        "affinity_source": affinity_source,
        "pre_groups": (
            None
            if result.pre_groups is None
            else [[names[i] for i in group] for group in result.pre_groups]
        ),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as stream:
        yaml.safe_dump(document, stream, sort_keys=False, default_flow_style=None)
    return path


def load_partition(path: str | Path) -> list[list[str]]:
    """Feature names of each tower from a partition YAML written by :func:`save_partition`."""
    document = yaml.safe_load(Path(path).read_text())
    towers = document.get("towers") if isinstance(document, dict) else None
    if (
        not isinstance(towers, list)
        or not towers
        or not all(isinstance(tower, list) and tower for tower in towers)
    ):
        raise ValueError(f"{str(path)!r}: 'towers' must be a non-empty list of non-empty lists")
    names = [str(name) for tower in towers for name in tower]
    if len(set(names)) != len(names):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"{str(path)!r}: features in more than one tower: {duplicates}")
    return [[str(name) for name in tower] for tower in towers]


def tower_affinities(affinity: np.ndarray, towers: Sequence[Sequence[int]]) -> list[float]:
    """Mean affinity over the pairs ``i < j`` inside each tower (NaN for one-feature towers)."""
    means = []
    for tower in towers:
        size = len(tower)
        if size < 2:
            means.append(float("nan"))
            continue
        block = affinity[np.ix_(tower, tower)]
        means.append(float((block.sum() - np.trace(block)) / (size * (size - 1))))
    return means


def _mean_across(affinity: np.ndarray, towers: Sequence[Sequence[int]]) -> float:
    num_features = affinity.shape[0]
    total = float(affinity.sum() - np.trace(affinity))
    within = 0.0
    within_pairs = 0
    for tower in towers:
        block = affinity[np.ix_(tower, tower)]
        within += float(block.sum() - np.trace(block))
        within_pairs += len(tower) * (len(tower) - 1)
    across_pairs = num_features * (num_features - 1) - within_pairs
    return (total - within) / across_pairs if across_pairs else float("nan")


def format_summary(
    result: PartitionResult,
    affinity: np.ndarray,
    feature_names: Sequence[str] | None = None,
    *,
    max_names: int = 8,
) -> str:
    """A plain-text table: per tower its size, mean within-tower affinity and first features."""
    means = tower_affinities(affinity, result.towers)
    within = [m for m in means if not np.isnan(m)]
    lines = [
        f"Tower Partitioner: {result.num_features} features -> {result.num_towers} towers, "
        f"strategy={result.strategy}, seed={result.seed}, "
        f"max_size_ratio={result.max_size_ratio:g}, embed_dim={result.embed_dim}",
        f"embedding stress {result.stress:.4f}; tower sizes {min(result.sizes)}-"
        f"{max(result.sizes)}; mean affinity within towers "
        f"{np.mean(within) if within else float('nan'):.4f}, across towers "
        f"{_mean_across(affinity, result.towers):.4f}",
        f"{'tower':>5}  {'size':>5}  {'affinity':>8}  features",
    ]
    for index, (tower, mean) in enumerate(zip(result.towers, means, strict=True)):
        shown = [feature_names[i] if feature_names is not None else str(i) for i in tower]
        more = f" ... (+{len(shown) - max_names})" if len(shown) > max_names else ""
        lines.append(
            f"{index:>5}  {len(tower):>5}  {mean:>8.4f}  {', '.join(shown[:max_names])}{more}"
        )
    return "\n".join(lines)


def plot_affinity_heatmap(
    path: str | Path,
    affinity: np.ndarray,
    towers: Sequence[Sequence[int]],
    feature_names: Sequence[str] | None = None,
    *,
    title: str | None = None,
) -> Path:
    """Save the affinity as a PNG with features grouped by tower (paper Figure 9).

    Features are reordered tower by tower; each tower's diagonal block is outlined in its own
    color. Above 1024 features the matrix is subsampled evenly along the tower order.
    """
    # The object API with the Agg canvas: no pyplot state, no global backend switch.
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    order = np.concatenate([np.asarray(tower, dtype=np.int64) for tower in towers])
    bounds = np.cumsum([0] + [len(tower) for tower in towers])
    shown = np.arange(len(order))
    if len(order) > _MAX_HEATMAP_FEATURES:
        shown = np.linspace(0, len(order) - 1, _MAX_HEATMAP_FEATURES).round().astype(np.int64)
    picked = order[shown]
    # Block edges in the coordinates of the (possibly subsampled) image.
    edges = np.searchsorted(shown, bounds) - 0.5

    fig = Figure(figsize=(7, 6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(
        affinity[np.ix_(picked, picked)],
        cmap="viridis",
        vmin=0.0,
        vmax=1.0,
        interpolation="nearest",
    )
    fig.colorbar(image, ax=ax, label="affinity |mean cos|")
    colors = colormaps["tab20"]
    for tower in range(len(towers)):
        start, stop = edges[tower], edges[tower + 1]
        ax.add_patch(
            Rectangle(
                (start, start),
                stop - start,
                stop - start,
                fill=False,
                edgecolor=colors(tower % 20),
                linewidth=1.5,
            )
        )
    if len(picked) <= _MAX_TICK_LABELS and feature_names is not None:
        labels = [feature_names[i] for i in picked]
        # names as they are: "$" in a name is not mathtext to parse
        ax.set_xticks(range(len(picked)), labels, rotation=90, fontsize=6, parse_math=False)
        ax.set_yticks(range(len(picked)), labels, fontsize=6, parse_math=False)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_xlabel("features, grouped by tower")
    ax.set_title(title or f"Feature affinity, {len(towers)} towers")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
