"""``dmt-partition``: run the Tower Partitioner on a saved affinity matrix.

Example::

    dmt-partition --affinity affinity.npy --num-towers 8 --strategy coherent --out outputs/tp

writes ``outputs/tp/partition.yaml`` and ``outputs/tp/affinity_heatmap.png`` and prints a summary.
Feature names come from the affinity's sidecar ``affinity.features.json`` (see
:mod:`dmt.partitioner.affinity`), else ``cat_0 ..``.

``--pre-groups FILE.yaml`` switches to hierarchical mode. The file holds either a list of groups or
a mapping from group name to group; each group is a list of feature names or feature indices::

    item: [cat_0, cat_1, cat_2]
    user: [cat_3, cat_4]
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import yaml

from dmt.partitioner.affinity import load_affinity
from dmt.partitioner.distance import STRATEGIES
from dmt.partitioner.output import format_summary, plot_affinity_heatmap, save_partition
from dmt.partitioner.partition import PartitionResult, partition_hierarchical, tower_partition

__all__ = ["PARTITION_FILE", "HEATMAP_FILE", "load_pre_groups", "main", "run_partition"]

PARTITION_FILE = "partition.yaml"
HEATMAP_FILE = "affinity_heatmap.png"


def run_partition(
    affinity: np.ndarray,
    feature_names: Sequence[str],
    num_towers: int,
    *,
    out_dir: str | Path,
    strategy: str = "coherent",
    max_size_ratio: float = 1.0,
    embed_dim: int = 2,
    seed: int = 0,
    pre_groups: Sequence[Sequence[int]] | None = None,
    affinity_source: str | None = None,
) -> PartitionResult:
    """Partition, then write ``partition.yaml`` and ``affinity_heatmap.png`` into ``out_dir``.

    Args:
        affinity: ``(F, F)`` affinity (any source: a file, or one just computed from a model).
        feature_names: the ``F`` names, in affinity row order.
        num_towers: ``T``.
        out_dir: output folder (created if missing).
        strategy, max_size_ratio, embed_dim, seed: see
            :func:`~dmt.partitioner.partition.tower_partition`.
        pre_groups: feature indices of each pre-group for hierarchical mode, else ``None``.
        affinity_source: recorded in the YAML (e.g. the affinity path or a checkpoint).

    Returns:
        The :class:`~dmt.partitioner.partition.PartitionResult`.
    """
    if len(feature_names) != len(affinity):
        raise ValueError(
            f"got {len(feature_names)} feature names for a {len(affinity)}-feature affinity"
        )
    if pre_groups is None:
        result = tower_partition(
            affinity,
            num_towers,
            strategy,
            max_size_ratio=max_size_ratio,
            embed_dim=embed_dim,
            seed=seed,
        )
    else:
        result = partition_hierarchical(
            affinity,
            num_towers,
            pre_groups,
            strategy,
            max_size_ratio=max_size_ratio,
            embed_dim=embed_dim,
            seed=seed,
        )
    out = Path(out_dir)
    save_partition(out / PARTITION_FILE, result, feature_names, affinity_source=affinity_source)
    plot_affinity_heatmap(
        out / HEATMAP_FILE,
        affinity,
        result.towers,
        feature_names,
        title=f"TP {result.strategy}: {result.num_towers} towers (stress {result.stress:.3f})",
    )
    return result


def load_pre_groups(path: str | Path, feature_names: Sequence[str]) -> list[list[int]]:
    """Pre-groups from YAML (see the module docstring) as lists of feature indices."""
    document = yaml.safe_load(Path(path).read_text())
    groups = list(document.values()) if isinstance(document, Mapping) else document
    if not isinstance(groups, list) or not all(isinstance(group, list) for group in groups):
        raise ValueError(
            f"{str(path)!r}: pre-groups must be a list of lists (or a mapping of name -> list) "
            "of feature names or indices"
        )
    index_of = {name: index for index, name in enumerate(feature_names)}
    resolved = []
    for group in groups:
        indices = []
        for feature in group:
            if isinstance(feature, int) and not isinstance(feature, bool):
                indices.append(feature)
            elif str(feature) in index_of:
                indices.append(index_of[str(feature)])
            else:
                raise ValueError(f"{str(path)!r}: unknown feature {feature!r} in pre-groups")
        resolved.append(indices)
    return resolved


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dmt-partition",
        description="Tower Partitioner (DMT paper §3.3): balanced feature-to-tower assignment "
        "from a feature affinity matrix.",
    )
    parser.add_argument("--affinity", required=True, type=Path, help="(F, F) affinity .npy")
    parser.add_argument("--num-towers", required=True, type=int, help="number of towers T")
    parser.add_argument("--strategy", choices=STRATEGIES, default="coherent")
    parser.add_argument(
        "--max-size-ratio",
        type=float,
        default=1.0,
        help="largest tower at most this many times the smallest (1: most balanced)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--embed-dim", type=int, default=2, help="Euclidean embedding dim n")
    parser.add_argument("--pre-groups", type=Path, help="YAML of feature pre-groups")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        affinity, feature_names = load_affinity(args.affinity)
        pre_groups = (
            load_pre_groups(args.pre_groups, feature_names) if args.pre_groups is not None else None
        )
        result = run_partition(
            affinity,
            feature_names,
            args.num_towers,
            out_dir=args.out,
            strategy=args.strategy,
            max_size_ratio=args.max_size_ratio,
            embed_dim=args.embed_dim,
            seed=args.seed,
            pre_groups=pre_groups,
            affinity_source=str(args.affinity),
        )
    except (OSError, ValueError) as error:
        parser.error(str(error))  # exits with status 2 and the message on stderr
    print(format_summary(result, affinity, feature_names))
    print(f"wrote {args.out / PARTITION_FILE} and {args.out / HEATMAP_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
