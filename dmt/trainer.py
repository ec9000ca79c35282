"""The training loop: build data and model, shard with TorchRec, train, evaluate, checkpoint."""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.train_pipeline import (
    EvalPipelineSparseDist,
    TrainPipelineBase,
    TrainPipelineSparseDist,
)
from torchrec.optim.optimizers import in_backward_optimizer_filter
from tqdm import tqdm

from dmt import checkpoint, results
from dmt.config import Config, config_yaml, ignored_settings, use_pipeline
from dmt.data import BatchSource, DataBundle, build_data, closing_batches, pad_empty_batch
from dmt.ema import DenseEMA
from dmt.history import RunHistory
from dmt.metrics import StreamingClickMetrics, click_probabilities
from dmt.models import DMTModel, build_model, embedding_parameters
from dmt.models.rec_model import RecModel
from dmt.optim import (
    apply_sparse_optimizer,
    build_lr_scheduler,
    build_optimizer,
    check_sparse_optimizer,
    restore_lr_scheduler,
    schedule_beyond_run,
)
from dmt.runtime import Runtime
from dmt.sharding import job_gpus, memory_budget, shard_model, write_sharding_plan
from dmt.sptt.dmt_sharding import ShardedDMT, shard_dmt, topology_from
from dmt.tracking import wandb_name, wandb_values

log = logging.getLogger(__name__)

#: ``train_loss_last`` is the mean loss of an attempt's last this many steps (of an attempt that
#: trains nothing, its checkpoint's saving attempt's: :meth:`Trainer._earlier_training`)
LAST_STEPS = 50


class TrainTask(nn.Module):
    """Model plus loss: ``forward(batch) -> (loss, logits)`` (the module TorchRec shards)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(batch.dense_features, batch.sparse_features)
        return self.loss_fn(logits, batch.labels), logits


@dataclass
class TrainResult:
    metrics: dict[str, float]
    # training loss of every step run here with fit(keep_losses=True), else of the last
    # LAST_STEPS only (train_loss_last's): a long run holds no float per step
    losses: list[float] = field(default_factory=list)


class Trainer:
    """Reads top to bottom: ``fit()`` = setup, loop over steps, final evaluation."""

    def __init__(self, cfg: Config, runtime: Runtime, output_dir: Path, logger: Any = None) -> None:
        self.cfg = cfg
        self.rt = runtime
        self.output_dir = Path(output_dir)
        self.logger = logger
        check_sparse_optimizer(cfg.optim, runtime.device.type)
        torch.manual_seed(cfg.trainer.seed)
        np.random.seed(cfg.trainer.seed)
        self.data: DataBundle = build_data(
            cfg.data, rank=runtime.rank, world_size=runtime.world_size, seed=cfg.trainer.seed
        )
        plain = build_model(
            cfg.model,
            feature_names=self.data.feature_names,
            cardinalities=self.data.cardinalities,
            num_dense=self.data.num_dense,
            table_device="meta",
            dense_device=runtime.device,
        )
        if cfg.model.partition.kind == "tp" and isinstance(plain, DMTModel):
            # the file's towers, in every checkpoint's config.yaml: its readers build these, and
            # a resume is refused where the file holds others by then
            partition = replace(cfg.model.partition, recorded_towers=plain.partition)
            self.cfg = cfg = replace(cfg, model=replace(cfg.model, partition=partition))
        memory = memory_budget(cfg.sharding, runtime.device.type, gpus=job_gpus(runtime))
        # before sharding: a flat resume plans its tables into the checkpoint's column blocks
        self.resume_from, column_blocks = self._find_resume(flat=not cfg.sptt.enabled)
        if cfg.sptt.enabled:
            topology = topology_from(
                runtime,
                hosts_per_tower=cfg.sptt.hosts_per_tower,
                local_world_size=cfg.sptt.local_world_size,
            )
            self.model, self.optimizer = shard_dmt(
                TrainTask(plain),
                runtime,
                topology=topology,
                optim_cfg=cfg.optim,
                sharding_type=cfg.sptt.sharding_type,
                init_seed=cfg.trainer.seed,
                peer_permute=cfg.sptt.peer_permute,
                comm_precision=cfg.sptt.comm_precision,
                memory=memory,
                even_batches=True,  # the training sources split whole global batches evenly
                timeout=timedelta(seconds=cfg.trainer.collective_timeout_s),
            )
        else:
            apply_sparse_optimizer(embedding_parameters(plain), cfg.optim)
            self.model = shard_model(
                TrainTask(plain),
                runtime,
                batch_size=cfg.data.batch_size,
                memory=memory,
                comm_precision=cfg.sptt.comm_precision,
                column_blocks=column_blocks,
            )
            self.optimizer = build_optimizer(self.model, cfg.optim)
        # the weights are made: from here on each rank draws its own dropout masks
        seed_rank_stream(cfg.trainer.seed, rank=runtime.rank, world_size=runtime.world_size)
        write_sharding_plan(self.model, self.output_dir, rank=runtime.rank, memory=memory)
        pipelined = use_pipeline(cfg.trainer, runtime.world_size)
        if cfg.trainer.pipeline and not pipelined and runtime.is_main:
            log.info(
                "trainer.pipeline: a world of one has no input distribution to overlap; "
                "training with the plain loop (trainer.pipeline_world_of_one=true pipelines "
                "it anyway)"
            )
        if cfg.trainer.pipeline_world_of_one and not cfg.trainer.pipeline and runtime.is_main:
            log.warning(
                "trainer.pipeline_world_of_one=true has no effect with trainer.pipeline=false: "
                "the plain loop trains at every world size"
            )
        self.pipeline = (
            build_pipeline(self.model, self.optimizer, runtime.device) if pipelined else None
        )
        self.eval_pipeline = (
            build_eval_pipeline(self.model, self.optimizer, runtime.device) if pipelined else None
        )
        per_epoch = self.data.train.num_batches()
        self.total_steps = per_epoch * cfg.trainer.epochs
        if cfg.trainer.max_steps > 0:
            self.total_steps = min(self.total_steps, cfg.trainer.max_steps)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, cfg.optim, self.total_steps)
        if runtime.is_main:
            for problem in [
                *schedule_beyond_run(cfg.optim, self.total_steps),
                *ignored_settings(
                    cfg,
                    world_size=runtime.world_size,
                    total_steps=self.total_steps,
                    device=runtime.device.type,
                ),
            ]:
                log.warning(problem)
        # trainer.ema_decay: evaluation reads an average of the dense weights (dmt/ema.py)
        self.ema = (
            DenseEMA(dense_parameters(self.model), cfg.trainer.ema_decay)
            if cfg.trainer.ema_decay is not None
            else None
        )
        self.step_lrs: list[
            float | torch.Tensor
        ] = []  # each param group's LR in the last step's update
        self.step = 0
        self.history: RunHistory | None = None  # rank 0's history.jsonl and curves.png (fit)
        t = cfg.trainer
        self.checkpointer: checkpoint.Checkpointer | None = None
        self._skipped_a_save = False  # a checkpoint of a diverged state (save_unless_diverged)
        if t.checkpoint or t.checkpoint_every:
            self.checkpointer = checkpoint.Checkpointer(
                self.checkpoint_root(),
                rank=runtime.rank,
                world_size=runtime.world_size,
                async_save=t.checkpoint_async,
                timeout=timedelta(seconds=t.collective_timeout_s),
                keep=t.checkpoint_keep,
                run_dir=self.output_dir,
            )
        elif runtime.is_main:
            for unread in ("checkpoint_async", "checkpoint_keep"):
                if getattr(t, unread):
                    log.warning(
                        "trainer.%s=%s has no effect: this run writes no checkpoints "
                        "(trainer.checkpoint=true writes one at the end, "
                        "trainer.checkpoint_every=N every N steps)",
                        unread,
                        str(getattr(t, unread)).lower(),
                    )

    # -- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, source: BatchSource) -> dict[str, float]:
        """Metrics of :class:`StreamingClickMetrics` over every rank's share of ``source``: each
        rank keeps running sums, then one ``all_reduce`` adds them (no prediction leaves a rank).
        With ``trainer.ema_decay`` the dense weights are their moving average meanwhile. The
        fused sparse optimizer's step count stays as it was
        (:func:`~dmt.checkpoint.fused_optimizer_step_kept`: FBGEMM's Adam counts evaluation's
        forwards too), so training does not depend on how often it is evaluated."""
        self.model.eval()
        acc = StreamingClickMetrics(device=self.rt.device)
        cap = self.cfg.trainer.eval_max_batches
        with (
            closing_batches(source.batches(0)) as stream,
            self.ema.applied() if self.ema is not None else contextlib.nullcontext(),
            checkpoint.fused_optimizer_step_kept(self.model),
        ):
            batches = itertools.islice(stream, cap if cap > 0 else None)
            # closed before the stream, also when this loop raises (a KeyboardInterrupt): its
            # pipeline's reading thread stops first
            with contextlib.closing(self._eval_steps(batches)) as steps:
                for logits, labels in steps:
                    acc.update(click_probabilities(logits), labels)
        self.model.train()
        return acc.sync().compute()

    def _eval_steps(
        self, batches: Iterator[Batch]
    ) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
        """``(logits, labels)`` of every batch on the device. Pipelined (flat models, when
        :func:`~dmt.config.use_pipeline`): TorchRec's ``EvalPipelineSparseDist`` starts batch ``i+1``'s input
        all-to-all during batch ``i``'s forward and is detached at the end, so training can
        attach its own pipeline again. A rank without rows in a batch (the last global batch
        smaller than the world) runs the model on one padding row
        (:func:`~dmt.data.source.pad_empty_batch`) and yields no prediction of it."""
        pin = self.rt.device.type == "cuda"  # page-locked batches: their copies run asynchronously
        if pin:
            batches = (batch.pin_memory() for batch in batches)
        if self.eval_pipeline is None:
            for batch in batches:
                rows = batch.labels.numel()
                batch = pad_empty_batch(batch).to(self.rt.device, non_blocking=pin)
                _, logits = self.model(batch)
                yield logits[:rows], batch.labels[:rows]
            return
        labels: collections.deque[torch.Tensor] = collections.deque()  # in the pipeline's order
        # TorchRec's loading thread reads ``batches`` ahead, and its pipeline's reset does not
        # wait for it: each read holds ``reading``, and none starts once the pipeline has ended,
        # so that the caller can close the batches then (closing a generator being read fails,
        # "generator already executing", and that error replaced the one that ended evaluation)
        reading, ended = threading.Lock(), threading.Event()

        def feed() -> Iterator[Batch]:
            while True:
                with reading:
                    batch = None if ended.is_set() else next(batches, None)
                if batch is None:
                    return
                labels.append(batch.labels)
                yield pad_empty_batch(batch)

        pipeline, fed = self.eval_pipeline, feed()
        pipeline.attach(self.model)
        try:
            while True:
                try:
                    logits = pipeline.progress(fed)
                except StopIteration:
                    return
                labels_of = labels.popleft().to(self.rt.device, non_blocking=pin)
                yield logits[: labels_of.numel()], labels_of
        finally:
            with reading:  # a read in flight ends first; none starts after
                ended.set()
            pipeline.reset()
            pipeline.detach()

    def oracle_auc(self, source: BatchSource) -> float | None:
        """AUC of the true click probabilities on the samples ``evaluate`` scores (synthetic)."""
        local = getattr(source, "local_true_probs", lambda: None)()
        if local is None or self.cfg.trainer.eval_max_batches > 0:
            return None
        labels = np.concatenate([b.labels.numpy() for b in source.batches(0)])
        acc = StreamingClickMetrics(device=self.rt.device)
        acc.update(torch.from_numpy(local), torch.from_numpy(labels))
        return acc.sync().compute()["auc"]

    # -- training -----------------------------------------------------------------------------
    def train_step(self, batch: Batch) -> torch.Tensor:
        """One step of the plain loop (``trainer.pipeline=false``, or a world of one); returns the loss on the
        device (no host sync)."""
        self.optimizer.zero_grad()  # also pushes the LR into the fused embedding kernels
        loss, _ = self.model(batch.to(self.rt.device, non_blocking=True))
        loss.backward()  # the fused sparse optimizer updates the tables here
        self.optimizer.step()
        self._after_step()
        return loss.detach()

    def _after_step(self) -> None:
        """After each optimizer step: the LR of the next step, the step count, the EMA."""
        self.step_lrs = self.lr_scheduler.get_last_lr()
        self.lr_scheduler.step()
        self.step += 1
        if self.ema is not None:
            self.ema.update()

    def run_steps(self, batches: Iterator[Batch]) -> Iterator[torch.Tensor]:
        """Train on ``batches``, yielding each step's loss (on the device). Pipelined
        (:func:`~dmt.config.use_pipeline`): the pipeline copies batch i+1 and starts its input distribution
        while batch i trains; it is drained when ``batches`` ends, so evaluation and checkpoints
        happen between whole segments, exactly as in the plain loop."""
        if self.pipeline is None:
            for batch in batches:
                yield self.train_step(batch)
            return
        while True:
            try:
                loss = self.pipeline.progress(batches)  # zero_grad pushes the LR, as above
            except StopIteration:
                # drained: the next segment refills; detached, the model runs as a plain
                # module (evaluation) until the next progress() attaches it again
                self.pipeline.reset()
                if isinstance(self.pipeline, TrainPipelineSparseDist):
                    self.pipeline.detach()
                return
            self._after_step()  # progress() has run the optimizer step
            yield loss

    def _segment_end(self, epoch_end: int) -> int:
        """The step the current segment runs to: the next evaluation, checkpoint, end of
        epoch or end of training."""
        t = self.cfg.trainer
        ends = [self.total_steps, epoch_end]
        for every in (t.eval_every, t.checkpoint_every):
            if every:
                ends.append((self.step // every + 1) * every)
        return min(ends)

    def fit(self, *, keep_losses: bool = False) -> TrainResult:
        """Train, evaluate and write ``metrics.json``; ``keep_losses``: the result holds every
        step's loss (tests comparing runs step by step), not only the last ``LAST_STEPS``'."""
        t = self.cfg.trainer
        start_epoch = 0
        resume = self.resume_from  # its config checked (_find_resume)
        if resume is not None:
            meta = checkpoint.load(
                resume,
                self.model,
                self.optimizer,
                rank=self.rt.rank,
                partial_optimizer=t.resume_allow_config_change,
                ema=self.ema,
            )
            self.step = int(meta["step"])
            checkpoint.check_ends_after(self.step, self.total_steps, resume, t)
            restore_lr_scheduler(self.lr_scheduler, meta.get("lr_scheduler"), self.step)
            start_epoch = int(
                meta["epoch"]
            )  # the data position is the step (batch_in_epoch agrees)
            if self.rt.is_main:
                log.info(
                    "resumed from %s at step %d (saved by %d ranks, now %d)",
                    resume,
                    self.step,
                    meta["world_size"],
                    self.rt.world_size,
                )

        start_step = self.step
        self.history = (
            RunHistory(self.output_dir, batch_size=self.cfg.data.batch_size, start_step=self.step)
            if self.rt.is_main
            else None
        )
        val_step = -1  # the step of the last validation
        per_epoch = self.data.train.num_batches()
        # the losses since the last log step, on the device: read back there, one copy for all
        # (a device tensor per step for the whole run would hold a GPU block per step)
        pending: list[torch.Tensor] = []
        loss_values: collections.deque[float] = collections.deque(
            maxlen=None if keep_losses else LAST_STEPS
        )
        diverged = False  # a training loss was not finite (said once, by rank 0)

        def read_back() -> None:
            """The pending steps' losses of the global batch: every rank's is the mean over its
            equal share (training batches are whole), so their mean is the batch's, whatever
            the world size (one all-gather per log step; every rank reads back at the same
            steps). This attempt's first loss that is not finite is a warning (rank 0's)
            naming its step (a resumed run warns again, at its first such step)."""
            nonlocal diverged
            losses = torch.stack(pending).float()
            if self.rt.world_size > 1:
                losses = mean_over_ranks(losses, self.rt.world_size)
            values = losses.cpu().tolist()
            loss_values.extend(values)
            if not diverged and self.rt.is_main:
                first = self.step - len(values) + 1  # the step of values[0]
                bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
                if bad is not None:
                    diverged = True
                    log.warning(
                        "training diverged: train/loss is %s at step %d (not finite; "
                        "history.jsonl writes it as null); a lower learning rate "
                        "(optim.lr, optim.sparse_lr) may help",
                        values[bad],
                        first + bad,
                    )
            pending.clear()

        def training_figures() -> dict[str, float]:
            """This attempt's ``train_samples_per_s`` (NaN: it trained nothing) and
            ``train_loss_last`` so far: what ``metrics.json`` holds at its end, and each of its
            checkpoints for an attempt that resumes one and trains nothing."""
            if pending:
                read_back()
            samples = (self.step - start_step) * self.cfg.data.batch_size  # global batches
            last = list(loss_values)[-LAST_STEPS:]  # fewer steps after a resume
            return {
                "train_samples_per_s": (
                    samples / train_time if samples > 0 and train_time > 0 else float("nan")
                ),
                "train_loss_last": float(np.mean(last)) if last else float("nan"),
            }

        metrics: dict[str, float] = {}
        train_time = 0.0
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            disable=not (t.progress_bar and self.rt.is_main),
            desc="train",
            dynamic_ncols=True,
        )
        for epoch in range(start_epoch, t.epochs):
            if self.step >= self.total_steps:
                break
            epoch_end = (epoch + 1) * per_epoch
            while self.step < min(epoch_end, self.total_steps):
                end = self._segment_end(epoch_end)
                first = self.step - epoch * per_epoch
                stream = self.data.train.batches(epoch, first)
                batches: Iterator[Batch] = itertools.islice(stream, end - self.step)
                if self.rt.device.type == "cuda":  # page-locked: the copies run asynchronously
                    batches = (batch.pin_memory() for batch in batches)
                tick = time.perf_counter()
                with closing_batches(stream):  # a step that raises stops its prefetching too
                    for loss in self.run_steps(batches):
                        pending.append(loss)
                        bar.update(1)
                        if self.step % t.log_every == 0:  # the only host sync of training steps
                            read_back()
                            if self.checkpointer is not None:  # an async save written by now is
                                self.checkpointer.poll()  # marked complete: restarts resume from it
                            value = loss_values[-1]
                            bar.set_postfix(loss=f"{value:.4f}")
                            self._log_train(value, train_time + time.perf_counter() - tick)
                if self.rt.device.type == "cuda":  # the segment's queued kernels count too
                    torch.cuda.synchronize(self.rt.device)
                train_time += time.perf_counter() - tick
                if t.eval_every and self.step % t.eval_every == 0:
                    val, val_step = self.evaluate(self.data.val), self.step
                    self._log_eval(val, "val")
                if t.checkpoint_every and self.step % t.checkpoint_every == 0:
                    self.save_unless_diverged(
                        epoch, self.step - epoch * per_epoch, training_figures()
                    )
        bar.close()
        last_epoch, last_batch = divmod(self.step, per_epoch)
        if t.checkpoint and not (t.checkpoint_every and self.step % t.checkpoint_every == 0):
            if self.step > start_step:  # nothing new to save after resuming a finished run
                self.save_unless_diverged(last_epoch, last_batch, training_figures())
        if self.checkpointer is not None:
            self.checkpointer.close()

        if val_step != self.step:  # not evaluated since the last step
            val = self.evaluate(self.data.val)
            self._log_eval(val, "val")
        test = self.evaluate(self.data.test)
        self._log_eval(test, "test")
        metrics.update({f"val_{k}": v for k, v in val.items()})
        metrics.update({f"test_{k}": v for k, v in test.items()})
        figures = training_figures()  # this attempt's; the run's samples, earlier attempts too
        if resume is not None and self.step == start_step and self.rt.is_main:
            # nothing trained here: the run's training figures are its last attempt's
            figures.update(self._earlier_training(resume))
        if self.rt.world_size > 1:
            # rank 0's on every rank, as metrics.json holds them: another rank's own training
            # time also holds its waits for rank 0's work between segments (curves.png)
            shared: list[Any] = [figures]
            dist.broadcast_object_list(shared, src=0)
            figures = shared[0]
        metrics["train_samples_per_s"] = figures["train_samples_per_s"]
        metrics["num_train_samples"] = float(self.step * self.cfg.data.batch_size)
        metrics["num_steps"] = float(self.step)
        metrics["train_loss_last"] = figures["train_loss_last"]
        oracle = self.oracle_auc(self.data.test)
        if oracle is not None:
            metrics["oracle_test_auc"] = oracle
        oracle_val = self.oracle_auc(self.data.val)
        if oracle_val is not None:
            metrics["oracle_val_auc"] = oracle_val
        if self.rt.is_main:
            if self.logger is not None:  # wandb's summary: the final values, under the same names
                self.logger.summarize({wandb_name(k): v for k, v in metrics.items()})
            assert self.history is not None
            self.history.close()
            self.output_dir.mkdir(parents=True, exist_ok=True)
            # whole or not at all (a resumed run that had ended rewrites it); NaN stays a float
            results.write_json(
                self.output_dir / "metrics.json", self._record(metrics), standard=False
            )
        return TrainResult(metrics, list(loss_values))

    # -- helpers ------------------------------------------------------------------------------
    def _record(self, metrics: dict[str, float]) -> dict[str, Any]:
        """What ``metrics.json`` holds: ``metrics`` and, for towers a ``tp`` partition file
        gave, those towers (:data:`dmt.checkpoint.RECORDED_TOWERS`, as every checkpoint's
        ``config.yaml`` records them; not a metric: neither in the result nor in wandb's
        summary), which :mod:`dmt.seeds` holds the file to where no checkpoint was kept."""
        towers = self.cfg.model.partition.recorded_towers
        return metrics if towers is None else {**metrics, checkpoint.RECORDED_TOWERS: towers}

    def _earlier_training(self, resume: Path) -> dict[str, float]:
        """``train_samples_per_s`` and ``train_loss_last`` of the attempt that saved ``resume``,
        the checkpoint of the current step (an attempt that trained nothing resumed a run that
        had ended there, or was stopped in its final evaluation, and has none of its own): as
        the checkpoint records them (:data:`dmt.checkpoint.TRAINING_KEY`), else (one saved by
        an earlier dmt) as this run's ``metrics.json`` does if it was written at that step;
        nothing, with a warning, where neither does."""
        keys = ("train_samples_per_s", "train_loss_last")
        recorded = checkpoint.read_meta(resume).get(checkpoint.TRAINING_KEY)
        if isinstance(recorded, dict):
            return {
                k: float("nan") if recorded.get(k) is None else float(recorded[k]) for k in keys
            }
        try:
            metrics = json.loads((self.output_dir / "metrics.json").read_text())
        except (OSError, ValueError):
            metrics = None
        if isinstance(metrics, dict) and metrics.get("num_steps") == float(self.step):
            return {k: float(metrics[k]) for k in keys if isinstance(metrics.get(k), int | float)}
        log.warning(
            "train_loss_last and train_samples_per_s are NaN: this attempt trained nothing "
            "(checkpoint %s is at the run's last step %d), and neither that checkpoint (saved "
            "by an earlier dmt) nor a metrics.json of step %d in %s records the figures of the "
            "attempt that trained to it",
            resume,
            self.step,
            self.step,
            self.output_dir,
        )
        return {}

    def checkpoint_root(self) -> Path:
        p = Path(self.cfg.trainer.checkpoint_dir)
        return p if p.is_absolute() else self.output_dir / p

    def config_yaml(self) -> str:
        return config_yaml(self.cfg)

    def _find_resume(self, *, flat: bool) -> tuple[Path | None, dict[str, int] | None]:
        """The checkpoint to resume from: ``trainer.resume_from`` resolved, or with ``auto`` the
        newest complete checkpoint of this run (``None``: start fresh), its config and data
        position and rows checked against this run's (:func:`dmt.checkpoint.check_config`,
        :func:`dmt.checkpoint.check_data_position`, :func:`dmt.checkpoint.check_data_fingerprint`,
        and for an SPTT run the column blocks of its row-wise optimizer state:
        :func:`dmt.checkpoint.check_sptt_column_blocks`); for a ``flat`` run also its tables'
        column blocks (:func:`dmt.checkpoint.row_wise_state_blocks`). Rank 0 decides; its error
        is every rank's."""
        setting = self.cfg.trainer.resume_from
        if not setting:
            return None, None
        # the checkpoint, its column blocks, or rank 0's error, for every rank
        found: list[Any] = [None, None, None]
        if self.rt.is_main:
            try:
                found[0] = checkpoint.resume_checkpoint(setting, self.checkpoint_root())
                if found[0] is None:
                    log.info(
                        "trainer.resume_from=auto: no complete checkpoint in %s; starting fresh",
                        self.checkpoint_root(),
                    )
                else:  # before its column blocks shape this run's plan
                    checkpoint.check_not_going_back(found[0], self.checkpoint_root())
                    checkpoint.check_config(
                        found[0],
                        self.config_yaml(),
                        allow_change=self.cfg.trainer.resume_allow_config_change,
                    )
                    checkpoint.check_data_position(
                        found[0], self.data.train.num_batches(), self.cfg.data.batch_size
                    )
                    checkpoint.check_data_fingerprint(
                        found[0],
                        self.data.train_fingerprint,
                        f"data.criteo.preprocessed_dir={self.data.info.get('preprocessed_dir')!r}",
                        allow_change=self.cfg.trainer.resume_allow_config_change,
                    )
                    if not flat:  # before this run's plan is written
                        sptt = self.cfg.sptt
                        local = sptt.local_world_size or self.rt.local_world_size
                        checkpoint.check_sptt_column_blocks(
                            found[0],
                            sharding_type=sptt.sharding_type,
                            tower_size=sptt.hosts_per_tower * local,
                            optim=self.cfg.optim,
                        )
                if found[0] is not None and flat:
                    found[1] = checkpoint.row_wise_state_blocks(found[0])
                    split = sorted(t for t, k in found[1].items() if k > 1)
                    if split:
                        log.info(
                            "resuming %s: tables %s keep the column blocks their row-wise "
                            "optimizer state was saved in",
                            found[0],
                            split,
                        )
            except ValueError as e:
                found[2] = str(e)
        if self.rt.world_size > 1:
            dist.broadcast_object_list(found, src=0)
        if found[2] is not None:
            raise ValueError(found[2])
        return (None if found[0] is None else Path(found[0])), found[1]

    def save(
        self, epoch: int, batch_in_epoch: int, training: dict[str, float] | None = None
    ) -> Path:
        if batch_in_epoch >= self.data.train.num_batches():
            epoch, batch_in_epoch = epoch + 1, 0
        assert self.checkpointer is not None
        return self.checkpointer.save(
            self.model,
            self.optimizer,
            step=self.step,
            epoch=epoch,
            batch_in_epoch=batch_in_epoch,
            config=self.config_yaml(),
            lr_scheduler=self.lr_scheduler.state_dict(),
            ema=self.ema,
            data=self.data.train_fingerprint,
            training=training,
        )

    def save_unless_diverged(
        self, epoch: int, batch_in_epoch: int, training: dict[str, float] | None = None
    ) -> Path | None:
        """:meth:`save`, unless a value of the state is not finite on some rank
        (:func:`dmt.checkpoint.not_finite_key`, every rank alike): the run has diverged, and a
        resume would refuse that checkpoint (:func:`dmt.checkpoint.load`), so it is not written
        (no directory), and rank 0 warns, the first time, naming the step, the value and this
        run's newest checkpoint, which stays the one ``trainer.resume_from=auto`` takes; later
        ones are logged. ``None``: not written."""
        assert self.checkpointer is not None
        bad = checkpoint.not_finite_key(
            self.model,
            self.optimizer,
            rank=self.rt.rank,
            world_size=self.rt.world_size,
            ema=self.ema,
        )
        if bad is None:
            return self.save(epoch, batch_in_epoch, training)
        self.checkpointer.wait()  # an earlier step's pending save: complete, so it is named
        if self.rt.is_main:
            root = self.checkpoint_root()
            kept = checkpoint.newest_before(root, self.step)
            (log.warning if not self._skipped_a_save else log.info)(
                "checkpoint of step %d not written: the run has diverged (its state holds values "
                "that are not finite, NaN or inf, first in %s), and a resume would refuse it; %s",
                self.step,
                bad,
                f"this run's newest checkpoint stays {kept}"
                if kept is not None
                else f"this run has no checkpoint in {root}",
            )
        self._skipped_a_save = True
        return None

    def _log_train(self, loss: float, train_time_s: float) -> None:
        """A log step into ``history.jsonl`` and wandb (rank 0): the loss, and the LR of each
        param group for this step's update (the scheduler has already moved to the next)."""
        if not self.rt.is_main:
            return
        lrs = [float(lr) for lr in self.step_lrs]
        # the schedule's factor: the LR over its peak, of the first group with a nonzero peak
        factor = next((lr / b for lr, b in zip(lrs, self.lr_scheduler.base_lrs) if b), 0.0)
        assert self.history is not None
        record = self.history.log_train(
            step=self.step, loss=loss, lrs=lrs, train_time_s=train_time_s
        )
        if not self.cfg.trainer.progress_bar:  # the bar's figures, as a line of the log
            rate = record.get("train/samples_per_s")
            log.info(
                "step %d/%d: train/loss %.4f%s",
                self.step,
                self.total_steps,
                loss,
                "" if rate is None else f", {rate:.0f} samples/s",
            )
        self._log({**record, "train/lr_factor": factor})

    def _log_eval(self, metrics: dict[str, float], split: str) -> None:
        """An evaluation into ``history.jsonl`` and wandb (rank 0), and without
        ``trainer.progress_bar`` a line of the log (a cluster job's console has no bar)."""
        if self.rt.is_main:
            if not self.cfg.trainer.progress_bar:
                log.info("step %d/%d: %s", self.step, self.total_steps, eval_line(metrics, split))
            assert self.history is not None
            again = self.history.has_eval(self.step, split)
            record = self.history.log_eval(step=self.step, metrics=metrics, split=split)
            if again and self.logger is not None and self.logger.continued:
                # a resumed run that had ended here: its continued wandb run has this point
                # already (a second one at the same step would be a duplicate); the summary
                # gets this evaluation's values
                return
            self._log(record)

    def _log(self, record: dict[str, Any]) -> None:
        if self.logger is not None and self.rt.is_main:
            self.logger.log(wandb_values(record), step=self.step)


def eval_line(metrics: dict[str, float], split: str) -> str:
    """An evaluation's metrics as the log gives them: ``val/auc 0.7012, val/logloss 0.4533,
    ..., val/num_samples 1024`` (NaN where a split cannot define a metric)."""
    return ", ".join(
        f"{split}/{k} {v:.0f}" if k == "num_samples" else f"{split}/{k} {v:.4f}"
        for k, v in metrics.items()
    )


def seed_rank_stream(seed: int, *, rank: int, world_size: int) -> None:
    """Seed torch's generators (CPU and every GPU's: dropout draws from them) with a stream of
    ``(seed, rank)``, once the model is built and sharded. Every rank seeds ``seed`` before, so
    that it builds the same weights; left so, sample ``i`` of each rank's local batch would get
    the same dropout mask on every rank. A world of one keeps ``seed``'s stream (its masks are
    those of earlier dmt)."""
    if world_size == 1:
        return
    torch.manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))


def build_pipeline(
    model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> TrainPipelineSparseDist[Batch, torch.Tensor] | TrainPipelineBase[Batch, torch.Tensor]:
    """TorchRec's training pipeline for a sharded ``TrainTask``.

    Flat base models (DLRM, DCN) and SPTT's ``ShardedDMT`` get ``TrainPipelineSparseDist``:
    batch ``i+1`` is copied to the device and its input all-to-all (the sharded EBC's, or SPTT's
    step a in :class:`~dmt.sptt.sharded_towers.ShardedTowers`) runs while batch ``i`` trains.
    Flat DMT models, whose towers' EBCs read features split out of the batch (an input the
    pipeline cannot hand to the next batch's input dist), get ``TrainPipelineBase``, which
    overlaps the host-to-device copy only. Each step's output is the detached loss.
    """
    if isinstance(unwrap(model), RecModel | ShardedDMT):

        def forward(batch: Batch | None) -> tuple[torch.Tensor, torch.Tensor]:
            loss, _ = model(batch)
            return loss, loss.detach()

        return TrainPipelineSparseDist(model, optimizer, device, custom_model_fwd=forward)
    return TrainPipelineBase(_ReportLoss(model), optimizer, device)


def build_eval_pipeline(
    model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> EvalPipelineSparseDist[Batch, torch.Tensor] | None:
    """TorchRec's ``EvalPipelineSparseDist`` for a flat base model (DLRM, DCN), whose steps
    return the logits; ``None`` for the others, evaluated by the plain loop: SPTT's ranks may
    hold last batches of different sizes, which ``ShardedDMT`` pads after a collective that the
    pipeline's tracing cannot follow, and flat DMT models' towers split the features."""
    if not isinstance(unwrap(model), RecModel):
        return None
    return EvalPipelineSparseDist(model, optimizer, device)


class _ReportLoss(nn.Module):
    """``batch -> (loss, loss.detach())``: TrainPipelineBase reports the model's second output."""

    def __init__(self, task: nn.Module) -> None:
        super().__init__()
        self.task = task

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        loss, _ = self.task(batch)
        return loss, loss.detach()


def mean_over_ranks(values: torch.Tensor, world_size: int) -> torch.Tensor:
    """The mean of every rank's ``values`` (same shape on each), each element summed in rank
    order. Not an all-reduce: at 3+ ranks gloo's adds an element's values in an order set by
    its offset in the tensor, so a step's logged loss depended on its place among the losses
    read back together (``trainer.log_every``, where a resume started), 1 ulp apart."""
    gathered = [torch.empty_like(values) for _ in range(world_size)]
    dist.all_gather(gathered, values)
    total = gathered[0].clone()
    for other in gathered[1:]:
        total += other
    return total / world_size


def dense_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """This rank's parameters the dense optimizer updates (not the fused tables) in a sharded
    ``TrainTask``, flat or SPTT."""
    inner = unwrap(model)
    if isinstance(inner, ShardedDMT):
        return inner.named_dense_parameters()
    return list(in_backward_optimizer_filter(model.named_parameters()))


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside a sharded ``TrainTask``."""
    if isinstance(model, DistributedModelParallel):
        model = model.module
    if isinstance(model, TrainTask):
        model = model.model
    return model
