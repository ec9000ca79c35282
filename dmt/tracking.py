"""Experiment tracking with Weights & Biases (rank 0 only).

Metric names are the same during and after a run: ``train/loss``, ``train/lr/<group>``,
``train/lr_factor``, ``train/samples``, ``train/samples_per_s`` at log steps, ``val/<metric>`` at
evaluations, ``test/<metric>`` at the end; the run's summary holds every final value of
``metrics.json`` under those names (:func:`wandb_name`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from dmt.config import LoggerConfig, WandbMode

SPLITS = ("train", "val", "test")
OTHER_NAMES = {"num_train_samples": "train/num_samples", "num_steps": "train/num_steps"}


def wandb_name(key: str) -> str:
    """The wandb name of a ``metrics.json`` key: ``val_auc`` -> ``val/auc``,
    ``oracle_test_auc`` -> ``test/oracle_auc``, ``train_samples_per_s`` ->
    ``train/samples_per_s``, ``num_steps`` -> ``train/num_steps``."""
    for split in SPLITS:
        if key.startswith(f"{split}_"):
            return f"{split}/{key[len(split) + 1 :]}"
        if key.startswith(f"oracle_{split}_"):
            return f"{split}/oracle_{key[len(split) + 8 :]}"
    return OTHER_NAMES.get(key, key)


def wandb_values(record: dict[str, Any]) -> dict[str, float]:
    """A ``history.jsonl`` record as wandb values: ``samples`` -> ``train/samples``, a list
    (``train/lr``) -> one value per entry (``train/lr/0``, ...), ``None`` and ``step`` left out
    (the step goes to ``log(step=)``)."""
    values: dict[str, float] = {}
    for key, value in record.items():
        if key == "step" or value is None:
            continue
        if key == "samples":
            values["train/samples"] = value
        elif isinstance(value, list):
            values.update({f"{key}/{i}": v for i, v in enumerate(value) if v is not None})
        else:
            values[key] = value
    return values


class WandbLogger:
    """Thin wrapper so the trainer only sees ``log(values, step)``, ``summarize(values)`` and
    ``finish()``."""

    def __init__(
        self, cfg: LoggerConfig, config: dict[str, Any], output_dir: Path, group: str | None = None
    ) -> None:
        import wandb  # noqa: PLC0415 (slow import, only when logging)

        self._wandb = wandb
        self.run = wandb.init(
            mode=cast(WandbMode, cfg.mode),
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.name,
            group=cfg.group or group,
            tags=list(cfg.tags),
            config=config,
            dir=str(output_dir),
            reinit="finish_previous",
        )

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def summarize(self, values: dict[str, float]) -> None:
        """The run's final values (its summary), under the names logged during the run."""
        self.run.summary.update(values)

    def finish(self) -> None:
        self.run.finish()


def open_logger(
    cfg: LoggerConfig,
    config: dict[str, Any],
    output_dir: Path,
    *,
    is_main: bool,
    group: str | None = None,
) -> WandbLogger | None:
    """wandb on rank 0 (``None`` elsewhere or with ``logger.mode=disabled``); ``group`` (a
    Hydra multirun's sweep directory) groups a sweep's points unless ``logger.group`` is set."""
    if cfg.mode == "disabled" or not is_main:
        return None
    output_dir.mkdir(parents=True, exist_ok=True)
    return WandbLogger(cfg, config, output_dir, group)
