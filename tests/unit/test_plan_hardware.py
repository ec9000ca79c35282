"""Cluster presets (dmt/conf/cluster/*.yaml) against the ClusterConfig schema and their checks."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dmt.planning.hardware import ClusterConfig, register_cluster_configs, validate_cluster
from dmt.planning.network import LinkSpec

CONF = Path(__file__).resolve().parents[2] / "dmt" / "conf"
PRESETS = sorted(p.stem for p in (CONF / "cluster").glob("*.yaml"))


def _compose(*overrides: str) -> ClusterConfig:
    register_cluster_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name=None, overrides=list(overrides))
    cluster = OmegaConf.to_object(cfg.cluster)
    assert isinstance(cluster, ClusterConfig)
    return cluster


def test_gpu_presets_exist() -> None:
    assert {"v100", "a100", "h100"} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_and_validates(preset: str) -> None:
    cluster = _compose(f"+cluster={preset}")
    validate_cluster(cluster)
    assert cluster.name == preset
    assert cluster.source


def test_paper_table1_figures() -> None:
    # the paper's Table 1: scale-out per GPU (Gbit/s -> GB/s), scale-up per GPU
    for preset, nic_gbit, nvlink in (
        ("v100", 100, 150.0),
        ("a100", 200, 300.0),
        ("h100", 400, 450.0),
    ):
        c = _compose(f"+cluster={preset}")
        assert (c.nic_bandwidth_gbps * 8, c.intra_bandwidth_gbps) == (nic_gbit, nvlink)
        assert (c.gpus_per_host, c.ranks_per_nic) == (8, 1)


@pytest.mark.parametrize(
    ("preset", "fp32_tflops"),
    [("v100", 15.7), ("a100", 19.5), ("h100", 67.0)],  # NVIDIA datasheets, FP32 (no tensor core)
)
def test_dense_throughput_is_the_fp32_peak_dmt_trains_at(preset: str, fp32_tflops: float) -> None:
    # dmt trains its dense part in plain fp32 (below), so the tensor-core TF32/BF16 peaks of the
    # paper's Table 1 do not apply
    assert _compose(f"+cluster={preset}").dense_tflops == fp32_tflops


def test_training_leaves_the_dense_part_in_plain_fp32(tmp_path) -> None:
    """What the presets' FP32 peaks assume: after a training run in this process, torch's
    float32 matmul precision is still "highest" (TF32 off)."""
    from dmt.train import train  # noqa: PLC0415
    from tests.conftest import compose_config  # noqa: PLC0415

    small = [
        "trainer=smoke",
        "logger=disabled",
        "trainer.progress_bar=false",
        "trainer.max_steps=2",
    ]
    train(compose_config(*small, "trainer.checkpoint=true"), tmp_path)
    assert torch.get_float32_matmul_precision() == "highest"
    assert not torch.backends.cuda.matmul.allow_tf32  # (cuDNN's is for convolutions: none here)


@pytest.mark.parametrize(
    ("preset", "reported_bytes"),
    [
        ("v100", 31.74 * 2**30),  # V100-SXM2-32GB: "31.74 GiB total capacity" (torch)
        ("a100", 81049 * 2**20),  # A100 80GB: 81,049 MiB (deviceQuery)
        ("h100", 85_045_903_360),  # H100 SXM 80GB: torch.cuda.get_device_properties().total_memory
    ],
)
def test_gpu_memory_is_the_gib_cuda_reports(preset: str, reported_bytes: float) -> None:
    # GiB like sharding.hbm_gb, at most what CUDA offers (a datasheet's "80 GB" is more)
    memory = _compose(f"+cluster={preset}").gpu_memory_gb
    assert reported_bytes / 2**30 - 0.1 < memory <= reported_bytes / 2**30


def test_overrides_and_links() -> None:
    c = _compose("+cluster=h100", "cluster.hosts=64", "cluster.nic_latency_us=3")
    assert c.world_size == 512
    assert c.inter == LinkSpec(bandwidth_gbps=50.0, latency_us=3.0)
    assert c.intra == LinkSpec(bandwidth_gbps=450.0, latency_us=5.7)


def test_misspelt_key_fails_at_composition() -> None:
    with pytest.raises(ConfigCompositionException, match=r"^Could not override 'cluster.hostz'"):
        _compose("+cluster=h100", "cluster.hostz=64")
    # the schema (ClusterConfig) types the presets' values
    with pytest.raises(ConfigCompositionException, match="cluster.hosts=many") as bad:
        _compose("+cluster=h100", "cluster.hosts=many")
    assert "could not be converted to Integer" in str(bad.value.__cause__)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hosts": 0}, "cluster.hosts=0 must be a positive integer"),
        ({"nic_bandwidth_gbps": 0.0}, "cluster.nic_bandwidth_gbps=0.0 must be > 0 and finite"),
        # reproduced bug: inf passed, then an OverflowError traceback in dmt-plan
        ({"gpu_memory_gb": math.inf}, "cluster.gpu_memory_gb=inf must be > 0 and finite"),
        ({"compute_efficiency": 1.5}, "cluster.compute_efficiency=1.5 must be in (0, 1]"),
        ({"nic_latency_us": -1.0}, "cluster.nic_latency_us=-1.0 must be >= 0 and finite"),
        (
            {"ranks_per_nic": 3},
            "cluster.ranks_per_nic=3 must divide cluster.gpus_per_host=8 "
            "(the NICs of a host serve equal numbers of its ranks)",
        ),
    ],
)
def test_bad_cluster(change: dict[str, object], message: str) -> None:
    c = replace(_compose("+cluster=a100"), **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as err:
        validate_cluster(c)
    assert str(err.value) == message
