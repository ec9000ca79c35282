"""The generalisation levers set from the command line, and the guard on a sparse weight decay
that FBGEMM's kernels would ignore (its CPU kernels: tests/integration/test_sparse_weight_decay.py)."""

import inspect

import pytest
import torch
from fbgemm_gpu.split_embedding_codegen_lookup_invokers import (
    lookup_adagrad,
    lookup_adam,
    lookup_rowwise_adagrad,
    lookup_sgd,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode
from torch import nn

from dmt.optim import (
    LRSchedule,
    check_sparse_optimizer,
    dense_optimizer,
    sparse_optimizer_spec,
)
from tests.conftest import typed_config


def test_every_lever_is_a_command_line_override():
    """Dropout, EMA, missing id, threshold, hashing, embedding dim, dense weight decay (AdamW)
    and the LR schedule: overrides of existing settings, no code."""
    cfg = typed_config(
        "data=criteo_sample",
        "data.criteo.frequency_threshold=5",
        "data.criteo.missing_id=distinct",
        "model.embedding_dim=32",
        "model.bottom_mlp=[64,32]",
        "model.dropout=0.2",
        "trainer.ema_decay=0.99",
        "optim.dense._target_=torch.optim.AdamW",
        "optim.dense.weight_decay=0.01",
        "optim.schedule.warmup_steps=10",
        "optim.schedule.decay=cosine",
    )
    assert cfg.data.criteo is not None
    assert (cfg.data.criteo.frequency_threshold, cfg.data.criteo.missing_id) == (5, "distinct")
    assert cfg.data.criteo.preprocessed_dir.endswith("_t5")  # one directory per threshold
    assert (cfg.model.embedding_dim, cfg.model.dropout, cfg.trainer.ema_decay) == (32, 0.2, 0.99)
    opt = dense_optimizer([nn.Parameter(torch.zeros(2))], cfg.optim)
    assert type(opt) is torch.optim.AdamW and opt.param_groups[0]["weight_decay"] == 0.01
    assert cfg.optim.schedule["decay"] == "cosine" and cfg.optim.schedule["warmup_steps"] == 10
    assert LRSchedule(100, warmup_steps=10, decay="cosine")(55) == pytest.approx(0.5)
    hashed = typed_config(
        "data=criteo_sample", "data.criteo.categorical_mode=hash", "data.criteo.hash_sizes=[1000]"
    )
    assert hashed.data.criteo is not None and hashed.data.criteo.table_hash_sizes() == [1000] * 26


def test_sparse_weight_decay_is_refused_where_the_kernels_ignore_it():
    cfg = typed_config("+optim.sparse.weight_decay=0.01").optim
    with pytest.raises(
        ValueError,
        match=r"optim.sparse.weight_decay=0.01 would do nothing: FBGEMM's CPU embedding kernels "
        r"ignore weight decay",
    ):
        check_sparse_optimizer(cfg, "cpu")
    with pytest.raises(ValueError, match=r"needs \+optim.sparse.weight_decay_mode=l2 or decouple"):
        check_sparse_optimizer(cfg, "cuda")
    with_mode = typed_config(
        "+optim.sparse.weight_decay=0.01", "+optim.sparse.weight_decay_mode=l2"
    ).optim
    check_sparse_optimizer(with_mode, "cuda")
    _, kwargs = sparse_optimizer_spec(with_mode)
    assert kwargs["weight_decay_mode"] is WeightDecayMode.L2 and kwargs["weight_decay"] == 0.01
    check_sparse_optimizer(typed_config("+optim.sparse.weight_decay=0.0").optim, "cpu")  # off
    with pytest.raises(ValueError, match=r"weight_decay_mode='lasso' is not one of \['none'"):
        typed_config("+optim.sparse.weight_decay_mode=lasso")  # checked with the config


def test_fbgemm_kernels_take_the_weight_decay_the_guard_expects():
    """The guard's premise, read from FBGEMM's lookups (one per optimizer, for CPU and CUDA
    alike): SGD's and Adagrad's hand their kernel no weight decay, Adam's hands it without a
    mode (its kernel decouples it), row-wise Adagrad's both. When FBGEMM changes this, this
    fails and ``dmt.optim.check_sparse_weight_decay`` must follow."""

    def passes(lookup, arg: str) -> bool:
        return f'"{arg}"' in inspect.getsource(lookup.invoke)

    assert not passes(lookup_sgd, "weight_decay") and not passes(lookup_adagrad, "weight_decay")
    assert passes(lookup_adam, "weight_decay") and not passes(lookup_adam, "weight_decay_mode")
    assert passes(lookup_rowwise_adagrad, "weight_decay")
    assert passes(lookup_rowwise_adagrad, "weight_decay_mode")


NO_DECAY = (
    "optim.sparse.weight_decay=0.01 would do nothing: FBGEMM's {} embedding kernel takes no "
    "weight decay, on CPU or CUDA; set it to 0 (regularise the dense part with "
    "optim.dense.weight_decay), or on CUDA use optim.sparse._target_=torchrec.optim.RowWiseAdagrad "
    "with +optim.sparse.weight_decay_mode=l2 or decouple"
)
ADAM_DECOUPLES = (
    "optim.sparse.weight_decay=0.01 with weight_decay_mode {}: FBGEMM's Adam kernel applies it "
    "decoupled (w -= lr * weight_decay * w, AdamW's) whatever the mode; say so with "
    "optim.sparse._target_=torchrec.optim.Adam +optim.sparse.weight_decay_mode=decouple"
)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.sparse._target_=torchrec.optim.SGD", "+optim.sparse.weight_decay_mode=l2"],
         NO_DECAY.format("exact_sgd")),
        (["optim.sparse._target_=torchrec.optim.Adagrad", "+optim.sparse.weight_decay_mode=decouple"],
         NO_DECAY.format("exact_adagrad")),
        (["optim=adam", "optim.sparse._target_=torchrec.optim.Adam",
          "+optim.sparse.weight_decay_mode=l2"], ADAM_DECOUPLES.format("l2")),
        (["optim=adam"], ADAM_DECOUPLES.format("none")),  # torch.optim.Adam: no mode to give
    ],
    ids=["sgd", "adagrad", "adam-l2", "adam-none"],
)  # fmt: skip
def test_cuda_sparse_weight_decay_is_refused_unless_the_kernel_applies_it_so(overrides, message):
    """On CUDA (FBGEMM's GPU kernels, no GPU needed for the check): a weight decay that SGD's
    and Adagrad's kernels would drop (any mode), or an Adam mode its kernel would not follow,
    is refused naming what would work, rather than training otherwise than asked."""
    cfg = typed_config(*overrides, "+optim.sparse.weight_decay=0.01").optim
    with pytest.raises(ValueError) as err:
        check_sparse_optimizer(cfg, "cuda")
    assert str(err.value) == message


def test_cuda_sparse_adam_takes_a_decoupled_weight_decay():
    cfg = typed_config(
        "optim=adam",
        "optim.sparse._target_=torchrec.optim.Adam",
        "+optim.sparse.weight_decay=0.01",
        "+optim.sparse.weight_decay_mode=decouple",
    ).optim
    check_sparse_optimizer(cfg, "cuda")  # what FBGEMM's Adam kernel does
    _, kwargs = sparse_optimizer_spec(cfg)
    assert (
        kwargs["weight_decay_mode"] is WeightDecayMode.DECOUPLE and kwargs["weight_decay"] == 0.01
    )


@pytest.mark.parametrize(
    ("overrides", "device", "kernel"),
    [
        ([], "cpu", "exact_row_wise_adagrad"),
        (["optim=adam", "optim.sparse._target_=torchrec.optim.Adam"], "cuda", "adam"),
    ],
)
def test_sparse_max_norm_is_refused_where_the_kernel_ignores_it(overrides, device, kernel):
    """FBGEMM clips rows to ``max_norm`` in its CUDA row-wise Adagrad kernel only (CPU:
    tests/integration/test_sparse_weight_decay.py); elsewhere the setting is refused, not
    dropped."""
    cfg = typed_config(*overrides, "+optim.sparse.max_norm=0.5").optim
    with pytest.raises(ValueError) as err:
        check_sparse_optimizer(cfg, device)
    assert str(err.value) == (
        "optim.sparse.max_norm=0.5 would do nothing: FBGEMM clips the rows to max_norm in its "
        f"CUDA row-wise Adagrad kernel only, not in its {kernel} kernel on {device}; set it to 0, "
        "or train on CUDA with optim.sparse._target_=torchrec.optim.RowWiseAdagrad"
    )
    check_sparse_optimizer(typed_config("+optim.sparse.max_norm=0.5").optim, "cuda")


def _tiny_dmt() -> nn.Module:
    from dmt.config import DLRMTowerConfig, DotInteractionConfig, ModelConfig, PartitionConfig
    from dmt.models import build_dmt_model

    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=4,
        bottom_mlp=[4, 2],
        top_mlp=[3, 1],
        tower=DLRMTowerConfig(dim=2, c=1, p=1),
        partition=PartitionConfig(kind="explicit"),
    )
    torch.manual_seed(0)
    return build_dmt_model(
        cfg, [["a", "b"], ["c"]], feature_names=["a", "b", "c"], cardinalities=[3, 4, 5],
        num_dense=2,
    )  # fmt: skip


@pytest.mark.parametrize("scale", [0.0, 0.25])
def test_tower_lr_scale_is_a_param_group_of_the_tower_modules(scale):
    """``optim.tower_lr_scale``: the tower modules' parameters (``towers.<t>.tower_module.*``) in
    a second group of ``optim.dense`` at ``scale`` times its LR, scheduled alike; an Adam step
    moves them by ``scale`` times what it moves them at scale 1 (0 freezes them), and every
    other parameter as at scale 1."""
    from torchrec import KeyedJaggedTensor

    from dmt.optim import build_lr_scheduler, build_optimizer

    cfg = typed_config(f"optim.tower_lr_scale={scale}", "optim.schedule.warmup_steps=4").optim
    steps = {}
    for s, conf in ((scale, cfg), (1.0, typed_config("optim.schedule.warmup_steps=4").optim)):
        model = _tiny_dmt()
        opt = build_optimizer(model, conf)
        dense = [g for g in opt.param_groups if g["params"]]
        assert len(dense) == (1 if s == 1 else 2)
        sched = build_lr_scheduler(opt, conf, total_steps=10)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        gen = torch.Generator().manual_seed(1)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=["a", "b", "c"], values=torch.tensor([0, 1, 2] * 5), lengths=torch.ones(15).int()
        )
        opt.zero_grad()
        model(torch.randn(5, 2, generator=gen), kjt).sum().backward()
        opt.step()
        sched.step()
        sched.step()  # warmup step 2 of 4: LR x 3/4 in both groups
        assert sorted(g["lr"] for g in dense) == pytest.approx(
            sorted({s * 0.003 * 3 / 4, 0.003 * 3 / 4})
        )
        steps[s] = {n: p.detach() - before[n] for n, p in model.named_parameters()}
    tower = [n for n in steps[1.0] if ".tower_module." in n]
    assert len(tower) == 8  # weight and bias of each tower's feature and tower linears, 2 towers
    for name, moved in steps[1.0].items():
        expected = scale * moved if name in tower else moved
        # the moves are ~2e-4; p_after - p_before rounds at the parameters ~0.3 (fp32: ~3e-8)
        torch.testing.assert_close(steps[scale][name], expected, rtol=0, atol=1e-7)
        assert moved.abs().sum() > 0 or "embedding" in name, name


def test_tower_lr_scale_must_not_be_negative():
    with pytest.raises(ValueError, match=r"optim.tower_lr_scale must be >= 0, got -0.5"):
        dense_optimizer(
            [nn.Parameter(torch.zeros(2))], typed_config("optim.tower_lr_scale=-0.5").optim
        )


def test_tower_lr_scale_refuses_a_schedule_that_sets_the_peak_lrs(caplog):
    """A schedule that sets every group's peak LR itself (torch's OneCycleLR: ``max_lr`` for all)
    would drop the tower modules' scale without a word: refused, naming both LRs. On a model
    without tower modules the setting does nothing, and says so."""
    from dmt.optim import build_lr_scheduler, build_optimizer

    cfg = typed_config("optim.tower_lr_scale=0.1").optim
    cfg.schedule = {
        "_target_": "torch.optim.lr_scheduler.OneCycleLR",
        "max_lr": 0.003,
        "cycle_momentum": False,
    }
    opt = build_optimizer(_tiny_dmt(), cfg)
    with pytest.raises(
        ValueError,
        match=r"optim.schedule \(_target_=torch.optim.lr_scheduler.OneCycleLR\) sets the param "
        r"groups' peak LRs itself \(the tower modules' group 0.00012, not "
        r"optim.tower_lr_scale=0.1 times the dense LR: 0.0003\)",
    ):
        build_lr_scheduler(opt, cfg, total_steps=10)
    plain = nn.Sequential(nn.Linear(2, 1))
    with caplog.at_level("WARNING", logger="dmt.optim"):
        build_optimizer(plain, typed_config("optim.tower_lr_scale=0.1").optim)
    assert "optim.tower_lr_scale=0.1 does nothing: the model has no tower-module" in caplog.text


def _one_cycle(*overrides: str, **settings):
    cfg = typed_config(*overrides).optim
    cfg.schedule = {"_target_": "torch.optim.lr_scheduler.OneCycleLR", **settings}
    return cfg


def test_a_schedule_the_combined_optimizer_cannot_take_is_refused_before_any_data_is_read():
    """Reproduced: OneCycleLR (``cycle_momentum`` on, its default) passed the config's check,
    built over a lone Adam, whose defaults have betas, and failed in the trainer, after the
    data was read and the tables sharded: the trainer's optimizer is TorchRec's
    ``CombinedOptimizer``, whose defaults hold no optimizer's hyperparameters. The check builds
    the schedule over such an optimizer."""
    from dmt.optim import build_lr_scheduler, build_optimizer, check_optim

    message = "optim.schedule: optimizer must support momentum or beta1 with `cycle_momentum`"
    cfg = _one_cycle(max_lr=0.003)
    with pytest.raises(ValueError, match=f"^{message} option enabled$"):
        build_lr_scheduler(build_optimizer(nn.Linear(2, 1), cfg), cfg, total_steps=10)
    with pytest.raises(ValueError, match=f"^{message} option enabled$"):
        check_optim(cfg)


def test_a_schedule_that_sets_the_tables_lr_to_the_dense_one_is_refused():
    """Reproduced: OneCycleLR's one ``max_lr`` set every param group's LR, the fused tables'
    too: they trained at the dense part's LR (0.05 peak for optim.sparse_lr=0.1), and
    ``optim.sparse_lr`` was read by nothing, without a word. A schedule that sets the groups'
    peak LRs is refused unless they keep the proportion of their own."""
    from dmt.optim import check_optim

    overrides = ("optim.lr=0.01", "optim.sparse_lr=0.1")
    cfg = _one_cycle(*overrides, max_lr=0.05, cycle_momentum=False)
    with pytest.raises(
        ValueError,
        match=r"^optim.schedule \(_target_=torch.optim.lr_scheduler.OneCycleLR\) sets the param "
        r"groups' peak LRs itself \(0.002, 0.002\), not in the proportion of theirs \(0.1, 0.01: "
        r"the tables' optim.sparse_lr=0.1, the dense optim.lr=0.01\); use a schedule that "
        r"multiplies each group's own LR, such as dmt.optim.warmup_decay_schedule, or set "
        r"optim.sparse_lr equal to optim.lr \(how many param groups the tables have depends on "
        r"the model and its sharding: one LR per group cannot be given before they are "
        r"sharded\)$",
    ):
        check_optim(cfg)
    check_optim(_one_cycle("optim.lr=0.1", "optim.sparse_lr=0.1", max_lr=0.5, cycle_momentum=False))
    check_optim(typed_config(*overrides, "optim.schedule.warmup_steps=4").optim)


@pytest.mark.parametrize(
    "model", [(), ("experiment=dmt_4t_dlrm",), ("experiment=dmt_4t_dlrm", "sptt=on")]
)
def test_a_schedule_of_one_value_per_param_group_is_refused_before_any_data_is_read(model):
    """Reproduced: OneCycleLR's ``max_lr=[0.5, 0.05]`` (one per group of the check's tables and
    dense optimizer) passed the config's check, and a DMT model's trainer refused it after the
    data was read: "max_lr has 2 values, param_groups has 5". The tables' param groups are
    TorchRec's, one per fused kernel (a flat or SPTT model's too: per sharding type, cached or
    not, pooling), so no list of them can be given before they are sharded."""
    from dmt.config import Config, validate

    def one_cycle(sparse_lr: float, max_lr: object) -> Config:
        conf = typed_config(*model, "optim.lr=0.01", f"optim.sparse_lr={sparse_lr}")
        conf.optim.schedule = {
            "_target_": "torch.optim.lr_scheduler.OneCycleLR",
            "max_lr": max_lr,
            "cycle_momentum": False,
        }
        return conf

    with pytest.raises(
        ValueError,
        match=r"^optim.schedule \(_target_=torch.optim.lr_scheduler.OneCycleLR\) takes one value "
        r"per param group, but how many param groups the tables have is known only once they "
        r"are sharded \(TorchRec makes one per fused embedding kernel: it depends on the model, "
        r"its sharding and the world size; over two table groups and the dense one: max_lr must "
        r"have the same length as optimizer.param_groups. max_lr has 2 values, param_groups has "
        r"3.\); give one value for all groups \(with optim.sparse_lr equal to optim.lr\) or use "
        r"a schedule that multiplies each group's own LR, such as "
        r"dmt.optim.warmup_decay_schedule$",
    ):
        validate(one_cycle(0.1, [0.5, 0.05]))
    validate(one_cycle(0.01, 0.05))  # one for all, the tables' LR the dense one's: the remedy


_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=_GPU)])
@pytest.mark.parametrize(
    "target,extra",
    [
        ("torch.optim.Adam", []),
        ("torch.optim.AdamW", ["optim.dense.weight_decay=0.01"]),
        ("torch.optim.Adagrad", []),
        ("torch.optim.SGD", ["~optim.dense.eps", "+optim.dense.momentum=0.9"]),
    ],
)
def test_the_dense_optimizer_is_torchs_fused_one_and_updates_as_its_loop(target, extra, device):
    """``optim.dense_fused`` (the default): the dense optimizer is built with ``fused=True``
    where its class has a fused kernel, and its updates are those of torch's default
    implementation (``optim.dense_fused=false``) to float rounding, over several steps of
    two param groups (``optim.tower_lr_scale``)."""
    base = [f"optim.dense._target_={target}", "optim.tower_lr_scale=0.5", *extra]
    if target == "torch.optim.Adagrad":  # the default config's dense optimizer is Adam's
        base = ["optim=adagrad", "optim.tower_lr_scale=0.5", *extra]
    moved = {}
    for fused in (True, False):
        torch.manual_seed(0)
        shapes = ((7, 5), (5,), (3, 7), (3,))
        params = [nn.Parameter(torch.randn(shape).to(device)) for shape in shapes]
        start = [p.detach().clone() for p in params]
        cfg = typed_config(*base, f"optim.dense_fused={fused}").optim
        opt = dense_optimizer(params, cfg, scaled=params[2:])
        assert len(opt.param_groups) == 2
        assert opt.defaults.get("fused") is (True if fused else None), opt.defaults
        gen = torch.Generator().manual_seed(1)
        for _ in range(5):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen).to(device)
            opt.step()
        moved[fused] = [p.detach().clone() for p in params]
    for a, b in zip(moved[True], moved[False]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(moved[True], start))  # all moved


def test_the_dense_optimizer_keeps_torchs_default_without_a_fused_kernel_or_when_set():
    """No ``fused=True`` where the class has no fused kernel (RMSprop), where ``optim.dense``
    sets ``fused`` or ``foreach`` itself (the user's choice stands), or for parameters on a
    device without torch's fused kernels."""
    from dmt.optim import dense_fused_kwargs

    param = [nn.Parameter(torch.zeros(2))]
    rmsprop = typed_config("optim.dense._target_=torch.optim.RMSprop").optim
    assert dense_fused_kwargs(rmsprop, param) == {}
    assert "fused" not in inspect.signature(torch.optim.RMSprop).parameters
    assert dense_optimizer(param, rmsprop).defaults["foreach"] is None
    foreach = dense_optimizer(param, typed_config("+optim.dense.foreach=true").optim)
    assert foreach.defaults["foreach"] is True and not foreach.defaults["fused"]
    unfused = dense_optimizer(param, typed_config("+optim.dense.fused=false").optim)
    assert unfused.defaults["fused"] is False
    assert dense_fused_kwargs(typed_config().optim, param) == {"fused": True}
    assert dense_fused_kwargs(typed_config().optim, [torch.zeros(2, device="meta")]) == {}


def test_a_schedule_that_moves_a_frozen_groups_lr_is_refused():
    """Reproduced: the check of a schedule's peak LRs left out every param group at LR 0, so
    with the tables frozen (optim.sparse.lr=0) OneCycleLR's one ``max_lr`` trained them at
    0.002 (max_lr / div_factor 25, then up to 0.05) without a word. A group at 0 must stay at
    0 (dmt's schedule keeps it there), and the other groups keep the proportion of theirs even
    when a frozen group comes first."""
    from dmt.config import OptimConfig
    from dmt.optim import build_lr_scheduler, check_optim

    frozen = {"_target_": "torchrec.optim.RowWiseAdagrad", "_partial_": True, "lr": 0.0}
    cfg = OptimConfig(lr=0.01, sparse=frozen)
    check_optim(cfg)
    one_cycle = {"_target_": "torch.optim.lr_scheduler.OneCycleLR", "cycle_momentum": False}
    cfg.schedule = {**one_cycle, "max_lr": 0.05}
    with pytest.raises(
        ValueError,
        match=r"^optim.schedule \(_target_=torch.optim.lr_scheduler.OneCycleLR\) sets the param "
        r"groups' peak LRs itself \(0.002, 0.002\), not in the proportion of theirs \(0, 0.01: "
        r"the tables' optim.sparse.lr=0, the dense optim.lr=0.01\); use a schedule that "
        r"multiplies each group's own LR, such as dmt.optim.warmup_decay_schedule, which keeps "
        r"a group at LR 0 \(frozen\) at 0 \(how many ",
    ):
        check_optim(cfg)
    cfg.schedule = {**one_cycle, "max_lr": [0.0, 0.5, 0.5]}
    params = [nn.Parameter(torch.zeros(1)) for _ in range(3)]
    opt = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, (0.0, 0.1, 0.01))])
    with pytest.raises(
        ValueError,
        match=r"sets the param groups' peak LRs itself \(0, 0.02, 0.02\), not in the proportion "
        r"of theirs \(0, 0.1, 0.01: ",
    ):
        build_lr_scheduler(opt, cfg, total_steps=10)


def test_the_tables_get_the_sparse_optimizer_and_the_dense_one_the_rest():
    """``apply_sparse_optimizer`` attaches ``optim.sparse`` (class and settings) to every table,
    where TorchRec's sharders read it (``_optimizer_kwargs``, as TorchRec's own example prints);
    ``build_optimizer``'s dense optimizer then takes every other parameter and no table (a table
    in both would be updated twice)."""
    from dmt.config import OptimConfig
    from dmt.models import embedding_parameters
    from dmt.optim import apply_sparse_optimizer, build_optimizer

    sparse = {"_target_": "torch.optim.Adagrad", "_partial_": True, "lr": "${..sparse_lr}"}
    cfg = OptimConfig(sparse_lr=0.05, sparse=sparse)
    model = _tiny_dmt()
    tables = embedding_parameters(model)
    apply_sparse_optimizer(tables, cfg)
    assert len(tables) == 3  # a, b in the first tower's collection, c in the second's
    for p in tables:
        assert p._optimizer_classes == [torch.optim.Adagrad]  # type: ignore[attr-defined]
        assert p._optimizer_kwargs == [{"lr": 0.05}]  # type: ignore[attr-defined]
    dense = {id(p) for group in build_optimizer(model, cfg).param_groups for p in group["params"]}
    assert dense == {id(p) for p in model.parameters()} - {id(p) for p in tables}


def test_a_schedule_keeps_the_proportion_of_a_float32_table_lr():
    """FBGEMM keeps the tables' LR in float32: with optim.sparse_lr equal to optim.lr, the
    tables' group holds 0.1 rounded to float32 (0.10000000149) beside the dense group's 0.1,
    which one ``max_lr`` for both keeps in proportion (to 1.5e-8, not to float64's rounding)."""
    from dmt.config import OptimConfig
    from dmt.optim import build_lr_scheduler

    tables_lr = torch.tensor(0.1, dtype=torch.float32).item()
    assert tables_lr != 0.1
    params = [nn.Parameter(torch.zeros(1)) for _ in range(2)]
    opt = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, (tables_lr, 0.1))])
    cfg = OptimConfig(
        schedule={
            "_target_": "torch.optim.lr_scheduler.OneCycleLR",
            "max_lr": 0.05,
            "cycle_momentum": False,
        }
    )
    build_lr_scheduler(opt, cfg, total_steps=10)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.002, 0.002])


def test_a_sparse_optimizer_the_memory_plan_cannot_count_is_refused_on_cuda():
    """FBGEMM fuses LAMB on CUDA, but dmt's memory plan counts the state of four optimizers
    only: refused where the device allows it, as on CPU."""
    from dmt.config import OptimConfig

    cfg = OptimConfig(sparse={"_target_": "torchrec.optim.LAMB", "_partial_": True, "lr": 0.01})
    with pytest.raises(ValueError) as err:
        check_sparse_optimizer(cfg, "cuda")
    assert str(err.value) == (
        "optim.sparse._target_=LAMB (FBGEMM lamb): dmt's memory plan accounts for the state of "
        "['exact_sgd', 'exact_adagrad', 'exact_row_wise_adagrad', 'adam'] only"
    )


def test_a_schedule_that_builds_no_lr_scheduler_is_refused():
    """A ``_target_`` that takes the optimizer and the step count but builds something else
    (here a dict) is named, not met later as a missing attribute."""
    from dmt.config import OptimConfig
    from dmt.optim import build_lr_scheduler

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(TypeError) as err:
        build_lr_scheduler(opt, OptimConfig(schedule={"_target_": "builtins.dict"}), 10)
    assert str(err.value) == (
        "optim.schedule built a dict, not a torch.optim.lr_scheduler.LRScheduler"
    )
