"""``dmt-train``: the Hydra training app (``python -m dmt.train`` works too).

Examples::

    dmt-train                                  # DLRM on planted synthetic data
    dmt-train model=dcn optim=adam trainer.epochs=2
    dmt-train -m model=dlrm,dcn optim.lr=1e-3,2e-3
    torchrun --nproc-per-node=2 -m dmt.train   # multi-process (gloo on CPU, nccl on GPU)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dmt.config import Config, register_configs, validate
from dmt.run_dir import agree_on_run_dir, claim_run_dir
from dmt.runtime import close_runtime, init_runtime
from dmt.tracking import open_logger
from dmt.trainer import Trainer
from dmt.watchdog import watch_ranks

log = logging.getLogger(__name__)
register_configs()
# conf/ sits beside the package (editable install); an absolute path keeps Hydra on the file system.
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")

SUMMARY_KEYS = ("val_auc", "test_auc", "test_ne", "test_logloss", "oracle_test_auc", "train_samples_per_s")


def compose_config(*overrides: str) -> DictConfig:
    """Compose the root config with Hydra overrides, from Python (tests, notebooks, drivers)."""
    from hydra import compose, initialize_config_dir  # noqa: PLC0415

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def to_config(cfg: DictConfig | Config) -> Config:
    """Typed config from a composed DictConfig (validated)."""
    conf = cfg if isinstance(cfg, Config) else OmegaConf.to_object(cfg)
    assert isinstance(conf, Config)
    validate(conf)
    return conf


def train(cfg: DictConfig | Config, output_dir: Path | None = None) -> dict[str, float]:
    """Train and evaluate; returns the final metrics (also written to ``metrics.json``).

    The run directory is rank 0's on every rank, locked by rank 0 for the run, and refused if it
    holds another run's outputs that this run does not resume (:mod:`dmt.run_dir`); a rank that
    stops answering ends the job after ``trainer.collective_timeout_s`` (:mod:`dmt.watchdog`).
    """
    conf = to_config(cfg)
    t = conf.trainer
    out = Path(output_dir) if output_dir is not None else Path(HydraConfig.get().runtime.output_dir)
    runtime = init_runtime(t.device, timeout_s=t.collective_timeout_s)
    try:
        out = agree_on_run_dir(out, rank=runtime.rank, world_size=runtime.world_size,
                               from_hydra=output_dir is None)
        with (
            claim_run_dir(out, resume_from=t.resume_from, checkpoint_dir=t.checkpoint_dir,
                          rank=runtime.rank, world_size=runtime.world_size),
            watch_ranks(runtime, timeout_s=t.collective_timeout_s),
        ):
            config = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(conf)))
            logger = open_logger(conf.logger, config, out, is_main=runtime.is_main)
            try:
                metrics = Trainer(conf, runtime, out, logger).fit().metrics
            finally:
                if logger is not None:
                    logger.finish()
    finally:
        close_runtime()
    if runtime.is_main:
        print(" ".join(f"{k}={metrics[k]:.4f}" if k != "train_samples_per_s" else f"{k}={metrics[k]:.0f}"
                       for k in SUMMARY_KEYS if k in metrics), flush=True)
        print(f"metrics written to {out / 'metrics.json'}", flush=True)
    return metrics


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> float:
    metrics = train(cfg)
    return metrics[to_config(cfg).trainer.optimize_metric]


if __name__ == "__main__":
    main()
