"""``dmt-partition``: run the Tower Partitioner on a saved affinity matrix or a trained model.

Examples::

    dmt-partition --affinity affinity.npy --num-towers 8 --strategy coherent --out outputs/tp
    dmt-partition --checkpoint outputs/<run>/checkpoints --data val --num-towers 8 --out outputs/tp

write ``outputs/tp/partition.yaml`` and ``outputs/tp/affinity_heatmap.png`` and print a summary.
With ``--affinity``, feature names come from the affinity's sidecar ``affinity.features.json``
(see :mod:`dmt.partitioner.affinity`), else ``cat_0 ..``. With ``--checkpoint`` (a training
checkpoint, read as ``dmt-eval`` reads it: :mod:`dmt.evaluate`), the affinity is computed from the
model's pooled embeddings over ``--data`` (the run's ``train``/``val``/``test`` split, a raw Criteo
TSV or a preprocessed split; at most ``--max-batches`` batches) and saved as
``outputs/tp/affinity.npy`` (with its feature-name sidecar) for later runs.

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

from dmt.partitioner.affinity import load_affinity, model_affinity, save_affinity
from dmt.partitioner.distance import STRATEGIES
from dmt.partitioner.output import format_summary, plot_affinity_heatmap, save_partition
from dmt.partitioner.partition import PartitionResult, partition_hierarchical, tower_partition

__all__ = [
    "AFFINITY_FILE",
    "HEATMAP_FILE",
    "PARTITION_FILE",
    "checkpoint_affinity",
    "load_pre_groups",
    "main",
    "run_partition",
]

PARTITION_FILE = "partition.yaml"
HEATMAP_FILE = "affinity_heatmap.png"
AFFINITY_FILE = "affinity.npy"


def checkpoint_affinity(
    checkpoint: str | Path,
    data: str = "val",
    *,
    max_batches: int | None = None,
    batch_size: int = 4096,
    config: str | Path | None = None,
) -> tuple[np.ndarray, list[str]]:
    """The feature affinity of a training checkpoint's model over ``data`` (see the module
    docstring), rows in the run's sparse feature order."""
    from dmt.evaluate import load_model, open_checkpoint, open_data, run_schema  # noqa: PLC0415

    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1; got {batch_size}")
    ckpt = open_checkpoint(checkpoint, config)
    model = load_model(ckpt)
    rows = open_data(ckpt, data, batch_size=batch_size, progress=False)
    if rows.source.num_batches() == 0:
        raise ValueError(
            f"--data {data}: no rows (e.g. the validation split of a run without one); the "
            "affinity needs at least one batch: choose another --data"
        )
    feature_names, _, _ = run_schema(ckpt.config)
    return model_affinity(model, rows.source.batches(0), max_batches, feature_names=feature_names)


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
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--affinity", type=Path, help="(F, F) affinity .npy")
    source.add_argument(
        "--checkpoint",
        type=Path,
        help="training checkpoint (<run>/checkpoints or its step_N): compute the affinity "
        "from the model's embeddings",
    )
    parser.add_argument(
        "--data",
        default="val",
        help="with --checkpoint: train|val|test, a raw Criteo TSV or a preprocessed split "
        "(default: val)",
    )
    parser.add_argument(
        "--max-batches", type=int, default=None, help="with --checkpoint: batches to average over"
    )
    parser.add_argument(
        "--batch-size", type=int, default=4096, help="with --checkpoint: samples per batch"
    )
    parser.add_argument(
        "--config", type=Path, help="with --checkpoint: the run's config, if not found beside it"
    )
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
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier partition's files in --out"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.max_batches is not None and args.max_batches < 1:
        parser.error(f"--max-batches must be at least 1; got {args.max_batches}")
    written = [PARTITION_FILE, HEATMAP_FILE] + ([AFFINITY_FILE] if args.checkpoint else [])
    existing = [str(args.out / name) for name in written if (args.out / name).exists()]
    if existing and not args.overwrite:
        parser.error(
            f"{', '.join(existing)} exist already (an earlier partition); choose another --out, "
            "or pass --overwrite to replace them"
        )
    try:
        if args.checkpoint is not None:
            affinity, feature_names = checkpoint_affinity(
                args.checkpoint,
                args.data,
                max_batches=args.max_batches,
                batch_size=args.batch_size,
                config=args.config,
            )
            source = f"checkpoint {args.checkpoint} on {args.data}"
        else:
            affinity, feature_names = load_affinity(args.affinity)
            source = str(args.affinity)
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
            affinity_source=source,
        )
        if args.checkpoint is not None:
            save_affinity(args.out / AFFINITY_FILE, affinity, feature_names)
    except (OSError, ValueError) as error:
        parser.error(str(error))  # exits with status 2 and the message on stderr
    print(format_summary(result, affinity, feature_names))
    print("wrote " + ", ".join(str(args.out / name) for name in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
