"""Data: dmt's synthetic generator, Criteo preprocessing and loaders, all as BatchSources."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dmt.config import DataConfig
from dmt.data.source import (
    BatchSource,
    InMemorySource,
    closing_batches,
    make_kjt,
    pad_empty_batch,
    rank_slice,
)
from dmt.data.synthetic import SyntheticWorld


def sparse_feature_names(num_sparse: int) -> list[str]:
    return [f"cat_{i}" for i in range(num_sparse)]


def config_feature_names(cfg: DataConfig) -> list[str] | None:
    """The sparse features' names the model is built over, from the config alone (no data is
    read): synthetic data's ``num_sparse``; Criteo's 26, every preprocessed directory's
    (``None`` where the config gives no count: a bad ``data.kind`` or ``num_sparse``)."""
    if cfg.kind == "criteo":
        from dmt.data.criteo_parse import NUM_SPARSE  # noqa: PLC0415

        return sparse_feature_names(NUM_SPARSE)
    num_sparse = cfg.synthetic.num_sparse if cfg.kind == "synthetic" else None
    if not isinstance(num_sparse, int) or num_sparse < 1:
        return None
    return sparse_feature_names(num_sparse)


@dataclass
class DataBundle:
    """The three splits and the schema the model is built from."""

    train: BatchSource
    val: BatchSource
    test: BatchSource
    feature_names: list[str]
    cardinalities: list[int]
    num_dense: int
    planted_groups: list[list[int]] | None = None  # synthetic planted mode: true feature groups
    info: dict[str, Any] = field(default_factory=dict)
    #: what identifies the training rows where a resume may move them (Criteo's
    #: ``raw_path``/``preprocessed_dir``), recorded in every checkpoint; ``None``: the config
    #: alone fixes them (synthetic: ``data.synthetic.*``, which a resume may not change)
    train_fingerprint: dict[str, Any] | None = None


def check_train_rows(num_rows: int, batch_size: int, *, what: str, world_size: int = 1) -> None:
    """Stop before training when the training split holds no full global batch.

    Training drops the final partial global batch (``drop_last``; ``batch_size`` is global, split
    over the ``world_size`` ranks), so with fewer rows than one batch it would run no step.

    Args:
        num_rows: rows of the training split.
        batch_size: ``data.batch_size``, the global batch.
        what: the setting or directory that gave ``num_rows``, for the message.
        world_size: ranks the batch is split over (named in the message).

    Raises:
        ValueError: ``num_rows < batch_size``, naming ``what`` and ``data.batch_size``.
    """
    if num_rows >= batch_size:
        return
    ranks = f", the global batch over {world_size} ranks" if world_size > 1 else ""
    amount = "holds no training rows" if num_rows == 0 else "is smaller than one batch"
    raise ValueError(
        f"{what} {amount} (data.batch_size={batch_size}{ranks}): training drops the last "
        "partial batch, so it would run no step; provide at least data.batch_size training "
        "rows or lower data.batch_size"
    )


def build_synthetic(cfg: DataConfig, *, rank: int, world_size: int, seed: int) -> DataBundle:
    s = cfg.synthetic
    check_train_rows(
        s.num_train,
        cfg.batch_size,
        what=f"data.synthetic.num_train={s.num_train}",
        world_size=world_size,
    )
    world = SyntheticWorld(s)
    names = sparse_feature_names(s.num_sparse)

    def source(split: str, n: int, train: bool) -> InMemorySource:
        data = world.generate(split, n)
        return InMemorySource(
            data.dense,
            data.sparse,
            data.labels,
            names,
            batch_size=cfg.batch_size if train else cfg.eval_batch_size,
            rank=rank,
            world_size=world_size,
            shuffle=train and cfg.shuffle,
            seed=seed,
            drop_last=train,
            true_probs=data.true_probs,
        )

    return DataBundle(
        train=source("train", s.num_train, True),
        val=source("val", s.num_val, False),
        test=source("test", s.num_test, False),
        feature_names=names,
        cardinalities=[int(c) for c in world.cards],
        num_dense=s.num_dense,
        planted_groups=world.feature_groups if s.mode == "planted" else None,
    )


def build_data(cfg: DataConfig, *, rank: int = 0, world_size: int = 1, seed: int = 0) -> DataBundle:
    """Build the splits of ``cfg`` for ``rank`` of ``world_size`` (data order seeded by ``seed``).

    Raises:
        ValueError: the training split holds fewer rows than one global batch (see
            :func:`check_train_rows`), or bad or damaged data.
    """
    if cfg.kind == "synthetic":
        return build_synthetic(cfg, rank=rank, world_size=world_size, seed=seed)
    if cfg.kind == "criteo":
        from dmt.data.criteo_dataset import build_criteo  # noqa: PLC0415 (optional heavy import)

        return build_criteo(cfg, rank=rank, world_size=world_size, seed=seed)
    raise ValueError(f"data.kind={cfg.kind!r} is not supported; expected 'synthetic' or 'criteo'")


__all__ = [
    "BatchSource",
    "DataBundle",
    "InMemorySource",
    "build_data",
    "check_train_rows",
    "closing_batches",
    "make_kjt",
    "pad_empty_batch",
    "rank_slice",
    "sparse_feature_names",
]
