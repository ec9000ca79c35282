"""``dmt-plan <hydra overrides>``: bytes per collective and memory per GPU of a model on a cluster,
for flat TorchRec sharding, SPTT (pass-through towers) and DMT (tower modules), without a GPU or
a process group.

Example::

    dmt-plan experiment=paper_dmt_8t_dlrm cluster=h100 cluster.hosts=64 \
        cluster.gpus_per_host=8 sptt.hosts_per_tower=1

For every mode it plans the tables like the real code does (TorchRec's
``EmbeddingShardingPlanner`` with a ``Topology`` of ``G = hosts x gpus_per_host`` CUDA ranks for
``flat``; :func:`dmt.sptt.plan.build_plan` through
:class:`~dmt.sptt.dmt_sharding.DMTSharder` for ``sptt``/``dmt``), counts the bytes the busiest
rank sends per collective and direction, split intra-host / cross-host, with the busiest
receiver's bytes for the sparse-input all-to-alls (:mod:`dmt.planning.collectives`), and the memory every rank needs
(:mod:`dmt.planning.memory`). Every mode places its tables within the budget training gives them
(``sharding.hbm_gb``, unset: 80% of ``cluster.gpu_memory_gb``; ``sharding.ddr_gb``), then check that
every rank's tables, dense part and activations fit in the GPU. Models are built with tables on
``meta``.

Modes: ``flat`` is the experiment's model without towers (``model.partition.kind=none``),
``sptt`` its towers with pass-through tower modules, ``dmt`` its towers with its tower modules
(equal to ``sptt`` when those are pass-through). A model that is not a DMT model gets the naive
partition into ``T = hosts / K`` towers.

Writes ``plan.json`` in the Hydra run directory (``modes.<mode>.cross_host_mb``,
``intra_host_mb``, ``max_rank_memory_gb``, the collectives and the busiest rank's memory) and
prints a table. A run directory that holds a training run's outputs is refused, one that holds an
earlier plan too unless ``overwrite=true`` (:mod:`dmt.planning.run_dir`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torchrec.distributed.planner.proposers import UniformProposer
from torchrec.distributed.planner.types import PlannerError
from torchrec.distributed.types import ShardingPlan

from dmt.config import (
    Config,
    ModelConfig,
    PartitionConfig,
    PassThroughTowerConfig,
    check_row_wise_rows,
    register_configs,
    use_pipeline,
    validate,
)
from dmt.inspect import schema
from dmt.memory import GIB, MemoryBudget
from dmt.models import (
    DMTModel,
    RecModel,
    build_dmt_model,
    build_model,
    embedding_parameters,
)
from dmt.models.accounting import dense_inputs, tower_inputs
from dmt.models.partition import naive_partition, resolve_partition
from dmt.optim import (
    apply_sparse_optimizer,
    check_sparse_optimizer,
    sparse_optimizer_name,
    sparse_optimizer_spec,
)
from dmt.planning.collectives import (
    CollectiveBytes,
    Workload,
    flat_collectives,
    flat_lookup_rows,
    flat_tables,
    sptt_collectives,
    sptt_lookup_rows,
)
from dmt.planning.dry_run import dry_run
from dmt.planning.hardware import ClusterConfig, validate_cluster
from dmt.planning.memory import (
    RankMemory,
    check_fits,
    dense_activations_per_sample,
    dense_optimizer_states,
    flat_rank_memory,
    sptt_rank_memory,
)
from dmt.planning.run_dir import PLAN_FILE, one_line_errors, write_run_output
from dmt.planning.timing import ComputeLoad, ModeWorkload, StepTime, compute_load, predict_modes
from dmt.sharding import (
    flat_planner,
    flat_sharders,
    plan_tables,
    table_constraints,
    table_shardings,
)
from dmt.sptt.collectives import COMM_PRECISIONS
from dmt.sptt.dmt_sharding import DMTSharder
from dmt.sptt.plan import SPTTPlan
from dmt.sptt.topology import Topology
from dmt.train import CONF_PATH, to_config

MB = 1e6
log = logging.getLogger(__name__)


@dataclass
class PlanConfig(Config):
    """``dmt-plan``'s root config: the training config plus the cluster."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    flat_search: str = "auto"  # TorchRec planner search for flat: "full" (as training), "uniform" (fast), "auto" (full up to FULL_SEARCH_LIMIT tables x GPUs)
    dry_run: bool = False  # also build rank 0's real sharded modules of every mode at this size and train one step (dmt.planning.dry_run)
    overwrite: bool = False  # replace an earlier plan's plan.json in hydra.run.dir (a training run's directory is always refused: dmt.planning.run_dir)


def register_plan_configs() -> None:
    """Register the training schemas, ``base_plan_config`` and the ``cluster`` group's."""
    register_configs()
    cs = ConfigStore.instance()
    cs.store(name="base_plan_config", node=PlanConfig)
    cs.store(group="cluster", name="base_cluster", node=ClusterConfig, package="cluster")


register_plan_configs()


@dataclass(frozen=True)
class ModePlan:
    """The plan of one mode."""

    collectives: list[CollectiveBytes]
    worst: RankMemory
    """The rank that needs the most GPU memory."""
    model: ModelConfig
    """The mode's model config (towers as an explicit partition for ``sptt``/``dmt``)."""
    compute: ComputeLoad
    """Dense FLOPs and lookup bytes per sample (:func:`dmt.planning.timing.compute_load`)."""
    passthrough: bool = False
    """Towers without trainable tower modules (``sptt``, and ``dmt`` when the experiment has
    none): its dry run is SPTT's."""

    @property
    def cross_host_bytes(self) -> int:
        return sum(c.cross_host_bytes for c in self.collectives)

    @property
    def intra_host_bytes(self) -> int:
        return sum(c.intra_host_bytes for c in self.collectives)


def _param_bytes(module: nn.Module | None) -> int:
    if module is None:
        return 0
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def _dense_activations(model: RecModel | DMTModel) -> int:
    """Dense activations per sample of ``model.dense_forward`` (tower modules included)."""
    return dense_activations_per_sample(model.dense_forward, *dense_inputs(model))


def _check_cluster(conf: PlanConfig) -> tuple[Topology, int]:
    """The SPTT topology and the local batch ``B``; ``ValueError`` naming the numbers."""
    c, K = conf.cluster, conf.sptt.hosts_per_tower
    validate_cluster(c)
    for name, value in (
        ("cluster.hosts", c.hosts),
        ("cluster.gpus_per_host", c.gpus_per_host),
        ("sptt.hosts_per_tower", K),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if c.gpu_memory_gb <= 0:
        raise ValueError(f"cluster.gpu_memory_gb must be positive, got {c.gpu_memory_gb}")
    if c.hosts % K:
        raise ValueError(
            f"cluster.hosts={c.hosts} is not divisible by sptt.hosts_per_tower={K}: every "
            f"tower spans K whole hosts, so G = {c.hosts} * {c.gpus_per_host} = "
            f"{c.hosts * c.gpus_per_host} GPUs must be a multiple of K * L = "
            f"{K} * {c.gpus_per_host} = {K * c.gpus_per_host}"
        )
    topo = Topology(c.hosts * c.gpus_per_host, c.gpus_per_host, K)
    G, batch = topo.world_size, conf.data.batch_size
    if batch % G:
        raise ValueError(
            f"data.batch_size={batch} (global) is not divisible by the G = {c.hosts} * "
            f"{c.gpus_per_host} = {G} GPUs: every rank trains on the same local batch"
        )
    return topo, batch // G


def _partition(conf: PlanConfig, names: list[str], topo: Topology) -> list[list[str]]:
    """The towers of the experiment's model, which must be ``T = G / (K L)``."""
    T, K, c = topo.num_towers, topo.hosts_per_tower, conf.cluster
    if conf.model.partition.kind == "none":
        if len(names) < T:
            raise ValueError(
                f"the model's {len(names)} sparse features cannot fill T = cluster.hosts / "
                f"sptt.hosts_per_tower = {c.hosts} / {K} = {T} towers (one feature at least each)"
            )
        return naive_partition(names, T)
    partition = resolve_partition(conf.model.partition, names)
    if len(partition) != T:
        towers = len(partition)
        fix = (
            f"set sptt.hosts_per_tower={c.hosts // towers} ({c.hosts} hosts / {towers} towers)"
            if c.hosts % towers == 0
            else f"set cluster.hosts to {towers} towers times sptt.hosts_per_tower"
        )
        raise ValueError(
            f"the model has {towers} towers (model.partition), but the cluster gives "
            f"T = G / (K * L) = {topo.world_size} / ({K} * {c.gpus_per_host}) = {T} towers "
            f"(cluster.hosts={c.hosts}, cluster.gpus_per_host={c.gpus_per_host}, "
            f"sptt.hosts_per_tower={K}): {fix}, or {_towers_fix(conf.model.partition, T)}"
        )
    return partition


def _towers_fix(p: PartitionConfig, T: int) -> str:
    """How to give a partition of ``model.partition.kind`` ``T`` towers: only ``naive`` reads
    ``num_towers`` to make them (``tp`` and ``per_feature`` check it against theirs)."""
    if p.kind == "naive":
        return f"set model.partition.num_towers={T}"
    if p.kind == "tp":
        count = f" and model.partition.num_towers={T}" if p.num_towers is not None else ""
        return (
            f"set model.partition.path to a partition file of {T} towers (dmt-partition "
            f"--num-towers {T} writes one: <--out>/partition.yaml){count}"
        )
    if p.kind == "explicit":
        return f"list {T} towers in model.partition.towers"
    return (  # per_feature: one tower per sparse feature
        f"split the features into {T} towers with another partition kind (e.g. "
        f"model.partition.kind=naive model.partition.num_towers={T})"
    )


def _check_sparse_optimizer(conf: PlanConfig) -> None:
    """``optim.sparse`` as ``dmt-train`` checks it on the cluster's device, every mode
    (:attr:`ClusterConfig.device_type`: CPU for an emulated cluster), and with ``dry_run=true``
    on CPU too, where the dry run trains; a refusal on CPU says why CPU."""
    device = conf.cluster.device_type
    if device == "cuda":
        check_sparse_optimizer(conf.optim, "cuda")
        if not conf.dry_run:
            return
    try:
        check_sparse_optimizer(conf.optim, "cpu")
    except ValueError as e:
        why = (
            f"cluster.name={conf.cluster.name} is an emulated CPU cluster (cluster.shared_cores="
            f"{conf.cluster.shared_cores}: dmt-train runs its ranks on CPU)"
            if device == "cpu"
            else "dry_run=true trains one step of every mode on CPU (dmt.planning.dry_run; plan "
            "without it)"
        )
        raise ValueError(f"{why}: {e}") from None


def ignored_plan_settings(conf: PlanConfig) -> list[str]:
    """The settings of ``conf`` a ``dmt-train`` run reads that :func:`plan` does not act on, one
    message each (:func:`plan` warns of them): ``sptt.local_world_size`` unlike
    ``cluster.gpus_per_host``, the plan's ``L`` (the cluster's hosts; in ``dmt-train`` it
    emulates hosts, in place of the launcher's ``LOCAL_WORLD_SIZE``, without a word)."""
    c, emulated = conf.cluster, conf.sptt.local_world_size
    if emulated is None or emulated == c.gpus_per_host:
        return []
    G, K = c.hosts * c.gpus_per_host, conf.sptt.hosts_per_tower
    fix = (
        f"cluster.hosts={G // emulated} cluster.gpus_per_host={emulated} plans those emulated hosts"
        if G % emulated == 0
        else f"G = {G} ranks are no multiple of {emulated}: dmt-train refuses that world"
    )
    return [
        f"sptt.local_world_size={emulated} is not planned: dmt-plan takes L = "
        f"cluster.gpus_per_host={c.gpus_per_host} ranks per host, towers of K*L = {K}*"
        f"{c.gpus_per_host} ranks (sptt.hosts_per_tower={K}), while dmt-train on this cluster "
        f"takes sptt.local_world_size over LOCAL_WORLD_SIZE (it emulates hosts) and trains "
        f"towers of K*L = {K}*{emulated}; {fix}, sptt.local_world_size=null the cluster's"
    ]


def _check_sptt_run(conf: PlanConfig, mode: str, model: ModelConfig) -> None:
    """Refuse the ``mode`` (``sptt``, ``dmt``) that ``dmt-train`` would refuse: its run,
    ``sptt=on`` with ``model``, on the cluster's ``cluster.gpus_per_host`` ranks per host
    (:func:`dmt.config.validate`, :func:`dmt.config.check_row_wise_rows`; not
    ``sptt.local_world_size``, of which :func:`plan` warns: :func:`ignored_plan_settings`);
    ``ValueError`` naming the mode and the setting, as a mode beyond the GPU's memory is
    refused."""
    L = conf.cluster.gpus_per_host
    run = replace(conf, model=model, sptt=replace(conf.sptt, enabled=True, local_world_size=None))
    try:
        validate(run)
        check_row_wise_rows(run, L, f"cluster.gpus_per_host={L}")
    except ValueError as e:
        raise ValueError(f"{mode}: {e}") from None


def _dense_states(conf: PlanConfig) -> int:
    """State tensors per dense parameter: ``optim.dense``'s (its class and kwargs) and, with
    ``trainer.ema_decay``, the average the evaluation reads (:class:`dmt.ema.DenseEMA`)."""
    node = OmegaConf.structured(conf.optim).dense
    kwargs = OmegaConf.to_container(node, resolve=True)
    assert isinstance(kwargs, dict)
    target = str(kwargs.get("_target_"))
    try:
        cls = get_class(target)
    except Exception as e:  # hydra raises ImportError/ValueError variants
        raise ValueError(f"optim.dense: cannot import _target_={target!r}: {e}") from e
    ema = 0 if conf.trainer.ema_decay is None else 1
    return dense_optimizer_states(cls, {str(k): v for k, v in kwargs.items()}) + ema


@dataclass(frozen=True)
class PlanInputs:
    """What :func:`plan` plans from, checked (:func:`check_plan_config`)."""

    topo: Topology
    local_batch: int
    names: list[str]
    cardinalities: list[int]
    num_dense: int
    gpu_bytes: int
    budget: MemoryBudget
    """The tables' budget per rank, as training computes it."""
    dense_states: int
    """State tensors per dense parameter of ``optim.dense``."""
    sparse_spec: tuple[type, dict[str, Any]]
    """``optim.sparse``'s class and kwargs."""
    partition: list[list[str]]
    flat_search: str
    """``flat_search`` resolved: ``"full"`` or ``"uniform"``."""
    sptt: dict[str, tuple[ModelConfig, DMTModel, SPTTPlan]]
    """Per SPTT mode (``"sptt"``, ``"dmt"``): its model's config, the model (on ``meta``) and
    its shards' plan."""


def check_plan_config(conf: PlanConfig) -> PlanInputs:
    """Check every setting :func:`plan` reads, without planning (a fraction of a second): the
    training part, the cluster, the tables' budget, the optimizers, the towers and
    ``flat_search``. ``dmt-plan overwrite=true`` runs it before it touches an earlier plan.

    Raises:
        ValueError: a cluster whose GPUs or hosts do not divide as the topology needs, a tower
            count that does not match the cluster, a batch that does not split evenly, a
            ``sharding.hbm_gb`` larger than ``cluster.gpu_memory_gb`` (naming the numbers), or
            a mode's run or an ``optim.sparse`` that ``dmt-train`` refuses on the cluster's
            devices (its message; CPU ranks for an emulated cluster: ``cluster.shared_cores``).
    """
    to_config(conf)  # validates the training part
    _check_sparse_optimizer(conf)
    topo, B = _check_cluster(conf)
    names, cards, num_dense = schema(conf)
    gpu_bytes = int(conf.cluster.gpu_memory_gb * GIB)
    # the tables' budget as training computes it (sharding.hbm_gb, or its share of the GPU);
    # check_fits adds the dense part and the activations against the whole GPU
    budget = MemoryBudget.from_gib(
        "cuda",
        hbm_gb=conf.sharding.hbm_gb,
        ddr_gb=conf.sharding.ddr_gb,
        uvm_cache_load_factor=conf.sharding.uvm_cache_load_factor,
        gpu_bytes=gpu_bytes,
        gpu_setting=f"cluster.gpu_memory_gb={conf.cluster.gpu_memory_gb}",
    )
    budget.check_device(f"a GPU of cluster.gpu_memory_gb={conf.cluster.gpu_memory_gb}", gpu_bytes)
    sparse_spec = sparse_optimizer_spec(conf.optim)
    partition = _partition(conf, names, topo)
    # the towers, pass-through or with the experiment's tower modules, and their shards (a
    # layout SPTT cannot shard, e.g. row-wise tables of fewer rows than a tower's ranks, fails
    # here)
    sharder = DMTSharder(
        topo, sharding_type=conf.sptt.sharding_type, sparse_optimizer=sparse_spec, memory=budget
    )
    towers = PartitionConfig(kind="explicit", towers=partition)
    sptt: dict[str, tuple[ModelConfig, DMTModel, SPTTPlan]] = {}
    for mode in ("sptt", "dmt"):
        model_cfg = replace(conf.model, partition=towers)
        if mode == "sptt" or conf.model.partition.kind == "none":
            model_cfg = _base_dense(replace(model_cfg, tower=PassThroughTowerConfig()))
        _check_sptt_run(conf, mode, model_cfg)
        model = build_dmt_model(
            model_cfg,
            partition,
            feature_names=names,
            cardinalities=cards,
            num_dense=num_dense,
            table_device="meta",
            dense_device="meta",
        )
        sptt[mode] = (model_cfg, model, sharder.plan(model, dense_on_meta=True))
    return PlanInputs(
        topo=topo,
        local_batch=B,
        names=names,
        cardinalities=cards,
        num_dense=num_dense,
        gpu_bytes=gpu_bytes,
        budget=budget,
        dense_states=_dense_states(conf),
        sparse_spec=sparse_spec,
        partition=partition,
        flat_search=_flat_search(conf.flat_search, len(names), topo.world_size),
        sptt=sptt,
    )


def plan(conf: PlanConfig) -> dict[str, Any]:
    """The plan of every mode as ``plan.json`` holds it (see the module docstring).

    Raises:
        ValueError: a setting :func:`check_plan_config` refuses, or a rank that does not fit in
            the GPU's memory (naming the numbers).
    """
    started = time.perf_counter()
    inputs = check_plan_config(conf)
    for message in ignored_plan_settings(conf):
        log.warning(message)
    topo, B, budget = inputs.topo, inputs.local_batch, inputs.budget
    G, L = topo.world_size, topo.local_world_size
    names, cards, num_dense = inputs.names, inputs.cardinalities, inputs.num_dense
    gpu_bytes, dense_states, sparse_spec = inputs.gpu_bytes, inputs.dense_states, inputs.sparse_spec
    multi_hot = conf.data.synthetic.multi_hot if conf.data.kind == "synthetic" else 1
    workload = Workload.uniform(
        B,
        len(names),
        ids_per_sample=multi_hot,
        comm_size=COMM_PRECISIONS[conf.sptt.comm_precision].itemsize,
    )
    sparse_name = sparse_optimizer_name(sparse_spec[0])
    modes: dict[str, ModePlan] = {}

    # sptt / dmt: the towers and their shards' plans (check_plan_config)
    for mode, (model_cfg, model, sptt_plan) in inputs.sptt.items():
        dims = model.tower_output_dims
        tower_bytes = [_param_bytes(t.tower_module) for t in model.towers]
        tower_acts = [
            dense_activations_per_sample(t.tower_module, tower_inputs(t.tower_module))
            for t in model.towers
        ]
        dense = _param_bytes(model) - sum(_param_bytes(t) for t in model.towers)
        activations = _dense_activations(model) - sum(tower_acts)
        memory = [
            sptt_rank_memory(
                sptt_plan,
                r,
                local_batch=B,
                dense_param_bytes=dense,
                dense_optimizer_states=dense_states,
                dense_activations=activations,
                tower_param_bytes=tower_bytes,
                tower_activations=tower_acts,
                tower_output_dims=dims,
            )
            for r in range(G)
        ]
        modes[mode] = ModePlan(
            sptt_collectives(
                sptt_plan,
                workload,
                tower_output_dims=dims,
                tower_param_bytes=tower_bytes,
                dense_param_bytes=dense,
            ),
            check_fits(memory, gpu_bytes, what=mode),
            model_cfg,
            compute_load(
                model,
                ids_per_sample=max(sptt_lookup_rows(sptt_plan, workload)) / B,
                sparse_optimizer=sparse_name,
                busiest_tower=True,
            ),
            passthrough=not any(tower_bytes),
        )
    # flat: the model without towers, TorchRec's planner on G CUDA ranks
    flat_cfg = _base_dense(replace(conf.model, partition=PartitionConfig(kind="none")))
    flat_model = build_model(
        flat_cfg,
        feature_names=names,
        cardinalities=cards,
        num_dense=num_dense,
        table_device="meta",
        dense_device="meta",
    )
    apply_sparse_optimizer(embedding_parameters(flat_model), conf.optim)  # its state counts
    search = inputs.flat_search
    try:
        sharding = (
            plan_tables(
                flat_model,
                budget,
                world_size=G,
                local_world_size=L,
                batch_size=conf.data.batch_size,
                comm_precision=conf.sptt.comm_precision,
            )
            if search == "full"
            else _uniform_plan(
                flat_model, budget, G, L, conf.data.batch_size, conf.sptt.comm_precision
            )
        )
    except ValueError as e:
        raise ValueError(f"flat: {e}") from e
    tables = flat_tables(sharding, flat_model, names)
    dense = _param_bytes(flat_model) - sum(
        _param_bytes(m) for m in flat_model.modules() if _is_ebc(m)
    )
    activations = _dense_activations(flat_model)
    memory = [
        flat_rank_memory(
            tables,
            topo,
            r,
            local_batch=B,
            sparse_optimizer=sparse_name,
            dense_param_bytes=dense,
            dense_optimizer_states=dense_states,
            dense_activations=activations,
            budget=budget,
        )
        for r in range(G)
    ]
    modes["flat"] = ModePlan(
        flat_collectives(tables, topo, workload, dense_param_bytes=dense),
        check_fits(memory, gpu_bytes, what="flat"),
        flat_cfg,
        compute_load(
            flat_model,
            ids_per_sample=max(flat_lookup_rows(tables, G, workload)) / B,
            sparse_optimizer=sparse_name,
        ),
    )

    modes = {mode: modes[mode] for mode in ("flat", "sptt", "dmt")}
    times = predict_modes(
        {m: ModeWorkload(p.collectives, p.compute) for m, p in modes.items()},
        B,
        conf.cluster,
        pipelined=use_pipeline(conf.trainer, G),
    )
    report = _report(conf, topo, B, modes, times, time.perf_counter() - started)
    report["flat_search"] = search
    if conf.dry_run:
        # the flat plan reported above (the GPU cluster's), its sharding types built for real
        flat_types = {name: ps.sharding_type for name, ps in table_shardings(sharding).items()}
        runs: dict[str, dict[str, Any]] = {}
        for mode, p in modes.items():  # flat, sptt, dmt: sptt's run is there for dmt's
            if mode == "dmt" and p.passthrough and p.model == modes["sptt"].model:
                # pass-through towers: the dmt mode is the sptt mode, dry-run once
                runs[mode] = {**runs["sptt"], "runs_as": "sptt"}
                continue
            as_mode = "sptt" if mode == "dmt" and p.passthrough else mode
            runs[mode] = dry_run(
                replace(conf, model=p.model),
                world_size=G,
                local_world_size=L,
                mode=as_mode,
                flat_sharding_types=flat_types if mode == "flat" else None,
            ).to_dict()
            if as_mode != mode:
                runs[mode]["runs_as"] = as_mode
        report["dry_run"] = runs
    return report


FULL_SEARCH_LIMIT = 4096
"""``flat_search=auto`` runs TorchRec's full search up to this many tables x GPUs (26 tables on
64 GPUs: about 15 s on 2 cores; 26 on 512: over a minute)."""
FAST_SHARDING_TYPES = ("table_wise", "table_row_wise", "column_wise", "table_column_wise")


def _flat_search(setting: str, num_tables: int, world_size: int) -> str:
    if setting not in ("auto", "full", "uniform"):
        raise ValueError(f"flat_search={setting!r} is not one of ['auto', 'full', 'uniform']")
    if setting != "auto":
        return setting
    return "full" if num_tables * world_size <= FULL_SEARCH_LIMIT else "uniform"


def _uniform_plan(
    model: nn.Module,
    budget: MemoryBudget,
    world_size: int,
    local_world_size: int,
    batch: int,
    comm_precision: str,
) -> ShardingPlan:
    """TorchRec's planner, searching only plans of one sharding type for all tables
    (``UniformProposer``) among :data:`FAST_SHARDING_TYPES` (row-wise, whose shards on all
    ``G`` ranks make the enumeration grow with ``G``, left out). At hundreds of GPUs and
    thousands of tables the full search takes tens of minutes; this one seconds. The sharders
    are training's, of ``comm_precision`` (``sptt.comm_precision``), as in :func:`plan_tables`."""
    constraints = table_constraints(model, budget)
    for c in constraints.values():
        c.sharding_types = list(FAST_SHARDING_TYPES)
    planner = flat_planner(
        budget,
        world_size=world_size,
        local_world_size=local_world_size,
        batch_size=max(batch // world_size, 1),
        constraints=constraints,
        proposer=[UniformProposer()],
    )
    try:
        return planner.plan(model, flat_sharders(comm_precision))
    except PlannerError as e:
        raise ValueError(
            f"TorchRec's planner found no sharding of the tables within the memory budget "
            f"({budget.describe()}; sharding.hbm_gb, sharding.ddr_gb): {e}"
        ) from e


def _base_dense(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` for embeddings of size ``N`` (flat, pass-through towers): a dot interaction joins
    the dense vector to the embeddings, so a bottom MLP that ends at the towers' ``D`` (DMT
    experiments) ends at ``N`` instead, as in the base model."""
    N, bottom = cfg.embedding_dim, list(cfg.bottom_mlp)
    if bottom and bottom[-1] != N and "Dot" in type(cfg.interaction).__name__:
        return replace(cfg, bottom_mlp=[*bottom[:-1], N])
    return cfg


def _is_ebc(module: nn.Module) -> bool:
    from torchrec.modules.embedding_modules import EmbeddingBagCollection  # noqa: PLC0415

    return isinstance(module, EmbeddingBagCollection)


def _report(
    conf: PlanConfig,
    topo: Topology,
    B: int,
    modes: dict[str, ModePlan],
    times: dict[str, StepTime],
    seconds: float,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cluster": asdict(conf.cluster),
        "world_size": topo.world_size,
        "local_world_size": topo.local_world_size,
        "hosts_per_tower": topo.hosts_per_tower,
        "num_towers": topo.num_towers,
        "global_batch": conf.data.batch_size,
        "local_batch": B,
        "model": conf.model.name,
        "comm_precision": conf.sptt.comm_precision,
        "sptt_sharding_type": conf.sptt.sharding_type,
        "planning_seconds": round(seconds, 3),
        "modes": {},
    }
    for mode, p in modes.items():
        memory = asdict(p.worst)
        memory["device_bytes"] = p.worst.device_bytes
        out["modes"][mode] = {
            "cross_host_mb": p.cross_host_bytes / MB,
            "intra_host_mb": p.intra_host_bytes / MB,
            "max_rank_memory_gb": p.worst.device_bytes / GIB,
            "predicted_ms_per_step": times[mode].total_ms,
            "speedup_over_flat": times[mode].speedup_over_flat,
            "breakdown": _breakdown(times[mode]),
            "memory": memory,
            "collectives": [asdict(c) for c in p.collectives],
        }
    return out


def _breakdown(t: StepTime) -> dict[str, Any]:
    """The predicted step's parts (ms): what ``total_ms`` adds up, and each collective."""
    return {
        "compute_ms": t.compute_ms,
        "lookup_ms": t.lookup_ms,
        "overhead_ms": t.overhead_ms,
        "communication_ms": t.communication_ms,
        "exposed_ms": t.exposed_ms,
        "overlapped_ms": t.overlapped_ms,
        "exposed_ms_by_step": t.exposed_by_step(),
        "collectives": [asdict(c) for c in t.collectives],
    }


def format_report(report: dict[str, Any]) -> str:
    """The plan as a table: per mode, per collective the busiest rank's MB (intra / cross host),
    then totals and the largest per-GPU memory."""
    lines = [
        f"G={report['world_size']} GPUs ({report['cluster']['hosts']} hosts x "
        f"{report['local_world_size']}), K={report['hosts_per_tower']} hosts per tower, "
        f"T={report['num_towers']} towers, local batch {report['local_batch']}",
        "",
        f"{'mode':5s} {'step':16s} {'op':15s} {'group':6s} {'dir':8s} {'size':>5s} "
        f"{'intra MB':>10s} {'cross MB':>10s}",
    ]
    for mode, m in report["modes"].items():
        for c in m["collectives"]:
            lines.append(
                f"{mode:5s} {c['step']:16s} {c['op']:15s} {c['group']:6s} {c['direction']:8s} "
                f"{c['group_size']:5d} {c['intra_host_bytes'] / MB:10.3f} "
                f"{c['cross_host_bytes'] / MB:10.3f}"
            )
    lines += [
        "",
        f"{'mode':5s} {'intra MB/step':>14s} {'cross MB/step':>14s} {'max GPU GiB':>12s} "
        f"{'ms/step':>9s} {'compute':>8s} {'lookup':>8s} {'exposed':>8s} {'hidden':>8s} "
        f"{'vs flat':>8s}",
    ]
    for mode, m in report["modes"].items():
        b = m["breakdown"]
        lines.append(
            f"{mode:5s} {m['intra_host_mb']:14.3f} {m['cross_host_mb']:14.3f} "
            f"{m['max_rank_memory_gb']:12.3f} {m['predicted_ms_per_step']:9.3f} "
            f"{b['compute_ms']:8.3f} {b['lookup_ms']:8.3f} {b['exposed_ms']:8.3f} "
            f"{b['overlapped_ms']:8.3f} {m['speedup_over_flat']:7.2f}x"
        )
    dmt = report["modes"]["dmt"]
    exposed = ", ".join(f"{k} {v:.3f}" for k, v in dmt["breakdown"]["exposed_ms_by_step"].items())
    lines += [
        "",
        f"DMT is predicted {dmt['speedup_over_flat']:.2f}x flat's speed on this cluster "
        f"(ms/step: flat {report['modes']['flat']['predicted_ms_per_step']:.3f}, "
        f"dmt {dmt['predicted_ms_per_step']:.3f}; dmt's exposed ms by step: {exposed}).",
    ]
    if "dry_run" in report:
        for mode, d in report["dry_run"].items():
            step = (
                f"one step not trained ({d['phase_2_skipped']})"
                if d.get("phase_2_skipped")
                else f"one step trained: logits {tuple(d['logits_shape'])}"
            )
            other = (
                f"; {len(d['substituted'])} tables built with a sharding type the CPU has "
                f"instead of the plan's ({', '.join(f'{n}: {k}' for n, k in d['substituted'].items())})"
                if d.get("substituted")
                else ""
            )
            same = f" (pass-through towers: dry-run as {d['runs_as']})" if d.get("runs_as") else ""
            lines.append(
                f"dry run {mode}{same}: rank {d['rank']} of {d['world_size']} built "
                f"({d['planned_tables']}/{d['num_tables']} tables planned){other}, {step}, "
                f"{d['seconds']:.1f} s"
            )
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path=CONF_PATH, config_name="plan")
def main(cfg: DictConfig) -> None:
    conf = OmegaConf.to_object(cfg)
    assert isinstance(conf, PlanConfig)
    out = Path(HydraConfig.get().runtime.output_dir)

    def make() -> dict[str, Any]:
        with torch.device("cpu"):
            return plan(conf)

    # PlanRunDirGuard checked a run's directory and its settings before
    # Hydra wrote there; a sweep's job, whose directory it may not know, is checked here.
    # An earlier plan.json stays until the new one replaces it, or goes if planning fails
    # (dmt.planning.run_dir.write_run_output)
    with one_line_errors():
        report = write_run_output(
            out, make, overwrite=conf.overwrite, checkpoint_dir=conf.trainer.checkpoint_dir
        )
    print(format_report(report))
    print(f"written to {out / PLAN_FILE}")


if __name__ == "__main__":
    main()
