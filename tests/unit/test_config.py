import os

import pytest
import torch
import torch.distributed as dist
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from dmt.config import ignored_settings, validate
from dmt.data import build_data
from dmt.inspect import inspect_config
from dmt.train import train
from tests.conftest import REPO, compose_config, free_port, typed_config

GROUPS = ["model", "data", "optim", "trainer", "logger", "sptt", "sharding", "tower", "partition"]
#: what an option needs beside it: tower and partition options configure a DMT model (towers
#: of DCN, whose interaction takes towers of any output size; an experiment that has one),
#: sptt=on trains one, a tp partition reads a file (not read here)
CONTEXT = {
    "tower": [
        "model=dcn",
        "+partition=naive",
        "model.partition.num_towers=2",
        "+tower=passthrough",
    ],
    "partition": ["experiment=dmt_4t_dlrm"],
    "sptt": ["experiment=dmt_4t_dlrm"],
}
#: a run long enough for every trainer.*_every, on 8 ranks: only settings nothing reads remain
LONG_RUN = {"world_size": 8, "total_steps": 10**9, "device": "cpu"}
#: what each option must set, where a group has a field that names it
CHOSEN = {
    "model": lambda conf: conf.model.name,
    # conf/tower/<name>.yaml builds dmt.models.tower_modules.<Name>TowerModule (or PassThrough)
    "tower": lambda conf: (
        conf.model.tower._target_.rsplit(".", 1)[1].lower().removesuffix("towermodule")
    ),
    "partition": lambda conf: conf.model.partition.kind,
    "sptt": lambda conf: "on" if conf.sptt.enabled else "off",
    "data": lambda conf: "synthetic" if conf.data.kind == "synthetic" else "criteo",
}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (REPO / "dmt" / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes(group):
    """Every option of the group composes and validates (the Criteo data options too: they need
    their data only to build the data set), sets what it names, and nothing its run would not
    read."""
    opts = options(group)
    assert opts, group
    for opt in opts:
        path = ["model.partition.path=towers.yaml"] if (group, opt) == ("partition", "tp") else []
        conf = typed_config(*CONTEXT.get(group, []), f"{group}={opt}", *path)
        if group in CHOSEN:
            expected = opt if group != "data" else "synthetic" if "synthetic" in opt else "criteo"
            assert CHOSEN[group](conf) == expected, (group, opt)
        if group == "data" and conf.data.kind == "criteo":
            assert conf.data.criteo is not None and conf.data.criteo.preprocessed_dir, opt
        assert ignored_settings(conf, **LONG_RUN) == [], (group, opt)


EXPERIMENTS = options("experiment")
#: the Criteo data's shape (26 categorical, 13 dense) for inspecting a Criteo experiment without
#: its preprocessed arrays (table sizes only change the parameter count)
CRITEO_SCHEMA = ([f"cat_{i}" for i in range(26)], [1000] * 26, 13)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_inspects(name, monkeypatch):
    conf = typed_config(f"experiment={name}")
    assert ignored_settings(conf, **LONG_RUN) == []
    if conf.data.kind != "synthetic":
        assert conf.data.criteo is not None
        assert conf.data.criteo.raw_path == "../shared/data/criteo-kaggle-sample/train.tsv", name
        monkeypatch.setattr("dmt.data.criteo_dataset.criteo_schema", lambda data: CRITEO_SCHEMA)
    report = inspect_config(conf)
    assert report["num_parameters"] > 0 and report["train_mflops_per_sample"] > 0
    if conf.data.kind != "synthetic":
        assert report["num_features"] == 26
        assert report["num_embedding_parameters"] == 26 * 1000 * conf.model.embedding_dim


def test_paper_configs_match_the_paper_accounting():
    dlrm = inspect_config(typed_config("experiment=paper_dlrm"))
    dcn = inspect_config(typed_config("experiment=paper_dcn"))
    assert round(dlrm["num_parameters"] / 1e9, 2) == 22.78  # paper Table 3
    assert abs(dlrm["train_mflops_per_sample"] - 14.74) < 0.01
    assert round(dcn["num_parameters"] / 1e9, 2) == 22.79
    assert abs(dcn["train_mflops_per_sample"] - 96.22) < 0.1


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["model.interaction._target_=dmt.models.Transformer"],
            r"model.interaction: cannot build _target_='dmt.models.Transformer'",
        ),
        (
            ["model.interaction=cross"],
            r"^model.interaction='cross' is a string, not a config with a _target_",
        ),
        (["model.embedding_dim=0"], r"model.embedding_dim=0 must be positive"),
        (["model.top_mlp=[64,-1,1]"], r"model.top_mlp\[1\]=-1 must be a positive integer"),
        (["model.top_mlp=[64,2]"], r"model.top_mlp must end in 1"),
        (
            ["model.bottom_mlp=[64,32]"],
            r"model.interaction: DotInteraction: the dense vector has size 32 "
            r"\(model.bottom_mlp\[-1\]\) but the sparse vectors have size 16",
        ),
        (["data.batch_size=0"], r"data.batch_size=0 must be positive"),
        (["data.synthetic.num_groups=40"], r"data.synthetic.num_groups=40 exceeds num_sparse=26"),
        (
            ["data.synthetic.cardinalities=[5,5]"],
            r"data.synthetic.cardinalities has 2 entries but data.synthetic.num_sparse=26",
        ),
        (
            ["optim.sparse._target_=torch.optim.AdamW"],
            r"optim.sparse._target_=torch.optim.adamw.AdamW cannot be fused",
        ),
        (
            ["optim.dense.lr=-1"],
            r"optim.dense \(_target_=torch.optim.Adam\): Invalid learning rate",
        ),
        (  # a reproduced bug: the sparse optimizer's own checks named no setting
            ["+optim.sparse.weight_decay=-0.1"],
            r"^optim.sparse \(_target_=torchrec.optim.RowWiseAdagrad\): Invalid weight_decay "
            r"value: -0.1$",
        ),
        (
            ["optim.sparse.eps=-1"],
            r"^optim.sparse \(_target_=torchrec.optim.RowWiseAdagrad\): Invalid epsilon value",
        ),
        (["optim.schedule.decay=step"], r"optim.schedule: decay='step' is not one of"),
        (["optim.lr=-1"], r"optim.lr=-1.0 must be positive"),
        (["logger.mode=loud"], r"logger.mode='loud' is not supported"),
        (["trainer.collective_timeout_s=0"], r"trainer.collective_timeout_s=0.0 must be positive"),
        # reproduced bugs: NaN passed (then "cannot convert float NaN to integer" in the
        # runtime), inf an OverflowError there; a seed numpy refuses failed in the trainer
        (
            ["trainer.collective_timeout_s=nan"],
            r"^trainer.collective_timeout_s=nan must be positive$",
        ),
        (
            ["trainer.collective_timeout_s=inf"],
            r"^trainer.collective_timeout_s=inf must be finite$",
        ),
        (["trainer.seed=-1"], r"^trainer.seed=-1 must be in \[0, 2\*\*32 - 1\]$"),
        (["trainer.seed=4294967296"], r"^trainer.seed=4294967296 must be in \[0, 2\*\*32 - 1\]$"),
        (  # reproduced bugs: -1 failed in the trainer with numpy's "expected non-negative
            # integer"; 2**32 drew the same generators as other seeds (seed 0's rows 65,536 on)
            ["data.synthetic.seed=-1"],
            r"^data.synthetic.seed=-1 must be in \[0, 2\*\*32 - 1\]$",
        ),
        (
            ["data.synthetic.seed=4294967296"],
            r"^data.synthetic.seed=4294967296 must be in \[0, 2\*\*32 - 1\]$",
        ),
        (
            ["data=criteo_sample", "data.criteo.split_fractions=[nan,0.5,0.5]"],
            r"^data.criteo: split_fractions must be 3 finite non-negative numbers",
        ),
        (
            ["sptt.timeout_s=30"],
            r"sptt.timeout_s=30.0 was replaced by trainer.collective_timeout_s, the timeout of every "
            r"process group \(flat and SPTT\): set trainer.collective_timeout_s=30.0 instead",
        ),
        (  # checked with the config, before the runtime and the logger start
            ["data=criteo_sample", "data.criteo.split_fractions=[0.5,0.6,0.1]"],
            r"^data.criteo: split_fractions must sum to 1; got \[0.5, 0.6, 0.1\]",
        ),
        (  # Hydra's override syntax for a group the defaults list lacks
            ["+tower=dlrm"],
            r"pick a partition \(\+partition=naive\|tp\|per_feature\)$",
        ),
        (  # failed in ShardedDMT, after the process groups, naming neither setting
            [
                "experiment=dmt_4t_dlrm",
                "sptt=on",
                "sptt.sharding_type=row_wise",
                "model.pooling=mean",
            ],
            r"^sptt.sharding_type=row_wise needs model.pooling=sum, got model.pooling=mean: step d "
            r"adds each row shard's partial sums",
        ),
        (  # a reproduced bug: the run directory was said to hold another run's outputs ('./')
            ["trainer.checkpoint_dir="],
            r"^trainer.checkpoint_dir='' is the run directory itself; it must name a directory of "
            r"the checkpoints' own, relative to the run directory \(e.g. checkpoints, the "
            r"default\) or absolute$",
        ),
        (
            ["trainer.checkpoint_dir=./"],
            r"^trainer.checkpoint_dir='./' is the run directory itself",
        ),
        (["trainer.checkpoint_dir=/"], r"^trainer.checkpoint_dir='/' is the file system's root; "),
        (
            ["trainer.checkpoint_keep=-1"],
            r"^trainer.checkpoint_keep=-1 must be >= 0 \(the newest checkpoints to keep; 0: "
            r"keep all\)$",
        ),
        (["trainer.checkpoint_dir=//"], r"^trainer.checkpoint_dir='//' is the file system's root"),
        (  # a reproduced bug: with sptt=off these were not checked, and the run trained
            ["sptt.sharding_type=bogus"],
            r"^sptt.sharding_type='bogus' is not supported; expected one of \['table_wise', "
            r"'column_wise', 'row_wise'\]$",
        ),
        (["sptt.peer_permute=bogus"], r"^sptt.peer_permute='bogus' is not supported"),
        (["sptt.hosts_per_tower=0"], r"^sptt.hosts_per_tower=0 must be positive"),
        (["sptt.local_world_size=0"], r"^sptt.local_world_size=0 must be positive"),
        # every check of validate() below failed no unit test when dropped (mutation testing)
        (["model.name="], r"^model.name='' must be a non-empty name \(it labels reports"),
        (["model.pooling=max"], r"^model.pooling='max' is not supported; expected one of"),
        (["data.eval_batch_size=0"], r"^data.eval_batch_size=0 must be positive$"),
        (["data.synthetic.mode=foo"], r"^data.synthetic.mode='foo' is not supported"),
        (["data.synthetic.tie_prob=1.5"], r"^data.synthetic.tie_prob=1.5 must be in \[0, 1\]$"),
        (["data.synthetic.click_rate=1"], r"^data.synthetic.click_rate=1.0 must be in \(0, 1\)$"),
        (["model.top_mlp=[64,0,1]"], r"^model.top_mlp\[1\]=0 must be a positive integer"),
        (
            ["sharding.uvm_cache_load_factor=1"],
            r"^sharding.uvm_cache_load_factor=1.0 must be strictly between 0 and 1",
        ),
        (["data.synthetic.skew=-1"], r"^data.synthetic.skew=-1.0 must be >= 0$"),
        (["data.kind=criteo"], r"^data.kind=criteo needs a data.criteo section"),
        (["optim.sparse_lr=0"], r"^optim.sparse_lr=0.0 must be positive$"),
        (["trainer.device=tpu"], r"^trainer.device='tpu' is not supported; expected one of"),
        (["trainer.log_every=0"], r"^trainer.log_every=0 must be positive$"),
        (["trainer.eval_every=-1"], r"^trainer.eval_every=-1 must be >= 0 \(0: only at the end\)$"),
        (
            ["trainer.checkpoint_every=-1"],
            r"^trainer.checkpoint_every=-1 must be >= 0 \(0: only at the end\)$",
        ),
        # reproduced bugs, all accepted: a NaN skew drew ids of no Zipf law (random mode: 99 of
        # 100 ids where skew=1.1 draws 81), a NaN or infinite scale labelled every row 0
        (["data.synthetic.skew=nan"], r"^data.synthetic.skew=nan must be >= 0$"),
        (["data.synthetic.skew=inf"], r"^data.synthetic.skew=inf must be finite$"),
        (["data.synthetic.signal_scale=nan"], r"^data.synthetic.signal_scale=nan must be finite$"),
        (["data.synthetic.dense_scale=-inf"], r"^data.synthetic.dense_scale=-inf must be finite$"),
        (  # read by the flat baseline too, so checked with sptt=off
            ["sptt.comm_precision=int8"],
            r"^sptt.comm_precision='int8' is not supported; expected one of "
            r"\['fp32', 'bf16', 'fp16'\]$",
        ),
    ],
)
def test_bad_configs_raise_clear_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        typed_config(*overrides)


def test_random_synthetic_data_may_have_fewer_features_than_planted_groups():
    """A reproduced bug: ``data=synthetic_random data.synthetic.num_sparse=2`` was refused with
    ``data.synthetic.num_groups=4 exceeds num_sparse=2``, a bound of the planted groups, which
    random mode does not draw."""
    conf = typed_config(
        "data=synthetic_random", "data.synthetic.num_sparse=2", "data.synthetic.num_train=2048"
    )
    validate(conf)
    batch = next(build_data(conf.data).train.batches(0))
    assert batch.sparse_features.keys() == ["cat_0", "cat_1"]
    assert batch.labels.shape == (2048,)


def test_a_checkpoint_dir_under_a_file_is_refused(tmp_path):
    """Reproduced bug: the run trained to its end, then died at its first checkpoint
    (NotADirectoryError), without metrics.json."""
    (tmp_path / "afile").write_text("")
    for path in (tmp_path / "afile", tmp_path / "afile" / "ckpt"):
        with pytest.raises(ValueError) as refused:
            validate(typed_config(f"trainer.checkpoint_dir={path}"))
        assert str(refused.value) == (
            f"trainer.checkpoint_dir={str(path)!r}: {tmp_path / 'afile'} is not a directory (the "
            "run would train, then fail at its first checkpoint)"
        )
    validate(typed_config(f"trainer.checkpoint_dir={tmp_path / 'new' / 'ckpt'}"))


def test_unknown_config_key_is_rejected_at_composition():
    with pytest.raises(
        (ConfigCompositionException, ConfigKeyError, ValidationError), match="embeding_dim"
    ):
        compose_config("model.embeding_dim=8")


def test_wrong_type_is_rejected_at_composition():
    with pytest.raises((ConfigCompositionException, ValidationError), match="embedding_dim"):
        compose_config("model.embedding_dim=big")


def test_sparse_adam_on_cpu_is_rejected():
    from dmt.optim import check_sparse_optimizer

    with pytest.raises(
        ValueError, match=r"optim.sparse._target_=torch.optim.Adam \(FBGEMM adam\) needs a CUDA"
    ):
        check_sparse_optimizer(typed_config("optim=adam").optim, "cpu")


def test_comm_precision_is_checked_where_it_is_used():
    """The sharders, called without the config, give the config's message."""
    from dmt.sharding import flat_sharders
    from dmt.sptt.collectives import comm_dtype_of

    message = (
        r"^sptt.comm_precision='FP16' is not supported; expected one of \['fp32', 'bf16', 'fp16'\]$"
    )
    for check in (comm_dtype_of, flat_sharders):
        with pytest.raises(ValueError, match=message):
            check("FP16")
    assert [comm_dtype_of(p) for p in ("fp32", "bf16", "fp16")] == [
        None,
        torch.bfloat16,
        torch.float16,
    ]


def test_a_key_added_to_a_typed_group_is_an_error():
    """Hydra's own hint for a misspelt key is ``+trainer.epoch=2``; OmegaConf then keeps the key
    on the dataclass, where nothing reads it."""
    with pytest.raises(ValueError) as e:
        typed_config("+trainer.epoch=2")
    assert str(e.value) == (
        "trainer.epoch is not a setting of TrainerConfig (a + override adds keys only where the "
        "config takes any key, e.g. optim.sparse); did you mean trainer.epochs?"
    )
    with pytest.raises(ValueError) as e:
        typed_config("+model.partition.blah=3")
    assert str(e.value) == (
        "model.partition.blah is not a setting of PartitionConfig (a + override adds keys only "
        "where the config takes any key, e.g. optim.sparse)"
    )
    # nodes that are not dataclasses take any key: FBGEMM's keyword arguments of the optimizer
    assert (
        typed_config("+optim.sparse.weight_decay_mode=l2").optim.sparse["weight_decay_mode"] == "l2"
    )


def test_a_sparse_optimizer_setting_the_kernel_does_not_take_is_refused_at_validation():
    """A misspelt ``optim.sparse`` field failed only when the model was sharded, inside FBGEMM
    ("unexpected keyword argument"); torch's ``betas`` is FBGEMM's ``beta1``/``beta2``."""
    from dmt.optim import check_optim, sparse_kernel_settings

    with pytest.raises(
        ValueError, match=r"^optim.sparse.epss is not a setting .*did you mean eps\?"
    ):
        check_optim(typed_config("+optim.sparse.epss=1e-3").optim)
    with pytest.raises(ValueError, match=r"^optim.sparse.betas .*did you mean beta1 and beta2\?"):
        check_optim(typed_config("optim=adam", "+optim.sparse.betas=[0.9,0.99]").optim)
    # every shipped optim config's fields are the kernel's; the kernel takes what TorchRec passes
    for name in ("default", "adagrad", "adam"):
        check_optim(typed_config(f"optim={name}").optim)
    assert {"lr", "eps", "beta1", "beta2", "weight_decay", "cache_load_factor"} <= (
        sparse_kernel_settings()
    )
    assert "optimizer" not in sparse_kernel_settings()
    # TorchRec reads its raw-embedding-streaming fields itself, before FBGEMM
    check_optim(typed_config("+optim.sparse.enable_raw_embedding_streaming=false").optim)
    # Reproduced bugs: a kernel setting the flat path's class does not take passed validation
    # and failed in the trainer as a bare TypeError (torch.optim.Adam and beta1, SGD and eps);
    # learning_rate passed and was replaced by lr
    with pytest.raises(
        ValueError,
        match=r"^optim.sparse._target_=torch.optim.adam.Adam does not take the settings "
        r"\['beta1', 'eps', 'lr'\]: .*torchrec.optim.Adam for beta1/beta2",
    ):
        check_optim(typed_config("optim=adam", "+optim.sparse.beta1=0.8").optim)
    check_optim(
        typed_config(
            "optim=adam", "optim.sparse._target_=torchrec.optim.Adam", "+optim.sparse.beta1=0.8"
        ).optim
    )
    with pytest.raises(ValueError, match=r"^optim.sparse._target_=torch.optim.sgd.SGD does not"):
        check_optim(typed_config("optim.sparse._target_=torch.optim.SGD").optim)
    with pytest.raises(ValueError, match=r"^optim.sparse.learning_rate would be replaced by"):
        check_optim(typed_config("+optim.sparse.learning_rate=0.5").optim)


@pytest.mark.parametrize(
    "overrides",
    [(), ("experiment=paper_dlrm",), ("experiment=criteo_forward_dlrm",), ("+partition=naive",)],
)
def test_dmt_inspect_composes_the_training_config(overrides):
    """dmt-inspect's root config (conf/inspect.yaml) lists training's groups again: it must
    compose what training's does, but for the logger (off), its ``overwrite`` and the sweep
    group, so that a group added to conf/config.yaml is not missed there."""
    from hydra import compose, initialize_config_module

    from dmt.inspect import register_inspect_configs
    from dmt.train import CONF_MODULE, compose_config

    register_inspect_configs()
    training = OmegaConf.to_container(compose_config(*overrides))
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        inspect = OmegaConf.to_container(compose("inspect", overrides=list(overrides)))
    assert isinstance(training, dict) and isinstance(inspect, dict)
    assert inspect.pop("overwrite") is False
    for config in (training, inspect):
        config.pop("logger")
        config.pop("hparams_search", None)
    assert inspect == training


@pytest.mark.parametrize(
    ("overrides", "kwargs", "warning"),
    [
        (
            ["data.synthetic.num_train=1000", "data.synthetic.cardinality=7", "data=criteo_sample"],
            LONG_RUN,
            "data.synthetic.cardinality=7, data.synthetic.num_train=1000 are set, but "
            "data.kind='criteo' reads none of data.synthetic (the synthetic generator's settings)",
        ),
        (  # a reproduced bug: the Terabyte tables (up to 48M rows) were built without a word
            ["data.synthetic.cardinality=1000", "data=criteo_1tb_synthetic"],
            LONG_RUN,
            "data.synthetic.cardinality=1000 is set, but data.synthetic.cardinalities gives every "
            "table's rows (26 entries) and overrides it: data.synthetic.cardinalities=null gives "
            "every table data.synthetic.cardinality rows",
        ),
        (
            ["data=criteo_sample", "data.kind=synthetic"],
            LONG_RUN,
            "data.criteo is set (data.criteo.preprocessed_dir='data_cache/criteo_sample_t3'), but "
            "data.kind='synthetic' trains on generated data and reads none of data.criteo: "
            "data.kind=criteo trains on it",
        ),
        (
            ["data=criteo_sample", "data.shuffle=false", "data.criteo.shuffle_window_rows=1000"],
            LONG_RUN,
            "data.criteo.shuffle_window_rows=1000 has no effect with data.shuffle=false: the "
            "training rows are read in their order",
        ),
        (
            ["trainer.log_every=1", "trainer.checkpoint=true", "trainer.checkpoint_every=20"],
            {"world_size": 1, "total_steps": 16, "device": "cpu"},
            "trainer.checkpoint_every=20 is longer than the run (16 steps: trainer.epochs, "
            "trainer.max_steps): the only checkpoint is the one at the end "
            "(trainer.checkpoint=true)",
        ),
    ],
)
def test_settings_a_run_does_not_read_are_named(overrides, kwargs, warning):
    """What dmt-train ran without a word (the same losses as without them); without the last
    override, which makes them unread, nothing."""
    assert ignored_settings(typed_config(*overrides), **kwargs) == [warning]
    assert ignored_settings(typed_config(*overrides[:-1]), **kwargs) == []


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=dcn", "model.dcn_num_layers=5", "model.dcn_low_rank=8"],  # the interaction's
        [  # DMT-DLRM's DCN towers
            "experiment=dmt_4t_dlrm",
            "tower=dcn",
            "model.tower.dim=8",
            "model.dcn_num_layers=5",
        ],
        ["experiment=dmt_4t_dlrm", "sptt=on", "sptt.peer_permute=output", "sptt.hosts_per_tower=2"],
        ["data=synthetic_random", "data.synthetic.click_rate=0.5", "data.synthetic.skew=1.1"],
        ["data=criteo_sample", "data.criteo.shuffle_window_rows=1000"],
        ["trainer.checkpoint_every=20", "trainer.resume_from=auto"],
    ],
)
def test_settings_a_run_reads_are_not_named(overrides):
    assert ignored_settings(typed_config(*overrides), **LONG_RUN) == []


def test_settings_that_end_with_the_run_are_not_named():
    """A step setting equal to the run's length acts on its last step (mutation testing: ``>=``
    for ``>`` in each of these checks failed no test)."""
    every = ["max_steps", "log_every", "eval_every", "checkpoint_every"]
    conf = typed_config(*(f"trainer.{key}=20" for key in every))
    assert ignored_settings(conf, world_size=1, total_steps=20, device="cuda") == []


def test_sptt_topology_settings_are_named_on_a_flat_run():
    flat = typed_config("sptt.local_world_size=4", "sptt.hosts_per_tower=2")
    assert ignored_settings(flat, **LONG_RUN) == [
        "sptt.hosts_per_tower=2, sptt.local_world_size=4 are set, but sptt.enabled=false (flat "
        "TorchRec sharding) reads none of sptt.hosts_per_tower, sptt.local_world_size, "
        "sptt.sharding_type, sptt.peer_permute: sptt=on trains with them"
    ]


def test_comm_precision_is_named_only_where_nothing_rounds():
    """A flat run of one rank sends nothing through TorchRec's collectives (a group of one
    returns its input); SPTT's own collectives round at any world size."""
    flat = typed_config("sptt.comm_precision=fp16")
    sptt = typed_config("experiment=dmt_4t_dlrm", "sptt=on", "sptt.comm_precision=fp16")
    assert ignored_settings(flat, world_size=1, total_steps=100, device="cpu") == [
        "sptt.comm_precision=fp16 has no effect on a flat run (sptt.enabled=false) in a world of "
        "one: TorchRec's collectives of one rank send nothing, so no pooled embedding is rounded "
        "to fp16 (sptt=on rounds in its collectives at any world size)"
    ]
    assert ignored_settings(flat, world_size=2, total_steps=100, device="cpu") == []
    assert ignored_settings(sptt, world_size=1, total_steps=100, device="cpu") == []


@pytest.mark.parametrize("sptt", [[], ["experiment=dmt_4t_dlrm", "sptt=on"]])
def test_gpu_memory_settings_are_named_only_on_cpu(sptt):
    """Reproduced bug: sharding.hbm_gb and sharding.uvm_cache_load_factor budget HBM and its
    UVM caches, which a CPU run has none of (every table lives in host memory, within
    sharding.ddr_gb, which it reads), and a CPU run took them without a word."""
    given = typed_config(*sptt, "sharding.hbm_gb=4", "sharding.uvm_cache_load_factor=0.5")
    assert ignored_settings(given, **LONG_RUN) == [
        "sharding.hbm_gb=4.0, sharding.uvm_cache_load_factor=0.5 are set, but this run trains "
        "on CPU, which has no HBM and caches no table, and reads none of sharding.hbm_gb, "
        "sharding.uvm_cache_load_factor: every table lives in host memory, within "
        "sharding.ddr_gb (a CUDA run budgets its HBM with them)"
    ]
    assert ignored_settings(given, **{**LONG_RUN, "device": "cuda"}) == []
    # the defaults written out, and the host memory a CPU run plans its tables in
    defaults = typed_config(
        *sptt, "sharding.hbm_gb=null", "sharding.uvm_cache_load_factor=0.2", "sharding.ddr_gb=1"
    )
    assert ignored_settings(defaults, **LONG_RUN) == []


ROW_WISE = ["experiment=dmt_4t_dlrm", "sptt=on", "sptt.sharding_type=row_wise"]


def _too_few_rows(K: int, L: int, per_host: str, rows: int, value: str, feature: str) -> str:
    return (
        f"sptt.sharding_type=row_wise puts a row block of every table on each of the K*L={K * L} "
        f"ranks of its tower (sptt.hosts_per_tower={K}, {per_host}), but the table of feature {feature} has {rows} row{'' if rows == 1 else 's'}"
        f" ({value}): a row-wise table needs at least {K * L} rows; give it more, or use "
        "sptt.sharding_type=table_wise or column_wise"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["sptt.local_world_size=4", "data.synthetic.cardinality=3"],
            _too_few_rows(
                1, 4, "sptt.local_world_size=4", 3, "data.synthetic.cardinality=3", "cat_0"
            ),
        ),
        (
            [
                "sptt.hosts_per_tower=2",
                "sptt.local_world_size=1",
                "data.synthetic.num_sparse=3",
                "data.synthetic.num_groups=1",
                "data.synthetic.cardinalities=[5,1,5]",
            ],
            _too_few_rows(
                2, 1, "sptt.local_world_size=1", 1, "data.synthetic.cardinalities[1]=1", "cat_1"
            ),
        ),
        (
            [
                "sptt.local_world_size=2",
                "data.synthetic.cardinality=1",
                "model.num_embeddings_per_feature=[4,4,4,4,4,4,4,1]",
                "data.synthetic.num_sparse=8",
                "data.synthetic.num_groups=2",
            ],
            _too_few_rows(
                1,
                2,
                "sptt.local_world_size=2",
                1,
                "model.num_embeddings_per_feature[7]=1",
                "cat_7",
            ),
        ),
    ],
    ids=["cardinality", "cardinalities", "num_embeddings_per_feature"],
)
def test_a_row_wise_table_with_fewer_rows_than_its_towers_ranks_is_refused(overrides, message):
    """Reproduced: SPTT's plan refused such a table once the run had built its process groups,
    read its data and built its model ("feature 'cat_0' (row_wise, tower 0) has 1 row, fewer
    than the K*L=2 ranks of a tower"), naming no setting. Validation refuses it, naming the
    settings, where the config gives the tower's ranks and the table's rows."""
    with pytest.raises(ValueError) as refused:
        typed_config(*ROW_WISE, *overrides)
    assert str(refused.value) == message


def test_row_wise_tables_with_enough_rows_or_rows_from_the_data_pass_validation():
    """The rows needed are the tower's K*L: as many rows as ranks pass; Criteo's rows come from
    its data (checked when the model is sharded); without sptt=on, or row-wise, no table is
    split into rows."""
    for overrides in (
        [*ROW_WISE, "sptt.local_world_size=4", "data.synthetic.cardinality=4"],
        [*ROW_WISE, "data.synthetic.cardinality=1"],  # L from the launcher (1 here)
        [*ROW_WISE, "sptt.local_world_size=4", "data=criteo_sample"],
        [
            "experiment=dmt_4t_dlrm",
            "sptt=on",
            "sptt.local_world_size=4",
            "data.synthetic.cardinality=1",
        ],
        ["sptt.sharding_type=row_wise", "sptt.local_world_size=4", "data.synthetic.cardinality=1"],
    ):
        validate(typed_config(*overrides))


def test_dmt_train_refuses_a_row_wise_table_split_over_the_launchers_ranks(tmp_path, monkeypatch):
    """Reproduced: under ``torchrun --nproc-per-node=2``, a row-wise table of one row failed in
    SPTT's plan after the process group was built. ``train`` refuses it, with the launcher's
    ranks per host (``LOCAL_WORLD_SIZE``), before it starts the runtime or writes anything."""
    launch = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    launch |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    # (a bounded wait for the rank that never comes, where the refusal is missed)
    overrides = [
        "logger=disabled",
        "data.synthetic.cardinality=1",
        "trainer.collective_timeout_s=10",
    ]
    conf = typed_config(*ROW_WISE, *overrides)
    with pytest.raises(ValueError) as refused:
        train(conf, tmp_path / "run")
    assert str(refused.value) == _too_few_rows(
        1, 2, "L=2 ranks per host (LOCAL_WORLD_SIZE)", 1, "data.synthetic.cardinality=1", "cat_0"
    )
    assert not dist.is_initialized() and not (tmp_path / "run").exists()


def test_dmt_train_names_slurms_tasks_per_node_for_the_ranks_per_host(tmp_path, monkeypatch):
    """Reproduced: under ``srun`` (no torchrun) the refusal said ``L=2 ranks per host
    (LOCAL_WORLD_SIZE)``, a variable the job never set: SLURM's tasks per node gave them."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("SLURM_")]:  # a job's own: this one's only
        monkeypatch.delenv(name)
    step = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    step |= {"SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2"}
    step |= {"SLURM_JOB_NODELIST": "n1"}
    for name, value in step.items():
        monkeypatch.setenv(name, value)
    conf = typed_config(*ROW_WISE, "logger=disabled", "data.synthetic.cardinality=1")
    with pytest.raises(ValueError) as refused:
        train(conf, tmp_path / "run")
    assert str(refused.value) == _too_few_rows(
        1,
        2,
        "L=2 ranks per host (the SLURM step's tasks per node)",
        1,
        "data.synthetic.cardinality=1",
        "cat_0",
    )
    assert not dist.is_initialized() and not (tmp_path / "run").exists()
