"""``dmt-eval`` end to end: train tiny models with checkpoints, then score them.

The Criteo-format rows here are made up by the tests (``make_rows``); real Criteo rows are only
read from ``../shared/data`` (skipped when absent) and only copied into temporary directories.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from sklearn.metrics import log_loss, roc_auc_score
from torchrec.datasets.utils import Batch

from dmt.data.criteo_config import CriteoConfig
from dmt.data.criteo_preprocess import preprocess_criteo
from dmt.data.source import make_kjt
from dmt.evaluate import (
    evaluate,
    load_model,
    main,
    open_checkpoint,
    open_data,
    read_config,
    run_schema,
)
from dmt.metrics import binary_entropy
from dmt.models import build_model
from dmt.partitioner.cli import checkpoint_affinity
from dmt.runtime import Runtime, close_runtime, init_runtime
from dmt.seeds import scored_predictions_problem
from dmt.train import to_config
from dmt.trainer import Trainer
from tests.conftest import compose_config
from tests.distributed.distributed_harness import run_on_ranks
from tests.unit.test_criteo_preprocess import make_rows, ref_parse, ref_vocab, write

TINY = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=2048",
    "data.synthetic.num_val=700",
    "data.synthetic.num_test=900",
    "data.batch_size=256",
    "data.eval_batch_size=256",  # the last test batch is partial (900 = 3 * 256 + 132)
    "trainer.max_steps=3",
    "trainer.checkpoint_every=2",
    "trainer.checkpoint=true",
    "trainer.eval_max_batches=-1",
]
SMALL_MODEL = ["model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,1]"]
METRICS = ("auc", "ne", "logloss", "calibration")


def _fit(overrides: list[str], out: Path) -> Trainer:
    torch.set_num_threads(1)
    trainer = Trainer(to_config(compose_config(*overrides)), init_runtime("cpu"), out)
    trainer.fit()
    return trainer


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic_run")
    try:
        _fit(TINY, out)
    finally:
        close_runtime()
    return out


def _copy_run(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    return dest


def _assert_matches_trainer(report: dict, trained: dict, split: str, **tol: float) -> None:
    """dmt-eval's exact metrics against the trainer's streaming ones (binned AUC: within 1e-4)."""
    for k in METRICS:
        if k == "auc":
            torch.testing.assert_close(report[k], trained[f"{split}_{k}"], msg=k, rtol=0, atol=1e-4)
        else:
            torch.testing.assert_close(report[k], trained[f"{split}_{k}"], msg=k, **tol)
    assert report["rows"] == trained[f"{split}_num_samples"]


# -- synthetic runs ---------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["test", "val"])
def test_eval_reproduces_the_trainers_metrics(synthetic_run: Path, split: str) -> None:
    trained = json.loads((synthetic_run / "metrics.json").read_text())
    report = evaluate(synthetic_run / "checkpoints", split)
    assert report["step"] == 3 and report["checkpoint"].endswith("step_3")
    _assert_matches_trainer(report, trained, split)
    assert report["rows"] == {"test": 900, "val": 700}[split]
    # a different batch size and an earlier step give other numbers, so the match is not luck
    other = evaluate(synthetic_run / "checkpoints" / "step_2", split, batch_size=100)
    assert other["step"] == 2 and other["logloss"] != report["logloss"]


def test_max_rows_and_the_train_split(synthetic_run: Path, tmp_path: Path) -> None:
    """``max_rows`` scores the split's first rows, in order, with other batch sizes alike."""
    first, whole = tmp_path / "first.npz", tmp_path / "whole.npz"
    ckpt = synthetic_run / "checkpoints"
    report = evaluate(ckpt, "train", max_rows=300, batch_size=256, predictions=first)
    assert report["rows"] == 300
    full = evaluate(ckpt, "train", predictions=whole)
    assert full["rows"] == 2048
    with np.load(first) as a, np.load(whole) as b:
        np.testing.assert_array_equal(a["label"], b["label"][:300])
        np.testing.assert_allclose(a["prob"], b["prob"][:300], rtol=1e-6, atol=1e-7)
        assert report["logloss"] == pytest.approx(log_loss(a["label"], a["prob"]), rel=1e-5)
        assert report["auc"] == pytest.approx(roc_auc_score(a["label"], a["prob"]), abs=1e-4)
    # and they are the train split's rows, not another split's (val: 700, test: 900 rows)
    train_labels = torch.cat(
        [b.labels.flatten() for b in open_data(open_checkpoint(ckpt), "train", batch_size=300)
         .source.batches(0)]
    )  # fmt: skip
    with np.load(first) as a:
        np.testing.assert_array_equal(a["label"], train_labels[:300].round().to(torch.int8).numpy())


def test_cli_prints_the_table_and_writes_json(synthetic_run: Path, tmp_path: Path) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "dmt-eval")
    out = tmp_path / "nested" / "eval.json"
    res = subprocess.run(
        [
            exe,
            "--checkpoint",
            str(synthetic_run / "checkpoints"),
            "--data",
            "test",
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    written = json.loads(out.read_text())
    assert list(written) == [
        "checkpoint",
        "step",
        "data",
        "auc",
        "ne",
        "logloss",
        "calibration",
        "positive_rate",
        "rows",
    ]
    _assert_matches_trainer(
        written, json.loads((synthetic_run / "metrics.json").read_text()), "test"
    )
    assert re.search(r"^auc\s+0\.\d{6}$", res.stdout, re.M) and "rows           900" in res.stdout
    assert not [p for p in out.parent.iterdir() if p.name != "eval.json"]  # no temporary left
    # torch's warning of the single-process load that dmt-eval asks for (no_dist=True) was
    # printed at every run: "... assuming the intent is to load in a single process"
    assert "torch.distributed is disabled" not in res.stderr, res.stderr


def test_config_of_a_hydra_run_directory(synthetic_run: Path, tmp_path: Path) -> None:
    """Checkpoints without config.yaml (older runs) use the Hydra run's .hydra/config.yaml."""
    run = _copy_run(synthetic_run, tmp_path / "run")
    for p in run.glob("checkpoints/step_*/config.yaml"):
        p.unlink()
    with pytest.raises(
        ValueError,
        match=r"has no training config: looked for .*step_3/config.yaml "
        r"and .*run/\.hydra/config.yaml; pass the run's config with --config",
    ):
        evaluate(run / "checkpoints", "test")
    (run / ".hydra").mkdir()
    OmegaConf.save(compose_config(*TINY), run / ".hydra" / "config.yaml")
    report = evaluate(run / "checkpoints", "test")
    _assert_matches_trainer(report, json.loads((run / "metrics.json").read_text()), "test")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_device_cuda_without_cuda_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A reproduced bug: --device cuda on a CPU machine ended in a traceback from torch."""
    args = ["--checkpoint", str(tmp_path), "--data", "test", "--out", str(tmp_path / "e.json")]
    assert main([*args, "--device", "cuda"]) == 1
    assert capsys.readouterr().err.startswith(
        "dmt-eval: error: --device cuda: no CUDA device here (torch "
    )


def test_a_checkpoint_config_that_no_longer_reads_gives_way_to_config(
    synthetic_run: Path, tmp_path: Path
) -> None:
    """A checkpoint's own config.yaml with a key this dmt no longer has: --config stands in
    for it (with a warning), as before --config was checked against it."""
    run = _copy_run(synthetic_run, tmp_path / "run")
    step = run / "checkpoints" / "step_3"
    given = shutil.copy(step / "config.yaml", tmp_path / "given.yaml")
    _edit_config(step, trainer__old_knob=1)
    with pytest.raises(ValueError, match=r"not a dmt training config: Key 'old_knob'"):
        evaluate(step, "test")
    with pytest.warns(UserWarning, match=rf"Key 'old_knob'.*; reading --config '{given}' instead"):
        report = evaluate(step, "test", config=given)
    _assert_matches_trainer(report, json.loads((run / "metrics.json").read_text()), "test")


def test_checkpoint_errors(
    synthetic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = ["--out", str(tmp_path / "eval.json")]  # not the working directory's eval.json
    assert main(["--checkpoint", str(tmp_path / "nope"), "--data", "test", *out]) == 1
    assert (
        f"dmt-eval: error: --checkpoint '{tmp_path / 'nope'}': no such directory"
        in capsys.readouterr().err
    )

    (tmp_path / "empty" / "step_5").mkdir(parents=True)  # a step without meta.json is incomplete
    with pytest.raises(
        ValueError, match=r"--checkpoint=.*empty': no complete checkpoint \(step_N/meta.json\)"
    ):
        evaluate(tmp_path / "empty", "test")

    run = _copy_run(synthetic_run, tmp_path / "run")
    with pytest.raises(ValueError) as e:  # the run directory, not its checkpoints
        evaluate(run, "test")
    assert str(e.value) == (
        f"--checkpoint={str(run)!r}: no complete checkpoint (step_N/meta.json) there (a run "
        f"directory? its checkpoints are in {run / 'checkpoints'})"
    )
    (run / "checkpoints" / "step_9").mkdir()  # incomplete: ignored, the latest complete is used
    assert evaluate(run / "checkpoints", "test")["step"] == 3
    # copied with `cp step_3/* copy/step_3/` (no dotfiles): the parent's error says why (it
    # said only "no complete checkpoint", the reason in a warning above it)
    copy = tmp_path / "copy" / "step_3"
    copy.mkdir(parents=True)
    for f in (run / "checkpoints" / "step_3").iterdir():
        if not f.name.startswith("."):
            shutil.copy(f, copy / f.name)
    with pytest.raises(ValueError) as e:
        evaluate(tmp_path / "copy", "test")
    assert str(e.value) == (
        f"--checkpoint={str(tmp_path / 'copy')!r}: no complete checkpoint (step_N/meta.json) "
        f"there (the newest, step_3: {copy / '.metadata'} is missing; a copy that skips "
        "dotfiles (cp dir/*) leaves it behind)"
    )
    # A truncated data file (a crash during the write, a full disk): named, never read.
    data_file = run / "checkpoints" / "step_3" / "__0_0.distcp"
    size = data_file.stat().st_size
    with open(data_file, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(
        ValueError,
        match=rf"--checkpoint='.*step_3' is not a usable checkpoint: .*step_3/__0_0.distcp has {size // 2} bytes, meta.json says {size}$",
    ):
        evaluate(run / "checkpoints" / "step_3", "test")
    (run / "checkpoints" / "step_2" / "__0_0.distcp").unlink()
    with pytest.raises(ValueError, match=r"--checkpoint='.*checkpoints': no complete checkpoint"):
        evaluate(run / "checkpoints", "test")


def _edit_config(step_dir: Path, **changes: object) -> Path:
    path = step_dir / "config.yaml"
    cfg = OmegaConf.load(path)
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)
    OmegaConf.save(cfg, path)
    return path


def test_config_that_does_not_match_the_weights(synthetic_run: Path, tmp_path: Path) -> None:
    run = _copy_run(synthetic_run, tmp_path / "run")
    step = run / "checkpoints" / "step_3"
    cfg_path = _edit_config(step, data__synthetic__cardinality=50)
    with pytest.raises(ValueError) as e:
        evaluate(step, "test")
    msg = str(e.value)
    assert msg.startswith(
        f"checkpoint {step} does not match the model its config {cfg_path} builds: "
    )
    assert "embedding_bags.t_cat_0.weight: checkpoint (100, 16), config (50, 16)" in msg

    cross = {"_target_": "dmt.models.interaction.CrossInteraction", "num_layers": 3, "low_rank": 64}
    _edit_config(
        step, data__synthetic__cardinality=100, model__name="dcn", model__interaction=cross
    )
    with pytest.raises(
        ValueError,
        match=r"model.top.0.weight: checkpoint \(256, 367\), config \(256, 432\); 9 tensors missing from the checkpoint \(e.g. model\.interaction\.crossnet",
    ):
        evaluate(step, "test")

    _edit_config(
        step,
        model__name="dlrm",
        model__interaction={"_target_": "dmt.models.interaction.DotInteraction"},
        sptt__enabled=True,
        model__partition__kind="naive",
        model__partition__num_towers=2,
    )
    with pytest.raises(
        ValueError,
        match=r"26 tensors missing from the checkpoint \(e.g. model.towers.0.embedding_bag_collection.embedding_bags.t_cat_0.weight\)",
    ):
        evaluate(step, "test")

    _edit_config(step, sptt__enabled=False, model__partition__kind="none", model__embedding_dim=0)
    with pytest.raises(
        ValueError, match=r"config.yaml: invalid training config: model.embedding_dim=0"
    ):
        evaluate(step, "test")
    (step / "config.yaml").write_text("model:\n  no_such_key: 1\n")
    with pytest.raises(
        ValueError,
        match=r"config.yaml: not a dmt training config: Key 'no_such_key' not in 'ModelConfig' \(at model.no_such_key\)",
    ):
        evaluate(step, "test")


def test_files_need_a_criteo_run(synthetic_run: Path, tmp_path: Path) -> None:
    tsv = write(tmp_path / "rows.tsv", make_rows(5))
    with pytest.raises(ValueError, match=r"run on synthetic data .*use --data train\|val\|test"):
        evaluate(synthetic_run / "checkpoints", str(tsv))


# -- a multi-rank checkpoint ------------------------------------------------------------------


def _two_rank_worker(rank: int, world_size: int, out: str, extra: list[str]) -> dict[str, float]:
    rt = Runtime(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")
    return Trainer(to_config(compose_config(*TINY, *extra)), rt, Path(out)).fit().metrics


@pytest.mark.parametrize(
    "extra",
    [
        [],
        [
            "experiment=dmt_4t_dlrm",
            "model.partition.num_towers=2",
            "sptt=on",
            "sptt.local_world_size=1",
            *SMALL_MODEL,
        ],
        [  # the moving average of the towers' modules and the dense arch, evaluated in their place
            "experiment=dmt_4t_dlrm",
            "model.partition.num_towers=2",
            "sptt=on",
            "sptt.local_world_size=1",
            *SMALL_MODEL,
            "trainer.ema_decay=0.5",
        ],
    ],
    ids=["flat", "sptt", "sptt-ema"],
)
def test_a_two_rank_checkpoint_loads_in_one_process(tmp_path: Path, extra: list[str]) -> None:
    metrics = run_on_ranks(_two_rank_worker, 2, str(tmp_path), extra, timeout_s=240)[0]
    assert (
        json.loads((tmp_path / "checkpoints" / "step_3" / "meta.json").read_text())["world_size"]
        == 2
    )
    # the tables are split over the ranks: neither rank file alone holds the model
    report = evaluate(tmp_path / "checkpoints", "test")
    # the trainer adds the ranks' sums: the same numbers up to float sums (AUC: binned)
    _assert_matches_trainer(report, metrics, "test", rtol=1e-7, atol=1e-8)
    # dmt-partition --checkpoint reads the same checkpoint (SPTT: the DMT model's towers)
    affinity, names = checkpoint_affinity(tmp_path / "checkpoints", "val", max_batches=2)
    assert names == [f"cat_{i}" for i in range(26)]
    reference = _affinity_by_hand(tmp_path / "checkpoints", names, batches=2)
    np.testing.assert_allclose(affinity, reference, rtol=1e-5, atol=1e-7)  # float32 pooling
    assert np.ptp(affinity[~np.eye(26, dtype=bool)]) > 0.05  # rows that tell features apart


def _affinity_by_hand(checkpoint: Path, names: list[str], batches: int) -> np.ndarray:
    """``|mean over samples of cos(F_i, F_j)|`` (diagonal 1) of the checkpoint's tables over the
    first ``batches`` validation batches of 4096 rows, each feature's bag summed from its table
    by hand, rows in ``names``' order: none of the affinity code."""
    ckpt = open_checkpoint(checkpoint)
    assert ckpt.config.model.pooling == "sum"
    state = load_model(ckpt).state_dict()
    tables = {}
    for name in names:  # one table per feature, wherever its tower keeps it
        (key,) = [k for k in state if k.endswith(f"embedding_bags.t_{name}.weight")]
        tables[name] = state[key].double()
    total, count = torch.zeros(len(names), len(names), dtype=torch.float64), 0
    rows = open_data(ckpt, "val", batch_size=4096, progress=False)
    for _, batch in zip(range(batches), rows.source.batches(0), strict=False):
        bags = batch.sparse_features.to_dict()
        pooled = torch.stack(
            [
                torch.nn.functional.embedding_bag(
                    bags[n].values(), tables[n], bags[n].offsets()[:-1], mode="sum"
                )
                for n in names
            ],
            dim=1,
        )  # (B, F, N)
        unit = pooled / pooled.norm(dim=2, keepdim=True).clamp_min(1e-300)
        unit[pooled.norm(dim=2) == 0] = 0  # an all-zero bag has no direction: cosine 0
        total += torch.einsum("bin,bjn->ij", unit, unit)
        count += pooled.size(0)
    result = (total / count).abs().numpy()
    np.fill_diagonal(result, 1.0)
    return result


# -- Criteo runs: raw TSV through the training vocabularies -----------------------------------

CRITEO = [
    "logger=disabled",
    "data=criteo_sample",
    "data.criteo.num_workers=1",
    "data.criteo.prefetch_batches=0",
    "data.batch_size=64",
    "data.eval_batch_size=40",
    "trainer.progress_bar=false",
    "trainer.checkpoint=true",
    "trainer.eval_max_batches=-1",
    *SMALL_MODEL,
]


TRAIN_ROWS = make_rows(600, seed=1)  # made-up rows; the first 85% are the training split
# rows with the training values (some frequent enough for their own id) and unseen values
EVAL_ROWS = make_rows(750, seed=1)[600:] + make_rows(60, seed=2)


def _reference_predictions(trainer: Trainer, rows: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Parse and map ``rows`` in plain Python; score them with the trained (sharded) model."""
    vocab = ref_vocab(TRAIN_ROWS[:510], 3)
    parsed = [ref_parse(r) for r in rows]
    ids = np.array(
        [[vocab[f].get(v, 0) if v is not None else 0 for f, v in enumerate(p[2])] for p in parsed],
        np.int64,
    )
    assert (ids == 0).mean() < 0.6 and (ids > 0).any()  # both seen and unseen values
    labels = np.array([p[0] for p in parsed], np.float32)
    batch = Batch(
        dense_features=torch.tensor([p[1] for p in parsed], dtype=torch.float32),
        sparse_features=make_kjt([f"cat_{f}" for f in range(26)], ids[:, :, None]),
        labels=torch.from_numpy(labels),
    )
    trainer.model.eval()
    with torch.no_grad():
        probs = torch.sigmoid(trainer.model(batch)[1]).double().numpy()
    return probs, labels


@pytest.fixture(scope="module")
def criteo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """A DLRM trained on made-up Criteo-format rows, with relative data paths (as the
    criteo_sample config has them) from its own working directory; and its reference
    predictions of ``EVAL_ROWS``."""
    root = tmp_path_factory.mktemp("criteo_run")
    write(root / "train.tsv", TRAIN_ROWS)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        preprocess_criteo(
            CriteoConfig(raw_path="train.tsv", preprocessed_dir="prep", num_workers=1),
            progress=False,
        )
        trainer = _fit(
            [*CRITEO, "data.criteo.raw_path=train.tsv", "data.criteo.preprocessed_dir=prep"],
            root / "run",
        )
        probs, labels = _reference_predictions(trainer, EVAL_ROWS)
    finally:
        close_runtime()
        os.chdir(cwd)
    return root, probs, labels


def _last_step(checkpoints: Path) -> Path:
    return max(checkpoints.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))


def test_raw_tsv_matches_a_reference_from_the_models_own_predictions(criteo_run, tmp_path) -> None:
    root, probs, labels = criteo_run
    tsv = write(tmp_path / "eval.tsv.gz", EVAL_ROWS)
    report = evaluate(root / "run" / "checkpoints", str(tsv), batch_size=32)
    ctr = labels.mean()
    assert report["rows"] == len(EVAL_ROWS) and report["positive_rate"] == pytest.approx(ctr)
    torch.testing.assert_close(report["auc"], roc_auc_score(labels, probs), rtol=1e-6, atol=1e-6)
    ref_logloss = log_loss(labels, probs)
    torch.testing.assert_close(report["logloss"], ref_logloss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(
        report["ne"], ref_logloss / binary_entropy(float(ctr)), rtol=1e-6, atol=1e-7
    )
    torch.testing.assert_close(report["calibration"], probs.mean() / ctr, rtol=1e-6, atol=1e-7)


def test_predictions_of_a_raw_tsv_are_its_rows_in_file_order(criteo_run, tmp_path) -> None:
    """Row by row against the trained model's own predictions of the file's rows (computed
    without dmt-eval's data path)."""
    root, probs, labels = criteo_run
    tsv = write(tmp_path / "eval.tsv.gz", EVAL_ROWS)
    pred = tmp_path / "pred.npz"
    evaluate(root / "run" / "checkpoints", str(tsv), batch_size=32, predictions=pred)
    with np.load(pred) as f:
        np.testing.assert_allclose(f["prob"], probs, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(f["label"], labels.astype(np.int8))


def test_criteo_splits_and_preprocessed_directories(criteo_run, tmp_path) -> None:
    root, _, _ = criteo_run
    trained = json.loads((root / "run" / "metrics.json").read_text())
    ckpt = root / "run" / "checkpoints"
    test = evaluate(ckpt, "test")  # from another working directory: paths follow the training job's
    _assert_matches_trainer(test, trained, "test")
    assert test["rows"] == 45
    assert evaluate(ckpt, str(root / "prep" / "test")) == {
        **test,
        "data": str(root / "prep" / "test"),
    }
    with pytest.raises(
        ValueError, match=r"preprocessed directory with splits \['test', 'train', 'val'\]; name one"
    ):
        evaluate(ckpt, str(root / "prep"))

    # data preprocessed with other vocabularies
    other = tmp_path / "other"
    preprocess_criteo(
        CriteoConfig(
            raw_path=str(root / "train.tsv"),
            preprocessed_dir=str(other),
            frequency_threshold=1,
            num_workers=1,
        ),
        progress=False,
    )
    with pytest.raises(
        ValueError,
        match=r"was preprocessed with other vocabularies than the run's "
        r"training data .*pass the raw TSV instead",
    ):
        evaluate(ckpt, str(other / "val"))
    config = tmp_path / "config.yaml"
    shutil.copy(_last_step(ckpt) / "config.yaml", config)
    OmegaConf.save(
        OmegaConf.merge(
            OmegaConf.load(config), {"data": {"criteo": {"preprocessed_dir": str(other)}}}
        ),
        config,
    )
    # a --config that differs from the checkpoint's own is refused (it was used instead of it)
    with pytest.raises(ValueError) as e:
        evaluate(ckpt, "test", config=config)
    assert str(e.value) == (
        f"--config {str(config)!r} differs from the config checkpoint {_last_step(ckpt)} was "
        f"trained with ({_last_step(ckpt) / 'config.yaml'}) in data.criteo.preprocessed_dir; "
        "the checkpoint's own config is the one that fits its weights: leave --config out (for "
        "data that moved, edit the paths in that file)"
    )
    shutil.copy(_last_step(ckpt) / "config.yaml", tmp_path / "same.yaml")
    assert evaluate(ckpt, "test", config=tmp_path / "same.yaml") == test
    # without a config of its own, the --config given is read, and checked against the weights
    bare = tmp_path / "bare" / "checkpoints"
    shutil.copytree(ckpt, bare)
    for own in bare.glob("step_*/config.yaml"):
        own.unlink()
    with pytest.raises(
        ValueError,
        match=r"does not match the model its config .*config.yaml builds: .*"
        r"table rows come from .*other/manifest.json",
    ):
        evaluate(bare, "test", config=config)


def test_scores_of_the_test_split_of_a_run_with_its_own_test_file_are_its_split(
    criteo_run, tmp_path
) -> None:
    """Reproduced: with ``data.criteo.test_path``, ``dmt-eval --data test`` records data
    ``test (<the file>)``, and :func:`dmt.seeds.scored_predictions_problem` refused those
    predictions of the run's own test split ("records data 'test (...)' (the run's: 'test')").
    They are accepted; the scores of other data with as many rows are still refused."""
    root, _, _ = criteo_run
    test_tsv = write(tmp_path / "test.tsv", EVAL_ROWS)
    prep = root / "prep"
    run = tmp_path / "run"
    data = [f"data.criteo.raw_path={root / 'train.tsv'}", f"data.criteo.preprocessed_dir={prep}"]
    try:
        _fit([*CRITEO, *data, f"data.criteo.test_path={test_tsv}", "trainer.max_steps=3"], run)
    finally:
        close_runtime()

    def score(data: str, split: str) -> None:
        pred, out = run / f"pred_{split}.npz", run / f"eval_{split}.json"
        argv = ["--checkpoint", str(run / "checkpoints"), "--data", data, "--no-progress"]
        assert main([*argv, "--out", str(out), "--predictions", str(pred), "--overwrite"]) == 0

    for split in ("val", "test"):
        score(split, split)
        assert scored_predictions_problem(run, split) is None
    assert json.loads((run / "eval_test.json").read_text())["data"] == f"test ({test_tsv})"
    other = write(tmp_path / "other.tsv", make_rows(len(EVAL_ROWS), seed=5))
    score(str(other), "test")
    pred, report = run / "pred_test.npz", run / "eval_test.json"
    assert scored_predictions_problem(run, "test") == (
        f"{pred} is not run {run}'s scores on its whole test split as it ended: {report} records "
        f"data {str(other)!r} (the run's: 'test'); move {pred} and {report} away to score the run "
        "again"
    )


@pytest.mark.slow  # CI time (dmt-eval 5 times, about 8 s)
def test_scores_of_another_runs_checkpoint_are_not_the_runs_scores(synthetic_run, tmp_path):
    """Reproduced: :func:`dmt.seeds.scored_predictions_problem` took ``dmt-eval`` of another
    run's checkpoint (as many steps, the same rows), written into this run's directory, as this
    run's scores. The checkpoint scored must be in the run's own ``trainer.checkpoint_dir``
    (relative to the run directory or absolute, as the run's record composes it)."""
    own, other = (_copy_run(synthetic_run, tmp_path / name) for name in ("own", "other"))
    pred, report = own / "pred_test.npz", own / "eval_test.json"

    def score(checkpoints: Path) -> str | None:
        argv = ["--checkpoint", str(checkpoints), "--data", "test", "--no-progress"]
        argv += ["--out", str(report), "--predictions", str(pred), "--overwrite"]
        assert main(argv) == 0
        return scored_predictions_problem(own, "test")

    def refusal(checkpoints: Path, expected: Path) -> str:
        return (
            f"{pred} is not run {own}'s scores on its whole test split as it ended: {report} "
            f"records checkpoint {str(checkpoints / 'step_3')!r} (the run's: a step_N in "
            f"{str(expected)!r}); move {pred} and {report} away to score the run again"
        )

    assert score(own / "checkpoints") is None
    assert score(other / "checkpoints") == refusal(other / "checkpoints", own / "checkpoints")
    # a study moved since it was scored: the recorded checkpoint is gone, the run's name stays
    assert score(own / "checkpoints") is None
    moved = tmp_path / "moved" / "own"
    shutil.copytree(own, moved)
    shutil.rmtree(own / "checkpoints")
    assert scored_predictions_problem(moved, "test") is None
    shutil.copytree(moved / "checkpoints", own / "checkpoints")
    # a run whose record puts its checkpoints elsewhere (an absolute trainer.checkpoint_dir)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(own / "checkpoints", elsewhere)
    overrides = [*TINY, f"trainer.checkpoint_dir={elsewhere}"]
    (own / "seed_run.json").write_text(json.dumps({"overrides": overrides}))
    assert score(elsewhere) is None
    assert score(other / "checkpoints") == refusal(other / "checkpoints", elsewhere)


def test_bad_tsv_row_names_file_and_line(criteo_run, tmp_path, capsys) -> None:
    root, _, _ = criteo_run
    rows = make_rows(20, seed=3)
    rows[11] = rows[11].replace("\t", "\tx", 1)  # the first dense field is not a number
    tsv = write(tmp_path / "bad.tsv", rows)
    args = [
        "--checkpoint",
        str(root / "run" / "checkpoints"),
        "--data",
        str(tsv),
        "--no-progress",
        "--out",
        str(tmp_path / "e.json"),
    ]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"dmt-eval: error: {tsv.resolve()}:12: " in err and "I1 is 'x" in err
    assert not (tmp_path / "e.json").exists()
    assert main([*args, "--skip-bad-rows"]) == 0
    written = json.loads((tmp_path / "e.json").read_text())
    assert written["rows"] == 19 and written["bad_rows"] == 1
    assert main([*args[:3], str(tmp_path / "missing.tsv"), "--out", str(tmp_path / "m.json")]) == 1
    assert "--data '" in capsys.readouterr().err


def test_a_file_without_labels_is_refused_naming_it(criteo_run, tmp_path, capsys) -> None:
    """Bug: ``--data`` Kaggle's test.txt (39 fields: no label column) was refused as 'found 39
    tab-separated field(s)', without saying that its labels are missing."""
    root, _, _ = criteo_run
    tsv = write(tmp_path / "test.txt", ["\t".join(r.split("\t")[1:]) for r in EVAL_ROWS])
    beside = sorted(root.iterdir())
    out = tmp_path / "e.json"
    args = ["--checkpoint", str(root / "run" / "checkpoints"), "--data", str(tsv)]
    assert main([*args, "--out", str(out), "--no-progress"]) == 1
    assert (
        f"dmt-eval: error: {tsv.resolve()}:1: found 39 tab-separated field(s); the label column "
        "is missing, as in Criteo's Kaggle test.txt, whose labels Criteo never published"
    ) in capsys.readouterr().err
    assert not out.exists() and sorted(root.iterdir()) == beside  # nothing written beside prep


# -- the Criteo Kaggle sample (../shared/data) ------------------------------------------------


@pytest.mark.criteo
def test_criteo_sample_slice(shared_data: Path, tmp_path: Path) -> None:
    """Train on the first 20k lines of the sample; the raw lines of its test split score exactly
    like the preprocessed split, and unseen later lines score as a model should."""
    with open(shared_data / "criteo-kaggle-sample" / "train.tsv", "rb") as f:
        lines = [f.readline() for _ in range(24_000)]
    (tmp_path / "head.tsv").write_bytes(b"".join(lines[:20_000]))
    (tmp_path / "test_rows.tsv").write_bytes(b"".join(lines[18_500:20_000]))  # the test split
    (tmp_path / "later.tsv").write_bytes(b"".join(lines[20_000:]))
    preprocess_criteo(
        CriteoConfig(
            raw_path=str(tmp_path / "head.tsv"),
            preprocessed_dir=str(tmp_path / "prep"),
            num_workers=1,
        ),
        progress=False,
    )
    try:
        _fit(
            [
                *CRITEO,
                f"data.criteo.raw_path={tmp_path / 'head.tsv'}",
                f"data.criteo.preprocessed_dir={tmp_path / 'prep'}",
                "data.batch_size=256",
                "data.eval_batch_size=4096",
                "model.embedding_dim=16",
                "model.bottom_mlp=[32,16]",
                "model.top_mlp=[64,1]",
                "optim.lr=0.01",
            ],
            tmp_path / "run",
        )
    finally:
        close_runtime()
    ckpt = tmp_path / "run" / "checkpoints"
    trained = json.loads((tmp_path / "run" / "metrics.json").read_text())
    split = evaluate(ckpt, "test")
    raw = evaluate(ckpt, str(tmp_path / "test_rows.tsv"))
    assert split["rows"] == raw["rows"] == 1500
    _assert_matches_trainer(split, trained, "test")
    for k in (*METRICS, "positive_rate"):
        assert raw[k] == split[k], k
    later = evaluate(ckpt, str(tmp_path / "later.tsv"), max_rows=3000)
    assert later["rows"] == 3000
    clicks = [int(line.split(b"\t", 1)[0]) for line in lines[20_000:23_000]]
    assert later["positive_rate"] == pytest.approx(np.mean(clicks))
    assert later["auc"] > 0.6 and math.isfinite(later["ne"]) and later["ne"] < 1.0, later


# -- dmt-export -------------------------------------------------------------------------------


def test_export_writes_the_plain_models_state(synthetic_run: Path, tmp_path: Path, capsys) -> None:
    from dmt.evaluate import load_model, open_checkpoint  # noqa: PLC0415
    from dmt.export import main as export_main  # noqa: PLC0415

    out = tmp_path / "model.pt"
    assert export_main(["--checkpoint", str(synthetic_run / "checkpoints"), "--out", str(out)]) == 0
    exported = torch.load(out, weights_only=True)
    model = load_model(open_checkpoint(synthetic_run / "checkpoints"))
    assert sorted(exported) == sorted(model.state_dict())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(exported[key], value, rtol=0, atol=0, msg=key)
    assert (tmp_path / "model.pt.config.yaml").read_text() == (
        synthetic_run / "checkpoints" / "step_3" / "config.yaml"
    ).read_text()
    # a model built from the sidecar alone takes the file and scores the test rows as trained
    conf = read_config(tmp_path / "model.pt.config.yaml")
    names, sizes, num_dense = run_schema(conf)
    fresh = build_model(conf.model, feature_names=names, cardinalities=sizes, num_dense=num_dense)
    fresh.load_state_dict(exported)  # strict: every key, no other
    fresh.eval()
    scores, labels = [], []
    rows = open_data(open_checkpoint(synthetic_run / "checkpoints"), "test", batch_size=64)
    with torch.no_grad():
        for batch in rows.source.batches(0):
            scores.append(fresh(batch.dense_features, batch.sparse_features).flatten())
            labels.append(batch.labels.flatten())
    trained = json.loads((synthetic_run / "metrics.json").read_text())
    auc = roc_auc_score(torch.cat(labels).numpy(), torch.cat(scores).numpy())
    assert auc == pytest.approx(trained["test_auc"], abs=1e-4)  # the trainer's AUC is binned
    before = out.read_bytes()
    assert export_main(["--checkpoint", str(synthetic_run / "checkpoints"), "--out", str(out)]) == 1
    assert f"dmt-export: error: {out} exists already" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "model.pt.config.yaml"]


def test_a_failed_export_leaves_nothing_and_a_damaged_checkpoint_is_bad_input(
    synthetic_run: Path, tmp_path: Path, capsys
) -> None:
    """Reproduced bugs: an export whose model file failed to write (here: a file-size limit)
    left its config sidecar, and every retry was refused for it; a checkpoint whose data was
    damaged without changing its size ended in DCP's traceback (its CheckpointException is a
    BaseException, past dmt's except Exception)."""
    import resource  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from dmt.export import main as export_main  # noqa: PLC0415

    out = tmp_path / "out" / "model.pt"
    argv = ["--checkpoint", str(synthetic_run / "checkpoints"), "--out", str(out)]
    config = synthetic_run / "checkpoints" / "step_3" / "config.yaml"
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (config.stat().st_size + 1024, limits[1]))
        assert export_main(argv) == 1
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert "File too large" in capsys.readouterr().err
    assert list(out.parent.iterdir()) == []
    assert export_main(argv) == 0 and out.stat().st_size > config.stat().st_size + 1024

    run = _copy_run(synthetic_run, tmp_path / "run")
    data = run / "checkpoints" / "step_3" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[: len(raw) // 2] = bytes(len(raw) // 2)  # same size: meta.json's check passes
    data.write_bytes(bytes(raw))
    assert export_main(["--checkpoint", str(data.parent), "--out", str(tmp_path / "m.pt")]) == 1
    assert f"dmt-export: error: cannot read checkpoint {data.parent}: " in capsys.readouterr().err


def test_export_never_replaces_a_file_that_appears_while_it_works(tmp_path: Path) -> None:
    """The existence check comes before a load that can take minutes: a file that appears
    meanwhile (another export) is kept, and no temporary file is left."""
    from dmt.export import _publish  # noqa: PLC0415

    out = tmp_path / "model.pt"
    out.write_bytes(b"the other export's")
    with pytest.raises(ValueError, match=f"^{out} exists already; dmt-export never replaces"):
        _publish(out, lambda f: f.write(b"ours"))
    assert out.read_bytes() == b"the other export's"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


_EXPORT_KILLED_WHILE_IT_WRITES = """
import os, signal, sys, torch
from dmt.export import main
save = torch.save
def save_then_stop(obj, f):  # kill, timeout or a scheduler, in the middle of the model's write
    f.write(b"the first bytes")
    os.kill(os.getpid(), signal.SIGTERM)
    save(obj, f)
torch.save = save_then_stop
sys.exit(main(sys.argv[1:]))
"""


def test_an_export_killed_while_it_writes_leaves_nothing_and_a_retry_works(
    synthetic_run: Path, tmp_path: Path
) -> None:
    """A reproduced bug: SIGTERM while the model was written (the long part of an export) left
    the config sidecar, published before it, and a hidden partial model file; every retry was
    refused for the sidecar ("model.pt.config.yaml exists already")."""
    from dmt.export import main as export_main  # noqa: PLC0415

    out = tmp_path / "out" / "model.pt"
    argv = ["--checkpoint", str(synthetic_run / "checkpoints"), "--out", str(out)]
    res = subprocess.run(
        [sys.executable, "-c", _EXPORT_KILLED_WHILE_IT_WRITES, *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert sorted(p.name for p in out.parent.iterdir()) == []
    assert res.returncode == 128 + 15, res.stderr[-3000:]
    assert res.stderr.endswith("dmt-export: stopped by SIGTERM\n"), res.stderr[-3000:]
    assert export_main(argv) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.pt", "model.pt.config.yaml"]


def test_an_export_without_its_checkpoint_or_config_is_refused_naming_it(
    synthetic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Reproduced bugs: a checkpoint without its config.yaml was exported without the sidecar
    (exit 0), which the documented way back into Python needs; a step directory that does not
    exist was reported as a save that did not finish."""
    from dmt.export import main as export_main  # noqa: PLC0415

    run = _copy_run(synthetic_run, tmp_path / "run")
    (run / "checkpoints" / "step_3" / "config.yaml").unlink()
    out = tmp_path / "out" / "model.pt"
    assert export_main(["--checkpoint", str(run / "checkpoints"), "--out", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"dmt-export: error: checkpoint {run / 'checkpoints' / 'step_3'} has no config.yaml (the "
        "training config that builds its model, written with every checkpoint); copy the run's "
        "config there (<run>/.hydra/config.yaml)\n"
    )
    assert not out.parent.exists()
    typo = synthetic_run / "checkpoints" / "step_30"
    assert export_main(["--checkpoint", str(typo), "--out", str(out)]) == 1
    assert capsys.readouterr().err == (
        f"dmt-export: error: --checkpoint {str(typo)!r}: no such directory\n"
    )
    assert not out.parent.exists()


def test_an_export_whose_config_does_not_fit_its_weights_is_refused(
    synthetic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A reproduced bug: dmt-export copied a hand-edited ``step_N/config.yaml`` beside the
    weights unchecked (exit 0): a sidecar whose model the export did not load into, or no valid
    config at all. It is refused as dmt-eval refuses it, and nothing is written."""
    from dmt.export import main as export_main  # noqa: PLC0415

    run = _copy_run(synthetic_run, tmp_path / "run")
    step = run / "checkpoints" / "step_3"
    out = tmp_path / "out" / "model.pt"
    argv = ["--checkpoint", str(run / "checkpoints"), "--out", str(out)]
    refused = (
        f"dmt-export: error: checkpoint {step} does not match the model its config "
        f"{step / 'config.yaml'} builds: "
    )
    _edit_config(step, model__embedding_dim=8, model__bottom_mlp=[64, 8])
    assert export_main(argv) == 1
    assert capsys.readouterr().err.startswith(
        refused + "model.embedding_bag_collection.embedding_bags.t_cat_0.weight: checkpoint "
        "(100, 16), config (100, 8); "
    )
    _edit_config(
        step,
        model__embedding_dim=16,
        model__bottom_mlp=[64, 16],
        sptt__enabled=True,
        model__partition__kind="naive",
        model__partition__num_towers=2,
    )
    assert export_main(argv) == 1
    assert capsys.readouterr().err.startswith(
        refused + "26 tensors missing from the checkpoint (e.g. "
        "model.towers.0.embedding_bag_collection.embedding_bags.t_cat_0.weight)"
    )
    _edit_config(step, sptt__enabled=False, model__partition__kind="none", model__embedding_dim=8)
    assert export_main(argv) == 1
    assert capsys.readouterr().err == (
        f"dmt-export: error: {step / 'config.yaml'}: invalid training config: model.interaction: "
        "DotInteraction: the dense vector has size 16 (model.bottom_mlp[-1]) but the sparse "
        "vectors have size 8 (the embedding dim N, or the towers' D); it joins their dot "
        "products: set model.bottom_mlp[-1] to 8\n"
    )
    assert not out.parent.exists()


def test_a_report_is_never_replaced_unless_asked(
    synthetic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "eval.json"
    out.write_text("an earlier report\n")
    argv = ["--checkpoint", str(synthetic_run / "checkpoints"), "--data", "test", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 1
    assert capsys.readouterr().err == (
        f"dmt-eval: error: --out {out} exists already (an earlier run's results); choose another "
        "file, or pass --overwrite to replace it\n"
    )
    assert out.read_text() == "an earlier report\n"
    # not a report dmt could have written (a user's notes): kept even with --overwrite
    assert main([*argv, "--no-progress", "--overwrite"]) == 1
    assert capsys.readouterr().err.startswith(
        f"dmt-eval: error: --out {out} exists and is not a JSON file, as dmt writes there "
        "(JSONDecodeError: "
    )
    assert out.read_text() == "an earlier report\n"
    out.write_text('{"rows": 0}\n')
    assert main([*argv, "--no-progress", "--overwrite"]) == 0
    assert json.loads(out.read_text())["rows"] > 0


def test_a_report_is_never_written_over_the_checkpoint_it_scores(
    synthetic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A reproduced bug: ``--out <step_N>/meta.json --overwrite`` replaced the checkpoint's
    meta.json (a JSON file) with the report: the checkpoint it had just scored was no longer
    complete, and the next dmt-eval scored an earlier step instead."""
    run = _copy_run(synthetic_run, tmp_path / "run")
    meta = run / "checkpoints" / "step_3" / "meta.json"
    before = meta.read_bytes()
    for checkpoint in (run / "checkpoints", meta.parent):
        argv = ["--checkpoint", str(checkpoint), "--data", "test", "--out", str(meta)]
        assert main([*argv, "--no-progress", "--overwrite"]) == 1
        assert capsys.readouterr().err == (
            f"dmt-eval: error: --out {meta} is one of the command's input files; write elsewhere\n"
        )
        assert meta.read_bytes() == before
    assert evaluate(run / "checkpoints", "test")["step"] == 3


def test_a_report_is_never_written_over_the_manifest_of_its_data(
    criteo_run, capsys: pytest.CaptureFixture
) -> None:
    """A reproduced bug: ``--out <preprocessed_dir>/manifest.json --overwrite`` replaced the
    manifest of the data it had just read (a JSON file) with the report: the preprocessed
    directory was no longer readable, neither by dmt-eval nor by training."""
    root, _, _ = criteo_run
    prep = root / "prep"
    manifest = prep / "manifest.json"
    before = manifest.read_bytes()
    try:
        for data in ("test", str(prep / "val")):
            argv = ["--checkpoint", str(root / "run" / "checkpoints"), "--data", data]
            assert main([*argv, "--out", str(manifest), "--no-progress", "--overwrite"]) == 1
            assert capsys.readouterr().err == (
                f"dmt-eval: error: --out {manifest} is the manifest of the preprocessed Criteo "
                f"directory {prep}: not replaced, even with --overwrite; write elsewhere\n"
            )
            assert manifest.read_bytes() == before
    finally:  # the module's run reads it
        manifest.write_bytes(before)
    assert evaluate(root / "run" / "checkpoints", "test")["rows"] == 45


def test_a_report_that_appears_while_scoring_is_kept(
    synthetic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    """The check before scoring does not cover the minutes of scoring: another dmt-eval's
    report written meanwhile was replaced."""
    import dmt.evaluate as ev  # noqa: PLC0415

    out = tmp_path / "eval.json"
    scored = ev.evaluate

    def evaluate_while_another_writes(*args: Any, **kwargs: Any) -> dict[str, Any]:
        report = scored(*args, **kwargs)
        out.write_text('{"other": 1}\n')
        return report

    monkeypatch.setattr(ev, "evaluate", evaluate_while_another_writes)
    argv = ["--checkpoint", str(synthetic_run / "checkpoints"), "--data", "test", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 1
    assert capsys.readouterr().err == (
        f"dmt-eval: error: --out {out}: {out} already exists: not replaced (it appeared while "
        "scoring)\n"
    )
    assert json.loads(out.read_text()) == {"other": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]  # no temporary


def test_predictions_are_the_scored_rows_in_the_datas_order(
    synthetic_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pred, out = tmp_path / "pred.npz", tmp_path / "eval.json"
    argv = ["--checkpoint", str(synthetic_run / "checkpoints"), "--data", "test", "--no-progress"]
    assert main([*argv, "--out", str(out), "--predictions", str(pred)]) == 0
    report = json.loads(out.read_text())
    assert report["predictions"] == str(pred)
    with np.load(pred) as f:
        prob, label = f["prob"], f["label"]
    assert (
        prob.dtype == np.float32 and label.dtype == np.int8 and len(prob) == report["rows"] == 900
    )
    # the file's rows are the ones the report scored: its metrics computed again from the file
    # (the report's in float32 arithmetic)
    assert roc_auc_score(label, prob) == pytest.approx(report["auc"], abs=1e-6)
    assert log_loss(label, prob.astype(np.float64)) == pytest.approx(report["logloss"], rel=1e-5)
    # ... in the split's order: the labels are the test split's, row by row
    ckpt = open_checkpoint(synthetic_run / "checkpoints")
    source = open_data(ckpt, "test", batch_size=256).source
    expected = torch.cat([b.labels for b in source.batches(0)]).numpy()
    np.testing.assert_array_equal(label, expected.astype(np.int8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json", "pred.npz"]  # no temporary
    # an earlier file is refused before any scoring (no report written), kept, then replaced
    pred.write_bytes(b"an earlier file")
    other = tmp_path / "other.json"
    assert main([*argv, "--out", str(other), "--predictions", str(pred)]) == 1
    assert capsys.readouterr().err == (
        f"dmt-eval: error: --predictions {pred} exists already (an earlier run's results); "
        "choose another file, or pass --overwrite to replace it\n"
    )
    assert pred.read_bytes() == b"an earlier file" and not other.exists()
    # not an archive dmt could have written: kept even with --overwrite
    assert main([*argv, "--out", str(other), "--predictions", str(pred), "--overwrite"]) == 1
    assert capsys.readouterr().err.startswith(
        f"dmt-eval: error: --predictions {pred} exists and is not a NumPy .npz archive, as dmt "
        "writes there ("
    )
    assert pred.read_bytes() == b"an earlier file" and not other.exists()
    np.savez(pred, prob=np.zeros(3), label=np.zeros(3))
    assert main([*argv, "--out", str(other), "--predictions", str(pred), "--overwrite"]) == 0
    with np.load(pred) as f:
        np.testing.assert_array_equal(f["prob"], prob)
    assert main([*argv, "--out", str(other), "--predictions", str(other), "--overwrite"]) == 1
    assert capsys.readouterr().err == (
        f"dmt-eval: error: --predictions {other} is the --out report's file; give each its own\n"
    )


def test_an_export_gets_the_mode_a_new_file_gets_under_the_umask(tmp_path: Path) -> None:
    """A reproduced bug: exports were the owner's only (mkstemp's 0600), unreadable to a serving
    user or a colleague on a shared file system."""
    from dmt.export import _publish  # noqa: PLC0415

    previous = os.umask(0o027)
    try:
        _publish(tmp_path / "model.pt", lambda f: f.write(b"weights"))
    finally:
        os.umask(previous)
    assert (tmp_path / "model.pt").stat().st_mode & 0o777 == 0o640
