"""Experiment tracking with Weights & Biases (rank 0 only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from dmt.config import LoggerConfig, WandbMode


class WandbLogger:
    """Thin wrapper so the trainer only sees ``log(values, step)`` and ``finish()``."""

    def __init__(self, cfg: LoggerConfig, config: dict[str, Any], output_dir: Path) -> None:
        import wandb  # noqa: PLC0415 (slow import, only when logging)

        self._wandb = wandb
        self.run = wandb.init(
            mode=cast(WandbMode, cfg.mode), project=cfg.project, entity=cfg.entity, name=cfg.name,
            tags=list(cfg.tags), config=config, dir=str(output_dir), reinit="finish_previous",
        )

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def finish(self) -> None:
        self.run.finish()


def open_logger(cfg: LoggerConfig, config: dict[str, Any], output_dir: Path, *, is_main: bool) -> WandbLogger | None:
    if cfg.mode == "disabled" or not is_main:
        return None
    output_dir.mkdir(parents=True, exist_ok=True)
    return WandbLogger(cfg, config, output_dir)
