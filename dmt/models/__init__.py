"""Plain (unsharded) models: DLRM, DCNv2, tower modules and DMT models. No torch.distributed here."""

from dmt.models.dcn import DCN
from dmt.models.dlrm import DLRM
from dmt.models.dmt import DMTDCN, DMTDLRM, DMTModel, Tower, copy_base_weights
from dmt.models.factory import (
    build_dmt_model,
    build_interaction,
    build_model,
    build_rec_model,
    build_tower_module,
    embedding_parameters,
    embedding_tables,
    table_name,
)
from dmt.models.interaction import CrossInteraction, DotInteraction
from dmt.models.partition import (
    check_partition,
    load_partition_file,
    naive_partition,
    per_feature_partition,
    resolve_partition,
)
from dmt.models.rec_model import RecModel
from dmt.models.tower_modules import DCNTowerModule, DLRMTowerModule, PassThrough, TowerModule

__all__ = [
    "DCN",
    "DLRM",
    "DMTDCN",
    "DMTDLRM",
    "CrossInteraction",
    "DCNTowerModule",
    "DLRMTowerModule",
    "DMTModel",
    "DotInteraction",
    "PassThrough",
    "RecModel",
    "Tower",
    "TowerModule",
    "build_dmt_model",
    "build_interaction",
    "build_model",
    "build_rec_model",
    "build_tower_module",
    "check_partition",
    "copy_base_weights",
    "embedding_parameters",
    "embedding_tables",
    "load_partition_file",
    "naive_partition",
    "per_feature_partition",
    "resolve_partition",
    "table_name",
]
