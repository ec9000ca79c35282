"""``dmt-partition``: run the Tower Partitioner on a saved affinity matrix or a trained model.

Examples::

    dmt-partition --affinity affinity.npy --num-towers 8 --strategy coherent --out outputs/tp
    dmt-partition --checkpoint outputs/<run>/checkpoints --data val --num-towers 8 --out outputs/tp

write ``outputs/tp/partition.yaml`` and ``outputs/tp/affinity_heatmap.png`` and print a summary.
Files of an earlier partition in ``--out`` are replaced only with ``--overwrite`` (also one that
appeared while this one was made), and all are put in place or none: an error or ``SIGTERM``
leaves no half-written partition (and no folder the run made).
With ``--affinity``, feature names come from the affinity's sidecar ``affinity.features.json``
(see :mod:`dmt.partitioner.affinity`), else ``cat_0 ..``. With ``--checkpoint`` (a training
checkpoint, read as ``dmt-eval`` reads it: :mod:`dmt.evaluate`), the affinity is computed from the
model's pooled embeddings over ``--data`` (the run's ``train``/``val``/``test`` split, a raw Criteo
TSV or a preprocessed split; at most ``--max-batches`` batches) and saved as
``outputs/tp/affinity.npy`` (with its feature-name sidecar) for later runs. ``--data``,
``--max-batches``, ``--batch-size`` and ``--config`` apply to ``--checkpoint`` only. Before that
(long) pass over the data, every partition argument is checked against the run's features
(``--num-towers``, ``--pre-groups``, ``--max-size-ratio``, ``--seed``, ``--embed-dim``).

``--pre-groups FILE.yaml`` switches to hierarchical mode. The file holds either a list of groups or
a mapping from group name to group; each group is a list of feature names or feature indices::

    item: [cat_0, cat_1, cat_2]
    user: [cat_3, cat_4]

An entry is a feature's name if ``str(entry)`` is one (YAML reads an unquoted ``7`` as the
integer 7, which names the feature ``"7"`` when the features are named ``"1" .. "12"``), else an
integer entry is a feature index (0-based, in affinity row order). The groups must be disjoint
and cover every feature.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml

from dmt.models.partition import describe_features, describe_yaml_error
from dmt.partitioner.affinity import load_affinity, model_affinity, save_affinity, sidecar_path
from dmt.partitioner.distance import STRATEGIES
from dmt.partitioner.output import format_summary, plot_affinity_heatmap, save_partition
from dmt.partitioner.partition import (
    PartitionResult,
    check_partition_arguments,
    check_pre_groups,
    partition_hierarchical,
    tower_partition,
)

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

# Defaults of the --checkpoint-only options (argparse's are None, to tell them apart from unset).
DEFAULT_DATA = "val"
DEFAULT_BATCH_SIZE = 4096
_MAX_SEED = 2**32 - 1


def checkpoint_affinity(
    checkpoint: str | Path,
    data: str = "val",
    *,
    max_batches: int | None = None,
    batch_size: int = 4096,
    config: str | Path | None = None,
    check: Callable[[list[str]], object] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """The feature affinity of a training checkpoint's model over ``data`` (see the module
    docstring), rows in the run's sparse feature order.

    ``check`` is called with the run's feature names as soon as they are known, before the model
    and the data are loaded: it can reject the arguments of what the affinity is for (raise
    ``ValueError``) without the wait.
    """
    from dmt.evaluate import load_model, open_checkpoint, open_data, run_schema  # noqa: PLC0415

    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1; got {batch_size}")
    ckpt = open_checkpoint(checkpoint, config)
    try:
        feature_names, _, _ = run_schema(ckpt.config)
    except ValueError as e:
        raise ValueError(f"cannot read the features of checkpoint {ckpt.path}: {e}") from None
    if check is not None:
        check(feature_names)
    model = load_model(ckpt)
    rows = open_data(ckpt, data, batch_size=batch_size, progress=False)
    if rows.source.num_batches() == 0:
        raise ValueError(
            f"--data {data}: no rows (e.g. the validation split of a run without one); the "
            "affinity needs at least one batch: choose another --data"
        )
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
    """Pre-groups from YAML (see the module docstring) as lists of feature indices.

    Raises:
        ValueError: naming the file: unreadable or not YAML, not a list of lists (or a mapping
            of lists), an entry that is neither a feature name nor a feature index, or groups
            that overlap or miss features (named).
    """
    where = f"pre-groups file {str(path)!r}"
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {where}: {e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{where} is not valid YAML: {describe_yaml_error(e)}") from None
    groups = list(document.values()) if isinstance(document, Mapping) else document
    if not isinstance(groups, list) or not all(isinstance(group, list) for group in groups):
        raise ValueError(
            f"{where}: pre-groups must be a list of lists (or a mapping of name -> list) "
            "of feature names or indices"
        )
    num_features = len(feature_names)
    index_of = {str(name): index for index, name in enumerate(feature_names)}
    resolved = []
    for group_index, group in enumerate(groups):
        indices = []
        for feature in group:
            if str(feature) in index_of:  # a name first: YAML reads an unquoted 7 as an int
                indices.append(index_of[str(feature)])
            elif isinstance(feature, int) and not isinstance(feature, bool):
                if not 0 <= feature < num_features:
                    raise ValueError(
                        f"{where}: pre-group {group_index} holds {feature}, neither a feature "
                        f"name nor a feature index in [0, {num_features})"
                    )
                indices.append(feature)
            else:
                raise ValueError(
                    f"{where}: unknown feature {feature!r} in pre-group {group_index} "
                    f"(expected a feature name or index; features: "
                    f"{_describe_names(feature_names)})"
                )
        resolved.append(indices)
    try:
        check_pre_groups(resolved, num_features, feature_names)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return resolved


def _describe_names(names: Sequence[str]) -> str:
    shown = describe_features(list(names))
    return shown if len(shown) <= 200 else shown[:200] + " ..."


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
        help="with --checkpoint: train|val|test, a raw Criteo TSV or a preprocessed split "
        f"(default: {DEFAULT_DATA})",
    )
    parser.add_argument(
        "--max-batches", type=int, help="with --checkpoint: batches to average over (default: all)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        help=f"with --checkpoint: samples per batch (default: {DEFAULT_BATCH_SIZE})",
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
        help="largest tower at most this many times the smallest (1: most balanced); with "
        "--pre-groups, within each pre-group",
    )
    parser.add_argument("--seed", type=int, default=0, help="between 0 and 2**32 - 1")
    parser.add_argument("--embed-dim", type=int, default=2, help="Euclidean embedding dim n >= 1")
    parser.add_argument("--pre-groups", type=Path, help="YAML of feature pre-groups")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier partition's files in --out"
    )
    return parser


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject what is wrong in the arguments alone (exits through ``parser.error``)."""
    checkpoint_only = {
        "--data": args.data,
        "--max-batches": args.max_batches,
        "--batch-size": args.batch_size,
        "--config": args.config,
    }
    if args.affinity is not None:
        given = [flag for flag, value in checkpoint_only.items() if value is not None]
        if given:
            parser.error(
                f"{', '.join(given)} can only be used with --checkpoint (to choose the data the "
                "affinity is computed from); --affinity reads an affinity that is computed already"
            )
    else:
        args.data = DEFAULT_DATA if args.data is None else args.data
        args.batch_size = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
    if args.max_batches is not None and args.max_batches < 1:
        parser.error(f"--max-batches must be at least 1; got {args.max_batches}")
    if args.num_towers < 1:
        parser.error(f"--num-towers must be at least 1; got {args.num_towers}")
    if math.isnan(args.max_size_ratio) or args.max_size_ratio < 1.0:
        parser.error(
            "--max-size-ratio must be >= 1 (largest tower / smallest tower); got "
            f"{args.max_size_ratio}"
        )
    if not 0 <= args.seed <= _MAX_SEED:
        parser.error(f"--seed must be between 0 and 2**32 - 1 = {_MAX_SEED}; got {args.seed}")
    if args.embed_dim < 1:
        parser.error(f"--embed-dim must be at least 1; got {args.embed_dim}")


def _checked_pre_groups(
    args: argparse.Namespace, feature_names: Sequence[str]
) -> list[list[int]] | None:
    """The ``--pre-groups`` over ``feature_names``, after every check the partition will make of
    its arguments (its size-ratio warning is left to the partition, not shown twice)."""
    pre_groups = (
        load_pre_groups(args.pre_groups, feature_names) if args.pre_groups is not None else None
    )
    check_partition_arguments(
        len(feature_names),
        args.num_towers,
        pre_groups=pre_groups,
        max_size_ratio=args.max_size_ratio,
        embed_dim=args.embed_dim,
        seed=args.seed,
        feature_names=feature_names,
        warn=False,
    )
    return pre_groups


class _Stop:
    """The ``SIGTERM`` handler of :func:`main`: the signal (kill, timeout, a scheduler's) as
    ``SystemExit(143)``, so that the staging folder and the folders the run made are removed on
    the way out, as on an error; held back while the files are put in place (:meth:`held`), so
    that they are all new or all as they were."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._holding = False

    def __call__(self, signum: int, frame: object) -> None:
        self.signum = signum
        if not self._holding:
            raise SystemExit(128 + signum)

    @contextmanager
    def held(self) -> Iterator[None]:
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self.signum is not None:
            raise SystemExit(128 + self.signum)


def _publish(staging: Path, out: Path, names: Sequence[str], *, overwrite: bool) -> None:
    """Move the staged files ``names`` into ``out``: with ``overwrite`` over an earlier
    partition's; without, never over a file, even one that appeared while this partition was
    made (another ``dmt-partition`` into the same ``--out``), and then none of them."""
    if overwrite:
        for name in names:
            os.replace(staging / name, out / name)
        return
    placed: list[Path] = []
    try:
        for name in names:
            os.link(staging / name, out / name)  # fails if the name exists, unlike os.replace
            placed.append(out / name)
    except OSError as error:
        for path in placed:
            path.unlink()
        if isinstance(error, FileExistsError):
            raise ValueError(
                f"{out / name} appeared while this partition was made (another dmt-partition "
                "with this --out?) and is kept, and none of this partition's files are written; "
                "choose another --out, or pass --overwrite to replace them"
            ) from None
        raise


def _write_partition(
    args: argparse.Namespace, written: Sequence[str], stop: _Stop
) -> tuple[PartitionResult, np.ndarray, list[str]]:
    """Partition as ``args`` say and write the files ``written`` into ``args.out``; returns the
    result, the affinity and its feature names."""
    # every file is written into a staging folder beside the others and put in place once all
    # are written: a failure (a heatmap that cannot be drawn, a full disk, SIGTERM) leaves none
    # of them half-made, and an earlier partition whole
    made = [d for d in (args.out, *args.out.parents) if not d.exists()]
    staging = args.out / f".dmt-partition-{os.getpid()}"
    try:
        staging.mkdir(parents=True)
        if args.checkpoint is not None:
            checked: list[list[list[int]] | None] = []
            affinity, feature_names = checkpoint_affinity(
                args.checkpoint,
                args.data,
                max_batches=args.max_batches,
                batch_size=args.batch_size,
                config=args.config,
                check=lambda names: checked.append(_checked_pre_groups(args, names)),
            )
            pre_groups = checked[0]
            source = f"checkpoint {args.checkpoint} on {args.data}"
        else:
            affinity, feature_names = load_affinity(args.affinity)
            pre_groups = _checked_pre_groups(args, feature_names)
            source = str(args.affinity)
        result = run_partition(
            affinity,
            feature_names,
            args.num_towers,
            strategy=args.strategy,
            max_size_ratio=args.max_size_ratio,
            embed_dim=args.embed_dim,
            seed=args.seed,
            pre_groups=pre_groups,
            affinity_source=source,
            out_dir=staging,
        )
        if args.checkpoint is not None:
            save_affinity(staging / AFFINITY_FILE, affinity, feature_names)
        with stop.held():
            _publish(staging, args.out, written, overwrite=args.overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for d in made:  # deepest first; only what this run made, and only when empty
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
    return result, affinity, feature_names


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {str(args.out)!r} is a file; expected a folder (made if missing)")
    written = [PARTITION_FILE, HEATMAP_FILE]
    if args.checkpoint:
        written += [AFFINITY_FILE, sidecar_path(AFFINITY_FILE).name]
    existing = [str(args.out / name) for name in written if (args.out / name).exists()]
    if existing and not args.overwrite:
        parser.error(
            f"{', '.join(existing)} exist already (an earlier partition); choose another --out, "
            "or pass --overwrite to replace them"
        )
    stop = _Stop()
    handler = signal.signal(signal.SIGTERM, stop)
    try:
        result, affinity, feature_names = _write_partition(args, written, stop)
    except (OSError, ValueError) as error:
        if stop.signum is None:
            parser.error(str(error))  # exits with status 2 and the message on stderr
        raise SystemExit(128 + stop.signum) from None  # a library's error over the SystemExit
    finally:
        signal.signal(signal.SIGTERM, handler)
        if stop.signum is not None:
            name = signal.Signals(stop.signum).name
            print(f"dmt-partition: stopped by {name}", file=sys.stderr)
    print(format_summary(result, affinity, feature_names))
    print("wrote " + ", ".join(str(args.out / name) for name in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
