"""The paired bootstrap over evaluation rows (dmt.bootstrap, scripts/row_bootstrap.py)."""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score

from dmt.bootstrap import auc, format_report, load_predictions, row_bootstrap
from dmt.metrics import click_metrics
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]


def _world(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a planted click model: a true logit per row and its 0/1 label."""
    logit = rng.normal(-1.0, 1.5, rows)
    return logit, (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int8)


def _runs(rng: np.random.Generator, logit: np.ndarray, noise: float, count: int) -> list:
    """``count`` runs of a model that sees the true logit through ``noise``: its seeds."""
    return [1 / (1 + np.exp(-(logit + rng.normal(0, noise, len(logit))))) for _ in range(count)]


def test_auc_is_sklearns_with_ties_and_weights() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    probs = np.round(rng.random(500) * 0.5 + 0.3 * labels, 2)  # two decimals: many ties
    weights = rng.integers(0, 4, 500).astype(float)
    assert auc(probs, labels) == pytest.approx(roc_auc_score(labels, probs), abs=1e-12)
    assert auc(probs, labels, weights) == pytest.approx(
        roc_auc_score(labels, probs, sample_weight=weights), abs=1e-12
    )
    # a weight of k is the row k times
    repeated = np.repeat(np.arange(500), weights.astype(int))
    assert auc(probs, labels, weights) == pytest.approx(
        auc(probs[repeated], labels[repeated]), abs=1e-12
    )
    assert np.isnan(auc(probs, np.zeros(500)))


def test_auc_is_dmt_evals_for_scores_beyond_the_clamp() -> None:
    """Reproduced bug: scores of confident models (below 1e-7 here) tie in dmt-eval's AUC
    (:func:`dmt.metrics.click_metrics` clamps them) and did not in the bootstrap's, so the two
    gave AUCs 1e-4 apart for the same predictions file."""
    rng = np.random.default_rng(3)
    y = (rng.random(20_000) < 0.05).astype(np.float32)
    p = (1 / (1 + np.exp(-(-14 + 4 * rng.standard_normal(20_000) + 2 * y)))).astype(np.float32)
    assert (p < 1e-7).mean() > 0.25
    exact = click_metrics(torch.from_numpy(p), torch.from_numpy(y))["auc"]
    assert auc(p, y) == pytest.approx(exact, abs=1e-7)  # torchmetrics sums in float32
    assert abs(auc(p, y) - roc_auc_score(y, p)) > 1e-4  # the clamp's ties do matter here
    assert auc(p, y) == pytest.approx(roc_auc_score(y, np.clip(p.astype(np.float64), 1e-7, 1)))


def test_one_model_against_itself_differs_by_nothing() -> None:
    rng = np.random.default_rng(1)
    logit, labels = _world(rng, 2000)
    runs = _runs(rng, logit, 1.0, 3)
    r = row_bootstrap(runs, runs, labels, resamples=200)
    assert r["difference"] == 0 and r["interval"] == [0.0, 0.0] and r["rows_std"] == 0
    assert r["p_two_sided"] == 1.0 and r["within_a_std"] == 1.0
    assert r["a"]["values"] == [auc(p, labels) for p in runs] == r["b"]["values"]
    assert r["a"]["median"] == statistics.median(r["a"]["values"])
    assert r["median_difference"] == 0


def test_a_planted_better_model_is_found_and_the_rows_spread_is_the_blocks() -> None:
    """Model b sees the true logit through less noise than a. The bootstrap's interval excludes
    0, and its rows' standard deviation, from one block of rows, is the spread of the difference
    over independent blocks of the same world (within 35%), and shrinks as 1/sqrt(rows)."""
    rng = np.random.default_rng(2)
    rows = 3000

    def block() -> tuple[np.ndarray, list, list]:
        logit, labels = _world(rng, rows)
        return labels, _runs(rng, logit, 1.2, 2), _runs(rng, logit, 0.9, 2)

    labels, a, b = block()
    r = row_bootstrap(a, b, labels, resamples=400, seed=3)
    assert r["difference"] > 0 and r["interval"][0] > 0 and r["p_two_sided"] < 0.01
    assert r["interval"][0] < r["difference"] < r["interval"][1]
    # the gap is many of a's seeds' standard deviations, on every resample
    assert r["within_a_std"] < 0.05 and 0 < r["a_std_resampled"] < r["difference"] / 3
    # every resample on one side: p is its floor, 2 / (resamples + 1), never 0
    assert row_bootstrap(a, b, labels, resamples=50)["p_two_sided"] == 2 / 51
    one = row_bootstrap(a[:1], b, labels, resamples=20)
    assert math.isnan(one["within_a_std"]) and math.isnan(one["a_std_resampled"])
    over_blocks = []
    for _ in range(40):
        labels_k, a_k, b_k = block()
        over_blocks.append(
            statistics.fmean(auc(p, labels_k) for p in b_k)
            - statistics.fmean(auc(p, labels_k) for p in a_k)
        )
    spread = statistics.stdev(over_blocks)
    assert 0.65 * spread < r["rows_std"] < 1.35 * spread, (r["rows_std"], spread)
    # four times the rows: about half the spread
    logit, labels = _world(rng, 4 * rows)
    big = row_bootstrap(_runs(rng, logit, 1.2, 2), _runs(rng, logit, 0.9, 2), labels, resamples=200)
    assert 0.35 < big["rows_std"] / r["rows_std"] < 0.7


@pytest.mark.parametrize("block", [1, 7])
def test_the_report_is_the_documented_computation_over_the_drawn_rows(block: int) -> None:
    """Every figure of the report, computed by hand (each resample's AUCs by the rank-sum formula
    on its rows, drawn as the bootstrap draws them: from the seeded generator, the starts of
    enough blocks of ``block`` consecutive rows, circular, for ``len(labels)`` rows, cut to
    those) on a small world (120 rows: 7 does not divide them) with three runs of a and two of b."""

    def rank_auc(y: np.ndarray, p: np.ndarray) -> float:  # Mann-Whitney U / (P * N), ties 1/2
        positives = int(y.sum())
        u = rankdata(np.clip(p, 1e-7, 1 - 1e-7))[y == 1].sum() - positives * (positives + 1) / 2
        return float(u / (positives * (len(y) - positives)))

    rng = np.random.default_rng(11)
    logit, labels = _world(rng, 120)
    a, b = _runs(rng, logit, 1.0, 3), _runs(rng, logit, 0.8, 2)
    resamples, level = 40, 0.8
    r = row_bootstrap(a, b, labels, resamples=resamples, seed=5, level=level, block=block)
    draws, n = np.random.default_rng(5), len(labels)
    diffs, a_stds = [], []
    for _ in range(resamples):
        starts = draws.integers(0, n, math.ceil(n / block))
        rows = np.concatenate([np.arange(s, s + block) % n for s in starts])[:n]
        ra = [rank_auc(labels[rows], p[rows]) for p in a]
        rb = [rank_auc(labels[rows], p[rows]) for p in b]
        diffs.append(np.mean(rb) - np.mean(ra))
        a_stds.append(np.std(ra, ddof=1))
    auc_a = [roc_auc_score(labels, p) for p in a]
    auc_b = [roc_auc_score(labels, p) for p in b]
    assert r["a"]["values"] == pytest.approx(auc_a) and r["b"]["values"] == pytest.approx(auc_b)
    assert r["rows"] == 120 and r["positives"] == labels.sum()
    assert r["difference"] == pytest.approx(np.mean(auc_b) - np.mean(auc_a))
    assert r["median_difference"] == pytest.approx(np.median(auc_b) - np.median(auc_a))
    assert r["rows_std"] == pytest.approx(np.std(diffs, ddof=1))
    assert r["interval"] == pytest.approx(list(np.quantile(diffs, [0.1, 0.9])))
    side = min(sum(d <= 0 for d in diffs), sum(d >= 0 for d in diffs))
    assert r["p_two_sided"] == pytest.approx(min(1.0, 2 * (side + 1) / (resamples + 1)))
    assert r["a_std_resampled"] == pytest.approx(np.median(a_stds))
    assert r["within_a_std"] == pytest.approx(np.mean(np.abs(diffs) <= np.array(a_stds)))


def test_a_level_outside_0_and_1_and_a_run_of_fewer_rows_are_refused() -> None:
    """A level of 0 (a zero-width interval at the median) or 1 is no central interval; a run
    shorter than the labels is refused by name (it failed inside NumPy's bincount)."""
    rng = np.random.default_rng(12)
    logit, labels = _world(rng, 100)
    a = _runs(rng, logit, 1.0, 2)
    for level in (0.0, 1.0):
        with pytest.raises(ValueError, match=rf"^row_bootstrap: level={level} must be between"):
            row_bootstrap(a, a, labels, level=level)
    with pytest.raises(ValueError, match=r"^row_bootstrap: a run has 99 scores for 100 labels$"):
        row_bootstrap(a, [a[0][:99]], labels)


def test_the_resampling_is_seeded() -> None:
    rng = np.random.default_rng(4)
    logit, labels = _world(rng, 1000)
    a, b = _runs(rng, logit, 1.0, 2), _runs(rng, logit, 1.1, 2)
    one = row_bootstrap(a, b, labels, resamples=50, seed=7)
    assert one == row_bootstrap(a, b, labels, resamples=50, seed=7)
    assert one["interval"] != row_bootstrap(a, b, labels, resamples=50, seed=8)["interval"]


def _save(path: Path, prob: np.ndarray, label: np.ndarray) -> Path:
    np.savez(path, prob=prob.astype(np.float32), label=label.astype(np.int8))
    return path


def test_predictions_files_must_hold_the_same_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    label = rng.integers(0, 2, 100)
    good = _save(tmp_path / "a.npz", rng.random(100), label)
    same = _save(tmp_path / "same.npz", rng.random(100), label)
    labels, runs = load_predictions({"a": [good], "b": [same]})
    assert np.array_equal(labels, label) and len(runs["a"]) == len(runs["b"]) == 1
    flipped = label.copy()
    flipped[17] = 1 - flipped[17]
    other = _save(tmp_path / "b.npz", rng.random(100), flipped)
    with pytest.raises(ValueError) as e:
        load_predictions({"a": [good], "b": [other]})
    assert str(e.value) == (
        f"{other}: not the rows of {good}: row 17 has label {flipped[17]} where {good} has "
        f"{label[17]} (score every run on the same data, in the same order)"
    )
    short = _save(tmp_path / "c.npz", rng.random(99), label[:99])
    with pytest.raises(ValueError, match=r"c\.npz: not the rows of .*: 99 rows where .* has 100"):
        load_predictions({"a": [good, short]})
    prob = rng.random(100)
    prob[3] = np.nan
    with pytest.raises(ValueError, match=r"nan\.npz: row 3: score nan is not finite"):
        load_predictions({"a": [_save(tmp_path / "nan.npz", prob, label)]})
    with pytest.raises(ValueError, match=r"one\.npz: every label is 1: AUC needs both classes"):
        load_predictions({"a": [_save(tmp_path / "one.npz", rng.random(100), np.ones(100))]})
    np.savez(tmp_path / "bad.npz", scores=rng.random(100))
    (tmp_path / "empty.npz").write_bytes(b"")
    np.save(tmp_path / "plain.npy", rng.random(100))
    for name in ("bad.npz", "empty.npz", "plain.npy"):
        with pytest.raises(ValueError, match=rf"{name}: not a predictions file"):
            load_predictions({"a": [tmp_path / name]})
    with pytest.raises(ValueError, match=r"none\.npz: 'prob' \(0,\) and 'label' \(0,\) must be"):
        load_predictions({"a": [_save(tmp_path / "none.npz", np.zeros(0), np.zeros(0))]})
    with pytest.raises(ValueError, match=r"a\.npz is a run of both a and b"):
        load_predictions({"a": [good], "b": [tmp_path / "x" / ".." / "a.npz"]})
    # one run given twice in a group (a glob and its own path) would count as two seeds
    with pytest.raises(ValueError, match=r"^.*x/\.\./a\.npz is given twice in a$"):
        load_predictions({"a": [good, same, tmp_path / "x" / ".." / "a.npz"], "b": [other]})


def test_scores_that_are_no_probabilities_are_refused(tmp_path: Path) -> None:
    """Reproduced bug: a file of logits was clamped into [1e-7, 1 - 1e-7] like probabilities,
    so every logit above 1 tied with every other, and so did every negative one: an AUC far
    from the scores' own (0.56 for 0.64 in a reproduction), with no error. Probabilities of
    exactly 0 and 1 (a float32 sigmoid saturates) are scores like any other."""
    rng = np.random.default_rng(11)
    label = rng.integers(0, 2, 2000)
    logit = -1 + 0.5 * label + rng.normal(0, 1, 2000)
    assert abs(auc(logit, label) - roc_auc_score(label, logit)) > 0.05  # the clamp's ties
    path = _save(tmp_path / "logits.npz", logit, label)
    row = int(np.flatnonzero((logit < 0) | (logit > 1))[0])
    with pytest.raises(ValueError) as e:
        load_predictions({"a": [path]})
    assert str(e.value) == (
        f"{path}: row {row}: score {np.float32(logit[row])} is not a probability in [0, 1] "
        "('prob' holds click probabilities, not logits)"
    )
    prob = rng.random(2000)
    prob[:2] = 0.0, 1.0
    edges = _save(tmp_path / "edges.npz", prob, label)
    _, runs = load_predictions({"a": [edges]})
    assert np.array_equal(runs["a"][0], prob.astype(np.float32))


def test_a_resample_of_one_class_is_refused_not_reported() -> None:
    """60 rows with 2 positives: about one resample in eight draws neither. Its AUCs were NaN,
    which made a p-value that counted them on neither side (too small: "significant"), or a
    crash in the seeds' std with several runs."""
    rng = np.random.default_rng(0)
    labels = np.zeros(60, dtype=np.int8)
    labels[[10, 40]] = 1
    a, b = _runs(rng, np.zeros(60), 1.0, 2), _runs(rng, np.zeros(60), 1.0, 2)
    with pytest.raises(ValueError) as e:
        row_bootstrap(a, b, labels, resamples=200)
    assert re.fullmatch(
        r"row_bootstrap: resample \d+ drew rows of one class only \(60 rows, 2 positive, "
        r"block=1\); every resample needs both classes: use more rows or a smaller block",
        str(e.value),
    )
    with pytest.raises(ValueError, match=r"\(60 rows, 58 positive, block=1\)"):
        row_bootstrap(a, b, 1 - labels, resamples=200)  # resamples of positives only, as well


@pytest.mark.slow  # five runs of the script (30-50 s on 2 shared cores); its parts are tested in-process
def test_the_command_compares_groups_and_keeps_earlier_results(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    logit, labels = _world(rng, 1500)
    for name, noise in (("base", 1.2), ("better", 0.8), ("same", 1.2)):
        for seed, prob in enumerate(_runs(rng, logit, noise, 3)):
            _save(tmp_path / f"{name}_{seed}.npz", prob, labels)
    out = tmp_path / "boot.json"
    argv = [
        sys.executable,
        str(ROOT / "scripts" / "row_bootstrap.py"),
        "--group",
        "base",
        str(tmp_path / "base_*.npz"),
        "--group",
        "better",
        str(tmp_path / "better_*.npz"),
        "--group",
        "same",
        str(tmp_path / "same_*.npz"),
        "--resamples",
        "200",
        "--out",
        str(out),
    ]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    reports = json.loads(out.read_text())
    assert list(reports) == ["better vs base", "same vs base"]
    better, same = reports["better vs base"], reports["same vs base"]
    assert better["interval"][0] > 0 and same["interval"][0] < 0 < same["interval"][1]
    assert better["a_files"] == [str(tmp_path / f"base_{i}.npz") for i in range(3)]
    assert "| better vs base |" in res.stdout and "| same vs base |" in res.stdout
    # the files one by one (as a shell expands a glob) give the same report
    listed = subprocess.run(
        [*argv[:2], "--group", "base", *(str(tmp_path / f"base_{i}.npz") for i in range(3)),
         "--group", "better", *(str(tmp_path / f"better_{i}.npz") for i in range(3)),
         "--resamples", "200", "--out", str(tmp_path / "listed.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert json.loads((tmp_path / "listed.json").read_text()) == {"better vs base": better}
    # a second run does not replace the first's results
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and f"--out {out} exists already" in again.stderr
    assert json.loads(out.read_text()) == reports
    missing = subprocess.run(
        [*argv[:2], "--group", "x", str(tmp_path / "nothing_*.npz"), "--group", "y", "z"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "--group x: no file matches" in missing.stderr
    bad_block = subprocess.run(
        [*argv[:8], "--block", "0"], capture_output=True, text=True, timeout=120
    )
    assert bad_block.returncode == 2
    assert "row_bootstrap: block=0 must be between 1 and the 1500 rows" in bad_block.stderr


def test_a_pair_of_a_group_with_itself_or_given_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reproduced bugs: ``--pair A A`` reported a comparison of a group with itself (a typo for
    ``--pair A B``), and a repeated ``--pair`` was silently merged into one row."""
    rng = np.random.default_rng(7)
    logit, labels = _world(rng, 200)
    groups = []
    for name in ("A", "B"):
        for seed, prob in enumerate(_runs(rng, logit, 1.0, 2)):
            _save(tmp_path / f"{name}_{seed}.npz", prob, labels)
        groups += ["--group", name, str(tmp_path / f"{name}_*.npz")]
    out = tmp_path / "boot.json"
    for pairs, message in (
        (["--pair", "A", "A"], "--pair A A compares a group with itself: give two groups"),
        (["--pair", "B", "A", "--pair", "B", "A"], "--pair B A is given twice"),
    ):
        with pytest.raises(SystemExit) as exit_:
            _driver().main([*groups, *pairs, "--out", str(out)])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.strip().endswith(f"error: {message}")
        assert not out.exists()


def test_format_report_names_each_comparison() -> None:
    rng = np.random.default_rng(8)
    logit, labels = _world(rng, 800)
    r = row_bootstrap(_runs(rng, logit, 1, 2), _runs(rng, logit, 1, 1), labels, resamples=20)
    text = format_report({"b vs a": r})
    row = text.splitlines()[2]
    assert row.startswith(f"| b vs a | {r['a']['mean']:.4f} | {r['b']['mean']:.4f} | ")
    assert f"{r['a']['std']:.4f} / -" in row  # one run of b: no seeds' std


def test_blocks_of_consecutive_rows() -> None:
    """One block of every row (circular) draws each row once: no spread at all; a block longer
    than the rows is refused."""
    rng = np.random.default_rng(9)
    logit, labels = _world(rng, 600)
    a, b = _runs(rng, logit, 1.0, 2), _runs(rng, logit, 1.3, 2)
    whole = row_bootstrap(a, b, labels, resamples=30, block=600)
    assert whole["rows_std"] == 0 and whole["interval"] == [whole["difference"]] * 2
    assert whole["block"] == 600
    some = row_bootstrap(a, b, labels, resamples=100, block=50)
    assert some["rows_std"] > 0 and some["interval"][0] < some["interval"][1]
    with pytest.raises(
        ValueError, match=r"^row_bootstrap: block=601 must be between 1 and the 600"
    ):
        row_bootstrap(a, b, labels, block=601)


def test_blocks_find_rows_that_come_in_runs() -> None:
    """Planted: every row of a 200-row world appears 50 times in a row, so the 10,000 rows hold
    200 rows' worth of information. Single rows drawn apart take them for 10,000 and narrow the
    spread about sqrt(50) = 7 times; blocks of the runs' length find it."""
    rng = np.random.default_rng(10)
    logit, labels = _world(rng, 200)
    a, b = _runs(rng, logit, 1.0, 2), _runs(rng, logit, 1.3, 2)
    rep = [np.repeat(p, 50) for p in a], [np.repeat(p, 50) for p in b]
    rows = row_bootstrap(*rep, np.repeat(labels, 50), resamples=300, seed=1)
    blocks = row_bootstrap(*rep, np.repeat(labels, 50), resamples=300, seed=1, block=50)
    truth = row_bootstrap(a, b, labels, resamples=300, seed=1)  # the 200 rows themselves
    assert blocks["rows_std"] > 4 * rows["rows_std"]
    assert 0.7 < blocks["rows_std"] / truth["rows_std"] < 1.4


def _driver():
    return load_script(ROOT / "scripts" / "row_bootstrap.py")


def test_an_existing_path_is_a_file_not_a_glob_and_seed_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reproduced bugs: every --group argument was a glob, so a file in a Hydra sweep directory
    (``mlp=[64,16]/pred.npz``: brackets are a glob's character class) matched nothing; --seed -1
    was NumPy's "expected non-negative integer", naming no option."""
    rng = np.random.default_rng(8)
    logit, labels = _world(rng, 300)
    files = {}
    for name, noise in (("mlp=[64,16]", 1.0), ("mlp=[32]", 0.8)):
        (tmp_path / name).mkdir()
        files[name] = _save(tmp_path / name / "pred.npz", _runs(rng, logit, noise, 1)[0], labels)
    argv = ["--group", "a", str(files["mlp=[64,16]"]), "--group", "b", str(files["mlp=[32]"])]
    reports = _driver().main([*argv, "--resamples", "20"])
    assert reports["b vs a"]["a_files"] == [str(files["mlp=[64,16]"])]
    assert reports["b vs a"]["b_files"] == [str(files["mlp=[32]"])]
    capsys.readouterr()
    # a pattern is still a glob (it is no file); one that matches nothing is refused
    pattern = str(tmp_path / "mlp=?32?" / "pred.npz")
    both = _driver().main(["--group", "a", str(files["mlp=[64,16]"]), "--group", "b", pattern,
                           "--resamples", "20"])  # fmt: skip
    assert both["b vs a"]["b_files"] == [str(files["mlp=[32]"])]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        _driver().main([*argv, "--seed", "-1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].endswith("error: --seed -1: expected a non-negative integer")
    with pytest.raises(ValueError, match=r"^row_bootstrap: seed=-1 must be >= 0$"):
        row_bootstrap([labels * 0.5 + 0.1], [labels * 0.5 + 0.2], labels, seed=-1)
