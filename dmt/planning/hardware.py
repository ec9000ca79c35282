"""Typed schema of the ``cluster`` config group of ``dmt-plan`` (minimal: hosts, GPUs per host,
GPU memory). The hardware presets (``dmt/conf/cluster/*.yaml``) extend it with link speeds and
compute throughput."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClusterConfig:
    """The cluster to plan for: ``hosts`` hosts of ``gpus_per_host`` GPUs (``L``), so
    ``G = hosts * gpus_per_host`` ranks."""

    hosts: int = 8  # hosts (nodes)
    gpus_per_host: int = 8  # L: GPUs (ranks) per host
    gpu_memory_gb: float = 80.0  # memory of one GPU, GiB
