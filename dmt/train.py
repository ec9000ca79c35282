"""``dmt-train``: the Hydra training app (``python -m dmt.train`` works too).

Examples::

    dmt-train                                  # DLRM on planted synthetic data
    dmt-train model=dcn optim=adam trainer.epochs=2
    dmt-train -m model=dlrm,dcn optim.lr=1e-3,2e-3
    torchrun --nproc-per-node=2 -m dmt.train   # multi-process (gloo on CPU, nccl on GPU)
"""

from __future__ import annotations

import functools
import gc
import hashlib
import logging
import math
import traceback
from pathlib import Path
from typing import Any, cast

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dmt import host_malloc
from dmt.config import Config, register_configs, validate
from dmt.metrics import CLICK_METRICS
from dmt.run_dir import agree_on_run_dir, check_launch_row_wise_rows, claim_run_dir, stale_lock_wait
from dmt.runtime import close_runtime, init_runtime
from dmt.tracking import open_logger
from dmt.trainer import Trainer
from dmt.trials import divergence
from dmt.watchdog import watch_ranks

# by name: under `python -m dmt.train` (torchrun's -m) __name__ is "__main__", outside the "dmt"
# loggers that hydra/job_logging=dmt logs at INFO
log = logging.getLogger("dmt.train")
register_configs()
#: the config groups: package data (dmt/conf/), so an installed dmt finds them from any directory
CONF_MODULE = "dmt.conf"
CONF_PATH = f"pkg://{CONF_MODULE}"

SUMMARY_KEYS = (
    "val_auc",
    "test_auc",
    "test_ne",
    "test_logloss",
    "oracle_test_auc",
    "train_samples_per_s",
)


def compose_config(*overrides: str) -> DictConfig:
    """Compose the root config with Hydra overrides, from Python (tests, notebooks, drivers)."""
    from hydra import compose, initialize_config_module  # noqa: PLC0415

    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def to_config(cfg: DictConfig | Config) -> Config:
    """Typed config from a composed DictConfig (validated)."""
    conf = cfg if isinstance(cfg, Config) else OmegaConf.to_object(cfg)
    assert isinstance(conf, Config)
    validate(conf)
    return conf


def hydra_job() -> str:
    """This Hydra job's name among a multirun's, the same on every rank that runs it: its number
    and a digest of its overrides (ranks running a sweep each choose their points; the digest
    keeps ranks that chose differently from training together)."""
    hydra_cfg = HydraConfig.get()
    num = OmegaConf.select(cast(DictConfig, hydra_cfg.job), "num", default=None)
    digest = hashlib.sha256("\x00".join(hydra_cfg.overrides.task).encode()).hexdigest()[:12]
    return f"job_{num if num is not None else 0}_{digest}"


def _release_model_memory(device: torch.device) -> None:
    """Free the finished job's model now, before the next job of a multirun builds its own.

    TorchRec's sharded modules hold themselves in reference cycles (state-dict hooks that close
    over ``self``), so dropping the trainer frees their tables only at Python's next full
    collection: on a GPU, the next job's tables would be allocated beside the old ones."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _drop_frames(error: BaseException) -> None:
    """Clear the local variables of the frames ``error`` and the errors it chains hold (those
    still running excepted): a Hydra multirun keeps a failed job's exception for the rest of the
    sweep (its ``JobReturn``), and its traceback held the job's trainer, model and tables; on a
    GPU the next jobs built theirs beside them. The traceback still prints, file and line."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


def train(cfg: DictConfig | Config, output_dir: Path | None = None) -> dict[str, float]:
    """Train and evaluate; returns the final metrics (also written to ``metrics.json``).

    The run directory is rank 0's on every rank, locked by rank 0 for the run (with a
    ``trainer.checkpoint_dir`` outside it that the run writes), and refused if it
    holds another run's outputs that this run does not resume (:mod:`dmt.run_dir`); a rank that
    stops answering ends the job after ``trainer.collective_timeout_s`` (:mod:`dmt.watchdog`).
    """
    conf = to_config(cfg)
    if conf.sptt.enabled:  # the launcher's ranks per host, before any process group
        check_launch_row_wise_rows(conf)
    t = conf.trainer
    out = Path(output_dir) if output_dir is not None else Path(HydraConfig.get().runtime.output_dir)
    runtime = init_runtime(
        t.device, timeout_s=t.collective_timeout_s, job=hydra_job() if output_dir is None else "run"
    )
    try:
        if t.reuse_host_memory:  # every rank's own; said once, by rank 0
            host_malloc.reuse_host_memory(announce=runtime.is_main)
        elif host_malloc.applied():
            log.warning(
                "trainer.reuse_host_memory=false, but an earlier run in this process kept freed "
                "host memory for reuse, which lasts as long as the process: this run does too"
            )
        out = agree_on_run_dir(
            out, rank=runtime.rank, world_size=runtime.world_size, from_hydra=output_dir is None
        )
        with (
            claim_run_dir(
                out,
                resume_from=t.resume_from,
                checkpoint_dir=t.checkpoint_dir,
                rank=runtime.rank,
                world_size=runtime.world_size,
                stale_wait_s=stale_lock_wait(t.collective_timeout_s),
                writes_checkpoints=bool(t.checkpoint or t.checkpoint_every),
            ),
            watch_ranks(runtime, timeout_s=t.collective_timeout_s),
        ):
            if runtime.is_main:  # where to look while it runs, or after it failed
                log.info("run directory %s", out)
            config = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(conf)))
            hydra_info = _hydra_info()
            logger = open_logger(
                conf.logger,
                {**config, **hydra_info},
                out,
                is_main=runtime.is_main,
                group=hydra_info.get("hydra", {}).get("sweep_dir"),
                # the other ranks wait for rank 0 in their first collective
                wait_s=t.collective_timeout_s / 2 if runtime.world_size > 1 else None,
            )
            ok = False
            try:
                metrics = Trainer(conf, runtime, out, logger).fit().metrics
                ok = True
            finally:
                # a run that raised (KeyboardInterrupt too) ends as failed; one killed by a
                # signal ends before this (its wandb run has no exit record: "crashed")
                if logger is not None:
                    logger.finish(exit_code=0 if ok else 1)
    except BaseException as error:
        # first the groups: freeing GPU memory waits for the kernels in flight, and the model
        # goes only with the frames that hold it. A cleanup that fails is logged; the job's own
        # error is the one raised
        for cleanup in (
            lambda: close_runtime(failed=True),
            functools.partial(_drop_frames, error),
            lambda: _release_model_memory(runtime.device),
        ):
            try:
                cleanup()
            except Exception:
                log.exception("cleanup after the job's error failed")
        raise
    _release_model_memory(runtime.device)
    close_runtime()
    if runtime.is_main:
        print(
            " ".join(
                f"{k}={metrics[k]:.4f}" if k != "train_samples_per_s" else f"{k}={metrics[k]:.0f}"
                for k in SUMMARY_KEYS
                if k in metrics
            ),
            flush=True,
        )
        print(f"metrics written to {out / 'metrics.json'}", flush=True)
    return metrics


def _hydra_info() -> dict[str, Any]:
    """For the wandb config: the Hydra app's config-group choices (``model: dlrm``), its
    command-line overrides and, in a multirun, the sweep directory (the run's wandb group).
    Empty outside a Hydra app (``train`` called from Python)."""
    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    info: dict[str, Any] = {
        "choices": {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/")},
        "overrides": list(hc.overrides.task),
    }
    if hc.mode == RunMode.MULTIRUN:
        info["sweep_dir"] = str(hc.sweep.dir)
    return {"hydra": info}


#: what every run's metrics.json holds (:meth:`dmt.trainer.Trainer.fit`)
RUN_METRICS = (
    *(f"{split}_{m}" for split in ("val", "test") for m in CLICK_METRICS),
    "train_samples_per_s",
    "num_train_samples",
    "num_steps",
    "train_loss_last",
)
#: on planted synthetic data evaluated whole (``trainer.eval_max_batches <= 0``) too
ORACLE_METRICS = ("oracle_val_auc", "oracle_test_auc")


def run_metric_names(conf: Config) -> list[str]:
    """The metrics a run of ``conf`` writes to ``metrics.json`` (:data:`RUN_METRICS`, and
    :data:`ORACLE_METRICS` on planted synthetic data evaluated whole)."""
    known = list(RUN_METRICS)
    planted = conf.data.kind == "synthetic" and conf.data.synthetic.mode != "random"
    if planted and conf.trainer.eval_max_batches <= 0:  # the true click probabilities
        known += ORACLE_METRICS
    return known


def check_sweep_metric(conf: Config) -> None:
    """Raise ``ValueError`` before a sweep's job trains when ``trainer.optimize_metric`` is not
    a metric its run reports, or a validation metric of data without validation rows (NaN):
    :func:`sweep_value` would say so only after the job, and every other job, had trained."""
    name = conf.trainer.optimize_metric
    known = run_metric_names(conf)
    if name not in known:
        raise ValueError(
            f"trainer.optimize_metric={name!r} is not a metric of this run; choose one of "
            f"{sorted(known)}"
        )
    why = undefined_metric(conf, name)
    if why is not None:
        raise ValueError(
            f"trainer.optimize_metric={name!r}: {why}, so it would be NaN in every job; choose a "
            "metric this data defines, e.g. trainer.optimize_metric=test_auc"
        )


def undefined_metric(conf: Config, name: str) -> str | None:
    """Why ``name``, a metric of :func:`run_metric_names`, is NaN in every run of ``conf``: a
    validation metric of data without validation rows; None when the data defines it."""
    c = conf.data.criteo
    if name.startswith("val_") and conf.data.kind == "criteo" and c is not None:
        # days: validation from val_day or half of eval_day; no raw path: the preprocessed one
        by_day = c.raw_path is None or Path(c.raw_path).is_dir()
        if not c.val_split or (not by_day and c.split_fractions[1] == 0):
            return (
                "this data has no validation rows (data.criteo.split_fractions[1] = 0 or "
                "data.criteo.val_split=false, e.g. data=criteo_sample_holdout)"
            )
    return None


def sweep_value(metrics: dict[str, float], name: str, *, fail_diverged: bool = False) -> float:
    """``metrics[name]``, the number a Hydra sweeper optimizes; a missing or NaN value is a
    ``ValueError`` naming the metric (a sweeper would rank points by nothing), except a value
    from a run that diverged (its last training loss, or its predictions, not finite:
    :func:`dmt.trials.divergence`), NaN or not (a saturated model's AUC of 0.5 is finite while
    its loss is inf): that trial failed, the sweep goes on.
    A diverged trial returns NaN (Hydra's basic sweeper: the trials table says "failed"), or
    with ``fail_diverged`` raises :class:`DivergedTrial` (the Optuna sweeper records a job that
    raised as a failed trial and goes on; the NaN it refuses, and the refusal stopped the sweep)."""
    value = metrics.get(name)
    if value is None:
        raise ValueError(
            f"trainer.optimize_metric={name!r} is not a metric of this run; "
            f"choose one of {sorted(metrics)}"
        )
    evidence = divergence(metrics, name)
    if evidence is not None:
        what = "NaN" if math.isnan(value) else f"{value:.4g}, not a result"
        message = f"trainer.optimize_metric={name!r} is {what}: this run diverged ({evidence})"
        if fail_diverged:
            raise DivergedTrial(
                f"{message}; the sweeper records this trial as failed, and goes on while "
                "hydra.sweeper.max_failure_rate allows (the hparams_search configs set 1.0)"
            )
        log.warning("%s", message)
        return math.nan
    if math.isnan(value):
        raise ValueError(
            f"trainer.optimize_metric={name!r} is NaN in this run (a split without rows, "
            f"e.g. val_* with data=criteo_sample_holdout, or without clicks); choose a metric "
            f"this data defines, e.g. trainer.optimize_metric=test_auc"
        )
    return value


class DivergedTrial(RuntimeError):
    """A sweep's trial whose training diverged (:func:`sweep_value`)."""


@hydra.main(version_base="1.3", config_path=CONF_PATH, config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Trains; in a multirun returns ``trainer.optimize_metric`` to the sweeper (an error if
    that metric is missing or NaN, except NaN from a run that diverged: :func:`sweep_value`)."""
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    conf = to_config(cfg)
    if multirun:
        check_sweep_metric(conf)
    metrics = train(cfg)
    name = conf.trainer.optimize_metric
    if multirun:
        sweeper = str(HydraConfig.get().sweeper.get("_target_", ""))
        return sweep_value(metrics, name, fail_diverged="optuna" in sweeper.lower())
    return metrics.get(name)


if __name__ == "__main__":
    main()
