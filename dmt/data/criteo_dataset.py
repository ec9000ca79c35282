"""Criteo loaders: :class:`CriteoSource`, a ``BatchSource`` over a preprocessed split.

A split directory (see :mod:`dmt.data.criteo_preprocess`) holds ``dense.npy`` float32 ``(S, 13)``,
``sparse.npy`` int32 ``(S, 26)`` and ``labels.npy`` int8 ``(S,)``. Arrays are memory-mapped
(streaming: memory stays bounded, the OS page cache holds what was read recently) or, with
``in_memory``, read into RAM once.

Order of an epoch (deterministic by ``seed`` and epoch): without shuffling, file order. With
shuffling, the split is cut into windows of ``shuffle_window_rows`` consecutive rows (default:
one window, a full shuffle); the windows are permuted and so are the rows inside each window.
Small windows keep reads local (each batch touches one or two windows of the file), which is
what a streaming run over data larger than RAM needs.

Global batch ``b`` is positions ``[b * B, (b + 1) * B)`` of that order (``B`` the global batch
size); rank ``r`` of ``G`` gets its contiguous share (:func:`dmt.data.source.rank_slice`), so a
``G``-process run sees exactly the batches of a single process. Rows of a memory-mapped array are
read in sorted order and put back in batch order. A background thread prepares
``prefetch_batches`` batches ahead.

In a multi-rank run, rank 0 alone preprocesses (``data.criteo.auto_preprocess``) and transforms
``data.criteo.test_path``; the other ranks wait for it through the default process group's store
(:func:`on_rank_zero`), not in a collective, so hours of preprocessing are not cut short by the
process group's timeout (``trainer.collective_timeout_s``).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from torchrec.datasets.utils import Batch

from dmt.config import DataConfig
from dmt.data import DataBundle, check_train_rows
from dmt.data.criteo_config import CriteoConfig
from dmt.data.criteo_preprocess import (
    ARRAY_FILES,
    NUM_DENSE,
    SPARSE_NAMES,
    OtherOutputError,
    missing_id_of,
    open_array,
    output_damage,
    preprocess_criteo,
    read_manifest,
    settings_differences,
    split_dir,
    train_fingerprint,
    transform_tsv,
)
from dmt.data.source import make_kjt, rank_slice

log = logging.getLogger(__name__)

RANK_ZERO_WAIT_S = 24 * 3600.0
"""How long the other ranks wait for rank 0's preprocessing (:func:`on_rank_zero`): 24 hours,
enough for the Criteo 1TB logs. Unlike a collective, this wait is not bounded by the process
group's timeout (``trainer.collective_timeout_s``)."""
RANK_ZERO_ACK_S = 60.0
"""How long a failed rank 0 waits for the others to read its error before it raises (and, when it
holds the job's TCPStore, takes the store down with it)."""
_POLL_S = (0.01, 1.0)  # first and longest pause between two looks at the store
_WAIT_LOG_S = 300.0  # a waiting rank says so this often
#: calls of on_rank_zero in this process with a process group: the same on every rank (all ranks
#: build the same data in the same order), so each call has its own key, apart from earlier calls'
#: (a Hydra multirun's jobs, or training then evaluation, in the same process)
_rank_zero_calls = itertools.count()


class CriteoSource:
    """A ``BatchSource`` over one preprocessed Criteo split.

    Args:
        directory (str | os.PathLike): the split directory (``<preprocessed_dir>/<split>``).
        batch_size (int): global batch size ``B`` (rows per step over all ranks).
        rank (int), world_size (int): this process's share of every global batch.
        shuffle (bool): reshuffle every epoch (by ``seed`` and the epoch).
        seed (int): shuffle seed.
        drop_last (bool): drop the final partial global batch (training).
        shuffle_window_rows (int | None): rows shuffled together (None: the whole split).
        in_memory (bool): read the arrays into RAM instead of memory-mapping them.
        prefetch_batches (int): batches prepared ahead by a background thread (0: none).
        feature_names (list[str]): keys of the KJT, one per sparse column.

    Example::

        src = CriteoSource("data/kaggle/train", batch_size=4096, shuffle=True, drop_last=True)
        for batch in src.batches(epoch=0):
            batch.dense_features  # (B, 13) float32
            batch.sparse_features  # KJT, keys cat_0..cat_25, one id per sample and key
            batch.labels  # (B,) float32
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        shuffle_window_rows: int | None = None,
        in_memory: bool = False,
        prefetch_batches: int = 4,
        feature_names: list[str] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if drop_last and batch_size % world_size:
            raise ValueError(
                f"batch_size={batch_size} must be divisible by the world size {world_size}"
            )
        if shuffle_window_rows is not None and shuffle_window_rows < 1:
            raise ValueError(f"shuffle_window_rows must be None or >= 1; got {shuffle_window_rows}")
        self.directory = Path(directory)
        load: Callable[[Path], np.ndarray] = np.load if in_memory else open_array
        self.dense = load(self.directory / ARRAY_FILES["dense"])
        self.sparse = load(self.directory / ARRAY_FILES["sparse"])
        self.labels = load(self.directory / ARRAY_FILES["labels"])
        n = len(self.labels)
        if self.dense.shape != (n, NUM_DENSE) or self.sparse.shape[0] != n:
            raise ValueError(
                f"{self.directory}: inconsistent arrays: dense {self.dense.shape}, "
                f"sparse {self.sparse.shape}, labels {self.labels.shape}"
            )
        self.feature_names = feature_names or SPARSE_NAMES[: self.sparse.shape[1]]
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.window = min(shuffle_window_rows or n, n) or 1
        self.prefetch_batches = prefetch_batches
        self._mapped = not in_memory
        self._last_order: _EpochOrder | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def num_batches(self) -> int:
        """Global batches per epoch."""
        n, b = len(self.labels), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This rank's share of global batches ``start, start + 1, ...`` of ``epoch``."""
        if self.prefetch_batches <= 0:
            return self._batches(epoch, start)
        return _prefetch(lambda: self._batches(epoch, start), self.prefetch_batches)

    def rows(self, epoch: int, batch: int) -> np.ndarray:
        """Row indices (into the split's arrays) of this rank's share of global batch ``batch``."""
        return self._order(epoch).positions(*self._rank_positions(batch))

    def global_rows(self, epoch: int, batch: int) -> np.ndarray:
        """Row indices of the whole global batch ``batch`` (all ranks)."""
        lo = batch * self.batch_size
        return self._order(epoch).positions(lo, min(len(self.labels), lo + self.batch_size))

    # -- internals ------------------------------------------------------------------------------

    def _rank_positions(self, batch: int) -> tuple[int, int]:
        lo = batch * self.batch_size
        size = min(len(self.labels), lo + self.batch_size) - lo
        share = rank_slice(size, self.rank, self.world_size)
        return lo + share.start, lo + share.stop

    def _order(self, epoch: int) -> _EpochOrder:
        if self._last_order is None or self._last_order.seed != (self.seed, epoch):
            self._last_order = _EpochOrder(
                len(self.labels), self.window, self.shuffle, (self.seed, epoch)
            )
        return self._last_order

    def _batches(self, epoch: int, start: int) -> Iterator[Batch]:
        order = self._order(epoch)
        for b in range(start, self.num_batches()):
            lo, hi = self._rank_positions(b)
            if not self.shuffle:
                dense, sparse, labels = (
                    np.array(a[lo:hi]) for a in (self.dense, self.sparse, self.labels)
                )
            else:
                rows = order.positions(lo, hi)
                dense, sparse, labels = (
                    _gather(a, rows, self._mapped) for a in (self.dense, self.sparse, self.labels)
                )
            yield self.make_batch(dense, sparse, labels)

    def make_batch(self, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> Batch:
        """A ``Batch`` from rows: dense ``(B, 13)``, sparse ids ``(B, F)``, labels ``(B,)``."""
        return Batch(
            dense_features=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
            sparse_features=make_kjt(self.feature_names, sparse.astype(np.int64)[:, :, None]),
            labels=torch.from_numpy(labels.astype(np.float32)),
        )


class _EpochOrder:
    """The row order of one epoch: permuted windows of permuted rows (or the identity).

    Window ``k`` holds rows ``[k * W, min(S, (k + 1) * W))``; the order visits the windows in a
    random order and each window's rows in a random order. Window permutations are made on
    demand (and the last one kept), so memory is ``O(W)``.
    """

    def __init__(self, num_rows: int, window: int, shuffle: bool, seed: tuple[int, int]) -> None:
        self.num_rows, self.window, self.shuffle, self.seed = num_rows, window, shuffle, seed
        if shuffle:
            num_windows = -(-num_rows // window)
            self.window_order = np.random.default_rng([*seed, 0]).permutation(num_windows)
            sizes = np.minimum(window, num_rows - self.window_order * window)
            self.starts = np.concatenate([[0], np.cumsum(sizes)])
        self._cached: tuple[int, np.ndarray] | None = None

    def positions(self, lo: int, hi: int) -> np.ndarray:
        """Rows at positions ``lo..hi-1`` of the order."""
        if not self.shuffle:
            return np.arange(lo, hi)
        parts = []
        k = int(np.searchsorted(self.starts, lo, side="right")) - 1
        while lo < hi:
            end = min(hi, int(self.starts[k + 1]))
            perm = self._window_rows(int(self.window_order[k]))
            parts.append(perm[lo - self.starts[k] : end - self.starts[k]])
            lo, k = end, k + 1
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def _window_rows(self, w: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != w:
            size = min(self.window, self.num_rows - w * self.window)
            rng = np.random.default_rng([*self.seed, 1, w])
            self._cached = (w, w * self.window + rng.permutation(size))
        return self._cached[1]


def _gather(array: np.ndarray, rows: np.ndarray, mapped: bool) -> np.ndarray:
    """``array[rows]``; for a memory map, read in increasing row order (page-friendly)."""
    if not mapped:
        return array[rows]
    order = np.argsort(rows, kind="stable")
    out = np.empty((len(rows), *array.shape[1:]), array.dtype)
    out[order] = array[rows[order]]
    return out


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def _prefetch(make: Callable[[], Iterator[Any]], depth: int) -> Iterator[Any]:
    """Iterate ``make()`` in a background thread, at most ``depth`` items ahead.

    Errors in the thread are re-raised here; closing this iterator early stops the thread.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in make():
                if not put(item):
                    return
            put(_END)
        except BaseException as e:  # handed to the consumer
            put(_Failure(e))

    thread = threading.Thread(target=work, name="criteo-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()


# ---------------------------------------------------------------------------------------------
# Entry points used by dmt.data.build_data and the commands
# ---------------------------------------------------------------------------------------------


def as_criteo_config(value: Any) -> CriteoConfig:
    """``data.criteo`` as a :class:`CriteoConfig` (accepts the dataclass or a mapping)."""
    if isinstance(value, CriteoConfig):
        return value
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return CriteoConfig(**dict(value))
    raise ValueError(
        f"data.criteo must be a CriteoConfig section; got {type(value).__name__} "
        "(use data=criteo_kaggle, criteo_1tb or criteo_sample)"
    )


@dataclass
class CriteoSchema:
    """What a model needs to know about a preprocessed Criteo directory."""

    feature_names: list[str]
    cardinalities: list[int]
    num_dense: int


def read_schema(preprocessed_dir: str | os.PathLike[str]) -> CriteoSchema:
    """Feature names, table sizes (incl. the shared bucket 0) and dense count, from the manifest."""
    m = read_manifest(preprocessed_dir)
    return CriteoSchema(list(m["sparse_features"]), list(m["cardinalities"]), int(m["num_dense"]))


def criteo_schema(cfg: DataConfig) -> tuple[list[str], list[int], int]:
    """``(feature_names, cardinalities, num_dense)`` of ``cfg.criteo`` without loading data."""
    s = read_schema(as_criteo_config(cfg.criteo).preprocessed_dir)
    return s.feature_names, s.cardinalities, s.num_dense


def tsv_source(
    vocab_dir: str | os.PathLike[str],
    tsv: str | os.PathLike[str],
    *,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    skip_bad_rows: bool = False,
    num_workers: int = 0,
    out_dir: str | os.PathLike[str] | None = None,
    in_memory: bool = False,
    prefetch_batches: int = 4,
    progress: bool = True,
) -> CriteoSource:
    """An evaluation source over any raw Criteo TSV, mapped through ``vocab_dir``'s vocabularies.

    Preprocesses ``tsv`` once with :func:`~dmt.data.criteo_preprocess.transform_tsv` (a no-op
    when already done) and reads its rows in file order.
    """
    out = transform_tsv(
        vocab_dir,
        tsv,
        out_dir,
        skip_bad_rows=skip_bad_rows,
        num_workers=num_workers,
        progress=progress,
    )
    return CriteoSource(
        split_dir(out, "test"),
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        in_memory=in_memory,
        prefetch_batches=prefetch_batches,
    )


def on_rank_zero(what: str, work: Callable[[], str], *, rank: int, world_size: int) -> str:
    """Run ``work`` on rank 0 only and return its result on every rank.

    The other ranks poll the default process group's store for rank 0's result for up to
    :data:`RANK_ZERO_WAIT_S`, independently of the group's timeout and backend (nothing goes
    through gloo or NCCL). Without a process group (or with one rank), this process runs ``work``
    itself.

    Raises:
        ValueError: on every rank, with the same message, when ``work`` raised a ValueError on
            rank 0.
        RuntimeError: on the other ranks when ``work`` raised anything else on rank 0 (which
            re-raises its own exception).
        TimeoutError: rank 0 did not answer within :data:`RANK_ZERO_WAIT_S`.
    """
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return work()
    store = dist.distributed_c10d._get_default_store()
    key = f"dmt/criteo_dataset/rank_zero/{next(_rank_zero_calls)}"
    if rank == 0:
        return _run_and_publish(store, key, work, world_size)
    answer = _wait_for(store, key, what, rank)
    if "result" in answer:
        return str(answer["result"])
    store.add(f"{key}/read", 1)  # rank 0 waits for this before it raises
    if answer["type"] == "ValueError":
        raise ValueError(answer["error"])
    raise RuntimeError(f"rank 0 failed to {what}: {answer['type']}: {answer['error']}")


def _run_and_publish(store: dist.Store, key: str, work: Callable[[], str], world_size: int) -> str:
    try:
        result = work()
    except Exception as exc:
        store.set(key, json.dumps({"error": str(exc), "type": type(exc).__name__}))
        # the others read the error before this rank raises and its process (perhaps holding
        # the job's TCPStore) ends
        deadline = time.monotonic() + RANK_ZERO_ACK_S
        while store.add(f"{key}/read", 0) < world_size - 1 and time.monotonic() < deadline:
            time.sleep(_POLL_S[0])
        if isinstance(exc, ValueError):
            raise ValueError(str(exc)) from exc
        raise
    except BaseException as exc:  # interrupted: no one waits a day for it
        store.set(key, json.dumps({"error": repr(exc), "type": type(exc).__name__}))
        raise
    store.set(key, json.dumps({"result": result}))
    return result


def _wait_for(store: dist.Store, key: str, what: str, rank: int) -> dict[str, Any]:
    start = time.monotonic()
    logged = start
    pause = _POLL_S[0]
    while not store.check([key]):
        now = time.monotonic()
        if now - start > RANK_ZERO_WAIT_S:
            raise TimeoutError(
                f"rank {rank}: rank 0 did not {what} within {RANK_ZERO_WAIT_S:g} s "
                "(dmt.data.criteo_dataset.RANK_ZERO_WAIT_S)"
            )
        if now - logged >= _WAIT_LOG_S:
            log.info("rank %d: waiting for rank 0 to %s (%.0f s so far)", rank, what, now - start)
            logged = now
        time.sleep(pause)
        pause = min(2 * pause, _POLL_S[1])
    answer: dict[str, Any] = json.loads(store.get(key))
    return answer


def _preprocess_once(c: CriteoConfig, *, rank: int, world_size: int) -> None:
    """Rank 0 brings ``c.preprocessed_dir`` up to date (a no-op when it is); the others wait."""

    def work() -> str:
        try:
            return str(preprocess_criteo(c, rebuild_damaged=True, progress=True))
        except OtherOutputError as exc:  # the directory is in the way: what dmt-train can do
            raise ValueError(
                f"{exc} (dmt-train never replaces a preprocessed directory: set "
                "data.criteo.preprocessed_dir to another one, rebuild this one with "
                "dmt-preprocess --overwrite, or set data.criteo.auto_preprocess=false to use an "
                "existing directory as is)"
            ) from exc

    try:
        on_rank_zero(
            f"preprocess data.criteo.raw_path={c.raw_path!r}",
            work,
            rank=rank,
            world_size=world_size,
        )
    except ValueError as exc:  # the same on every rank
        raise ValueError(
            f"preprocessing data.criteo.raw_path={c.raw_path!r} into "
            f"data.criteo.preprocessed_dir={c.preprocessed_dir!r} failed: {exc}"
        ) from exc


def check_missing_id(c: CriteoConfig, manifest: dict[str, Any]) -> None:
    """Raise unless ``c.missing_id`` is the one ``c.preprocessed_dir`` was made with (vocab mode:
    it decides which id empty fields have, and the table sizes)."""
    categorical = manifest["settings"]["categorical"]
    if c.categorical_mode != "vocab" or categorical.get("mode") != "vocab":
        return
    made = missing_id_of(categorical)
    if made != c.missing_id:
        raise ValueError(
            f"data.criteo.missing_id={c.missing_id!r}, but data.criteo.preprocessed_dir="
            f"{c.preprocessed_dir!r} was preprocessed with missing_id={made!r} (its manifest.json): "
            f"set data.criteo.missing_id={made}, or preprocess into another directory "
            f"(dmt-preprocess --missing-id {c.missing_id})"
        )


def build_criteo(
    cfg: DataConfig, *, rank: int = 0, world_size: int = 1, seed: int = 0
) -> DataBundle:
    """The train/val/test sources of a preprocessed Criteo directory (``cfg.criteo``).

    With ``cfg.criteo.test_path`` set, the test split is that raw file, mapped through the
    training vocabularies (preprocessed once, beside the directory).
    """
    c = as_criteo_config(cfg.criteo)
    c.validate()
    root = Path(c.preprocessed_dir)
    if c.auto_preprocess and c.raw_path is not None:
        _preprocess_once(c, rank=rank, world_size=world_size)
    manifest = read_manifest(root)
    damage = output_damage(root)
    if damage is not None:
        raise ValueError(
            f"data.criteo.preprocessed_dir={str(root)!r} is damaged: {damage}; rebuild it with "
            "dmt-preprocess --overwrite (or train with data.criteo.raw_path set and "
            "data.criteo.auto_preprocess=true, which rebuilds it)"
        )
    check_train_rows(
        int(manifest["splits"]["train"]["rows"]),
        cfg.batch_size,
        what=f"the training split of data.criteo.preprocessed_dir={str(root)!r} "
        f"({manifest['splits']['train']['rows']} rows)",
        world_size=world_size,
    )
    check_missing_id(c, manifest)
    if not (c.auto_preprocess and c.raw_path is not None):  # else made with these, or refused
        differences = settings_differences(c, manifest)
        if differences:
            log.warning(
                "data.criteo.preprocessed_dir=%r was made with other settings than data.criteo "
                "asks (%s); it is used as it is, with its own settings",
                str(root),
                "; ".join(differences),
            )
    val_rows = int(manifest["splits"]["val"]["rows"])
    if not c.val_split and val_rows:
        raise ValueError(
            f"data.criteo.val_split=false, but data.criteo.preprocessed_dir={str(root)!r} holds "
            f"{val_rows} validation rows (its manifest.json): preprocess into another directory "
            "without them (dmt-preprocess --no-val, or --split-fractions TRAIN 0 TEST for one "
            "file), or set data.criteo.val_split=true"
        )
    schema = read_schema(root)

    def source(directory: Path, train: bool) -> CriteoSource:
        return CriteoSource(
            directory,
            batch_size=cfg.batch_size if train else cfg.eval_batch_size,
            rank=rank,
            world_size=world_size,
            shuffle=train and cfg.shuffle,
            seed=seed,
            drop_last=train,
            shuffle_window_rows=c.shuffle_window_rows,
            in_memory=c.in_memory,
            prefetch_batches=c.prefetch_batches,
            feature_names=schema.feature_names,
        )

    test_dir = split_dir(root, "test")
    if c.test_path is not None:
        test_path = c.test_path

        def transform() -> str:
            return str(
                transform_tsv(
                    root,
                    test_path,
                    skip_bad_rows=c.skip_bad_rows,
                    num_workers=c.num_workers,
                    rebuild_damaged=True,
                    progress=rank == 0,
                )
            )

        # rank 0 alone: concurrent runs would each redo the work, and on hosts sharing a file
        # system take each other's in-progress output for an interrupted run's and remove it
        try:
            out = on_rank_zero(
                f"transform data.criteo.test_path={test_path!r}",
                transform,
                rank=rank,
                world_size=world_size,
            )
        except ValueError as exc:  # the same on every rank
            raise ValueError(
                f"mapping data.criteo.test_path={test_path!r} through the vocabularies of "
                f"data.criteo.preprocessed_dir={str(root)!r} failed: {exc}"
            ) from exc
        test_dir = split_dir(out, "test")
        if not test_dir.is_dir():  # rank 0 wrote it where this rank cannot see it
            raise ValueError(
                f"rank {rank}: rank 0 mapped data.criteo.test_path={test_path!r} into {out}, "
                "which this rank does not see: the ranks must share the file system of "
                "data.criteo.preprocessed_dir"
            )
    rows = {s: manifest["splits"][s]["rows"] for s in manifest["splits"]}
    return DataBundle(
        train=source(split_dir(root, "train"), True),
        val=source(split_dir(root, "val"), False),
        test=source(test_dir, False),
        feature_names=schema.feature_names,
        cardinalities=schema.cardinalities,
        num_dense=schema.num_dense,
        info={"preprocessed_dir": str(root), "rows": rows, "test_dir": str(test_dir)},
        train_fingerprint=train_fingerprint(root, manifest),
    )
