"""Build a model from its typed config (the edge where config becomes objects)."""

from __future__ import annotations

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType

from dmt.config import ModelConfig, TowerConfig
from dmt.models.dcn import DCN
from dmt.models.dlrm import DLRM
from dmt.models.dmt import DMTDCN, DMTDLRM, DMTModel, Tower
from dmt.models.partition import check_partition, resolve_partition
from dmt.models.tower_modules import DCNTowerModule, DLRMTowerModule, PassThrough, TowerModule


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


def build_model(
    cfg: ModelConfig,
    *,
    feature_names: list[str],
    cardinalities: list[int],
    num_dense: int,
    table_device: torch.device | str = "cpu",
    dense_device: torch.device | str = "cpu",
) -> nn.Module:
    """DLRM or DCN for the given features, or their DMT form when ``cfg.partition.kind`` is not
    ``"none"`` (see :func:`build_dmt_model`).

    Tables go on ``table_device``: ``meta`` before sharding (the sharder allocates them) or for
    accounting. Dense modules go on ``dense_device``; keep it real for training, since modules
    moved off ``meta`` later get uninitialized non-persistent buffers.
    """
    if cfg.partition.kind != "none":
        return build_dmt_model(
            cfg, resolve_partition(cfg.partition, feature_names), feature_names=feature_names,
            cardinalities=cardinalities, num_dense=num_dense, table_device=table_device,
            dense_device=dense_device,
        )
    sizes = list(cfg.num_embeddings_per_feature or cardinalities)
    ebc = EmbeddingBagCollection(
        tables=embedding_tables(feature_names, sizes, cfg.embedding_dim, cfg.pooling),
        device=torch.device(table_device),
    )
    with torch.device(dense_device):
        if cfg.name == "dlrm":
            model: nn.Module = DLRM(
                ebc, num_dense, list(cfg.bottom_mlp), list(cfg.top_mlp),
                bottom_final_activation=cfg.bottom_final_activation,
            )
        elif cfg.name == "dcn":
            model = DCN(
                ebc, num_dense, list(cfg.bottom_mlp), list(cfg.top_mlp),
                num_cross_layers=cfg.dcn_num_layers, low_rank=cfg.dcn_low_rank,
                bottom_final_activation=cfg.bottom_final_activation,
            )
        else:
            raise ValueError(f"model.name={cfg.name!r} is not supported; expected one of ['dlrm', 'dcn']")
    return model


def build_tower_module(
    cfg: TowerConfig, *, num_features: int, embedding_dim: int, model: ModelConfig | None = None
) -> TowerModule:
    """The tower module ``cfg`` describes for a tower of ``num_features`` features of dim
    ``embedding_dim``; DCN towers take unset CrossNet sizes from ``model``."""
    if cfg.module == "passthrough":
        return PassThrough(num_features, embedding_dim)
    if cfg.module == "dlrm":
        return DLRMTowerModule(num_features, embedding_dim, cfg.dim, c=cfg.c, p=cfg.p, skip_square=cfg.skip_square)
    if cfg.module == "dcn":
        layers, rank = cfg.dcn_num_layers, cfg.dcn_low_rank
        if model is not None:
            layers = model.dcn_num_layers if layers is None else layers
            rank = model.dcn_low_rank if rank is None else rank
        if layers is None or rank is None:
            raise ValueError("a dcn tower module needs dcn_num_layers and dcn_low_rank")
        return DCNTowerModule(num_features, embedding_dim, cfg.dim, num_cross_layers=layers, low_rank=rank, c=cfg.c, p=cfg.p, skip_square=cfg.skip_square)
    raise ValueError(
        f"model.tower.module={cfg.module!r} is not supported; expected one of ['passthrough', 'dlrm', 'dcn']"
    )


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
    """DMT-DLRM or DMT-DCN (``cfg.name``) with towers ``partition`` (feature names per tower) and
    ``cfg.tower`` modules; ``cfg.partition`` is not read, so any partition can be passed.

    Every tower gets its own EBC (the features' tables, as in the base model) and tower module.
    """
    check_partition(partition, feature_names)
    sizes = list(cfg.num_embeddings_per_feature or cardinalities)
    if len(sizes) != len(feature_names):
        raise ValueError(
            f"{len(feature_names)} sparse features but {len(sizes)} table sizes "
            "(model.num_embeddings_per_feature must have one entry per sparse feature)"
        )
    rows = dict(zip(feature_names, sizes))
    N = cfg.embedding_dim
    towers = []
    for features in partition:
        ebc = EmbeddingBagCollection(
            tables=embedding_tables(features, [rows[f] for f in features], N, cfg.pooling),
            device=torch.device(table_device),
        )
        with torch.device(dense_device):
            module = build_tower_module(cfg.tower, num_features=len(features), embedding_dim=N, model=cfg)
        towers.append(Tower(ebc, module))
    with torch.device(dense_device):
        if cfg.name == "dlrm":
            return DMTDLRM(
                towers, num_dense, list(cfg.bottom_mlp), list(cfg.top_mlp), feature_names=feature_names,
                bottom_final_activation=cfg.bottom_final_activation,
            )
        if cfg.name == "dcn":
            return DMTDCN(
                towers, num_dense, list(cfg.bottom_mlp), list(cfg.top_mlp), feature_names=feature_names,
                num_cross_layers=cfg.dcn_num_layers, low_rank=cfg.dcn_low_rank,
                bottom_final_activation=cfg.bottom_final_activation,
            )
    raise ValueError(f"model.name={cfg.name!r} is not supported; expected one of ['dlrm', 'dcn']")
