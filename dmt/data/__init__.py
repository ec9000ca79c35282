"""Data: dmt's synthetic generator, Criteo preprocessing and loaders, all as BatchSources."""

from __future__ import annotations

from dataclasses import dataclass, field

from dmt.config import DataConfig
from dmt.data.source import BatchSource, InMemorySource, make_kjt, rank_slice
from dmt.data.synthetic import SyntheticWorld


def sparse_feature_names(num_sparse: int) -> list[str]:
    return [f"cat_{i}" for i in range(num_sparse)]


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
    info: dict = field(default_factory=dict)


def build_synthetic(cfg: DataConfig, *, rank: int, world_size: int, seed: int) -> DataBundle:
    s = cfg.synthetic
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
    """Build the splits of ``cfg`` for ``rank`` of ``world_size`` (data order seeded by ``seed``)."""
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
    "make_kjt",
    "rank_slice",
    "sparse_feature_names",
]
