"""Flat TorchRec sharding of a model's embedding tables (the baseline every DMT run compares to).

TorchRec's planner places every table (table-, column- or row-wise, whatever the device and world
allow) within the per-rank memory budget (``sharding.*``, :class:`dmt.memory.MemoryBudget`): on
CUDA in HBM, or UVM-cached (``FUSED_UVM_CACHING``) when HBM is short, as the SPTT plan does; on
CPU in host memory. ``DistributedModelParallel`` wraps the dense part in DDP.
:func:`sharding_plan_text` is the plan of either path as ``sharding_plan.txt`` shows it.

``sptt.comm_precision`` (``bf16``/``fp16``) quantizes the pooled-embedding all-to-alls and
reduce-scatters of the sharded tables, forward and backward, with TorchRec's own codecs
(:func:`flat_sharders`), so the baseline and SPTT compare at equal precision: the same dtype and
bytes on the wire, and gradients rounded before TorchRec divides them by the world size. One
difference remains, TorchRec's: its row-wise reduce-scatter sums in the low precision inside the
backend (NCCL rounds at every hop), where SPTT's sums the rounded partial sums in fp32
(:mod:`dmt.sptt.collectives`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fbgemm_qcomm_codec import (
    CommOp,
    CommType,
    QCommsConfig,
    QuantizedCommCodecs,
    get_qcomm_codecs,
)
from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from torchrec.distributed.fused_embeddingbag import FusedEmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
    get_default_sharders,
)
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.proposers import Proposer
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    KernelConfig,
    PlannerError,
    ShardingOption,
    TopologyFactory,
)
from torchrec.distributed.planner.types import TrainerConfig as PlannerTrainerConfig
from torchrec.distributed.types import (
    CacheParams,
    EnumerableShardingSpec,
    ModuleSharder,
    ParameterSharding,
    ShardingEnv,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim import RowWiseAdagrad

from dmt.config import ShardingConfig
from dmt.history import start_history
from dmt.memory import MemoryBudget
from dmt.run_dir import PLAN_FILE
from dmt.runtime import Runtime, world_number
from dmt.sptt.collectives import comm_dtype_of
from dmt.sptt.dmt_sharding import ShardedDMT

# Tables are never data-parallel: a replica per rank does not scale, and its optimizer state has
# another layout than a sharded table's, which would tie a checkpoint to the world size that
# chose it (DCP reshards table-, row- and column-wise shards into one another).
SHARDED_TYPES = [
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
]


def memory_budget(
    cfg: ShardingConfig, compute_device: str, *, gpus: Sequence[tuple[str, int]] = ()
) -> MemoryBudget:
    """The per-rank budget of the ``sharding`` config group on ``compute_device``.

    ``gpus``: ``(name, total bytes)`` of every rank's GPU (:func:`job_gpus`). ``sharding.hbm_gb``
    unset takes :data:`dmt.memory.AUTO_HBM_SHARE` of the smallest, so every rank plans with the
    same budget; set, it must fit in the smallest (``ValueError`` naming that GPU otherwise).
    """
    smallest = min(gpus, key=lambda g: g[1], default=None)
    memory = MemoryBudget.from_gib(
        compute_device,
        hbm_gb=cfg.hbm_gb,
        ddr_gb=cfg.ddr_gb,
        uvm_cache_load_factor=cfg.uvm_cache_load_factor,
        gpu_bytes=None if smallest is None else smallest[1],
        gpu_name=None if smallest is None else smallest[0],
    )
    if smallest is not None:
        memory.check_device(*smallest)
    return memory


def job_gpus(runtime: Runtime) -> list[tuple[str, int]]:
    """``(name, total memory in bytes)`` of every rank's GPU, by rank, e.g. ``("rank 3's cuda:1",
    85045903360)`` (one object all-gather on CUDA; none for a world of one); ``[]`` on CPU."""
    if runtime.device.type != "cuda":
        return []
    own = (
        f"rank {runtime.rank}'s {runtime.device}",
        torch.cuda.get_device_properties(runtime.device).total_memory,
    )
    if runtime.world_size == 1:
        return [own]
    found: list[tuple[str, int] | None] = [None] * runtime.world_size
    dist.all_gather_object(found, own)
    return [g for g in found if g is not None]


def compute_kernels(memory: MemoryBudget | None) -> list[str] | None:
    """Kernels the planner may pick, the same choice as the SPTT plan: the table in the rank's
    memory (``FUSED``) or, on CUDA, UVM-cached (``FUSED_UVM_CACHING``). ``None``: TorchRec's."""
    if memory is None:
        return None
    kernels = [EmbeddingComputeKernel.FUSED.value]
    if memory.compute_device == "cuda":
        kernels.append(EmbeddingComputeKernel.FUSED_UVM_CACHING.value)
    return kernels


# the sharding types that split a table into column blocks
COLUMN_SPLIT_TYPES = (ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value)


def table_constraints(
    module: nn.Module,
    memory: MemoryBudget | None = None,
    *,
    column_blocks: Mapping[str, int] | None = None,
) -> dict[str, ParameterConstraints]:
    """Planner constraints that keep every table of ``module`` sharded (never data-parallel)
    and, given ``memory``, limit the kernels to :func:`compute_kernels` with its cache load
    factor.

    ``column_blocks``: per table name, the column blocks a resumed checkpoint keeps its
    row-wise optimizer state in (:func:`dmt.checkpoint.row_wise_state_blocks`). TorchRec keeps
    that state (row-wise Adagrad's) per row and column block, so it reshards only into the same
    blocks: a table saved in ``k > 1`` blocks is split column-wise into the same ``k`` blocks
    (of ``dim / k`` columns) at any world size, and one saved whole is never split column-wise.

    Raises ``ValueError`` for a table whose dimension is not a multiple of 4 (FBGEMM's fused
    kernels, which TorchRec builds for every shard, take no other), or does not split into
    ``k`` blocks of a multiple of 4 columns, as TorchRec's are.
    """
    cuda = memory is not None and memory.compute_device == "cuda"
    cache = CacheParams(load_factor=memory.uvm_cache_load_factor) if cuda and memory else None
    blocks = column_blocks or {}
    out = {}
    for m in module.modules():
        if not isinstance(m, EmbeddingBagCollection):
            continue
        for table in m.embedding_bag_configs():
            if table.embedding_dim % 4:
                raise ValueError(
                    f"table {table.name}: its dimension {table.embedding_dim} "
                    "(model.embedding_dim) must be a multiple of 4 for FBGEMM's fused embedding "
                    "kernels, which TorchRec's sharded tables run in"
                )
            types, min_partition = list(SHARDED_TYPES), None
            k = blocks.get(table.name)
            if k is not None and k > 1:
                if table.embedding_dim % k or (table.embedding_dim // k) % 4:
                    raise ValueError(
                        f"table {table.name}: its row-wise optimizer state was saved for {k} "
                        f"column blocks, which do not split its dimension {table.embedding_dim} "
                        "into blocks of a multiple of 4 columns (TorchRec's column-wise blocks)"
                    )
                types = [t for t in types if t in COLUMN_SPLIT_TYPES]
                min_partition = table.embedding_dim // k
            elif k is not None:
                types = [t for t in types if t not in COLUMN_SPLIT_TYPES]
            out[table.name] = ParameterConstraints(
                sharding_types=types,
                compute_kernels=compute_kernels(memory),
                cache_params=cache,
                min_partition=min_partition,
            )
    return out


def planner_topology(memory: MemoryBudget, *, world_size: int, local_world_size: int) -> Topology:
    """TorchRec's planner ``Topology``, built by ``TopologyFactory`` from the budget (on
    ``memory.compute_device``; TorchRec gives CPU ranks no HBM)."""
    return TopologyFactory.create_topology(
        trainer_config=PlannerTrainerConfig(
            world_size=world_size,
            local_world_size=local_world_size,
            hbm_cap_bytes=memory.hbm_bytes,
            ddr_cap_bytes=memory.ddr_bytes,
        ),
        kernel_config=KernelConfig(compute_device=memory.compute_device),
    )


# the sharders whose pooled-embedding collectives TorchRec quantizes with a codec registry
_QCOMM_SHARDERS = (
    EmbeddingBagCollectionSharder,
    FusedEmbeddingBagCollectionSharder,
    FeatureProcessedEmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
)


def qcomm_codecs_registry(comm_precision: str) -> dict[str, QuantizedCommCodecs] | None:
    """TorchRec's codec registry of ``comm_precision`` (``sptt.comm_precision``): FBGEMM codecs
    that cast the pooled (and sequence) embedding all-to-alls and the pooled reduce-scatter to
    bf16 or fp16, forward and backward (``QCommsConfig(forward_precision=...,
    backward_precision=...)``). ``None`` for ``"fp32"``.

    Built with ``get_qcomm_codecs`` per op rather than ``get_qcomm_codecs_registry``: the latter
    turns bf16 into fp16 on CPU (gloo lacked bf16 once), while gloo in torch 2.13 moves bf16 and
    the FBGEMM codecs cast to it on CPU, so ``bf16`` means bf16 on every device.
    """
    dtype = comm_dtype_of(comm_precision)  # validates the setting
    if dtype is None:
        return None
    comm_type = CommType(comm_precision)
    config = QCommsConfig(forward_precision=comm_type, backward_precision=comm_type)
    ops = (
        CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL,
        CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER,
        CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL,
    )
    return {op.name: get_qcomm_codecs(config) for op in ops}


def flat_sharders(comm_precision: str = "fp32") -> list[ModuleSharder[nn.Module]]:
    """TorchRec's default sharders, the embedding ones given :func:`qcomm_codecs_registry` of
    ``comm_precision`` (``"fp32"``: exactly ``get_default_sharders()``)."""
    registry = qcomm_codecs_registry(comm_precision)
    sharders = get_default_sharders()
    if registry is None:
        return sharders
    return [
        type(s)(qcomm_codecs_registry=registry) if type(s) in _QCOMM_SHARDERS else s
        for s in sharders
    ]


class OrderedEnumerator(EmbeddingEnumerator):
    """TorchRec's ``EmbeddingEnumerator`` with each table's options in a fixed order: sharding
    types as :data:`SHARDED_TYPES` lists them, kernels as ``EmbeddingComputeKernel`` does; the
    tables in TorchRec's order.

    TorchRec lists a table's sharding types (where constraints name them, as
    :func:`table_constraints` does) and kernels from a ``set`` of strings, whose order follows
    Python's per-process string hashing (``PYTHONHASHSEED``), and its planner keeps the first of
    equally rated plans: tied sharding types (e.g. table-wise, column-wise and
    table-column-wise tables of one shard each) were chosen differently from run to run."""

    def enumerate(
        self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
    ) -> list[ShardingOption]:
        options = super().enumerate(module, sharders)
        tables: dict[str, int] = {}
        for o in options:
            tables.setdefault(o.fqn, len(tables))
        types = {t: i for i, t in enumerate(SHARDED_TYPES)}
        kernels = {k.value: i for i, k in enumerate(EmbeddingComputeKernel)}
        return sorted(  # stable: options equal in all three keep TorchRec's order
            options,
            key=lambda o: (
                tables[o.fqn],
                types.get(o.sharding_type, len(types)),
                kernels.get(o.compute_kernel, len(kernels)),
            ),
        )


def flat_planner(
    memory: MemoryBudget,
    *,
    world_size: int,
    local_world_size: int,
    batch_size: int,
    constraints: dict[str, ParameterConstraints],
    proposer: Proposer | list[Proposer] | None = None,
) -> EmbeddingShardingPlanner:
    """TorchRec's planner for ``world_size`` ranks with ``memory`` per rank for the tables and
    their optimizer state, as the SPTT plan counts it (:func:`dmt.memory.choose_kernels`).
    ``batch_size`` is per rank.

    The planner reserves nothing of the budget (``FixedPercentageStorageReservation(0)``):
    TorchRec's default reservation keeps 15% of HBM plus its estimate of the dense part, so the
    same ``sharding.hbm_gb`` would give the flat baseline's tables less room than SPTT's and
    UVM-cache tables that SPTT keeps in HBM. ``sharding.hbm_gb`` is the tables' share on both
    paths; the rest of the GPU (dense model, activations, communication buffers) is what it
    leaves. The planner still counts each shard's input and output buffers (output: local batch x
    world size x columns x 4 bytes, about 4 MiB per table at 2048 per rank on 8 ranks and
    N = 64), which the SPTT plan leaves to the rest of the GPU. Its search sees every table's
    options in one order (:class:`OrderedEnumerator`): the same plan from run to run.
    """
    topology = planner_topology(memory, world_size=world_size, local_world_size=local_world_size)
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        enumerator=OrderedEnumerator(
            topology=topology, batch_size=batch_size, constraints=constraints
        ),
        constraints=constraints,
        proposer=proposer,
        storage_reservation=FixedPercentageStorageReservation(percentage=0.0),
    )


def plan_tables(
    module: nn.Module,
    memory: MemoryBudget,
    *,
    world_size: int,
    local_world_size: int,
    batch_size: int,
    comm_precision: str = "fp32",
    column_blocks: Mapping[str, int] | None = None,
) -> ShardingPlan:
    """TorchRec's plan of ``module``'s tables (no collective): never data-parallel, kernels of
    :func:`compute_kernels`, within ``memory`` per rank. ``batch_size`` is the global batch;
    ``comm_precision`` gives the planner's cost model the sharders that will run
    (:func:`flat_sharders`); ``column_blocks`` keeps a resumed checkpoint's column split
    (:func:`table_constraints`).

    Raises ``ValueError`` naming the budget when the planner finds no plan within it.
    """
    planner = flat_planner(
        memory,
        world_size=world_size,
        local_world_size=local_world_size,
        batch_size=max(batch_size // world_size, 1),
        constraints=table_constraints(module, memory, column_blocks=column_blocks),
    )
    try:
        plan = planner.plan(module, flat_sharders(comm_precision))
    except PlannerError as e:
        raise ValueError(
            f"TorchRec's planner found no sharding of the tables within the memory budget "
            f"({memory.describe()}; sharding.hbm_gb, sharding.ddr_gb): {e}"
        ) from e
    _warn_row_wise_state_split(module, plan)
    return plan


def _warn_row_wise_state_split(module: nn.Module, plan: ShardingPlan) -> None:
    """Warn when ``plan`` splits a table with row-wise Adagrad (TorchRec's fused
    ``RowWiseAdagrad``, attached in backward) into column blocks: each block keeps its own
    accumulator per row, so training differs from the whole table's (as SPTT warns for its
    column-wise tables)."""
    fused = {
        name.rsplit(".", 2)[-2]: getattr(p, "_optimizer_classes", [])
        for name, p in module.named_parameters()
        if name.endswith(".weight") and ".embedding_bags." in name
    }
    split = sorted(
        name
        for name, ps in table_shardings(plan).items()
        if ps.sharding_type in ("column_wise", "table_column_wise")
        and len(ps.ranks or []) > 1
        and RowWiseAdagrad in fused.get(name, [])
    )
    if split:
        warnings.warn(
            f"row-wise Adagrad on column-wise shards keeps one accumulator per row and shard, "
            f"not per row of the whole table: the plan splits {', '.join(split)} into column "
            "blocks, so training differs slightly from the unsharded model",
            stacklevel=3,
        )


def place_on_devices(plan: ShardingPlan, devices: Sequence[torch.device]) -> ShardingPlan:
    """``plan`` with every shard placed on the device its rank uses, ``devices[rank]``.

    TorchRec's planner places rank ``r``'s shards on ``cuda:<r % local_world_size>``, and
    TorchRec refuses a local shard whose tensor is on another device ("Local shard tensor device
    does not match with local Shard's placement!"). That index is not the rank's GPU when the
    launcher binds one GPU per task (SLURM ``--gpus-per-task=1``: every rank's ``cuda:0``) or
    numbers ranks otherwise than host by host. In place; the plan is returned.
    """
    for module_plan in plan.plan.values():
        for sharding in module_plan.values():
            spec = sharding.sharding_spec
            if not isinstance(spec, EnumerableShardingSpec):
                continue
            placed = []
            for shard in spec.shards:
                assert shard.placement is not None
                rank = shard.placement.rank()
                assert rank is not None
                placed.append(
                    ShardMetadata(
                        shard_offsets=shard.shard_offsets,
                        shard_sizes=shard.shard_sizes,
                        placement=f"rank:{rank}/{devices[rank]}",
                    )
                )
            spec.shards = placed
    return plan


def rank_devices(runtime: Runtime) -> list[torch.device]:
    """Every rank's device, by rank (one object all-gather; a world of one needs none)."""
    if runtime.world_size == 1:
        return [runtime.device]
    found: list[str | None] = [None] * runtime.world_size
    dist.all_gather_object(found, str(runtime.device))
    return [torch.device(str(d)) for d in found]


class WorldOfOneWrapper(DataParallelWrapper):
    """``DistributedModelParallel``'s dense part in a world of one: moved to the device, not
    wrapped in ``DistributedDataParallel`` (TorchRec's default), whose every step all-reduces the
    gradients over a group of one and copies them through its buckets, and whose forward adds
    its own bookkeeping: nothing a single process needs. Parameter and state-dict names are the
    same either way (``DistributedModelParallel`` strips DDP's ``module.``)."""

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        dmp._dmp_wrapped_module = dmp._dmp_wrapped_module.to(device)


class DenseDataParallelWrapper(DefaultDataParallelWrapper):
    """TorchRec's DDP wrapper of the dense part, without the ``FutureWarning`` that every rank
    printed as it wrapped (``broadcast_buffers`` is deprecated, use ``forward_sync_buffers``):
    TorchRec passes DDP that argument itself, where no setting of dmt or its user reaches it
    (SPTT's own DDP passes ``forward_sync_buffers=False``: :mod:`dmt.sptt.dmt_sharding`)."""

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning
            )
            super().wrap(dmp, env, device)


def data_parallel_wrapper(world_size: int) -> DataParallelWrapper:
    """How ``DistributedModelParallel`` replicates the dense part over ``world_size`` ranks:
    TorchRec's DDP wrapper (:class:`DenseDataParallelWrapper`), or none in a world of one
    (:class:`WorldOfOneWrapper`)."""
    return WorldOfOneWrapper() if world_size == 1 else DenseDataParallelWrapper()


def shard_model(
    module: nn.Module,
    runtime: Runtime,
    *,
    batch_size: int,
    memory: MemoryBudget | None = None,
    comm_precision: str = "fp32",
    column_blocks: Mapping[str, int] | None = None,
) -> DistributedModelParallel:
    """Plan and shard ``module`` (tables on the meta device) over the default process group,
    within ``memory`` per rank (``None``: the ``sharding`` group's defaults). ``comm_precision``
    (``sptt.comm_precision``: ``"fp32"``, ``"bf16"``, ``"fp16"``) is the dtype of the tables'
    pooled-embedding collectives on the wire, forward and backward (:func:`flat_sharders`).
    ``column_blocks`` (rank 0's is used): the column split of the checkpoint the run resumes
    from, which the plan keeps (:func:`table_constraints`).

    Raises ``ValueError`` on every rank when the planner finds no plan within the budget.
    """
    if memory is None:
        memory = memory_budget(ShardingConfig(), runtime.device.type, gpus=job_gpus(runtime))
    sharders = flat_sharders(comm_precision)  # validates before any collective
    # rank 0 plans; its plan, or its error, reaches every rank (TorchRec's collective_plan
    # would leave the other ranks waiting for a plan that never comes)
    found: list[ShardingPlan | str | None] = [None]
    if runtime.rank == 0:
        try:
            found[0] = plan_tables(
                module,
                memory,
                world_size=runtime.world_size,
                local_world_size=runtime.local_world_size,
                batch_size=batch_size,
                comm_precision=comm_precision,
                column_blocks=column_blocks,
            )
        except ValueError as e:
            found[0] = str(e)
    if runtime.world_size > 1:
        dist.broadcast_object_list(found, src=0)
    if isinstance(found[0], str):
        raise ValueError(found[0])
    assert isinstance(found[0], ShardingPlan)
    node_groups = (_table_row_wise(found[0]), runtime.backend, world_number())
    _NODE_GROUPS.check(*node_groups)
    plan = place_on_devices(found[0], rank_devices(runtime))
    dmp = DistributedModelParallel(
        module,
        device=runtime.device,
        plan=plan,
        sharders=sharders,
        data_parallel_wrapper=data_parallel_wrapper(runtime.world_size),
    )
    _NODE_GROUPS.record(*node_groups)  # TorchRec has made its groups
    return dmp


def table_shardings(plan: ShardingPlan) -> dict[str, ParameterSharding]:
    """Each table's ``ParameterSharding`` in ``plan``, by table name (whatever module holds it)."""
    return {name: ps for module_plan in plan.plan.values() for name, ps in module_plan.items()}


def _table_row_wise(plan: ShardingPlan) -> list[str]:
    return sorted(
        name
        for name, ps in table_shardings(plan).items()
        if ps.sharding_type == ShardingType.TABLE_ROW_WISE.value
    )


class TorchRecNodeGroups:
    """Which world TorchRec's intra- and cross-host groups of table-row-wise sharding belong to.

    TorchRec creates them on the first table-row-wise sharding of a process and caches them for
    the whole process (``torchrec.distributed.comm``); nothing public resets them. Each job of a
    multirun gets a fresh world and destroys its groups at the end, and on NCCL a destroyed
    group is shut down: a later job sharding a table table-row-wise would run its collectives on
    them. :meth:`check` refuses that job before any collective, naming its tables (gloo keeps
    working groups after destruction, and TorchRec offers no table-row-wise sharding there).
    Worlds are those :func:`dmt.runtime.init_runtime` starts; groups a caller makes itself are
    not counted (a stale case there is missed, never a sound one refused)."""

    def __init__(self) -> None:
        self.world: int | None = None

    def check(self, tables: Sequence[str], backend: str, world: int) -> None:
        """Refuse ``tables`` (sharded table-row-wise) in world number ``world``
        (:func:`dmt.runtime.world_number`) when TorchRec made its groups in another world."""
        if not tables or backend != "nccl":
            return
        if self.world is not None and self.world != world:
            raise ValueError(
                f"TorchRec's planner sharded table(s) {', '.join(tables)} table-row-wise, whose "
                "intra- and cross-host process groups TorchRec keeps for the whole process; this "
                f"process made them for an earlier job (world {self.world}, now shut down), so "
                f"this job (world {world}) cannot use them. Run each point of the sweep as its "
                "own job (hydra/launcher=slurm, or one torchrun per point)"
            )

    def record(self, tables: Sequence[str], backend: str, world: int) -> None:
        """Note that TorchRec has sharded ``tables`` table-row-wise in world ``world``, making
        its groups there (the first time)."""
        if tables and backend == "nccl" and self.world is None:
            self.world = world


_NODE_GROUPS = TorchRecNodeGroups()


def sharding_plan_text(model: nn.Module, memory: MemoryBudget | None = None) -> str:
    """The plan of a sharded model, readable: TorchRec's plan of a flat model (per table:
    sharding type, compute kernel, ranks, then its shards) under ``memory``, or the SPTT plan
    (:meth:`dmt.sptt.plan.SPTTPlan.describe`) of the ``ShardedDMT`` in ``model`` or
    ``model.model``."""
    if isinstance(model, DistributedModelParallel):
        budget = memory.describe() if memory else "not given"
        return f"flat TorchRec plan (EmbeddingShardingPlanner)\nmemory budget: {budget}\n{model.plan}\n"
    sharded = model if isinstance(model, ShardedDMT) else getattr(model, "model", None)
    if not isinstance(sharded, ShardedDMT):
        raise TypeError(f"{type(model).__name__} is neither a DMP nor holds a ShardedDMT")
    return sharded.dataflow.plan.describe()


def write_sharding_plan(
    model: nn.Module, run_dir: Path, *, rank: int, memory: MemoryBudget | None = None
) -> None:
    """Rank 0 writes :func:`sharding_plan_text` to ``run_dir / sharding_plan.txt``, beside a
    ``history.jsonl`` (:func:`dmt.history.start_history`): what tells dmt's plan from a user's
    file of that name, which a later run does not replace (:func:`dmt.run_dir.check_outputs`)."""
    if rank == 0:
        start_history(run_dir)
        (run_dir / PLAN_FILE).write_text(sharding_plan_text(model, memory))
