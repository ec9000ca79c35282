"""Feature-to-tower partitions of a DMT model: lists of feature names, one list per tower.

Sources: :func:`naive_partition` (the paper's strided baseline, §5.2.3), :func:`per_feature_partition`
(one tower per feature, Table 3), :func:`load_partition_file` (a Tower Partitioner YAML,
``towers: [[feature names...], ...]``, as ``dmt-partition`` writes it) or explicit lists.
:func:`check_partition` says what is wrong with one; :func:`resolve_partition` turns a
:class:`~dmt.config.PartitionConfig` into one.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import yaml

from dmt.config import PartitionConfig


def describe_features(names: Sequence[str]) -> str:
    """``cat_0..cat_25`` for a numbered run of names, else the list."""
    match = re.fullmatch(r"(.*?)0", names[0]) if names else None
    if match and len(names) > 2 and list(names) == [f"{match[1]}{i}" for i in range(len(names))]:
        return f"{names[0]}..{names[-1]}"
    return ", ".join(names)


def check_partition(partition: Sequence[Sequence[str]], feature_names: Sequence[str]) -> None:
    """Raise ``ValueError`` unless every feature of ``feature_names`` is in exactly one non-empty tower."""
    if len(partition) == 0:
        raise ValueError("partition has no towers")
    known = set(feature_names)
    tower_of: dict[str, int] = {}
    for t, tower in enumerate(partition):
        if isinstance(tower, str):
            raise ValueError(
                f"partition tower {t} is the string {tower!r}, not a list of feature names"
            )
        if len(tower) == 0:
            raise ValueError(f"partition tower {t} is empty")
        for f in tower:
            if f not in known:
                raise ValueError(
                    f"feature {f!r} is not a sparse feature of the data (expected one of "
                    f"{describe_features(feature_names)}); it is in partition tower {t}"
                )
            if f in tower_of:
                raise ValueError(f"feature {f!r} appears in towers {tower_of[f]} and {t}")
            tower_of[f] = t
    missing = [f for f in feature_names if f not in tower_of]
    if missing:
        raise ValueError(
            f"partition misses feature(s) {missing}: every sparse feature must be in exactly one tower"
        )


def strided_towers(num_features: int, num_towers: int) -> list[list[int]]:
    """Feature indices of the paper's naive towers (§5.2.3): tower ``t`` gets ``t, t + T, ...``.

    The one definition of the strided assignment: :func:`naive_partition` names its features,
    and the Tower Partitioner's baseline (:func:`dmt.partitioner.naive_partition`) is this.
    ``num_towers`` is not checked here (more towers than features leave towers empty).

    Example::

        >>> strided_towers(26, 8)[:3]
        [[0, 8, 16, 24], [1, 9, 17, 25], [2, 10, 18]]
    """
    return [list(range(tower, num_features, num_towers)) for tower in range(num_towers)]


def naive_partition(feature_names: Sequence[str], num_towers: int) -> list[list[str]]:
    """The paper's naive baseline: tower ``t`` gets features ``t, t + T, t + 2T, ...``.

    Example::

        >>> [len(t) for t in naive_partition([f"cat_{i}" for i in range(26)], 8)]
        [4, 4, 3, 3, 3, 3, 3, 3]
    """
    F = len(feature_names)
    if not isinstance(num_towers, int) or not 1 <= num_towers <= F:
        raise ValueError(
            f"num_towers={num_towers!r} must be an integer in [1, {F}] for {F} sparse features "
            "(more towers than features would leave towers empty)"
        )
    return [[feature_names[i] for i in tower] for tower in strided_towers(F, num_towers)]


def per_feature_partition(feature_names: Sequence[str]) -> list[list[str]]:
    """One tower per feature, in feature order (paper Table 3: SPTT with pass-through towers)."""
    return [[f] for f in feature_names]


def describe_yaml_error(error: yaml.YAMLError) -> str:
    """A YAML parse error as ``<problem> at line L, column C`` (PyYAML's own text names the
    parsed string, ``"<unicode string>"``, not the file)."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None)
    if problem is None:
        return str(error)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = getattr(error, "context", None)
    return f"{problem}{where}" + (f" ({context})" if context else "")


def load_partition_file(path: str | Path) -> list[list[str]]:
    """The ``towers`` of a partition YAML (other keys, e.g. TP's provenance, are ignored)."""
    path = Path(path)
    if path.is_dir():  # e.g. dmt-partition's --out
        raise ValueError(
            f"partition file {str(path)!r} is a folder; expected a partition YAML file "
            f"(dmt-partition --out {path} writes {str(path / 'partition.yaml')!r})"
        )
    if not path.is_file():
        raise ValueError(f"partition file {str(path)!r} does not exist")
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read partition file {str(path)!r}: {e}") from None
    except yaml.YAMLError as e:
        raise ValueError(
            f"partition file {str(path)!r} is not valid YAML: {describe_yaml_error(e)}"
        ) from None
    towers = document.get("towers") if isinstance(document, dict) else None
    if not isinstance(towers, list) or not all(isinstance(t, list) for t in towers):
        raise ValueError(
            f"partition file {str(path)!r} needs a 'towers' list of lists of feature names, "
            "e.g. towers: [[cat_0, cat_3], [cat_1, cat_2]]"
        )
    return [[str(f) for f in tower] for tower in towers]


def describe_towers_change(old: Sequence[Sequence[str]], new: Sequence[Sequence[str]]) -> str:
    """How partition ``new`` differs from ``old``, e.g. ``tower 0: [cat_0, cat_1] -> [cat_1,
    cat_0] (the same features in another order)``: the tower count, then the first 3 towers that
    differ."""
    parts = [] if len(old) == len(new) else [f"{len(old)} towers -> {len(new)}"]
    changed = [t for t in range(min(len(old), len(new))) if list(old[t]) != list(new[t])]
    for t in changed[:3]:
        order = " (the same features in another order)" if sorted(old[t]) == sorted(new[t]) else ""
        parts.append(f"tower {t}: [{', '.join(old[t])}] -> [{', '.join(new[t])}]{order}")
    if len(changed) > 3:
        parts.append(f"and {len(changed) - 3} more towers")
    return "; ".join(parts)


def _warn_if_file_changed(path: str, recorded: list[list[str]]) -> None:
    """Warn where the partition file ``path`` no longer holds the ``recorded`` towers."""
    try:
        now = load_partition_file(path)
    except ValueError as e:
        warnings.warn(
            f"model.partition.path={path}: {e}; building the towers the run trained with "
            "(model.partition.recorded_towers)",
            stacklevel=3,
        )
        return
    if now != recorded:
        warnings.warn(
            f"partition file {path!r} no longer holds the towers the run trained with "
            f"({describe_towers_change(recorded, now)}); building the towers the run trained "
            "with (model.partition.recorded_towers), not the file's",
            stacklevel=3,
        )


def tower_sizes(cfg: PartitionConfig, feature_names: Sequence[str]) -> list[int] | None:
    """Features of each tower ``cfg`` describes over ``feature_names``, known without the data
    (a ``tp`` partition's from its recorded towers or its file, without
    :func:`resolve_partition`'s warning); ``None`` where they are not towers that fit (yet: a
    ``tp`` file still to be written, a bad setting): building the model says what is wrong."""
    try:
        if cfg.kind != "tp":
            return [len(t) for t in resolve_partition(cfg, feature_names)]
        towers = cfg.recorded_towers
        if towers is None:
            towers = load_partition_file(cfg.path or "")
        check_partition(towers, feature_names)
    except ValueError:
        return None
    return [len(t) for t in towers]


def resolve_partition(cfg: PartitionConfig, feature_names: Sequence[str]) -> list[list[str]]:
    """The checked partition ``cfg`` describes, over ``feature_names``.

    A ``tp`` partition with ``recorded_towers`` (a checkpoint's config: the file's towers when
    the run trained) is those towers, with a warning if the file holds others by now (replaced,
    e.g. by ``dmt-partition --overwrite``, or edited): the run's weights fit only its own."""
    names = list(feature_names)
    if cfg.kind == "naive":
        if cfg.num_towers is None:
            raise ValueError("model.partition.kind='naive' needs model.partition.num_towers")
        try:
            partition = naive_partition(names, cfg.num_towers)
        except ValueError as e:
            raise ValueError(f"model.partition.num_towers: {e}") from None
    elif cfg.kind == "per_feature":
        partition = per_feature_partition(names)
    elif cfg.kind == "tp":
        if not cfg.path:
            raise ValueError(
                "model.partition.kind='tp' needs model.partition.path (a partition YAML)"
            )
        if cfg.recorded_towers is not None:
            partition = [list(t) for t in cfg.recorded_towers]
            try:
                check_partition(partition, names)
            except ValueError as e:
                raise ValueError(
                    f"model.partition.recorded_towers (the towers of {cfg.path} the run "
                    f"trained with): {e}"
                ) from None
            _warn_if_file_changed(cfg.path, partition)
        else:
            try:
                partition = load_partition_file(cfg.path)
                check_partition(partition, names)
            except ValueError as e:
                raise ValueError(f"model.partition.path={cfg.path}: {e}") from None
    elif cfg.kind == "explicit":
        partition = [list(t) for t in cfg.towers or []]
    else:
        raise ValueError(
            f"model.partition.kind={cfg.kind!r} does not describe towers; expected one of "
            "['naive', 'tp', 'per_feature', 'explicit']"
        )
    check_partition(partition, names)
    if cfg.num_towers is not None and len(partition) != cfg.num_towers:
        source = f" in {cfg.path!r}" if cfg.kind == "tp" else ""
        raise ValueError(
            f"model.partition.num_towers={cfg.num_towers} but the {cfg.kind} partition{source} "
            f"has {len(partition)} towers"
        )
    return partition
