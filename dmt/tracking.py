"""Experiment tracking with Weights & Biases (rank 0 only).

Metric names are the same during and after a run: ``train/loss``, ``train/lr/<group>``,
``train/lr_factor``, ``train/samples``, ``train/samples_per_s`` at log steps, ``val/<metric>`` at
evaluations, ``test/<metric>`` at the end; the run's summary holds every final value of
``metrics.json`` under those names (:func:`wandb_name`).

Online, one run directory is one wandb run: its id is kept in ``<run dir>/wandb_run_id``, so a
resumed, restarted (torchrun) or requeued (SLURM) run continues it (``resume="allow"``); offline,
each attempt is a run of its own (wandb cannot resume offline runs). The training step is logged
as ``train/step``, every metric's x-axis (``define_metric``), not as wandb's own step, which must
always increase: a run resumed from an earlier checkpoint logs steps again, and wandb would drop
them; a resumed online run that had ended is evaluated again, and its continued wandb run keeps
the one point per split and step it has (the summary takes the new values; an attempt between
them that logged offline, or whose logging stopped, leaves that point in its offline run or
nowhere, and history.jsonl has it). Tracking does not stop training: an online run that cannot
start (no API key, no server) logs offline instead, a run that cannot start at all is skipped,
and a failing wandb service is reported once and logging stops. In a job of several ranks, rank 0
waits for wandb's server at most half of ``trainer.collective_timeout_s`` (wandb's
``init_timeout``, 90 s by default, bounded): the other ranks wait for rank 0 meanwhile.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from dmt.config import LoggerConfig, wandb_mode_env
from dmt.results import write_atomic

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
STEP = "train/step"  # the x-axis of every metric
RUN_ID_FILE = "wandb_run_id"
DEFAULT_PROJECT = "dmt"  # without logger.project and WANDB_PROJECT
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
    (``train/lr``) -> one value per entry (``train/lr/0``, ...), ``None`` (not measured) and
    ``step`` left out (:meth:`WandbLogger.log` adds it as ``train/step``). NaN and inf stay: a
    diverged loss is logged as what it is."""
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


def wandb_project(cfg: LoggerConfig) -> str:
    """``logger.project``, else the environment variable ``WANDB_PROJECT``, else
    :data:`DEFAULT_PROJECT`. wandb takes a project it is given over its variable, so dmt reads
    the variable itself (a default of the config's beat the one a job script set)."""
    if cfg.project is not None:
        return cfg.project
    return os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT


class WandbLogger:
    """Thin wrapper so the trainer only sees ``log(values, step)``, ``summarize(values)``,
    ``finish(exit_code)`` and ``continued`` (wandb's server had the run: an earlier attempt's
    points are in it). Build with :func:`open_logger`."""

    def __init__(
        self,
        cfg: LoggerConfig,
        config: dict[str, Any],
        output_dir: Path,
        group: str | None = None,
        wait_s: float | None = None,
    ) -> None:
        import wandb  # noqa: PLC0415 (slow import, only when logging)

        self._wandb = wandb
        kwargs: dict[str, Any] = dict(
            project=wandb_project(cfg),
            entity=cfg.entity,
            name=cfg.name,
            group=cfg.group or group,
            tags=list(cfg.tags),
            config=config,
            dir=str(output_dir),
            reinit="finish_previous",
        )
        self.run: Any = None
        if cfg.mode == "online":
            try:  # the run directory's run, continued (wandb resumes online runs only)
                _check_credentials(wandb)
                self.run = wandb.init(
                    mode="online",
                    id=_run_id(output_dir),
                    resume="allow",
                    settings=_online_settings(wandb, wait_s),
                    **kwargs,
                )
            except Exception as e:
                _teardown(wandb)
                log.warning(
                    "wandb could not start an online run (%s: %s); logging offline to %s instead "
                    "(upload it later with `wandb sync`)",
                    type(e).__name__,
                    e,
                    output_dir / "wandb",
                )
        if self.run is None:  # offline: a run per attempt (wandb cannot resume offline runs)
            self.run = wandb.init(mode="offline", **kwargs)
        # the server had this run: an earlier attempt's points are in its history already
        self.continued: bool = bool(self.run.resumed)  # never an offline run
        self.run.define_metric(STEP)
        for split in SPLITS:
            self.run.define_metric(f"{split}/*", step_metric=STEP)

    def log(self, values: dict[str, float], step: int) -> None:
        self._call("log", {**values, STEP: step})

    def summarize(self, values: dict[str, float]) -> None:
        """The run's final values (its summary), under the names logged during the run; a
        value that is not finite as its name (``"nan"``, ``"inf"``), which wandb's summary
        keeps (it drops a float NaN: a diverged run's ``train/loss_last`` was missing)."""
        if self.run is not None:
            shown = {
                k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in values.items()
            }
            self._guard("summary", lambda: self.run.summary.update(shown))

    def finish(self, exit_code: int = 0) -> None:
        """End the run; a nonzero ``exit_code`` marks it failed (wandb's default is success)."""
        self._call("finish", exit_code=exit_code)
        self.run = None

    def _call(self, method: str, *args: Any, **kwargs: Any) -> None:
        if self.run is not None:
            self._guard(method, lambda: getattr(self.run, method)(*args, **kwargs))

    def _guard(self, what: str, call: Any) -> None:
        """Run ``call``; an error of wandb's (its service died, its disk is full) is logged once
        and ends the logging, never the training. wandb's process-wide state goes too, so that
        the next job of a multirun in this process starts a service of its own."""
        try:
            call()
        except Exception:
            log.exception("wandb failed (%s); logging to wandb stops, training goes on", what)
            self.run = None
            _teardown(self._wandb)


def _teardown(wandb: Any) -> None:
    try:
        wandb.teardown()
    except (Exception, SystemExit):  # a dead service (wandb exits with its code): nothing to free
        log.debug("wandb.teardown failed", exc_info=True)


def _check_credentials(wandb: Any) -> None:
    """wandb's ``UsageError`` where it has no credentials for its server (``WANDB_API_KEY``,
    ``wandb login``'s netrc, its settings): on a terminal ``wandb.init`` would ask for them and
    wait for an answer (rank 0 of a job for ever, the other ranks until their collective
    timeout), where dmt logs offline. Reads no network and changes nothing."""
    from wandb.sdk.lib import wbauth  # noqa: PLC0415 (with wandb)

    host = wandb.setup().settings.base_url
    if not wbauth.authenticate_session(host=host, source="dmt", prompt=False, update_session=False):
        raise wandb.errors.UsageError(
            f"No API key configured for {host}: log in with `wandb login` or set WANDB_API_KEY"
        )


def _online_settings(wandb: Any, wait_s: float | None) -> Any:
    """wandb's settings of an online run whose start may take at most ``wait_s`` seconds:
    its ``init_timeout`` (``WANDB_INIT_TIMEOUT``, 90 s by default) bounded by ``wait_s``;
    ``None`` (wandb's own) without a bound or within it."""
    if wait_s is None:
        return None
    timeout = float(wandb.setup().settings.init_timeout)
    if timeout <= wait_s:
        return None
    log.info(
        "wandb's init_timeout %g s bounded to %g s (half of trainer.collective_timeout_s: the "
        "other ranks wait for rank 0 while it reaches wandb's server)",
        timeout,
        wait_s,
    )
    return wandb.Settings(init_timeout=wait_s)


def _run_id(output_dir: Path) -> str:
    """The online wandb run of ``output_dir``: its id, read from :data:`RUN_ID_FILE`, or a new
    one written there (rank 0 holds the run directory's lock)."""
    path = output_dir / RUN_ID_FILE
    if path.exists():
        run_id = path.read_text().strip()
        if not run_id:
            raise ValueError(f"{path} is empty: expected the wandb run id this run directory uses")
        log.info("continuing wandb run %s (%s)", run_id, path)
        return run_id
    run_id = secrets.token_hex(6)  # wandb's ids are lowercase letters and digits
    write_atomic(path, lambda tmp: tmp.write_text(run_id + "\n"))
    return run_id


def open_logger(
    cfg: LoggerConfig,
    config: dict[str, Any],
    output_dir: Path,
    *,
    is_main: bool,
    group: str | None = None,
    wait_s: float | None = None,
) -> WandbLogger | None:
    """wandb on rank 0 (``None`` elsewhere or with ``logger.mode=disabled``); ``group`` (a
    Hydra multirun's sweep directory) groups a sweep's points unless ``logger.group`` is set;
    ``wait_s`` bounds the wait for wandb's server of an online run (the other ranks' wait for
    rank 0: :func:`_online_settings`), after which it logs offline.
    A run that cannot start even offline (a full disk, no wandb service) is logged, and the
    training goes on without wandb (``None``); a ``WANDB_MODE`` that wandb does not know is a
    ``ValueError`` (:func:`dmt.config.wandb_mode_env`)."""
    if cfg.mode == "disabled":
        return None
    wandb_mode_env()  # on every rank: one that stopped alone would leave the others waiting
    if not is_main:
        return None
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        return WandbLogger(cfg, config, output_dir, group, wait_s)
    except Exception:
        log.exception("wandb could not start a run; training goes on without wandb")
        if "wandb" in sys.modules:  # not when importing wandb itself failed
            _teardown(sys.modules["wandb"])
        return None
