"""DMT configs (issue 4): experiments compose and inspect; partitions and tower settings are checked."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest
import torch
import yaml
from hydra.errors import ConfigCompositionException

from dmt.config import (
    DCNTowerConfig,
    DLRMTowerConfig,
    DotInteractionConfig,
    ModelConfig,
    PartitionConfig,
    validate,
    validate_towers,
)
from dmt.inspect import inspect_config
from dmt.models import DMTModel, TowerModule, build_model, check_partition, resolve_partition
from dmt.models.partition import describe_towers_change
from tests.conftest import REPO, typed_config

NAMES = [f"cat_{i}" for i in range(26)]
DMT_EXPERIMENTS = sorted(
    p.stem
    for pattern in ("paper_sptt_*.yaml", "paper_dmt_*.yaml", "dmt_*.yaml")
    for p in (REPO / "dmt" / "conf" / "experiment").glob(pattern)
)
# name -> (towers, compression ratio); paper Tables 3-5.
EXPECTED = {
    "paper_sptt_dlrm": (26, 1.0),
    "paper_sptt_dcn": (26, 1.0),
    **{f"paper_dmt_{t}t_dlrm": (t, 2.0) for t in (2, 4, 8, 26)},
    "paper_dmt_16t_dlrm": (16, 26 / 16),
    **{f"paper_dmt_{t}t_dcn": (t, 26 / t) for t in (2, 4, 8, 16)},  # one 128-vector per tower
    "paper_dmt_26t_dcn": (26, 1.0),
    **{f"paper_dmt_8t_dlrm_cr{r}": (8, float(r)) for r in (2, 4, 8, 16)},
    "dmt_4t_dlrm": (4, 2.0),
    "dmt_4t_dcn": (4, 2.0),
}


def test_every_dmt_experiment_is_checked():
    assert DMT_EXPERIMENTS == sorted(EXPECTED)


@pytest.mark.parametrize("name", DMT_EXPERIMENTS)
def test_dmt_experiment_composes_and_inspects(name):
    report = inspect_config(typed_config(f"experiment={name}"))
    towers, ratio = EXPECTED[name]
    assert report["num_towers"] == towers and len(report["tower_output_sizes"]) == towers
    assert report["compression_ratio"] == pytest.approx(ratio)
    assert report["num_parameters"] > 0 and report["train_mflops_per_sample"] > 0
    if name.startswith("paper_"):
        assert round(report["num_parameters_g"], 1) == 22.8


@pytest.mark.parametrize("base", ["dlrm", "dcn"])
def test_sptt_accounting_equals_the_base_model(base):
    sptt = inspect_config(typed_config(f"experiment=paper_sptt_{base}"))
    plain = inspect_config(typed_config(f"experiment=paper_{base}"))
    for key in ("num_parameters", "train_mflops_per_sample", "forward_mflops_per_sample"):
        assert sptt[key] == plain[key], key


def test_table5_flops_fall_with_the_compression_ratio():
    """Paper Table 5: the FLOPs that scale with D drop by 1.02, 0.52, 0.25 MFLOPs per halving."""
    flops = [
        inspect_config(typed_config(f"experiment=paper_dmt_8t_dlrm_cr{r}"))[
            "train_mflops_per_sample"
        ]
        for r in (2, 4, 8, 16)
    ]
    steps = [a - b for a, b in zip(flops, flops[1:])]
    assert steps == pytest.approx([1.02, 0.51, 0.26], abs=0.01)


def write_partition(path, towers):
    path.write_text(yaml.safe_dump({"towers": towers, "strategy": "coherent"}))
    return str(path)


def test_tp_partition_file_builds_those_towers(tmp_path):
    towers = [NAMES[i::4] for i in (3, 1, 0, 2)]
    path = write_partition(tmp_path / "p.yaml", towers)
    conf = typed_config(
        "experiment=paper_dmt_4t_dcn", "partition=tp", f"model.partition.path={path}"
    )
    assert conf.model.partition == PartitionConfig(kind="tp", num_towers=4, path=path)
    report = inspect_config(conf)
    assert report["partition"] == "tp" and report["num_towers"] == 4
    model = build_model(
        conf.model,
        feature_names=NAMES,
        cardinalities=[10] * 26,
        num_dense=13,
        table_device="meta",
        dense_device="meta",
    )
    assert isinstance(model, DMTModel) and model.partition == towers
    # inspect.json carries the DMT fields (paper DCN towers: one 128-vector each)
    assert json.loads(json.dumps(report))["tower_output_sizes"] == [128] * 4


def test_tp_partition_with_the_wrong_tower_count_is_refused(tmp_path):
    path = write_partition(tmp_path / "p.yaml", [NAMES[:13], NAMES[13:]])
    conf = typed_config(
        "experiment=paper_dmt_8t_dlrm", "partition=tp", f"model.partition.path={path}"
    )
    with pytest.raises(
        ValueError, match=r"model.partition.num_towers=8 but the tp partition in .* has 2 towers"
    ):
        inspect_config(conf)


@pytest.mark.parametrize("name", [n for n in DMT_EXPERIMENTS if n.startswith("paper_")])
def test_every_paper_row_takes_naive_or_tp_towers_of_its_count(tmp_path, name):
    """README "DMT experiments": each paper row takes ``partition=naive`` or ``partition=tp``,
    and a partition file of another tower count than the row's is refused. A reproduced bug:
    the pass-through rows (``paper_sptt_*``, ``paper_dmt_26t_dcn``) set no tower count, so
    ``partition=naive`` failed and an 8-tower file built 8 towers under the 26-tower row."""
    towers = EXPECTED[name][0]
    naive = typed_config(f"experiment={name}", "partition=naive").model.partition
    assert resolve_partition(naive, NAMES) == [NAMES[t::towers] for t in range(towers)]
    other = 8 if towers != 8 else 2
    path = write_partition(tmp_path / "p.yaml", [NAMES[t::other] for t in range(other)])
    conf = typed_config(f"experiment={name}", "partition=tp", f"model.partition.path={path}")
    with pytest.raises(
        ValueError,
        match=rf"^model.partition.num_towers={towers} but the tp partition in '.*p.yaml' has "
        rf"{other} towers$",
    ):
        resolve_partition(conf.model.partition, NAMES)


def test_tp_partition_needs_a_path():
    with pytest.raises(
        ValueError,
        match=r"^model\.partition\.kind='tp' needs model\.partition\.path \(a partition YAML\)$",
    ):
        typed_config("experiment=dmt_4t_dlrm", "partition=tp")


SMALL = [f"cat_{i}" for i in range(6)]


@pytest.mark.parametrize(
    "partition,message",
    [
        (
            [["cat_0", "cat_1"], ["cat_2"], [], ["cat_3", "cat_4", "cat_5"]],
            r"^partition tower 2 is empty$",
        ),
        (
            [["cat_3", "cat_0"], ["cat_1"], ["cat_2"], ["cat_4"], ["cat_3", "cat_5"]],
            r"^feature 'cat_3' appears in towers 0 and 4$",
        ),
        (
            [["cat_0", "cat_1", "cat_2"], ["cat_3", "cat_4", "cat_99"], ["cat_5"]],
            r"^feature 'cat_99' is not a sparse feature of the data \(expected one of cat_0..cat_5\); "
            r"it is in partition tower 1$",
        ),
        (
            [["cat_0", "cat_1", "cat_2"], ["cat_4"]],
            r"partition misses feature\(s\) \['cat_3', 'cat_5'\]",
        ),
        ([], r"partition has no towers"),
    ],
)
def test_bad_partitions_raise(partition, message):
    with pytest.raises(ValueError, match=message):
        check_partition(partition, SMALL)
    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=4,
        bottom_mlp=[4],
        top_mlp=[1],
        partition=PartitionConfig(kind="explicit", towers=partition),
    )
    with pytest.raises(ValueError, match=message if partition else "needs model.partition.towers"):
        if not partition:
            from dmt.config import validate_towers  # noqa: PLC0415

            validate_towers(cfg)
        build_model(cfg, feature_names=SMALL, cardinalities=[5] * 6, num_dense=2)


def test_bad_partition_files_and_counts_raise(tmp_path):
    with pytest.raises(ValueError, match=r"num_towers=7 must be an integer in \[1, 6\]"):
        resolve_partition(PartitionConfig(kind="naive", num_towers=7), SMALL)
    with pytest.raises(ValueError, match=r"partition file '.*nowhere.yaml' does not exist"):
        resolve_partition(PartitionConfig(kind="tp", path=str(tmp_path / "nowhere.yaml")), SMALL)
    bad = tmp_path / "bad.yaml"
    bad.write_text("towers: cat_0\n")
    with pytest.raises(ValueError, match=r"needs a 'towers' list of lists"):
        resolve_partition(PartitionConfig(kind="tp", path=str(bad)), SMALL)
    with pytest.raises(
        ValueError, match=r"num_towers=3 but the per_feature partition has 6 towers"
    ):
        resolve_partition(PartitionConfig(kind="per_feature", num_towers=3), SMALL)
    dup = write_partition(tmp_path / "dup.yaml", [SMALL[:4], SMALL[3:]])
    with pytest.raises(ValueError, match=r"feature 'cat_3' appears in towers 0 and 1"):
        resolve_partition(PartitionConfig(kind="tp", path=dup), SMALL)


def test_recorded_towers_are_built_and_the_file_only_checked(tmp_path):
    """A checkpoint's config records the towers its run trained with: a file replaced since
    (other towers, or the same features in another order) gives way to them, with a warning
    that says what changed; the tower count is still checked."""
    trained = [SMALL[:3], SMALL[3:]]
    path = write_partition(tmp_path / "p.yaml", trained)
    cfg = PartitionConfig(kind="tp", path=path, recorded_towers=trained)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unchanged file: no warning
        assert resolve_partition(cfg, SMALL) == trained
    write_partition(tmp_path / "p.yaml", [SMALL[2::-1], SMALL[3:]])
    with pytest.warns(UserWarning) as caught:
        assert resolve_partition(cfg, SMALL) == trained
    assert str(caught[0].message) == (
        f"partition file {path!r} no longer holds the towers the run trained with (tower 0: "
        "[cat_0, cat_1, cat_2] -> [cat_2, cat_1, cat_0] (the same features in another order)); "
        "building the towers the run trained with (model.partition.recorded_towers), not the "
        "file's"
    )
    write_partition(tmp_path / "p.yaml", [SMALL[:2], SMALL[2:4], SMALL[4:]])
    with pytest.warns(
        UserWarning,
        match=r"\(2 towers -> 3; tower 0: \[cat_0, cat_1, cat_2\] -> \[cat_0, cat_1\]; ",
    ):
        assert resolve_partition(cfg, SMALL) == trained
    (tmp_path / "p.yaml").unlink()
    with pytest.warns(UserWarning, match=r"p.yaml' does not exist; building the towers the run"):
        assert resolve_partition(cfg, SMALL) == trained
    write_partition(tmp_path / "p.yaml", trained)
    with pytest.raises(ValueError, match=r"num_towers=3 but the tp partition in '.*p.yaml' has 2"):
        resolve_partition(replace(cfg, num_towers=3), SMALL)
    with pytest.raises(
        ValueError,
        match=r"model.partition.recorded_towers \(the towers of .*p.yaml the run trained "
        r"with\): partition misses feature\(s\) \['cat_5'\]",
    ):
        resolve_partition(replace(cfg, recorded_towers=[SMALL[:3], SMALL[3:5]]), SMALL)
    # only tp reads them
    with pytest.raises(
        ValueError, match=r"model.partition.recorded_towers=.* is set, but model.partition.kind="
    ):
        validate_towers(
            ModelConfig(
                name="dlrm",
                interaction=DotInteractionConfig(),
                partition=PartitionConfig(kind="naive", num_towers=2, recorded_towers=trained),
            )
        )


def test_describe_towers_change():
    old = [["a", "b"], ["c"], ["d"], ["e"], ["f"]]
    new = [["b", "a"], ["c", "d"], ["e"], ["f"]]
    assert describe_towers_change(old, new) == (
        "5 towers -> 4; tower 0: [a, b] -> [b, a] (the same features in another order); "
        "tower 1: [c] -> [c, d]; tower 2: [d] -> [e]; and 1 more towers"
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["model.tower.c=0", "model.tower.p=0"],
            r"model.tower: DLRMTowerModule: c=0 and p=0 must be integers >= 0 with c \+ p >= 1",
        ),
        (["model.tower.c=-1"], r"model.tower: DLRMTowerModule: c=-1 and p=0 must be"),
        (["model.tower.p=-2"], r"model.tower: DLRMTowerModule: c=1 and p=-2 must be"),
        (["model.tower.dim=0"], r"model.tower: DLRMTowerModule: dim=0 must be a positive integer"),
        (
            ["model.tower.dim=4"],
            r"model.interaction: DotInteraction: the dense vector has size 8 "
            r"\(model.bottom_mlp\[-1\]\) but the sparse vectors have size 4",
        ),
        (["model.partition.num_towers=0"], r"model.partition.num_towers=0 must be positive"),
        (["model.partition.num_towers=null"], r"'naive' needs model.partition.num_towers"),
        (["model.partition.kind=random"], r"model.partition.kind='random' is not supported"),
        (
            ["model.tower._target_=dmt.models.MLPTower"],
            r"model.tower: cannot build _target_='dmt.models.MLPTower'",
        ),
        (
            ["model.tower=dcn"],  # the setting, not its config group (tower=dcn)
            r"^model.tower='dcn' is a string, not a config with a _target_: pick a conf/ YAML "
            r"by its config group \(e.g. tower=dcn, model=dcn\)",
        ),
        (
            ["model.tower._target_=dmt.models.DotInteraction"],
            r"model.tower: DotInteraction.__init__\(\) got an unexpected keyword argument",
        ),
        (
            ["model.partition.kind=none", "model.partition.num_towers=null"],
            r"model.tower \(dmt.models.tower_modules.DLRMTowerModule\) needs towers",
        ),
        (["model.partition.kind=explicit"], r"'explicit' needs model.partition.towers"),
        (
            ["model.partition.path=tp4/partition.yaml"],
            r"^model.partition.path='tp4/partition.yaml' is set, but model.partition.kind='naive' "
            r"does not read it \(kinds that do: tp\); choose the kind \(partition=tp; \+partition="
            r"\.\.\. where the experiment has no partition\) or set model.partition.path=null$",
        ),
        (
            ["model.partition.kind=none"],
            r"^model.partition.num_towers=4 is set, but model.partition.kind='none'",
        ),
        (
            ["+model.partition.towers=[[cat_0]]"],
            r"^model.partition.towers=\[\['cat_0'\]\] is set, but model.partition.kind='naive'",
        ),
    ],
)
def test_invalid_dmt_settings_raise(overrides, message):
    with pytest.raises(ValueError, match=message):
        typed_config("experiment=dmt_4t_dlrm", *overrides)


def test_a_target_that_is_not_a_tower_module_is_refused():
    with pytest.raises(
        TypeError, match=r"model.tower built a Identity, not a dmt.models.TowerModule"
    ):
        typed_config("experiment=dmt_4t_dlrm", "model.tower._target_=torch.nn.Identity")
    with pytest.raises(
        TypeError, match=r"model.interaction built a Identity without an int output_dim"
    ):
        typed_config("model.interaction._target_=torch.nn.Identity")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model.tower.c=abc"], r"Error merging override model.tower.c=abc"),
        (["model.tower.width=3"], r"Could not override 'model.tower.width'"),
        (["model.tower.dcn_num_layers=null"], r"model.tower.dcn_num_layers=null"),
    ],
)
def test_tower_schema_checks_types_and_keys_at_composition(overrides, message):
    with pytest.raises(ConfigCompositionException, match=message):
        typed_config("experiment=dmt_4t_dcn", *overrides)


def test_dcn_tower_settings_are_checked_and_default_to_the_models_crossnet():
    with pytest.raises(
        ValueError, match=r"model.tower: DCNTowerModule: dcn_low_rank=0 must be a positive integer"
    ):
        typed_config("experiment=dmt_4t_dcn", "model.tower.dcn_low_rank=0")
    conf = typed_config(
        "model=dcn",
        "+partition=naive",
        "model.partition.num_towers=4",
        "+tower=dcn",
        "model.dcn_num_layers=2",
        "model.dcn_low_rank=5",
    )
    assert isinstance(conf.model.tower, DCNTowerConfig)
    model = build_model(conf.model, feature_names=NAMES, cardinalities=[10] * 26, num_dense=13)
    crossnet = model.towers[0].tower_module.crossnet
    assert len(crossnet.V_kernels) == 2 and crossnet.V_kernels[0].shape[0] == 5
    assert len(model.interaction.crossnet.V_kernels) == 2


def test_dmt_dlrm_model_needs_the_bottom_to_end_at_d():
    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=8,
        bottom_mlp=[8],
        top_mlp=[1],
        tower=DLRMTowerConfig(dim=4),
        partition=PartitionConfig(kind="naive", num_towers=2),
    )
    with pytest.raises(
        ValueError,
        match=r"model.interaction: DotInteraction: the dense vector has size 8 "
        r"\(model.bottom_mlp\[-1\]\) but the sparse vectors have size 4",
    ):
        build_model(cfg, feature_names=SMALL, cardinalities=[5] * 6, num_dense=2)


@pytest.mark.parametrize(
    "setting", ["model.partition.num_towers=4", "model.partition.path=tp4/partition.yaml"]
)
def test_a_tower_setting_without_a_partition_kind_is_refused(setting):
    """A reproduced bug: towers asked for without ``partition=...`` trained the base model."""
    name = setting.split("=")[0]
    with pytest.raises(ValueError, match=rf"^{name}=.* is set, but model.partition.kind='none'.*"
                       rf"choose the kind \(partition=.*or set {name}=null$"):  # fmt: skip
        validate(typed_config("experiment=criteo_sample_dlrm", setting))


class PairTowerModule(TowerModule):
    """A user's tower module (by ``_target_``) that mixes every pair of its tower's features: it
    refuses a tower of one feature."""

    def __init__(self, num_features: int, embedding_dim: int, dim: int) -> None:
        super().__init__()
        if num_features < 2:
            raise ValueError(f"PairTowerModule: num_features={num_features}: it needs pairs")
        self.num_features, self.embedding_dim, self.num_vectors, self.dim = (
            num_features,
            embedding_dim,
            1,
            dim,
        )
        self.proj = torch.nn.Linear(num_features * (num_features - 1) // 2, dim)

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        self._check_input(embs)
        i, j = torch.triu_indices(self.num_features, self.num_features, 1)
        return self.proj((embs[:, i] * embs[:, j]).sum(-1))[:, None]


def test_validation_builds_the_tower_module_with_the_partitions_tower_sizes(tmp_path):
    """Reproduced: validation built every tower module with one feature (F_t = 1), so a tower
    module that refuses one feature was refused (``model.tower: PairTowerModule:
    num_features=1``) where every tower of the run has more. It is built with the tower sizes
    the config gives, before any data is read; a partition with a one-feature tower is still
    refused."""
    (tmp_path / "tower").mkdir()
    target = f"{__name__}.PairTowerModule"
    (tmp_path / "tower" / "pair.yaml").write_text(
        f"# @package model.tower\n_target_: {target}\ndim: 8\n"
    )
    pair = [f"hydra.searchpath=[file://{tmp_path}]", "model=dlrm", "model.bottom_mlp=[64,8]"]
    refused = r"^model.tower: PairTowerModule: num_features=1: it needs pairs$"

    def towers(*overrides: str) -> list[int]:
        conf = typed_config(*pair, *overrides, "+tower=pair")
        model = build_model(conf.model, feature_names=NAMES, cardinalities=[5] * 26, num_dense=13)
        return [t.tower_module.num_features for t in model.towers]

    assert towers("+partition=naive", "model.partition.num_towers=4") == [7, 7, 6, 6]
    path = write_partition(tmp_path / "p.yaml", [NAMES[:2], NAMES[2:]])
    assert towers("+partition=tp", f"model.partition.path={path}") == [2, 24]
    # Criteo's 26 features are known without the data
    assert (
        towers("data=criteo_sample", "+partition=naive", "model.partition.num_towers=13")
        == [2] * 13
    )
    for partition in (
        ["+partition=per_feature"],
        ["+partition=naive", "model.partition.num_towers=16"],
    ):
        with pytest.raises(ValueError, match=refused):
            typed_config(*pair, *partition, "+tower=pair")


def test_a_tp_partition_whose_file_does_not_read_does_not_refuse_the_tower_module(tmp_path):
    """Reproduced: with ``model.partition.path`` a file that does not exist (yet), validation
    built the tower module with one feature and refused a :class:`PairTowerModule` run with
    ``model.tower: PairTowerModule: num_features=1: it needs pairs``, blaming the module for a
    size no tower of the run has, not the file. The towers not known, the module is tried at
    sizes from one feature up and refused only if it builds for none; training then names the
    missing file."""
    (tmp_path / "tower").mkdir()
    (tmp_path / "tower" / "pair.yaml").write_text(
        f"# @package model.tower\n_target_: {__name__}.PairTowerModule\ndim: 8\n"
    )
    missing = tmp_path / "partition.yaml"  # dmt-partition's to write
    base = [f"hydra.searchpath=[file://{tmp_path}]", "model=dlrm", "model.bottom_mlp=[64,8]"]
    tp = [*base, "+partition=tp", f"model.partition.path={missing}"]
    conf = typed_config(*tp, "+tower=pair")  # validated
    with pytest.raises(ValueError) as error:
        build_model(conf.model, feature_names=NAMES, cardinalities=[5] * 26, num_dense=13)
    assert str(error.value) == (
        f"model.partition.path={missing}: partition file {str(missing)!r} does not exist"
    )
    # a module that builds for no size is refused, with its error for one feature
    with pytest.raises(ValueError) as error:
        typed_config(*tp, "+tower=pair", "+model.tower.width=3")
    assert str(error.value) == (
        "model.tower: PairTowerModule.__init__() got an unexpected keyword argument 'width'"
    )


class PairsInteraction(torch.nn.Module):
    """A user's interaction (by ``_target_``) of the dot products of every pair of sparse
    vectors: it refuses a single vector."""

    def __init__(self, num_vectors: int, dim: int, dense_dim: int) -> None:
        super().__init__()
        if num_vectors < 2:
            raise ValueError(f"PairsInteraction: num_vectors={num_vectors}: it needs pairs")
        self.num_vectors = num_vectors
        self.output_dim = dense_dim + num_vectors * (num_vectors - 1) // 2

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        i, j = torch.triu_indices(self.num_vectors, self.num_vectors, 1)
        return torch.cat([dense, (sparse[:, i] * sparse[:, j]).sum(-1)], dim=1)


def test_validation_builds_the_interaction_with_the_models_number_of_vectors():
    """Reproduced: validation built the interaction over one sparse vector, so an interaction
    that refuses one was refused (``model.interaction: PairsInteraction: num_vectors=1``) where
    the model gives it one per feature, or the towers' vectors. It is built with the number the
    config gives, before any data is read; a model of one vector is still refused."""
    pairs = ["model=dlrm", f"model.interaction._target_={__name__}.PairsInteraction"]

    def vectors(*overrides: str) -> int:
        conf = typed_config(*pairs, *overrides)
        model = build_model(conf.model, feature_names=NAMES, cardinalities=[5] * 26, num_dense=13)
        return model.interaction.num_vectors

    # one vector per tower (c=0, p=1): the towers' vectors, not the features
    towers = ["+partition=naive", "+tower=dlrm", "model.tower.c=0", "model.tower.p=1"]
    assert vectors() == 26
    assert vectors("data=criteo_sample") == 26
    assert vectors(*towers, "model.partition.num_towers=2") == 2
    for one in (["data.synthetic.num_sparse=1"], [*towers, "model.partition.num_towers=1"]):
        with pytest.raises(ValueError) as error:
            typed_config(*pairs, *one)
        assert str(error.value) == (
            "model.interaction: PairsInteraction: num_vectors=1: it needs pairs"
        )
