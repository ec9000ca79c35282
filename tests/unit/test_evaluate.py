"""``dmt.evaluate`` and ``dmt.checkpoint.load_model_state`` pieces, without training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score
from torch import nn

from dmt.data import InMemorySource
from dmt.evaluate import (
    find_checkpoint,
    format_report,
    metrics_of,
    predict,
    read_config,
    write_json,
)
from dmt.metrics import binary_entropy


def test_metrics_match_sklearn() -> None:
    rng = np.random.default_rng(0)
    probs = rng.uniform(0.01, 0.99, 500)
    labels = (rng.uniform(size=500) < probs * 0.8).astype(np.float32)
    m = metrics_of(torch.from_numpy(probs).float(), torch.from_numpy(labels))
    ctr = labels.mean()
    assert m["rows"] == 500 and m["positive_rate"] == pytest.approx(ctr)
    assert m["auc"] == pytest.approx(roc_auc_score(labels, probs), abs=1e-6)
    assert m["logloss"] == pytest.approx(log_loss(labels, probs), rel=1e-6)
    assert m["ne"] == pytest.approx(log_loss(labels, probs) / binary_entropy(float(ctr)), rel=1e-6)
    assert m["calibration"] == pytest.approx(probs.mean() / ctr, rel=1e-6)
    assert math.isnan(metrics_of(torch.tensor([0.2, 0.7]), torch.tensor([1.0, 1.0]))["auc"])
    with pytest.raises(ValueError, match="no rows to evaluate"):
        metrics_of(torch.empty(0), torch.empty(0))


class _MeanDense(nn.Module):
    def forward(self, dense: torch.Tensor, sparse: object) -> torch.Tensor:
        return dense.mean(dim=1)


@pytest.mark.parametrize("max_rows", [None, 1, 64, 65, 150, 1000])
def test_predict_keeps_order_and_stops_after_max_rows(max_rows: int | None) -> None:
    n = 200
    dense = np.arange(n * 2, dtype=np.float32).reshape(n, 2) / 400
    labels = (np.arange(n) % 3 == 0).astype(np.float32)
    src = InMemorySource(dense, np.zeros((n, 1), np.int64), labels, ["cat_0"], batch_size=64)
    probs, ys = predict(_MeanDense(), src, max_rows=max_rows)
    k = min(max_rows or n, n)
    torch.testing.assert_close(probs, torch.sigmoid(torch.from_numpy(dense[:k].mean(1))))
    torch.testing.assert_close(ys, torch.from_numpy(labels[:k]))


class _Overflowing(nn.Module):
    """Logits of +inf and -inf on the first two rows of every four (an overflow), finite on the
    others."""

    def forward(self, dense: torch.Tensor, sparse: object) -> torch.Tensor:
        logits = dense.mean(dim=1)
        logits[0::4], logits[1::4] = math.inf, -math.inf
        return logits


def test_infinite_logits_are_predictions_that_are_not_finite() -> None:
    """A reproduced bug: a diverged model's infinite logits became probabilities of exactly 1
    and 0, which the metrics clamp: dmt-eval reported finite numbers (AUC 0, NE 12 on these
    rows) without a word, where NaN logits give NaN metrics and a warning."""
    n = 8
    dense = np.linspace(-1, 1, n * 2, dtype=np.float32).reshape(n, 2)
    labels = (np.arange(n) % 2).astype(np.float32)
    src = InMemorySource(dense, np.zeros((n, 1), np.int64), labels, ["cat_0"], batch_size=4)
    probs, ys = predict(_Overflowing(), src)
    overflow = (np.arange(n) % 4) < 2
    assert torch.isnan(probs[overflow]).all()
    torch.testing.assert_close(
        probs[~overflow], torch.sigmoid(torch.from_numpy(dense[~overflow].mean(1)))
    )
    with pytest.warns(RuntimeWarning, match=r"^4 of 8 predictions are not finite .*diverged"):
        m = metrics_of(probs, ys)
    assert all(math.isnan(m[k]) for k in ("auc", "ne", "logloss", "calibration"))
    assert m["rows"] == 8 and m["positive_rate"] == 0.5


def test_report_json_is_atomic_and_strict(tmp_path: Path) -> None:
    report = {"checkpoint": "/x/step_3", "step": 3, "data": "test", "auc": float("nan"), "rows": 10}
    out = tmp_path / "a" / "eval.json"
    out.parent.mkdir()
    out.write_text("old")
    assert write_json(out, report) == out
    assert json.loads(out.read_text()) == {**report, "auc": None}  # NaN is not valid JSON
    assert [p.name for p in out.parent.iterdir()] == ["eval.json"]
    table = format_report({"auc": 0.71234567, "rows": 12345, "data": "test"})
    assert table.splitlines() == [
        "auc            0.712346",
        "rows           12,345",
        "data           test",
    ]


def test_find_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--checkpoint '.*nope': no such directory"):
        find_checkpoint(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"is a file; expected a checkpoint directory"):
        find_checkpoint(tmp_path / "file")
    for step, complete in [(2, True), (10, True), (11, False)]:
        (tmp_path / f"step_{step}").mkdir()
        if complete:
            (tmp_path / f"step_{step}" / "meta.json").write_text('{"files": {}}')
            (tmp_path / f"step_{step}" / ".metadata").write_bytes(b"")  # DCP's index
    assert find_checkpoint(tmp_path) == tmp_path / "step_10"  # numeric order, complete only
    assert find_checkpoint(tmp_path / "step_2") == tmp_path / "step_2"
    with pytest.raises(
        ValueError,
        match=r"--checkpoint='.*step_11' is not a usable checkpoint: .*step_11/meta.json is missing \(the save did not finish\)$",
    ):
        find_checkpoint(tmp_path / "step_11")


def test_read_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  epochs: many\n")
    with pytest.raises(
        ValueError,
        match=r"bad.yaml: not a dmt training config: Value 'many' of type 'str' could not be converted to Integer \(at trainer.epochs\)$",
    ):
        read_config(bad)
    bad.write_text("garbage: [\n")  # a truncated or hand-broken file: YAML's own error
    with pytest.raises(ValueError, match=r"bad.yaml: not a dmt training config: while parsing"):
        read_config(bad)
    dot = "  interaction: {_target_: dmt.models.interaction.DotInteraction}\n"
    bad.write_text(f"model:\n  name: dlrm\n{dot}trainer:\n  epochs: 0\n")
    with pytest.raises(ValueError, match=r"bad.yaml: invalid training config: trainer.epochs=0"):
        read_config(bad)
    good = tmp_path / "good.yaml"
    cross = "  interaction: {_target_: dmt.models.interaction.CrossInteraction}\n"
    good.write_text(f"model:\n  name: dcn\n{cross}")
    assert read_config(good).model.name == "dcn"
    # a run of an older dmt whose partition setting its kind ignored is read without it
    old = tmp_path / "old.yaml"
    old.write_text(f"model:\n  name: dcn\n{cross}  partition:\n    path: tp.yaml\n")
    with pytest.warns(UserWarning, match=r"old.yaml: model.partition.path='tp.yaml' was not read"):
        assert read_config(old).model.partition.path is None
