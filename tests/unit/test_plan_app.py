"""``dmt-plan`` (:func:`dmt.planning.app.plan`) on small clusters: the report's bytes are those
of the collectives it lists and match the shapes of the plan, and bad input fails with a
message that names the numbers."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from torch import nn

from dmt.config import PartitionConfig
from dmt.models import TowerModule, build_model, embedding_parameters
from dmt.models.accounting import dense_flops
from dmt.optim import apply_sparse_optimizer
from dmt.planning.app import (
    PlanConfig,
    check_plan_config,
    format_report,
    ignored_plan_settings,
    plan,
)
from dmt.planning.network import collective_time_s
from dmt.sharding import plan_tables, table_shardings
from dmt.train import CONF_MODULE

# 8 one-hot features of 100 rows, N = 16; 2 hosts x 2 GPUs; 64 samples a step (B = 16 per GPU)
SMALL = [
    "data.synthetic.num_sparse=8",
    "data.synthetic.cardinality=100",
    "data.batch_size=64",
    "cluster.hosts=2",
    "cluster.gpus_per_host=2",
]


def _conf(*overrides: str) -> PlanConfig:
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        cfg = compose("plan", overrides=[*SMALL, *overrides])
    conf = OmegaConf.to_object(cfg)
    assert isinstance(conf, PlanConfig)
    return conf


def _collective(report: dict, mode: str, step: str, direction: str) -> dict:  # type: ignore[type-arg]
    (c,) = [
        c
        for c in report["modes"][mode]["collectives"]
        if (c["step"], c["direction"], c["op"]) == (step, direction, "all_to_all")
    ]
    return c


def test_plan_reports_every_mode() -> None:
    report = plan(_conf())
    assert (report["world_size"], report["num_towers"], report["local_batch"]) == (4, 2, 16)
    assert set(report["modes"]) == {"flat", "sptt", "dmt"}
    for mode in report["modes"].values():
        collectives = mode["collectives"]
        assert mode["cross_host_mb"] == sum(c["cross_host_bytes"] for c in collectives) / 1e6
        assert mode["intra_host_mb"] == sum(c["intra_host_bytes"] for c in collectives) / 1e6
        assert mode["max_rank_memory_gb"] == mode["memory"]["device_bytes"] / 2**30 > 0
    # pass-through towers of 4 features: step f sends B F_t N fp32 values to the one peer, on
    # the other host (K = 1), and gets as many gradients back
    f = _collective(report, "sptt", "f", "forward")
    assert (f["intra_host_bytes"], f["cross_host_bytes"]) == (0, 16 * 4 * 16 * 4)
    assert _collective(report, "sptt", "f", "backward") == {**f, "direction": "backward"}
    # step d stays inside the tower (one host), step a crosses hosts
    d = _collective(report, "sptt", "d", "forward")
    assert d["cross_host_bytes"] == 0 < d["intra_host_bytes"]
    assert _collective(report, "sptt", "a", "forward")["cross_host_bytes"] > 0
    text = format_report(report)
    assert re.search(r"^sptt  f +all_to_all +peer +forward +2 +0\.000 +0\.004$", text, re.M)


def test_bf16_halves_the_embedding_collectives() -> None:
    fp32 = plan(_conf())
    bf16 = plan(_conf("sptt.comm_precision=bf16"))
    for step in ("d", "f"):
        a, b = (_collective(r, "sptt", step, "forward") for r in (fp32, bf16))
        assert a["intra_host_bytes"] + a["cross_host_bytes"] == 2 * (
            b["intra_host_bytes"] + b["cross_host_bytes"]
        )


@pytest.mark.parametrize("search", ["full", "uniform"])
def test_the_flat_plan_is_trainings_at_bf16(search) -> None:
    """Reproduced: dmt-plan planned the flat mode's tables with fp32 sharders whatever
    sptt.comm_precision, which dmt-train's flat run (and dmt-plan's own dry run) plans with: at
    bf16 training's planner shards SMALL's tables table-row-wise, whose pooled outputs go
    through a reduce-scatter inside the host and an all-to-all across hosts, while dmt-plan
    reported table-wise tables' world all-to-all."""
    conf = _conf("sptt.comm_precision=bf16", f"flat_search={search}")
    inputs = check_plan_config(conf)
    model = build_model(
        replace(conf.model, partition=PartitionConfig(kind="none")),
        feature_names=inputs.names,
        cardinalities=inputs.cardinalities,
        num_dense=inputs.num_dense,
        table_device="meta",
        dense_device="meta",
    )
    apply_sparse_optimizer(embedding_parameters(model), conf.optim)
    training = plan_tables(
        model, inputs.budget, world_size=4, local_world_size=2, batch_size=64,
        comm_precision="bf16",
    )  # fmt: skip
    assert {ps.sharding_type for ps in table_shardings(training).values()} == {"table_row_wise"}
    flat = plan(conf)["modes"]["flat"]["collectives"]
    assert [(c["step"], c["op"], c["group"], c["direction"]) for c in flat] == [
        ("flat_input_a2a", "all_to_all", "world", "forward"),
        ("flat_output_a2a", "reduce_scatter", "host", "forward"),
        ("flat_output_a2a", "all_to_all", "cross", "forward"),
        ("flat_output_a2a", "all_gather", "host", "backward"),
        ("flat_output_a2a", "all_to_all", "cross", "backward"),
        ("dense_allreduce", "all_reduce", "world", "backward"),
    ]


def test_row_wise_towers_below_fp32_time_step_d_by_its_own_collectives() -> None:
    """Reproduced bug: with row-wise towers at bf16, step d's reduce-scatter (an all-to-all
    below fp32) was merged with the tower's empty all-to-all and timed again as that one's
    transposed backward, beside the all-gather: bf16 predicted step d slower than fp32."""
    overrides = ("sptt.sharding_type=row_wise", "model.pooling=sum")
    bf16 = plan(_conf(*overrides, "sptt.comm_precision=bf16"))
    fp32 = plan(_conf(*overrides))
    cluster = _conf().cluster
    for report, scatter in ((bf16, "all_to_all"), (fp32, "reduce_scatter")):
        mode = report["modes"]["sptt"]
        d = [c for c in mode["collectives"] if c["step"] == "d"]
        assert [(c["op"], c["direction"]) for c in d] == [
            (scatter, "forward"),
            ("all_gather", "backward"),
        ]
        wire = [
            1e3
            * collective_time_s(
                c["op"],
                group_size=c["group_size"],
                ranks_per_host=2,
                intra_host_bytes=c["intra_host_bytes"],
                cross_host_bytes=c["cross_host_bytes"],
                intra=cluster.intra,
                inter=cluster.inter,
                ranks_per_nic=cluster.ranks_per_nic,
            )
            for c in d
        ]
        timed = [c["time_ms"] for c in mode["breakdown"]["collectives"] if c["step"] == "d"]
        assert timed == wire
    assert (
        bf16["modes"]["sptt"]["breakdown"]["exposed_ms_by_step"]["d"]
        < fp32["modes"]["sptt"]["breakdown"]["exposed_ms_by_step"]["d"]
    )


def test_hosts_not_divisible_by_hosts_per_tower() -> None:
    with pytest.raises(ValueError) as e:
        plan(_conf("cluster.hosts=3", "sptt.hosts_per_tower=2", "data.batch_size=60"))
    assert str(e.value) == (
        "cluster.hosts=3 is not divisible by sptt.hosts_per_tower=2: every tower spans K whole "
        "hosts, so G = 3 * 2 = 6 GPUs must be a multiple of K * L = 2 * 2 = 4"
    )


def test_towers_that_do_not_fit_the_cluster() -> None:
    with pytest.raises(ValueError) as e:
        plan(_conf("+partition=naive", "model.partition.num_towers=4"))
    assert str(e.value) == (
        "the model has 4 towers (model.partition), but the cluster gives T = G / (K * L) = "
        "4 / (1 * 2) = 2 towers (cluster.hosts=2, cluster.gpus_per_host=2, "
        "sptt.hosts_per_tower=1): set cluster.hosts to 4 towers times sptt.hosts_per_tower, "
        "or set model.partition.num_towers=2"
    )
    with pytest.raises(ValueError) as e:
        plan(_conf("+partition=naive", "model.partition.num_towers=2", "cluster.hosts=4"))
    assert str(e.value) == (
        "the model has 2 towers (model.partition), but the cluster gives T = G / (K * L) = "
        "8 / (1 * 2) = 4 towers (cluster.hosts=4, cluster.gpus_per_host=2, "
        "sptt.hosts_per_tower=1): set sptt.hosts_per_tower=2 (4 hosts / 2 towers), or set "
        "model.partition.num_towers=4"
    )


@pytest.mark.parametrize("num_towers", [None, 2])
def test_towers_of_a_partition_file_that_do_not_fit_the_cluster(tmp_path, num_towers) -> None:
    """Reproduced: the advice "or change model.partition.num_towers" helps only a naive
    partition; a tp partition's towers are its file's, and following it was refused with
    "model.partition.num_towers=4 but the tp partition in '...' has 2 towers". The advice names
    a file of the cluster's towers (and num_towers where it is set), which plans."""
    two, four = tmp_path / "two.yaml", tmp_path / "four.yaml"
    two.write_text(f"towers: {[[f'cat_{i}' for i in range(t, 8, 2)] for t in range(2)]}\n")
    four.write_text(f"towers: {[[f'cat_{i}' for i in range(t, 8, 4)] for t in range(4)]}\n")
    count = [] if num_towers is None else [f"model.partition.num_towers={num_towers}"]
    with pytest.raises(ValueError) as e:
        check_plan_config(
            _conf("cluster.hosts=4", "+partition=tp", f"model.partition.path={two}", *count)
        )
    assert str(e.value).endswith(
        "sptt.hosts_per_tower=1): set sptt.hosts_per_tower=2 (4 hosts / 2 towers), or set "
        "model.partition.path to a partition file of 4 towers (dmt-partition --num-towers 4 "
        "writes one: <--out>/partition.yaml)"
        + ("" if num_towers is None else " and model.partition.num_towers=4")
    )
    followed = [f"model.partition.path={four}", *(["model.partition.num_towers=4"] * len(count))]
    assert check_plan_config(_conf("cluster.hosts=4", "+partition=tp", *followed)).partition == [
        [f"cat_{i}" for i in range(t, 8, 4)] for t in range(4)
    ]


@pytest.mark.parametrize(
    ("partition", "advice", "followed"),
    [
        (
            ["+partition=per_feature"],
            "set cluster.hosts to 8 towers times sptt.hosts_per_tower, or split the features "
            "into 4 towers with another partition kind (e.g. model.partition.kind=naive "
            "model.partition.num_towers=4)",
            ["+partition=naive", "model.partition.num_towers=4"],
        ),
        (
            [
                "model.partition.kind=explicit",
                "model.partition.towers=[[cat_0,cat_1],[cat_2,cat_3,cat_4,cat_5,cat_6,cat_7]]",
            ],
            "set sptt.hosts_per_tower=2 (4 hosts / 2 towers), or list 4 towers in "
            "model.partition.towers",
            [
                "model.partition.kind=explicit",
                "model.partition.towers=[[cat_0],[cat_1,cat_2],[cat_3,cat_4],[cat_5,cat_6,cat_7]]",
            ],
        ),
    ],
)
def test_towers_of_another_kind_that_do_not_fit_the_cluster(partition, advice, followed) -> None:
    """A per_feature partition has a tower per feature and an explicit one its listed towers:
    neither reads num_towers, which the advice named for every kind."""
    with pytest.raises(ValueError) as e:
        check_plan_config(_conf("cluster.hosts=4", *partition))
    assert str(e.value).endswith(f"sptt.hosts_per_tower=1): {advice}")
    assert check_plan_config(_conf("cluster.hosts=4", *followed)).topo.num_towers == 4


def test_batch_not_divisible_by_gpus() -> None:
    with pytest.raises(ValueError) as e:
        plan(_conf("data.batch_size=66"))
    assert str(e.value) == (
        "data.batch_size=66 (global) is not divisible by the G = 2 * 2 = 4 GPUs: every rank "
        "trains on the same local batch"
    )


ROWS = "data.synthetic.cardinalities=[100,100,100,1,100,100,100,100]"


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (
            ["sptt.sharding_type=row_wise", "model.pooling=mean"],
            "sptt: sptt.sharding_type=row_wise needs model.pooling=sum, got model.pooling=mean: "
            "step d adds each row shard's partial sums, and partial means do not add up to the "
            "mean; use sptt.sharding_type=table_wise or column_wise for mean pooling",
        ),
        (
            ["sptt.sharding_type=row_wise", ROWS, "sptt.local_world_size=1"],
            "sptt: sptt.sharding_type=row_wise puts a row block of every table on each of the "
            "K*L=2 ranks of its tower (sptt.hosts_per_tower=1, L=2 ranks per host "
            "(cluster.gpus_per_host=2)), but the table of feature cat_3 has 1 row "
            "(data.synthetic.cardinalities[3]=1): a row-wise table needs at least 2 rows; give "
            "it more, or use sptt.sharding_type=table_wise or column_wise",
        ),
        (
            ["+optim.sparse.weight_decay=0.01"],
            "optim.sparse.weight_decay=0.01 needs +optim.sparse.weight_decay_mode=l2 or decouple "
            "(FBGEMM's kernels ignore the weight decay under mode none; the mode is a kwarg of "
            "the torchrec.optim classes, e.g. torchrec.optim.RowWiseAdagrad)",
        ),
    ],
)
def test_a_layout_dmt_train_refuses_is_not_planned(overrides, refusal) -> None:
    """Reproduced: dmt-plan wrote figures for runs dmt-train refuses (row-wise SPTT tables of
    mean pooling; a sparse weight decay FBGEMM's CUDA kernels ignore), and refused a row-wise
    table of fewer rows than a tower's ranks without naming the setting. It refuses them with
    dmt-train's own message, the mode first where only SPTT's run refuses it (as a mode beyond
    the GPU's memory is), its L the cluster's (sptt.local_world_size emulates hosts in
    dmt-train only)."""
    with pytest.raises(ValueError) as e:
        check_plan_config(_conf(*overrides))
    assert str(e.value) == refusal


EMULATED = (
    "sptt.local_world_size=1 is not planned: dmt-plan takes L = cluster.gpus_per_host=2 ranks "
    "per host, towers of K*L = 1*2 ranks (sptt.hosts_per_tower=1), while dmt-train on this "
    "cluster takes sptt.local_world_size over LOCAL_WORLD_SIZE (it emulates hosts) and trains "
    "towers of K*L = 1*1; cluster.hosts=4 cluster.gpus_per_host=1 plans those emulated hosts, "
    "sptt.local_world_size=null the cluster's"
)


def test_emulated_hosts_are_named_not_planned() -> None:
    """Reproduced: sptt.local_world_size, which dmt-train takes over LOCAL_WORLD_SIZE to
    emulate hosts, was dropped without a word: the plan's L is cluster.gpus_per_host (a cluster
    preset's hosts are real), and a setting that disagrees is named with both (plan warns)."""
    conf = _conf()

    def ignored(emulated: int | None) -> list[str]:
        return ignored_plan_settings(
            replace(conf, sptt=replace(conf.sptt, local_world_size=emulated))
        )

    assert ignored(1) == [EMULATED]
    assert ignored(None) == ignored(2) == []
    (odd,) = ignored(3)
    assert odd.endswith(
        "towers of K*L = 1*3; G = 4 ranks are no multiple of 3: dmt-train refuses that world, "
        "sptt.local_world_size=null the cluster's"
    )


@pytest.mark.slow
def test_a_plan_of_emulated_hosts_warns(caplog) -> None:
    with caplog.at_level("WARNING", logger="dmt.planning.app"):
        report = plan(_conf("sptt.local_world_size=1"))
    assert (report["local_world_size"], report["num_towers"]) == (2, 2)
    assert [r.getMessage() for r in caplog.records if r.name == "dmt.planning.app"] == [EMULATED]


@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        (
            "optim=adam",
            "optim.sparse._target_=torch.optim.Adam (FBGEMM adam) needs a CUDA device: FBGEMM's "
            "CPU embedding kernels support ['exact_sgd', 'exact_adagrad', "
            "'exact_row_wise_adagrad'] (e.g. torchrec.optim.RowWiseAdagrad, torch.optim.Adagrad, "
            "torch.optim.SGD)",
        ),
        (
            "+optim.sparse.max_norm=1.0",
            "optim.sparse.max_norm=1.0 would do nothing: FBGEMM clips the rows to max_norm in "
            "its CUDA row-wise Adagrad kernel only, not in its exact_row_wise_adagrad kernel on "
            "cpu; set it to 0, or train on CUDA with "
            "optim.sparse._target_=torchrec.optim.RowWiseAdagrad",
        ),
    ],
)
def test_an_emulated_cluster_checks_the_sparse_optimizer_on_cpu(setting, refusal) -> None:
    """Reproduced: cluster=cpu_emulated (dmt-train on CPU ranks) checked optim.sparse as on
    CUDA and planned fused Adam and a max_norm that dmt-train refuses there (a GPU preset
    still plans them: CUDA's own refusals are test_a_layout_dmt_train_refuses_is_not_planned's)."""
    with pytest.raises(ValueError) as e:
        check_plan_config(_conf("cluster=cpu_emulated", setting))
    assert str(e.value) == (
        "cluster.name=cpu_emulated is an emulated CPU cluster (cluster.shared_cores=2: "
        f"dmt-train runs its ranks on CPU): {refusal}"
    )


def test_a_dry_run_refuses_a_sparse_optimizer_only_cuda_has_before_planning() -> None:
    """Reproduced: on a GPU cluster, optim=adam dry_run=true planned every mode, then failed in
    the dry run (on CPU) with "needs a CUDA device" alone, as if the GPU plan were wrong, and
    wrote no plan.json. The check before planning refuses it, saying the dry run is on CPU."""
    with pytest.raises(ValueError) as e:
        check_plan_config(_conf("optim=adam", "dry_run=true"))
    assert str(e.value).startswith(
        "dry_run=true trains one step of every mode on CPU (dmt.planning.dry_run; plan without "
        "it): optim.sparse._target_=torch.optim.Adam (FBGEMM adam) needs a CUDA device: "
    )


def test_a_model_that_does_not_fit_in_gpu_memory() -> None:
    """1 MiB GPUs hold the tables (51 KiB) but not a 65536-sample local batch's activations:
    the SPTT modes, planned first, say so."""
    with pytest.raises(ValueError) as e:
        plan(_conf("cluster.gpu_memory_gb=0.0009765625", "data.batch_size=262144"))
    match = re.fullmatch(
        r"sptt: rank (\d) needs (\d+) bytes \(\d+\.\d\d GiB\) of GPU memory, 1048576 bytes "
        r"\(0\.00 GiB\) are available \(tables (\d+), optimizer state (\d+), UVM caches 0, "
        r"dense (\d+), activations (\d+) bytes\)",
        str(e.value),
    )
    assert match, str(e.value)
    rank, needed, *parts = (int(g) for g in match.groups())
    assert needed == sum(parts) > 1048576


def test_a_tables_budget_larger_than_the_gpu_is_refused() -> None:
    """dmt-plan budgets the tables as training does: sharding.hbm_gb, which may not exceed the
    GPU's memory (cluster.gpu_memory_gb)."""
    with pytest.raises(ValueError) as e:
        plan(_conf("cluster.gpu_memory_gb=1", "sharding.hbm_gb=2"))
    assert str(e.value).startswith(
        "sharding.hbm_gb = 2 GiB (2147483648 bytes) is more than a GPU of "
        "cluster.gpu_memory_gb=1.0 has (1 GiB (1073741824 bytes) in all)"
    )


def test_a_budget_of_the_gpus_share_names_the_gpus_setting() -> None:
    """Reproduced: with sharding.hbm_gb unset (80% of cluster.gpu_memory_gb), a table that did
    not fit said "more than sharding.hbm_gb = 85 bytes per rank: raise sharding.hbm_gb"."""
    with pytest.raises(ValueError) as e:
        plan(_conf("cluster.gpu_memory_gb=0.0000001"))
    assert str(e.value).endswith(
        "of HBM, more than sharding.hbm_gb (unset: 80% of cluster.gpu_memory_gb=1e-07 GiB = 85 "
        "bytes) per rank: raise cluster.gpu_memory_gb or set sharding.hbm_gb, lower "
        "sharding.uvm_cache_load_factor, or use more ranks"
    ), str(e.value)


def test_tables_are_planned_within_sharding_hbm_gb() -> None:
    """Tables of 10,000 rows: a rank's two take 1.36 MB with their state, which misses a 1 MiB
    table budget: flat and SPTT both UVM-cache some, as training would, though the GPU itself
    has room (before, dmt-plan gave the tables the whole GPU)."""
    rows = "data.synthetic.cardinality=10000"
    roomy = plan(_conf(rows))
    short = plan(_conf(rows, f"sharding.hbm_gb={1 / 1024}"))
    for mode in ("flat", "sptt"):
        full = roomy["modes"][mode]["memory"]
        assert full["table_bytes"] + full["optimizer_state_bytes"] == 1_360_000
        assert full["uvm_cache_bytes"] == 0
        cached = short["modes"][mode]["memory"]
        assert cached["uvm_cache_bytes"] > 0 and cached["uvm_host_bytes"] > 0, (mode, cached)


def test_a_budget_only_the_flat_planner_refuses_fails_in_planning() -> None:
    """5,500 bytes hold a rank's two UVM-cached tables in SPTT's plan (2 x 2,480), not in
    TorchRec's, which counts their input and output buffers too: the settings pass the check
    that runs before Hydra writes the run directory (check_plan_config), and planning refuses
    them (README: with overwrite=true an earlier plan.json goes; it said it stays)."""
    conf = _conf(f"sharding.hbm_gb={5500 / 2**30}")
    sptt = check_plan_config(conf).sptt["sptt"][2]
    assert {s.compute_kernel for s in sptt.shards} == {"fused_uvm_caching"}
    with pytest.raises(ValueError) as e:
        plan(conf)
    assert str(e.value).startswith(
        "flat: TorchRec's planner found no sharding of the tables within the memory budget "
        "(cuda: HBM 5.37 KiB (5500 bytes), host memory 128 GiB (137438953472 bytes) per rank, "
        "UVM cache load factor 0.2; sharding.hbm_gb, sharding.ddr_gb): "
    )


def test_dry_run_of_an_experiment_without_tower_modules() -> None:
    # the default experiment has no towers: dmt is sptt (pass-through towers), and its dry run
    # is sptt's; 4 hosts of 2 GPUs, 2 hosts per tower: T = 2 towers of 4 ranks
    report = plan(_conf("cluster.hosts=4", "sptt.hosts_per_tower=2", "dry_run=true"))
    runs = report["dry_run"]
    assert set(runs) == {"flat", "sptt", "dmt"}
    assert runs["dmt"]["runs_as"] == "sptt"
    assert runs["dmt"]["mode"] == runs["sptt"]["mode"] == "sptt"
    for mode in ("sptt", "dmt"):
        assert (runs[mode]["world_size"], runs[mode]["num_towers"]) == (8, 2)
        assert runs[mode]["planned_tables"] == 8
        assert tuple(runs[mode]["logits_shape"]) == (2,)
    assert "dry run dmt (pass-through towers: dry-run as sptt): rank 0 of 8 built" in (
        format_report(report)
    )


def test_dense_memory_counts_the_dense_optimizers_state() -> None:
    # Adam (the default) keeps 2 tensors per parameter, RMSprop 1, RMSprop centered with
    # momentum 3, SGD with momentum 1: dense bytes are P (2 + states) for P bytes of parameters
    def dense(*overrides: str) -> int:
        return int(plan(_conf(*overrides))["modes"]["dmt"]["memory"]["dense_bytes"])

    def mlp(inputs: int, sizes: list[int]) -> int:  # weights and biases
        return sum((i + 1) * o for i, o in zip([inputs, *sizes[:-1]], sizes, strict=True))

    # SMALL's DLRM, counted by hand: 13 dense inputs, bottom 64-16, 8 tables of dim 16, and the
    # top MLP 256-128-1 over the dense vector and the 9 vectors' 36 pairwise dots; fp32
    params = 4 * (mlp(13, [64, 16]) + mlp(16 + 9 * 8 // 2, [256, 128, 1]))
    adam = dense()
    assert adam == 4 * params  # weights, gradients, Adam's two moments
    assert dense("optim.dense._target_=torch.optim.RMSprop") == 3 * params
    centered = ["optim.dense._target_=torch.optim.RMSprop", "+optim.dense.centered=true"]
    assert dense(*centered, "+optim.dense.momentum=0.9") == 5 * params
    assert dense("+optim.dense.amsgrad=true") == 5 * params
    sgd = ["optim.dense._target_=torch.optim.SGD", "~optim.dense.eps"]
    assert dense(*sgd, "+optim.dense.momentum=0.9") == 3 * params
    assert dense(*sgd) == 2 * params
    # trainer.ema_decay: the average of every dense parameter, one more copy (dmt.ema.DenseEMA)
    assert dense("trainer.ema_decay=0.9") == 5 * params


def test_an_unknown_dense_optimizer_is_named() -> None:
    with pytest.raises(ValueError, match=r"^optim.dense._target_=torch.optim.nadam.NAdam: "):
        plan(_conf("optim.dense._target_=torch.optim.NAdam"))


def test_fused_adam_on_the_tables_slows_the_lookup_by_seven_thirds() -> None:
    # row-wise Adagrad (the default) moves the row 3 times, fused Adam 3 + 2 x 2 (two moments)
    rowwise = plan(_conf())["modes"]
    adam = plan(_conf("optim=adam"))["modes"]
    for mode in ("flat", "sptt", "dmt"):
        assert adam[mode]["breakdown"]["lookup_ms"] == pytest.approx(
            rowwise[mode]["breakdown"]["lookup_ms"] * 7 / 3
        )


def test_the_tower_modules_compute_is_the_busiest_towers() -> None:
    """Reproduced bug: 7 features in 2 towers (4 and 3) with DLRM tower modules (N -> D per
    feature, 6 N D = 768 training FLOPs a feature and sample): a rank of the 4-feature tower
    runs its module over T B samples, 2 x 4 x 768 FLOPs per sample of its local batch, and the
    step waits for it; dmt-plan charged the towers' mean, 7 x 768."""
    conf = _conf(
        "experiment=dmt_4t_dlrm", "model.partition.num_towers=2", "data.synthetic.num_sparse=7"
    )
    model = check_plan_config(conf).sptt["dmt"][1]
    assert [t.num_features for t in model.towers] == [4, 3]
    flops = dense_flops(model)[1] + (2 * 4 - 7) * 6 * 16 * 8
    rate = conf.cluster.dense_tflops * conf.cluster.compute_efficiency * 1e12
    compute_ms = plan(conf)["modes"]["dmt"]["breakdown"]["compute_ms"]
    assert compute_ms == pytest.approx(1e3 * 16 * flops / rate)  # B = 16


def test_the_lookup_time_is_the_busiest_ranks() -> None:
    # 2 towers of 3 tables on 2 ranks each: a rank of each tower holds 2 tables, as every rank
    # does with 8 tables; the step waits for it (a reproduced bug: the lookup was charged at the
    # average, F ids per sample, so 6 tables took 3/4 of the time of 8)
    six = plan(_conf("data.synthetic.num_sparse=6"))["modes"]
    eight = plan(_conf())["modes"]
    for mode in ("sptt", "dmt"):
        assert six[mode]["breakdown"]["lookup_ms"] == pytest.approx(
            eight[mode]["breakdown"]["lookup_ms"]
        )


class LinearTower(TowerModule):
    """A user's tower module: ``Linear(F_t N -> hidden)``, ReLU, ``Linear(hidden -> D)``."""

    def __init__(self, num_features: int, embedding_dim: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.num_features, self.embedding_dim, self.num_vectors, self.dim = (
            num_features,
            embedding_dim,
            1,
            dim,
        )
        self.mlp = nn.Sequential(
            nn.Linear(num_features * embedding_dim, hidden, bias=False),
            nn.ReLU(),
            nn.Linear(hidden, dim, bias=False),
        )

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        return self.mlp(embs.flatten(1)).unsqueeze(1)


class WeightTower(LinearTower):
    """:class:`LinearTower`'s computation with its weights as parameters of its own."""

    def __init__(self, num_features: int, embedding_dim: int, dim: int, hidden: int) -> None:
        super().__init__(num_features, embedding_dim, dim, hidden)
        del self.mlp
        self.w1 = nn.Parameter(torch.zeros(num_features * embedding_dim, hidden))
        self.w2 = nn.Parameter(torch.zeros(hidden, dim))

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        return (torch.relu(embs.flatten(1) @ self.w1) @ self.w2).unsqueeze(1)


def test_a_tower_modules_activations_count_however_its_layers_are_written() -> None:
    """Reproduced: dmt-plan counted the activations of ``nn.Linear`` layers only, so a user's
    tower module holding its weights itself (or a CrossNet) counted none: with hidden=4096 the
    dmt mode's GPU memory was 0.20 GiB for :class:`WeightTower` and 2.21 GiB for
    :class:`LinearTower`, the same computation. Both count ``hidden + D`` per sample of the
    tower's batch (``T B``, ``T = 2``) now."""
    reports = {
        cls.__name__: plan(
            _conf(
                "+partition=naive",
                "model.partition.num_towers=2",
                f"model.tower._target_={__name__}.{cls.__name__}",
                "+model.tower.dim=16",
                "+model.tower.hidden=4096",
            )
        )["modes"]
        for cls in (LinearTower, WeightTower)
    }
    linear, weights = reports["LinearTower"], reports["WeightTower"]
    assert weights["dmt"]["memory"] == linear["dmt"]["memory"]
    # B = 16 per GPU, T = 2: the tower module's (4096 + 16) per sample of 2 B, activation and
    # gradient of 4 bytes, on top of the dense part's (bottom MLP, interaction, top MLP)
    towers = 2 * 4 * 2 * 16 * (4096 + 16)
    assert weights["dmt"]["memory"]["activation_bytes"] > towers
