"""``dmt-eval``: score a training checkpoint on a split, a raw Criteo TSV or a preprocessed split.

Examples::

    dmt-eval --checkpoint outputs/2025-01-01/12-00-00/checkpoints --data test
    dmt-eval --checkpoint outputs/.../checkpoints/step_2000 --data /data/day_24.tsv.gz --out day24.json
    dmt-eval --checkpoint outputs/.../checkpoints --data data_cache/criteo_sample/val --max-rows 5000

Prints AUC, NE, logloss, calibration (mean predicted / observed click rate), the observed click
rate and the number of rows, and writes them as JSON (``--out``, atomically). ``--predictions
FILE.npz`` also writes every row's click probability and label, in the data's order: several
models scored on the same rows can then be compared row by row (``scripts/row_bootstrap.py``).

How a checkpoint is read:

* ``--checkpoint`` is a ``step_N`` directory or its parent (the latest complete step is used).
* The model is rebuilt from the run's resolved config: ``step_N/config.yaml`` (written with every
  checkpoint), else the Hydra run's ``<run>/.hydra/config.yaml`` (checkpoints under
  ``<run>/checkpoints``), else ``--config`` (a ``--config`` that differs from the checkpoint's
  own is refused, naming the keys). Relative paths in it (preprocessed data, partition
  file) are taken relative to the training job's working directory when they exist there.
  A tp run's towers are the ones its checkpoint's config records
  (``model.partition.recorded_towers``, the file's when it trained), with a warning if the file
  holds others by now; a checkpoint of an older dmt, which records none, builds the file's, with
  a warning.
* The weights of every rank are reassembled into the plain (unsharded) model in this one process
  (:func:`dmt.checkpoint.load_model_state`, DCP), so a checkpoint of a ``G``-rank run loads too,
  flat-sharded or SPTT (``sptt=on``: the DMT model with its towers).

What ``--data`` can be:

* ``val``, ``test``, ``train``: the run's own split. Synthetic runs regenerate it from the config;
  Criteo runs read the preprocessed directory (``test`` is ``data.criteo.test_path`` when set,
  as in training).
* a raw Criteo TSV (plain or gzip): mapped through the *training* vocabularies of the run's
  preprocessed directory exactly as ``data.criteo.test_path`` is (unseen values share id 0),
  preprocessed once beside that directory.
* a preprocessed split directory (``dense.npy``, ``sparse.npy``, ``labels.npy``), or a directory
  written by ``dmt-preprocess --vocab-from`` (its ``test`` split); it must come from the run's
  vocabularies.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import nn
from tqdm import tqdm

from dmt import checkpoint, results
from dmt.config import Config, unread_partition_settings, validate
from dmt.data import BatchSource, InMemorySource, sparse_feature_names
from dmt.data.synthetic import SyntheticWorld, cardinalities
from dmt.metrics import click_metrics, click_probabilities
from dmt.models import build_model

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


@dataclass
class RunCheckpoint:
    """A complete checkpoint and the training config it was written with."""

    path: Path  # the step_N directory
    step: int
    world_size: int
    config: Config
    config_path: Path  # where the config was read from
    train_cwd: Path | None  # working directory of the training job, when known


@dataclass
class EvalData:
    """What ``--data`` named: the rows to score and a description for the report."""

    source: BatchSource
    name: str
    info: dict[str, Any] = field(default_factory=dict)  # extra report fields (e.g. bad_rows)


# -- the checkpoint and its config ------------------------------------------------------------


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The ``step_N`` directory ``path`` names: itself, or the latest complete one inside it."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"--checkpoint {str(path)!r}: no such directory")
    if not path.is_dir():
        raise ValueError(
            f"--checkpoint {str(path)!r} is a file; expected a checkpoint directory "
            "(<run>/checkpoints or <run>/checkpoints/step_N)"
        )
    return checkpoint.resolve(path, setting="--checkpoint")


def _config_candidates(step_dir: Path) -> list[Path]:
    return [step_dir / checkpoint.CONFIG_FILE, step_dir.parent.parent / ".hydra" / "config.yaml"]


def read_config(path: Path) -> Config:
    """A typed, validated training config from a YAML file (``config.yaml`` of a checkpoint or a
    Hydra run's ``.hydra/config.yaml``)."""
    try:
        raw = OmegaConf.load(path)
        merged = OmegaConf.merge(OmegaConf.structured(Config), raw)
        conf = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, OSError, ValueError, yaml.YAMLError) as e:
        key = getattr(e, "full_key", None)
        why = str(e).splitlines()[0] + (f" (at {key})" if key else "")
        raise ValueError(f"{path}: not a dmt training config: {why}") from None
    assert isinstance(conf, Config)
    # a run of an older dmt may hold a partition setting its kind ignored (dmt refuses it now):
    # the run trained without it, and so is read
    partition = conf.model.partition
    for name in unread_partition_settings(partition):
        warnings.warn(
            f"{path}: model.partition.{name}={getattr(partition, name)!r} was not read by kind "
            f"{partition.kind!r} when this run trained; reading the run without it",
            stacklevel=2,
        )
        setattr(partition, name, None)
    try:
        validate(conf)
    except ValueError as e:
        raise ValueError(f"{path}: invalid training config: {e}") from None
    return conf


def _train_cwd(meta: dict[str, Any], config_path: Path) -> Path | None:
    """The training job's working directory: from ``meta.json``, else (older checkpoints) from
    the Hydra run's ``.hydra/hydra.yaml``."""
    if meta.get("cwd"):
        return Path(meta["cwd"])
    hydra_yaml = config_path.parent / "hydra.yaml"
    if hydra_yaml.is_file():
        cwd = OmegaConf.select(OmegaConf.load(hydra_yaml), "hydra.runtime.cwd", default=None)
        if isinstance(cwd, str) and cwd:
            return Path(cwd)
    return None


def _rebase(value: str | None, train_cwd: Path | None) -> str | None:
    """A relative path of the training job: under its working directory if it exists there."""
    if value is None or Path(value).is_absolute() or train_cwd is None:
        return value
    there = train_cwd / value
    return str(there) if there.exists() else value


def open_checkpoint(
    path: str | os.PathLike[str], config: str | os.PathLike[str] | None = None
) -> RunCheckpoint:
    """Find the checkpoint ``path`` names and read its training config (``config`` overrides
    where it is looked for)."""
    step_dir = find_checkpoint(path)
    meta = checkpoint.read_meta(step_dir)
    found = [p for p in _config_candidates(step_dir) if p.is_file()]
    conf: Config | None = None
    if config is not None:
        given = Path(config)
        if not given.is_file():
            raise ValueError(f"--config {str(given)!r}: no such file")
        try:  # the run's own config decides; a --config that says otherwise is refused
            conf = read_config(found[0]) if found else None
        except ValueError as e:  # e.g. a key this dmt no longer has: the given one stands in
            warnings.warn(f"{e}; reading --config {str(given)!r} instead", stacklevel=2)
            found = []
        if conf is not None:
            given_conf = read_config(given)
            given_partition = given_conf.model.partition
            if given_partition.kind == "tp" and given_partition.recorded_towers is None:
                # e.g. <run>/.hydra/config.yaml: Hydra's record, made before the file was read
                given_partition.recorded_towers = conf.model.partition.recorded_towers
            differ = _differing_keys(conf, given_conf)
            if differ:
                shown = ", ".join(differ[:8]) + (
                    f" and {len(differ) - 8} more" if differ[8:] else ""
                )
                raise ValueError(
                    f"--config {str(given)!r} differs from the config checkpoint {step_dir} was "
                    f"trained with ({found[0]}) in {shown}; the checkpoint's own config is the "
                    "one that fits its weights: leave --config out (for data that moved, edit "
                    "the paths in that file)"
                )
        config_path = found[0] if found else given
    elif not found:
        looked = " and ".join(str(p) for p in _config_candidates(step_dir))
        raise ValueError(
            f"checkpoint {step_dir} has no training config: looked for {looked}; "
            "pass the run's config with --config <run>/.hydra/config.yaml"
        )
    else:
        config_path = found[0]
    if conf is None:
        conf = read_config(config_path)
    train_cwd = _train_cwd(meta, config_path)
    if conf.data.kind == "criteo":
        assert conf.data.criteo is not None
        conf.data.criteo.preprocessed_dir = (
            _rebase(conf.data.criteo.preprocessed_dir, train_cwd) or ""
        )
        conf.data.criteo.test_path = _rebase(conf.data.criteo.test_path, train_cwd)
    partition = conf.model.partition
    partition.path = _rebase(partition.path, train_cwd)
    if partition.kind == "tp" and partition.recorded_towers is None:
        warnings.warn(
            f"{config_path} does not record the towers of partition file {partition.path!r} "
            "(a checkpoint of an older dmt): the model is built from the file as it is now, which "
            "must hold the towers the run trained with (the same towers in another feature "
            "order would go unnoticed)",
            stacklevel=2,
        )
    return RunCheckpoint(
        step_dir, int(meta["step"]), int(meta["world_size"]), conf, config_path, train_cwd
    )


def _differing_keys(a: Config, b: Config) -> list[str]:
    """The dotted keys whose values differ between two configs."""
    fa, fb = (
        checkpoint.flatten_keys(OmegaConf.to_container(OmegaConf.structured(c))) for c in (a, b)
    )
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, None) != fb.get(k, None))


def run_schema(conf: Config) -> tuple[list[str], list[int], int]:
    """Feature names, table sizes and dense count the run's model was built with."""
    d = conf.data
    if d.kind == "synthetic":
        return (
            sparse_feature_names(d.synthetic.num_sparse),
            cardinalities(d.synthetic),
            d.synthetic.num_dense,
        )
    from dmt.data.criteo_dataset import criteo_schema  # noqa: PLC0415 (optional heavy import)

    return criteo_schema(d)


def load_model(ckpt: RunCheckpoint, device: torch.device | str = "cpu") -> nn.Module:
    """The run's plain model (``forward(dense, sparse) -> logits``) with the checkpoint's weights.

    Raises:
        ValueError: weights that do not fit the model the config builds
            (names and shapes of the differences in the message).
    """
    from dmt.trainer import TrainTask  # noqa: PLC0415 (torchrec's sharding stack, only here)

    conf = ckpt.config
    try:
        names, cards, num_dense = run_schema(conf)
    except ValueError as e:
        raise ValueError(f"cannot rebuild the model of checkpoint {ckpt.path}: {e}") from None
    try:
        model = build_model(
            conf.model,
            feature_names=names,
            cardinalities=cards,
            num_dense=num_dense,
            table_device="meta",
            dense_device="cpu",
        )
    except ValueError as e:  # e.g. the data's ids (re-preprocessed) outgrew the tables
        raise ValueError(f"cannot rebuild the model of checkpoint {ckpt.path}: {e}") from None
    task = TrainTask(model)
    state = checkpoint.load_model_state(ckpt.path)
    _check_state(state, task.state_dict(), ckpt)
    task.load_state_dict(state, strict=True, assign=True)
    return task.model.to(device)


def _check_state(
    state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], ckpt: RunCheckpoint
) -> None:
    problems = [
        f"{k}: checkpoint {tuple(state[k].shape)}, config {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing:
        problems.append(f"{len(missing)} tensors missing from the checkpoint (e.g. {missing[0]})")
    if unexpected:
        problems.append(
            f"{len(unexpected)} tensors the config does not build (e.g. {unexpected[0]})"
        )
    if not problems:
        return
    where = ""
    if ckpt.config.data.kind == "criteo" and ckpt.config.data.criteo is not None:
        where = (
            f"; table rows come from {ckpt.config.data.criteo.preprocessed_dir}/manifest.json "
            "(was the data preprocessed again with other settings?)"
        )
    partition = ckpt.config.model.partition
    if partition.kind == "tp" and partition.recorded_towers is None:
        where += (
            f"; the towers come from partition file {partition.path} (was it replaced since the "
            "run trained?)"
        )
    raise ValueError(
        f"checkpoint {ckpt.path} does not match the model its config {ckpt.config_path} builds: "
        + "; ".join(problems[:5])
        + (f"; ... ({len(problems)} differences)" if len(problems) > 5 else "")
        + where
    )


# -- the data ---------------------------------------------------------------------------------


def synthetic_split(conf: Config, split: str, *, batch_size: int) -> InMemorySource:
    """Split ``split`` of a synthetic run, regenerated from its config (in file order)."""
    s = conf.data.synthetic
    data = SyntheticWorld(s).generate(
        split, {"train": s.num_train, "val": s.num_val, "test": s.num_test}[split]
    )
    return InMemorySource(
        data.dense,
        data.sparse,
        data.labels,
        sparse_feature_names(s.num_sparse),
        batch_size=batch_size,
        true_probs=data.true_probs,
    )


def open_data(
    ckpt: RunCheckpoint,
    data: str,
    *,
    batch_size: int,
    skip_bad_rows: bool | None = None,
    progress: bool = True,
) -> EvalData:
    """The rows ``data`` names (see the module docstring), read in order, ``batch_size`` at a time."""
    conf = ckpt.config
    if conf.data.kind == "synthetic":
        if data in SPLITS:
            return EvalData(synthetic_split(conf, data, batch_size=batch_size), data)
        raise ValueError(
            f"--data {data!r}: checkpoint {ckpt.path} is from a run on synthetic data "
            "(data.kind=synthetic), which has no Criteo vocabularies to map files through; "
            f"use --data {'|'.join(SPLITS)}"
        )
    return _criteo_data(
        ckpt, data, batch_size=batch_size, skip_bad_rows=skip_bad_rows, progress=progress
    )


def _criteo_data(
    ckpt: RunCheckpoint, data: str, *, batch_size: int, skip_bad_rows: bool | None, progress: bool
) -> EvalData:
    from dmt.data.criteo_dataset import CriteoSource, as_criteo_config, read_schema  # noqa: PLC0415
    from dmt.data.criteo_preprocess import (  # noqa: PLC0415
        ARRAY_FILES,
        MANIFEST,
        read_manifest,
        split_dir,
        transform_tsv,
    )

    c = as_criteo_config(ckpt.config.data.criteo)
    root = Path(c.preprocessed_dir)
    try:
        run_manifest = read_manifest(root)
    except ValueError as e:
        raise ValueError(
            f"the training data of checkpoint {ckpt.path} is not readable: {e}"
        ) from None
    names = read_schema(root).feature_names
    skip = c.skip_bad_rows if skip_bad_rows is None else skip_bad_rows

    def source(directory: Path) -> CriteoSource:
        return CriteoSource(
            directory,
            batch_size=batch_size,
            in_memory=c.in_memory,
            prefetch_batches=c.prefetch_batches,
            feature_names=names,
        )

    def from_tsv(tsv: str | Path, name: str) -> EvalData:
        out = transform_tsv(
            root, tsv, skip_bad_rows=skip, num_workers=c.num_workers, progress=progress
        )
        bad = read_manifest(out)["bad_rows"]["total"]
        return EvalData(source(split_dir(out, "test")), name, {"bad_rows": bad} if skip else {})

    if data in SPLITS:
        if data == "test" and c.test_path is not None:
            return from_tsv(c.test_path, f"test ({c.test_path})")
        return EvalData(source(split_dir(root, data)), data)
    path = Path(data)
    if not path.exists():
        raise ValueError(
            f"--data {data!r}: no such file or directory; expected {', '.join(SPLITS)}, a raw "
            "Criteo TSV (plain or .gz) or a preprocessed split directory"
        )
    if path.is_file():
        return from_tsv(path, str(path))
    if (path / MANIFEST).is_file() and not (path / ARRAY_FILES["labels"]).is_file():
        manifest = read_manifest(path)
        if manifest["settings"]["layout"]["kind"] != "transform":
            raise ValueError(
                f"--data {data!r} is a preprocessed directory with splits {sorted(manifest['splits'])}; "
                f"name one of them (e.g. --data {path / 'val'})"
            )
        path = split_dir(path, "test")
    if not (path / ARRAY_FILES["labels"]).is_file():
        raise ValueError(
            f"--data {data!r}: not a preprocessed split directory (no {ARRAY_FILES['labels']}) "
            "and not a raw TSV file"
        )
    _check_vocabularies(path, root, run_manifest)
    return EvalData(source(path), str(path))


def _check_vocabularies(split: Path, root: Path, run_manifest: dict[str, Any]) -> None:
    """A preprocessed split must have the ids of the run's training vocabularies."""
    from dmt.data.criteo_preprocess import MANIFEST, read_manifest  # noqa: PLC0415

    parent = split.parent
    if not (parent / MANIFEST).is_file():
        log.warning(
            "%s has no %s beside it: cannot check that its ids come from the vocabularies of %s",
            split,
            MANIFEST,
            root,
        )
        return
    m = read_manifest(parent)
    settings = m["settings"]
    origin = (
        settings["vocab_from"]["settings_hash"]
        if settings["layout"]["kind"] == "transform"
        else m["settings_hash"]
    )
    if (
        origin != run_manifest["settings_hash"]
        or m["cardinalities"] != run_manifest["cardinalities"]
    ):
        raise ValueError(
            f"--data {str(split)!r} was preprocessed with other vocabularies than the run's training "
            f"data {root} (settings_hash {origin} in {parent / MANIFEST}, expected "
            f"{run_manifest['settings_hash']}); pass the raw TSV instead, it is mapped through the "
            "run's vocabularies"
        )


# -- scoring ----------------------------------------------------------------------------------


@torch.no_grad()
def predict(
    model: nn.Module,
    source: BatchSource,
    *,
    max_rows: int | None = None,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Click probabilities and labels of the first ``max_rows`` rows of ``source`` (all: None)."""
    model.eval()
    probs: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    seen = 0
    batches = source.batches(0)
    bar = tqdm(total=source.num_batches(), desc="eval", disable=not progress, dynamic_ncols=True)
    try:
        for batch in batches:
            if max_rows is not None and seen >= max_rows:
                break
            batch = batch.to(device)
            p = click_probabilities(model(batch.dense_features, batch.sparse_features)).cpu()
            y = batch.labels.cpu()
            if max_rows is not None and seen + len(y) > max_rows:
                p, y = p[: max_rows - seen], y[: max_rows - seen]
            probs.append(p)
            labels.append(y)
            seen += len(y)
            bar.update(1)
    finally:
        bar.close()
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # stops a prefetching thread
    return (torch.cat(probs) if probs else torch.empty(0)), (
        torch.cat(labels) if labels else torch.empty(0)
    )


def metrics_of(probs: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """``auc``, ``ne``, ``logloss``, ``calibration`` (see :func:`dmt.metrics.click_metrics`),
    ``positive_rate`` (observed click rate) and ``rows``."""
    if labels.numel() == 0:
        raise ValueError("no rows to evaluate")
    m = click_metrics(probs, labels)
    return {
        "auc": m["auc"],
        "ne": m["ne"],
        "logloss": m["logloss"],
        "calibration": m["calibration"],
        "positive_rate": float(labels.double().mean()),
        "rows": int(labels.numel()),
    }


def evaluate(
    checkpoint_path: str | os.PathLike[str],
    data: str,
    *,
    batch_size: int | None = None,
    max_rows: int | None = None,
    config: str | os.PathLike[str] | None = None,
    skip_bad_rows: bool | None = None,
    device: str = "cpu",
    progress: bool = False,
    predictions: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Score a checkpoint on ``data``; returns the report ``dmt-eval`` prints and writes.

    Args:
        checkpoint_path: a ``step_N`` directory or its parent (latest complete step).
        data: ``train``/``val``/``test``, a raw Criteo TSV or a preprocessed split directory.
        batch_size: rows per forward pass (default: the run's ``data.eval_batch_size``).
        max_rows: score only the first rows (in file or split order).
        config: the training config, when the checkpoint has none beside it (one that
            differs from the checkpoint's own is refused) or its own no longer reads.
        skip_bad_rows: raw TSV: drop malformed rows (default: the run's ``skip_bad_rows``).
        device: ``cpu`` or ``cuda``.
        progress: progress bars.
        predictions: also write every scored row's click probability and label here, in the
            data's order (:func:`write_predictions`); an existing file is refused unless
            ``overwrite``.

    Returns:
        ``checkpoint``, ``step``, ``data`` and :func:`metrics_of`'s metrics (``bad_rows`` too
        when malformed rows were skipped; ``predictions``, the file, when written).
    """
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1; got {batch_size}")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"--max-rows must be >= 1; got {max_rows}")
    if predictions is not None and (
        error := results.existing_output(predictions, "--predictions", overwrite, kind="npz")
    ):
        raise ValueError(error)
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device {device}: no CUDA device here (torch {torch.__version__}, "
            f"CUDA build: {torch.version.cuda or 'none'}); score with --device cpu"
        )
    ckpt = open_checkpoint(checkpoint_path, config)
    model = load_model(ckpt, device)
    target = open_data(
        ckpt,
        data,
        batch_size=batch_size or ckpt.config.data.eval_batch_size,
        skip_bad_rows=skip_bad_rows,
        progress=progress,
    )
    probs, labels = predict(
        model, target.source, max_rows=max_rows, device=device, progress=progress
    )
    if labels.numel() == 0:
        raise ValueError(f"--data {data!r} has no rows to evaluate")
    report = {
        "checkpoint": str(ckpt.path.resolve()),
        "step": ckpt.step,
        "data": target.name,
        **metrics_of(probs, labels),
        **target.info,
    }
    if predictions is not None:
        path = write_predictions(predictions, probs, labels, replace=overwrite)
        report["predictions"] = str(path)
    return report


def write_predictions(
    path: str | os.PathLike[str],
    probs: torch.Tensor,
    labels: torch.Tensor,
    *,
    replace: bool = False,
) -> Path:
    """Per-row scores as an ``.npz`` (:func:`dmt.results.write_npz`): ``prob`` (float32, the
    click probability) and ``label`` (int8, 0 or 1), one entry per scored row in the data's
    order, so that files of several models on the same rows line up (``scripts/row_bootstrap.py``)."""
    return results.write_npz(
        path,
        {
            "prob": probs.detach().cpu().float().numpy(),
            "label": labels.detach().cpu().round().to(torch.int8).numpy(),
        },
        replace=replace,
    )


# -- output -----------------------------------------------------------------------------------


def format_report(report: dict[str, Any]) -> str:
    """The report as an aligned two-column table."""
    lines = []
    for key, value in report.items():
        if isinstance(value, float):
            text = f"{value:.6f}"
        elif isinstance(value, int):
            text = f"{value:,d}"
        else:
            text = str(value)
        lines.append(f"{key:14s} {text}")
    return "\n".join(lines)


def write_json(
    path: str | os.PathLike[str], report: dict[str, Any], *, replace: bool = True
) -> Path:
    """Write ``report`` atomically (temporary file, then rename); NaN (AUC of a one-class set)
    becomes null. ``replace=False``: ``FileExistsError`` if ``path`` exists by then."""
    return results.write_json(path, report, replace=replace)


def checkpoint_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files of the checkpoint ``path`` names (none where it names none: scoring says why)."""
    try:
        step_dir = find_checkpoint(path)
    except ValueError:
        return []
    return [p for p in step_dir.iterdir() if p.is_file()]


def preprocessed_manifest(path: str | os.PathLike[str]) -> Path | None:
    """The preprocessed Criteo directory whose manifest ``path`` is (the data dmt-eval reads:
    the run's training data, a ``--data`` directory, a transformed file), None where it is no
    such manifest."""
    from dmt.data.criteo_preprocess import MANIFEST, read_manifest  # noqa: PLC0415

    path = Path(path)
    if path.name != MANIFEST:
        return None
    try:
        read_manifest(path.parent)
    except (OSError, ValueError):
        return None
    return path.parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dmt-eval",
        description="Score a dmt checkpoint: AUC, NE, logloss, calibration, click rate, rows.",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="<run>/checkpoints (latest complete step) or <run>/checkpoints/step_N",
    )
    p.add_argument(
        "--data",
        required=True,
        help="train, val or test (the run's split), a raw Criteo TSV (.gz too) or a "
        "preprocessed split directory",
    )
    p.add_argument("--out", default="eval.json", help="JSON report (default: eval.json)")
    p.add_argument(
        "--predictions",
        help="also write each row's click probability and label (.npz: prob, label), in the "
        "data's order",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing --out (and --predictions)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="rows per forward pass (default: the run's data.eval_batch_size)",
    )
    p.add_argument("--max-rows", type=int, help="score only the first N rows")
    p.add_argument(
        "--config", help="training config, if the checkpoint has none (<run>/.hydra/config.yaml)"
    )
    p.add_argument(
        "--skip-bad-rows",
        action="store_true",
        default=None,
        help="raw TSV: drop and count malformed rows (default: the run's setting)",
    )
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where to score (default: cpu)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dmt-eval``; returns the exit status (0 success, 1 bad input, 2 bad usage)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # before scoring; never over a file of the checkpoint it reads (its meta.json is JSON)
    replacing = args.overwrite and os.path.lexists(args.out)
    inputs = checkpoint_files(args.checkpoint) if replacing else []
    if error := results.existing_output(args.out, "--out", args.overwrite, inputs=inputs):
        print(f"dmt-eval: error: {error}", file=sys.stderr)
        return 1
    if replacing and (data := preprocessed_manifest(args.out)) is not None:  # JSON too
        print(
            f"dmt-eval: error: --out {args.out} is the manifest of the preprocessed Criteo "
            f"directory {data}: not replaced, even with --overwrite; write elsewhere",
            file=sys.stderr,
        )
        return 1
    if (
        args.predictions is not None
        and Path(args.predictions).resolve() == Path(args.out).resolve()
    ):
        print(
            f"dmt-eval: error: --predictions {args.predictions} is the --out report's file; give "
            "each its own",
            file=sys.stderr,
        )
        return 1
    try:
        report = evaluate(
            args.checkpoint,
            args.data,
            batch_size=args.batch_size,
            max_rows=args.max_rows,
            config=args.config,
            skip_bad_rows=args.skip_bad_rows,
            device=args.device,
            progress=not args.no_progress,
            predictions=args.predictions,
            overwrite=args.overwrite,
        )
    except ValueError as e:
        print(f"dmt-eval: error: {e}", file=sys.stderr)
        return 1
    print(format_report(report))
    try:  # a report that another process wrote there while this one scored is kept
        print(f"written to {write_json(args.out, report, replace=args.overwrite)}")
    except FileExistsError as e:
        print(
            f"dmt-eval: error: --out {args.out}: {e} (it appeared while scoring)", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
