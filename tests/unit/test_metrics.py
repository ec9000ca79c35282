import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

from dmt.config import OptimConfig, validate
from dmt.metrics import StreamingClickMetrics, click_metrics, click_probabilities
from dmt.optim import LRSchedule
from tests.conftest import typed_config


def test_metrics_match_sklearn_and_ne_definition():
    rng = np.random.default_rng(0)
    y = (rng.random(5000) < 0.3).astype(np.float32)
    p = np.clip(0.3 + 0.2 * (y - 0.3) + 0.1 * rng.standard_normal(5000), 0.01, 0.99)
    m = click_metrics(torch.from_numpy(p), torch.from_numpy(y))
    assert m["auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-6)
    assert m["logloss"] == pytest.approx(log_loss(y, p), rel=1e-6)
    ctr = y.mean()
    assert m["ne"] == pytest.approx(
        log_loss(y, p) / -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr)), rel=1e-5
    )
    assert m["calibration"] == pytest.approx(p.mean() / ctr, rel=1e-6)


def test_predicting_the_click_rate_has_ne_one():
    y = torch.tensor([0, 0, 1, 0, 1, 0, 0, 0.0])
    assert click_metrics(torch.full((8,), 0.25), y)["ne"] == pytest.approx(1.0, abs=1e-6)


def _scores(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Click labels (3% or 50% rate) and float32 probabilities of one shape of distribution."""
    y = rng.random(n) < (0.5 if kind == "balanced" else 0.03)
    z = rng.standard_normal(n)
    p = {
        "logit_normal": lambda: 1 / (1 + np.exp(-(-3.5 + z + 1.2 * y))),
        "clustered": lambda: 0.03 + 1e-3 * z + 2e-4 * y,  # every score within 0.03 +- 0.005
        "ties": lambda: np.round(rng.random(n) * 10) / 20 + 0.2 * y,  # 20 distinct values
        "skewed": lambda: 1 / (1 + np.exp(-(-12 + 3 * z + 2 * y))),  # many below the 1e-7 clamp
        "balanced": lambda: rng.random(n) * 0.3 + 0.2 * y,
        "constant": lambda: np.full(n, 0.25),
    }[kind]()
    return p.astype(np.float32), y.astype(np.float32)


def _assert_close_to_exact(streamed: dict[str, float], exact: dict[str, float]) -> None:
    assert streamed["auc"] == pytest.approx(exact["auc"], abs=1e-4)
    for k in ("logloss", "ne", "calibration"):  # exact float64 sums
        assert streamed[k] == pytest.approx(exact[k], rel=1e-12), k
    assert streamed["num_samples"] == exact["num_samples"]


@pytest.mark.parametrize("n", [20_000, 200_000])
@pytest.mark.parametrize(
    "kind", ["logit_normal", "clustered", "ties", "skewed", "balanced", "constant"]
)
def test_streaming_metrics_match_the_exact_ones(kind: str, n: int) -> None:
    p, y = _scores(kind, n, np.random.default_rng(1))
    acc = StreamingClickMetrics()
    for chunk in np.array_split(np.arange(n), [1, 5000, 5001, 9000]):  # uneven batches
        acc.update(torch.from_numpy(p[chunk]), torch.from_numpy(y[chunk]))
    exact = click_metrics(torch.from_numpy(p), torch.from_numpy(y))
    _assert_close_to_exact(acc.compute(), exact)
    if kind == "constant":
        assert acc.compute()["auc"] == pytest.approx(0.5, abs=1e-9) and exact["auc"] == 0.5


def test_streaming_metrics_on_criteo_labels(shared_data) -> None:
    """The Criteo sample's labels with a linear model's scores on its dense features."""
    pd = pytest.importorskip("pandas")
    table = pd.read_csv(
        shared_data / "criteo-kaggle-sample" / "train.tsv", sep="\t", header=None, usecols=range(14)
    )
    y = table[0].to_numpy(np.float64)
    x = np.log1p(np.clip(table.iloc[:, 1:].fillna(0).to_numpy(np.float64), 0, None))
    x = np.c_[x, np.ones(len(x))]
    p = np.clip(x @ np.linalg.lstsq(x, y, rcond=None)[0], 1e-3, 1 - 1e-3)
    probs, labels = torch.from_numpy(p).float(), torch.from_numpy(y).float()
    acc = StreamingClickMetrics()
    acc.update(probs, labels)
    exact = click_metrics(probs, labels)
    assert exact["auc"] > 0.6  # the scores rank clicks
    _assert_close_to_exact(acc.compute(), exact)


def test_streaming_state_does_not_grow_with_the_samples() -> None:
    acc = StreamingClickMetrics(num_bins=1024)
    size = acc.state.numel()
    assert size == 5 + 4 * 1024
    rng = np.random.default_rng(0)
    for n in (10, 1_000_000):
        p, y = _scores("logit_normal", n, rng)
        acc.update(torch.from_numpy(p), torch.from_numpy(y))
        assert acc.state.numel() == size
    assert [t.numel() for t in vars(acc).values() if isinstance(t, torch.Tensor)] == [size]
    assert StreamingClickMetrics().state.nbytes <= (2 << 20) + 64  # default: about 2 MiB


def test_streaming_metrics_undefined_cases() -> None:
    acc = StreamingClickMetrics()
    empty = acc.compute()
    assert empty["num_samples"] == 0 and all(math.isnan(empty[k]) for k in ("auc", "ne", "logloss"))
    acc.update(torch.tensor([0.2, 0.7]), torch.tensor([1.0, 1.0]))
    assert math.isnan(acc.compute()["auc"])  # one class only, as click_metrics
    assert math.isnan(click_metrics(torch.tensor([0.2, 0.7]), torch.tensor([1.0, 1.0]))["auc"])
    with pytest.raises(ValueError, match="probs and labels must have as many entries, got 2 and 3"):
        acc.update(torch.tensor([0.2, 0.7]), torch.ones(3))
    with pytest.raises(ValueError, match="num_bins must be >= 1, got 0"):
        StreamingClickMetrics(num_bins=0)
    with pytest.raises(ValueError, match="logit_range must be > 0, got 0"):
        StreamingClickMetrics(logit_range=0)
    one_bin = StreamingClickMetrics(num_bins=1)  # the least a user may ask for: one bin, all ties
    one_bin.update(torch.full((4,), 0.3), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    assert one_bin.compute()["auc"] == 0.5


def test_lr_schedule_warmup_and_decays():
    s = LRSchedule(
        100, warmup_steps=4, decay="linear", decay_start=4, decay_steps=4, min_lr_ratio=0.5
    )
    assert [s(i) for i in range(10)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.5]
    )
    c = LRSchedule(total_steps=10, decay="cosine")
    assert c(0) == 1.0 and c(5) == pytest.approx(0.5) and c(10) == pytest.approx(0.0)


def test_decay_starts_after_warmup():
    """With the default decay_start=0 the LR still reaches its peak at the end of the warmup and
    decays from there over the rest of the run (optim=adam's warmup-then-linear schedule)."""
    s = LRSchedule(1100, warmup_steps=100, decay="linear", min_lr_ratio=0.0)
    assert s(0) == pytest.approx(0.01) and s(98) == pytest.approx(0.99)
    assert s(99) == 1.0 and s(100) == 1.0  # the peak: the last warmup step and the first after
    assert s(600) == pytest.approx(0.5) and s(1100) == 0.0
    # a later decay_start still wins; an earlier one is moved to the end of the warmup
    late = LRSchedule(150, warmup_steps=10, decay="linear", decay_start=50)
    assert late(49) == 1.0 and late(100) == pytest.approx(0.5)


def test_lr_scheduler_drives_every_group_and_restores_from_its_state():
    """optim.schedule's default is a torch LambdaLR: each group's LR is its peak times the factor;
    its state (JSON, as in a checkpoint's meta.json) puts a new scheduler at the same step, keeping
    the new run's peak LRs."""
    import json

    from dmt.optim import build_lr_scheduler, restore_lr_scheduler

    schedule = {"warmup_steps": 4, "decay": "cosine", "min_lr_ratio": 0.1}
    cfg = OptimConfig(schedule={"_target_": "dmt.optim.warmup_decay_schedule", **schedule})
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 1.0}, {"params": [params[1]], "lr": 0.5}])
    sched = build_lr_scheduler(opt, cfg, total_steps=20)
    factor = LRSchedule(20, **schedule)
    lrs = []
    for _ in range(10):
        lrs.extend(g["lr"] for g in opt.param_groups)
        opt.step()
        sched.step()
    assert lrs == pytest.approx([f * factor(i) for i in range(10) for f in (1.0, 0.5)])
    state = json.loads(json.dumps(sched.state_dict()))

    opt2 = torch.optim.SGD([{"params": [params[0]], "lr": 2.0}, {"params": [params[1]], "lr": 0.5}])
    sched2 = build_lr_scheduler(opt2, cfg, total_steps=20)
    restore_lr_scheduler(sched2, state, step=10)
    assert [g["lr"] for g in opt2.param_groups] == pytest.approx([2 * factor(10), 0.5 * factor(10)])
    opt2.step()
    sched2.step()
    assert opt2.param_groups[1]["lr"] == pytest.approx(0.5 * factor(11))
    with pytest.raises(
        ValueError, match="the checkpoint's LR schedule is at step 10, its training at 9"
    ):
        restore_lr_scheduler(sched2, state, step=9)


def test_a_checkpoint_without_a_schedule_state_restores_at_its_step():
    """A checkpoint saved without the scheduler's state (``None``) is put at its training step,
    its LRs the schedule's there."""
    from dmt.optim import build_lr_scheduler, restore_lr_scheduler

    schedule = {"warmup_steps": 4, "decay": "linear", "min_lr_ratio": 1.0}
    cfg = OptimConfig(schedule={"_target_": "dmt.optim.warmup_decay_schedule", **schedule})
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = build_lr_scheduler(opt, cfg, total_steps=20)
    restore_lr_scheduler(sched, None, step=3)
    assert sched.last_epoch == 3 and opt.param_groups[0]["lr"] == pytest.approx(2.0)
    factor = LRSchedule(20, **schedule)  # min_lr_ratio=1: no decay at all
    assert [factor(i) for i in (0, 3, 4, 19)] == pytest.approx([0.25, 1.0, 1.0, 1.0])


def test_schedule_beyond_run_names_what_the_last_step_never_reaches():
    """The warmup's peak is reached at step warmup_steps - 1, the first decayed LR a step after
    the decay starts: the bounds of dmt-train's warnings."""
    from dmt.optim import schedule_beyond_run

    def beyond(total_steps: int, **schedule: object) -> list[str]:
        target = {"_target_": "dmt.optim.warmup_decay_schedule"}
        return schedule_beyond_run(OptimConfig(schedule={**target, **schedule}), total_steps)

    assert beyond(10, warmup_steps=10) == []  # step 9 is at the peak
    (late,) = beyond(9, warmup_steps=10)
    assert late.startswith("optim.schedule.warmup_steps=10 is longer than the run (9 steps")
    assert "0.9 of it at the last step" in late
    assert beyond(10, decay="linear", decay_start=8) == []  # step 9 is decayed
    (never,) = beyond(10, decay="linear", decay_start=9)
    assert never.startswith("optim.schedule.decay=linear starts at step 9 (")


def test_decay_settings_without_a_decay_are_refused():
    # a reproduced bug: optim.schedule.decay_steps / min_lr_ratio / decay_start with the default
    # decay=none trained at a constant LR, without a word (a sweep over them: equal trials)
    with pytest.raises(ValueError) as refused:  # composing a run's config validates it
        validate(typed_config("optim.schedule.decay_steps=4", "optim.schedule.min_lr_ratio=0.1"))
    assert str(refused.value) == (
        "optim.schedule: decay_steps=4, min_lr_ratio=0.1 set, but decay='none' reads none of "
        "decay_start, decay_steps and min_lr_ratio (the LR stays at its peak after the "
        "warmup): set decay=linear or decay=cosine, or leave them at 0"
    )
    validate(typed_config("optim.schedule.decay=linear", "optim.schedule.min_lr_ratio=0.1"))


def test_fractional_step_counts_are_refused():
    """A reproduced bug: optim.schedule.warmup_steps=0.1 (a share of the run, as a warmup
    ratio) trained step 0 at 10x the peak LR, 2.5 step 2 at 1.2x; 1e3 (Hydra's float) is 1000."""
    with pytest.raises(ValueError) as refused:
        typed_config("optim.schedule.warmup_steps=0.1")
    assert str(refused.value) == (
        "optim.schedule: warmup_steps=0.1: warmup_steps, decay_start and decay_steps are counts "
        "of steps and must be whole numbers"
    )
    with pytest.raises(ValueError, match=r"^optim.schedule: decay_start=2.5, decay_steps=0.5: "):
        typed_config(
            "optim.schedule.decay=linear",
            "optim.schedule.decay_start=2.5",
            "optim.schedule.decay_steps=0.5",
        )
    warmup = typed_config("optim.schedule.warmup_steps=1e3").optim.schedule["warmup_steps"]
    s = LRSchedule(2000, warmup_steps=warmup)
    assert [s(0), s(499), s(999), s(1000)] == pytest.approx([0.001, 0.5, 1.0, 1.0])


def test_lr_schedule_is_its_configs_target():
    """Any factory (optimizer, total_steps, **kwargs) -> LRScheduler is a schedule; a resume
    replays it to the checkpoint's step."""
    from dmt.optim import build_lr_scheduler, restore_lr_scheduler

    cfg = OptimConfig(
        schedule={"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 3, "gamma": 0.5}
    )
    with pytest.raises(ValueError, match=r"optim.schedule: .*total_steps"):
        build_lr_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), cfg, 10)
    cfg.schedule = {"_target_": "tests.unit.test_metrics.step_schedule", "step_size": 3}
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_lr_scheduler(opt, cfg, total_steps=10)
    for _ in range(7):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched2 = build_lr_scheduler(opt2, cfg, total_steps=10)
    opt2.param_groups[0]["lr"] = 0.125  # as a loaded optimizer state may leave it
    restore_lr_scheduler(sched2, sched.state_dict(), step=7)
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.25) and sched2.last_epoch == 7


def step_schedule(
    optimizer: torch.optim.Optimizer, total_steps: int, step_size: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """A schedule factory defined outside dmt (``test_lr_schedule_is_its_configs_target``)."""
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size, gamma=0.5)


def _both(probs: list[float], labels: list[float]) -> list[dict[str, float]]:
    """The exact and the streaming metrics of the same predictions."""
    p, y = torch.tensor(probs, dtype=torch.float64), torch.tensor(labels, dtype=torch.float64)
    acc = StreamingClickMetrics()
    acc.update(p, y)
    return [click_metrics(p, y), acc.compute()]


def test_one_class_leaves_ne_and_calibration_undefined() -> None:
    """A reproduced bug: one class only gave NE 3e4 and calibration 5e5 (the clamped entropy and
    click rate), finite numbers that history, wandb and the curves took as results."""
    for m in _both([0.2, 0.7, 0.4], [0.0, 0.0, 0.0]):  # no click: neither is defined
        assert math.isnan(m["ne"]) and math.isnan(m["calibration"]) and math.isnan(m["auc"])
        assert m["logloss"] == pytest.approx((-math.log(0.8) - math.log(0.3) - math.log(0.6)) / 3)
    for m in _both([0.2, 0.7, 0.4], [1.0, 1.0, 1.0]):  # all clicks: calibration is
        assert math.isnan(m["ne"]) and m["calibration"] == pytest.approx(1.3 / 3)


def test_a_diverged_model_gets_nan_metrics_and_a_warning() -> None:
    """A reproduced bug: a NaN prediction put a garbage bin index into index_add_ (IndexError;
    on CUDA a device-side assert), and dmt-eval's logloss raised "all elements of input should
    be between 0 and 1"."""
    p = torch.tensor([0.2, float("nan"), 0.7, 0.4], dtype=torch.float64)
    y = torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    acc = StreamingClickMetrics()
    acc.update(p, y)
    warning = r"^1 of 4 predictions are not finite .*diverged"
    for compute in (lambda: click_metrics(p, y), acc.compute):  # each warns on its own
        with pytest.warns(RuntimeWarning, match=warning):
            m = compute()
        assert m["num_samples"] == 4
        assert all(math.isnan(m[k]) for k in ("auc", "logloss", "ne", "calibration"))


def test_an_infinite_logit_is_a_diverged_prediction_not_a_certain_one() -> None:
    """``click_probabilities`` makes every logit that is not finite NaN, as documented: an
    infinite one too (its sigmoid, exactly 0 or 1, would be clamped into finite metrics)."""
    logits = torch.tensor([2.0, float("inf"), float("-inf"), float("nan"), 0.0])
    p = click_probabilities(logits)
    assert torch.isnan(p[1:4]).all() and p[0] == torch.sigmoid(torch.tensor(2.0)) and p[4] == 0.5
    with pytest.warns(RuntimeWarning, match=r"^3 of 5 predictions are not finite"):
        assert math.isnan(click_metrics(p, torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0]))["logloss"])


def test_the_binned_auc_stays_within_what_one_bins_pairs_can_win() -> None:
    """A reproduced bug: positives at the top of a bin and negatives at its bottom gave AUC 1.4
    (the first-order in-bin estimate, 1/2 + the gap in position, exceeds 1 per pair)."""
    acc = StreamingClickMetrics(num_bins=4, logit_range=1.0)  # bins of width 0.5 in logit
    logits = torch.tensor([0.01, 0.02, 0.48, 0.49])  # all four in one bin
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    acc.update(torch.sigmoid(logits), labels)
    assert acc.compute()["auc"] == 1.0  # the exact AUC: every positive above every negative
    below = StreamingClickMetrics(num_bins=4, logit_range=1.0)  # the mirror image: not below 0
    below.update(torch.sigmoid(logits), 1.0 - labels)
    assert below.compute()["auc"] == 0.0  # the exact AUC: every positive below every negative


def test_scores_beyond_the_logit_range_tie_in_the_edge_bins() -> None:
    """Scores beyond ``[-logit_range, logit_range]`` fall into the first or last bin at its edge:
    they tie there, as the exact AUC of the logits clipped to the range counts them."""
    acc = StreamingClickMetrics(num_bins=4, logit_range=1.0)
    logits = torch.tensor([-5.0, 3.0, 4.0, 6.0, -0.3, 0.2], dtype=torch.float64)
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    acc.update(torch.sigmoid(logits), labels)
    expected = roc_auc_score(labels.numpy(), logits.clamp(-1.0, 1.0).numpy())
    assert expected == pytest.approx(6 / 9) and acc.compute()["auc"] == pytest.approx(expected)
