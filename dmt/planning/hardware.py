"""Typed description of a training cluster for the step-time model (``cluster=`` config group).

A cluster is ``hosts`` hosts of ``gpus_per_host`` accelerators (``L`` ranks per host, ``G = hosts
L``), an intra-host link per rank (NVLink; loopback on an emulated host), one NIC per
``ranks_per_nic`` ranks and a full-bisection network (:mod:`dmt.planning.network`). Compute is a
dense throughput at the training precision (FP32 in the GPU presets: dmt trains its dense part
in plain fp32, without autocast or TF32) times an achieved efficiency; the embedding lookup is
bound by memory bandwidth (HBM) times a gather efficiency.

Presets live in ``dmt/conf/cluster/`` (``v100``, ``a100``, ``h100`` from public specifications,
``cpu_emulated`` written by ``dmt-plan-calibrate``), each citing its figures; any field is an
override, e.g. ``cluster=h100 cluster.hosts=64``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from dmt.planning.network import LinkSpec


@dataclass
class ClusterConfig:
    """Schema of ``conf/cluster/*.yaml``: hardware of the cluster a plan is made for."""

    name: str = MISSING
    """Preset name in reports ("h100", "cpu_emulated", ...)."""
    source: str = ""
    """Where the figures come from (datasheet, paper table, calibration command and data)."""
    hosts: int = 8
    """Hosts (nodes)."""
    gpus_per_host: int = 8
    """Accelerators (ranks) per host, ``L``."""
    gpu_memory_gb: float = 80.0
    """Memory of one accelerator in GiB (2**30 bytes), as CUDA reports it
    (``torch.cuda.get_device_properties(0).total_memory / 2**30``, e.g. 79.2 for an "80 GB"
    H100), like ``sharding.hbm_gb``; a datasheet's "80 GB" is more than the device offers."""
    dense_tflops: float = MISSING
    """Peak dense throughput of one accelerator at the training precision, TFLOP/s: FP32 for dmt's
    training (no autocast, TF32 off); set the TF32 or BF16 figure for a run that enables them."""
    compute_efficiency: float = 0.5
    """Fraction of ``dense_tflops`` the model's dense layers achieve (0, 1]."""
    hbm_bandwidth_gbps: float = MISSING
    """Memory bandwidth of one accelerator, GB/s."""
    lookup_efficiency: float = 0.5
    """Fraction of ``hbm_bandwidth_gbps`` an embedding gather/scatter achieves (0, 1]."""
    intra_bandwidth_gbps: float = MISSING
    """Intra-host bandwidth of one rank, GB/s per direction (NVLink)."""
    intra_latency_us: float = 5.0
    """Start-up latency of one intra-host message or ring hop, us."""
    nic_bandwidth_gbps: float = MISSING
    """Bandwidth of one NIC, GB/s per direction (100 Gbit/s = 12.5 GB/s)."""
    nic_latency_us: float = 10.0
    """Start-up latency of one cross-host message or ring hop, us."""
    ranks_per_nic: int = 1
    """Ranks that share one NIC (1: a NIC per GPU; ``gpus_per_host``: one NIC per host); divides
    ``gpus_per_host``."""
    collective_overhead_us: float = 0.0
    """Fixed cost of issuing one collective (launch, framework), us."""
    step_overhead_ms: float = 0.0
    """Fixed cost of one training step outside compute and communication (optimizer, Python), ms."""
    shared_cores: int = 0
    """Emulated clusters: CPU cores all ranks share (a rank's compute, lookup, overheads and
    intra-host copies run at ``min(1, shared_cores / G)`` of a core); 0 for real accelerators."""

    @property
    def world_size(self) -> int:
        """``G = hosts * gpus_per_host``."""
        return self.hosts * self.gpus_per_host

    @property
    def device_type(self) -> str:
        """The device ``dmt-train`` runs a rank on: ``"cpu"`` for an emulated cluster
        (``shared_cores > 0``: gloo over CPU cores), ``"cuda"`` for accelerators."""
        return "cpu" if self.shared_cores > 0 else "cuda"

    @property
    def intra(self) -> LinkSpec:
        """The intra-host link of one rank."""
        return LinkSpec(self.intra_bandwidth_gbps, self.intra_latency_us)

    @property
    def inter(self) -> LinkSpec:
        """One NIC."""
        return LinkSpec(self.nic_bandwidth_gbps, self.nic_latency_us)


def validate_cluster(c: ClusterConfig) -> None:
    """Check the numbers of a cluster; raises ValueError naming the setting and what was expected."""
    if not isinstance(c.shared_cores, int) or c.shared_cores < 0:
        raise ValueError(f"cluster.shared_cores={c.shared_cores!r} must be an integer >= 0")
    for setting in ("hosts", "gpus_per_host", "ranks_per_nic"):
        value = getattr(c, setting)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"cluster.{setting}={value!r} must be a positive integer")
    for setting in (
        "gpu_memory_gb",
        "dense_tflops",
        "hbm_bandwidth_gbps",
        "intra_bandwidth_gbps",
        "nic_bandwidth_gbps",
    ):
        value = getattr(c, setting)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"cluster.{setting}={value!r} must be > 0 and finite")
    for setting in ("compute_efficiency", "lookup_efficiency"):
        value = getattr(c, setting)
        if not 0 < value <= 1:
            raise ValueError(f"cluster.{setting}={value!r} must be in (0, 1]")
    for setting in (
        "intra_latency_us",
        "nic_latency_us",
        "collective_overhead_us",
        "step_overhead_ms",
    ):
        value = getattr(c, setting)
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"cluster.{setting}={value!r} must be >= 0 and finite")
    if c.gpus_per_host % c.ranks_per_nic:
        raise ValueError(
            f"cluster.ranks_per_nic={c.ranks_per_nic} must divide cluster.gpus_per_host="
            f"{c.gpus_per_host} (the NICs of a host serve equal numbers of its ranks)"
        )


def register_cluster_configs() -> None:
    """Register :class:`ClusterConfig` as ``cluster/base_cluster`` (package ``cluster``), the schema
    every ``conf/cluster/*.yaml`` extends (``defaults: [base_cluster, _self_]``)."""
    ConfigStore.instance().store(
        group="cluster", name="base_cluster", node=ClusterConfig, package="cluster"
    )
