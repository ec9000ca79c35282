"""Build a model from its typed config (the edge where config becomes objects).

The model itself (``model._target_``: a builder, :func:`build_rec_model` by default), the
interaction (``model.interaction``) and the tower modules (``model.tower``) are built with
``hydra.utils.instantiate`` from their ``_target_``; this module adds the sizes they depend on
(features, embedding dim, vectors) and the tables, and assembles :class:`RecModel` or
:class:`DMTModel`. No component is chosen by name here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import MISSING, OmegaConf
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

from dmt.config import ModelConfig
from dmt.models.dmt import DMTModel, Tower
from dmt.models.interaction import Interaction
from dmt.models.partition import check_partition, resolve_partition, tower_sizes
from dmt.models.rec_model import RecModel
from dmt.models.tower_modules import TowerModule

BUILD_REC_MODEL = "dmt.models.factory.build_rec_model"
"""The default ``model._target_`` (:func:`build_rec_model`)."""


def table_name(feature: str) -> str:
    """Name of the embedding table of ``feature`` (one table per feature)."""
    return f"t_{feature}"


def embedding_tables(
    feature_names: list[str], num_embeddings: list[int], dim: int, pooling: str = "sum"
) -> list[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per feature."""
    if len(feature_names) != len(num_embeddings):
        raise ValueError(
            f"{len(feature_names)} sparse features but {len(num_embeddings)} table sizes "
            "(model.num_embeddings_per_feature must have one entry per sparse feature)"
        )
    pool = PoolingType.SUM if pooling == "sum" else PoolingType.MEAN
    return [
        EmbeddingBagConfig(
            name=table_name(f), embedding_dim=dim, num_embeddings=n, feature_names=[f], pooling=pool
        )
        for f, n in zip(feature_names, num_embeddings)
    ]


def embedding_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of every embedding table of ``model`` (the base model's EBC or each DMT
    tower's): what the fused sparse optimizer updates."""
    return [
        p for m in model.modules() if isinstance(m, EmbeddingBagCollection) for p in m.parameters()
    ]


def _instantiate(node: Any, setting: str, **sizes: int) -> Any:
    """``hydra.utils.instantiate(node, **sizes)``, its errors as a ``ValueError`` naming ``setting``
    (the class's own message for a bad value; the ``_target_`` when it cannot be imported).

    ``node``: a component config (dataclass, dict or DictConfig) with a ``_target_``."""
    if node is None or node == MISSING:
        raise ValueError(
            f"{setting} is not set: give it a config with a _target_ (e.g. DotInteractionConfig(), "
            "DLRMTowerConfig(), or a conf/ YAML)"
        )
    if isinstance(node, str):  # e.g. model.tower=dcn: a name where its config group was meant
        raise ValueError(
            f"{setting}={node!r} is a string, not a config with a _target_: pick a conf/ YAML by "
            "its config group (e.g. tower=dcn, model=dcn), or give a config (e.g. "
            "DotInteractionConfig(), DLRMTowerConfig())"
        )
    conf = OmegaConf.create(node)
    target = conf.get("_target_")
    if not isinstance(target, str) or not target:
        raise ValueError(f"{setting} has no _target_ (the class to build), got {dict(conf)}")
    try:
        return instantiate(conf, **sizes)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, ValueError | TypeError):
            raise ValueError(f"{setting}: {cause}") from cause
        raise ValueError(f"{setting}: cannot build _target_={target!r}: {e}") from e


def build_tower_module(cfg: Any, *, num_features: int, embedding_dim: int) -> TowerModule:
    """The tower module ``cfg`` (``model.tower``: ``_target_`` and settings) describes for a
    tower of ``num_features`` features of dim ``embedding_dim``."""
    module = _instantiate(
        cfg, "model.tower", num_features=num_features, embedding_dim=embedding_dim
    )
    if not isinstance(module, TowerModule):
        raise TypeError(
            f"model.tower built a {type(module).__name__}, not a dmt.models.TowerModule "
            "(forward (B, F_t, N) -> (B, V_t, D) with num_features, embedding_dim, num_vectors, dim)"
        )
    return module


def build_interaction(cfg: ModelConfig, *, num_vectors: int, dim: int) -> Interaction:
    """The global interaction ``cfg.interaction`` over ``num_vectors`` sparse vectors of size
    ``dim`` and the bottom MLP's output."""
    interaction = _instantiate(
        cfg.interaction,
        "model.interaction",
        num_vectors=num_vectors,
        dim=dim,
        dense_dim=cfg.bottom_mlp[-1],
    )
    if not isinstance(getattr(interaction, "output_dim", None), int):
        raise TypeError(
            f"model.interaction built a {type(interaction).__name__} without an int output_dim "
            "(the top MLP's input size)"
        )
    return interaction


def check_components(cfg: ModelConfig, feature_names: Sequence[str] | None = None) -> None:
    """Build ``cfg``'s interaction and, for a DMT model, its tower module for each tower size of
    its partition over ``feature_names`` (:func:`~dmt.models.partition.tower_sizes`; where they
    are not known, one size it builds for: :func:`_some_tower_module`) on the meta device, so
    that their own checks fail before any data is read (:func:`dmt.config.validate`), and import
    the model builder ``cfg._target_``. The interaction is built over the vectors the model
    gives it: one per feature, or the towers' modules' ``num_vectors`` summed (one vector where
    the features or the towers are not known)."""
    model_builder(cfg)
    with torch.device("meta"):
        dim = cfg.embedding_dim
        num_vectors = len(feature_names) if feature_names else 1
        if cfg.partition.kind != "none":
            known = None if feature_names is None else tower_sizes(cfg.partition, feature_names)
            if known is None:
                dim = _some_tower_module(cfg, len(feature_names) if feature_names else 1).dim
                num_vectors = 1
            else:
                modules = {
                    n: build_tower_module(
                        cfg.tower, num_features=n, embedding_dim=cfg.embedding_dim
                    )
                    for n in sorted(set(known))
                }
                dim = modules[min(known)].dim
                num_vectors = sum(modules[n].num_vectors for n in known)
        build_interaction(cfg, num_vectors=num_vectors, dim=dim)


def _some_tower_module(cfg: ModelConfig, num_features: int) -> TowerModule:
    """The tower module of the first tower size, from one feature to ``num_features``, that it
    builds for; the error of one feature where it builds for none. For towers not known (yet: a
    ``tp`` partition file still to be written, or missing, which building the model names): a
    module that refuses some sizes (a tower of one feature) is not refused for a guess."""
    try:
        return build_tower_module(cfg.tower, num_features=1, embedding_dim=cfg.embedding_dim)
    except ValueError as error:
        for n in range(2, num_features + 1):
            try:
                return build_tower_module(
                    cfg.tower, num_features=n, embedding_dim=cfg.embedding_dim
                )
            except ValueError:
                continue
        raise error


def model_builder(cfg: ModelConfig) -> tuple[str, Callable[..., Any]]:
    """``cfg._target_`` and the builder it names (imported, not called)."""
    target = getattr(cfg, "_target_", None)
    if not isinstance(target, str) or not target:
        raise ValueError(
            f"model._target_ is not set: give the model builder, e.g. "
            f"model._target_={BUILD_REC_MODEL} (got {target!r})"
        )
    try:
        builder = instantiate({"_target_": target, "_partial_": True})
    except InstantiationException as e:
        raise ValueError(f"model._target_={target!r} cannot be imported: {e}") from e
    return target, builder


def build_model(
    cfg: ModelConfig,
    *,
    feature_names: list[str],
    cardinalities: list[int],
    num_dense: int,
    table_device: torch.device | str = "cpu",
    dense_device: torch.device | str = "cpu",
) -> RecModel | DMTModel:
    """The model ``cfg`` describes: ``cfg._target_`` (``model._target_``, a builder such as
    :func:`build_rec_model`) called with ``cfg`` and the data's sizes.

    A builder takes ``(cfg, *, feature_names, cardinalities, num_dense, table_device,
    dense_device)`` and returns a :class:`RecModel` or :class:`DMTModel` (or a subclass: the
    trainer shards, checkpoints and evaluates those). ``table_device``/``dense_device`` as in
    :func:`build_rec_model`.
    """
    target, builder = model_builder(cfg)
    model = builder(
        cfg,
        feature_names=feature_names,
        cardinalities=cardinalities,
        num_dense=num_dense,
        table_device=table_device,
        dense_device=dense_device,
    )
    if not isinstance(model, RecModel | DMTModel):
        raise TypeError(
            f"model._target_={target!r} built a {type(model).__name__}, not a "
            "dmt.models.RecModel or dmt.models.DMTModel (the trainer shards, checkpoints and "
            "evaluates those; subclass one of them)"
        )
    return model


def build_rec_model(
    cfg: ModelConfig,
    *,
    feature_names: list[str],
    cardinalities: list[int],
    num_dense: int,
    table_device: torch.device | str = "cpu",
    dense_device: torch.device | str = "cpu",
    model_class: type[RecModel] = RecModel,
) -> RecModel | DMTModel:
    """The default ``model._target_``: the base model (:class:`RecModel`: tables, bottom MLP,
    ``cfg.interaction``, top MLP) for the given features, or its DMT form when ``cfg.partition``
    describes towers (see :func:`build_dmt_model`).

    Tables go on ``table_device``: ``meta`` before sharding (the sharder allocates them) or for
    accounting. Dense modules go on ``dense_device``; keep it real for training, since modules
    moved off ``meta`` later get uninitialized non-persistent buffers.

    ``model_class``: the base model's class, a :class:`RecModel` subclass taking its constructor's
    arguments (a new model's builder passes its own; see docs/tower_modules.md). DMT forms are
    :class:`DMTModel`s.
    """
    if cfg.partition.kind != "none":
        if model_class is not RecModel:
            raise ValueError(
                f"{model_class.__name__} has no DMT form: leave model.partition unset "
                f"(got model.partition.kind={cfg.partition.kind!r})"
            )
        return build_dmt_model(
            cfg,
            resolve_partition(cfg.partition, feature_names),
            feature_names=feature_names,
            cardinalities=cardinalities,
            num_dense=num_dense,
            table_device=table_device,
            dense_device=dense_device,
        )
    sizes = table_sizes(cfg, feature_names, cardinalities)
    ebc = EmbeddingBagCollection(
        tables=embedding_tables(feature_names, sizes, cfg.embedding_dim, cfg.pooling),
        device=torch.device(table_device),
    )
    with torch.device(dense_device):
        interaction = build_interaction(cfg, num_vectors=len(feature_names), dim=cfg.embedding_dim)
        return model_class(
            ebc,
            num_dense,
            list(cfg.bottom_mlp),
            interaction,
            list(cfg.top_mlp),
            bottom_final_activation=cfg.bottom_final_activation,
            dropout=cfg.dropout,
        )


def table_sizes(cfg: ModelConfig, feature_names: list[str], cardinalities: list[int]) -> list[int]:
    """Rows of each feature's table: ``model.num_embeddings_per_feature``, or the data's
    ``cardinalities`` (ids ``0 .. cardinality - 1``). A table with fewer rows than its
    feature has ids is refused: TorchRec only warns and the lookups go out of range."""
    sizes = list(cfg.num_embeddings_per_feature or cardinalities)
    if len(sizes) != len(feature_names):
        raise ValueError(
            f"{len(feature_names)} sparse features but {len(sizes)} table sizes "
            "(model.num_embeddings_per_feature must have one entry per sparse feature)"
        )
    for i, (rows, ids) in enumerate(zip(sizes, cardinalities)):
        if rows < ids:
            raise ValueError(
                f"model.num_embeddings_per_feature[{i}] = {rows} rows for {feature_names[i]}, "
                f"whose ids run to {ids - 1} ({ids} in the data): every id needs a row; set it "
                "to at least that, or leave model.num_embeddings_per_feature unset (the data's "
                "sizes)"
            )
    return sizes


def build_dmt_model(
    cfg: ModelConfig,
    partition: list[list[str]],
    *,
    feature_names: list[str],
    cardinalities: list[int],
    num_dense: int,
    table_device: torch.device | str = "cpu",
    dense_device: torch.device | str = "cpu",
) -> DMTModel:
    """The DMT form of ``cfg``'s model with towers ``partition`` (feature names per tower) and
    ``cfg.tower`` modules, then ``cfg.interaction`` over the towers' vectors; ``cfg.partition`` is
    not read, so any partition can be passed.

    Every tower gets its own EBC (the features' tables, as in the base model) and tower module.
    """
    check_partition(partition, feature_names)
    sizes = table_sizes(cfg, feature_names, cardinalities)
    rows = dict(zip(feature_names, sizes))
    N = cfg.embedding_dim
    towers = []
    for features in partition:
        ebc = EmbeddingBagCollection(
            tables=embedding_tables(features, [rows[f] for f in features], N, cfg.pooling),
            device=torch.device(table_device),
        )
        with torch.device(dense_device):
            module = build_tower_module(cfg.tower, num_features=len(features), embedding_dim=N)
        towers.append(Tower(ebc, module))
    dims = {t.tower_module.dim for t in towers}
    if len(dims) != 1:
        raise ValueError(
            f"tower modules output vectors of sizes {sorted(dims)}; the global interaction needs one D"
        )
    with torch.device(dense_device):
        interaction = build_interaction(
            cfg, num_vectors=sum(t.tower_module.num_vectors for t in towers), dim=dims.pop()
        )
        return DMTModel(
            towers,
            num_dense,
            list(cfg.bottom_mlp),
            interaction,
            list(cfg.top_mlp),
            feature_names=feature_names,
            bottom_final_activation=cfg.bottom_final_activation,
            dropout=cfg.dropout,
        )
