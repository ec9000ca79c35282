"""Batch sources: what the trainer iterates. Deterministic by seed and epoch, sliceable per rank.

A *global* batch ``b`` is the same set of samples whatever the world size; rank ``r`` of ``G``
gets its contiguous ``1/G`` share. So a ``G``-process run sees exactly the samples of a
single-process run, which is what makes sharded training comparable with the reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch
from torchrec import KeyedJaggedTensor
from torchrec.datasets.utils import Batch


class BatchSource(Protocol):
    """What the trainer needs from a data set split."""

    def num_batches(self) -> int:
        """Global batches per epoch."""
        ...

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This rank's share of global batches ``start, start + 1, ...`` of ``epoch``."""
        ...


@contextlib.contextmanager
def closing_batches(batches: Iterator[Batch]) -> Iterator[Iterator[Batch]]:
    """``batches`` (of :meth:`BatchSource.batches`), closed on leaving the block, also by an
    exception: a prefetching source's thread (:class:`~dmt.data.criteo_dataset.CriteoSource`)
    stops then, not when the iterator's last reference goes, which the exception's traceback
    holds for as long as someone keeps it (a Hydra multirun keeps a failed job's)."""
    try:
        yield batches
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def rank_slice(n: int, rank: int, world_size: int) -> slice:
    """Contiguous share of ``n`` items for ``rank`` (the first ``n % world_size`` ranks get one more)."""
    base, extra = divmod(n, world_size)
    lo = rank * base + min(rank, extra)
    return slice(lo, lo + base + (1 if rank < extra else 0))


def make_kjt(feature_names: list[str], ids: np.ndarray) -> KeyedJaggedTensor:
    """KJT from fixed-size bags ``ids`` of shape ``(B, F, M)`` (``M`` ids per bag)."""
    b, f, m = ids.shape
    values = torch.from_numpy(np.ascontiguousarray(ids.transpose(1, 0, 2)).reshape(-1))
    lengths = torch.full((f * b,), m, dtype=torch.int32)
    # The per-key sizes are known here: given, no sharded module has to compute them from the
    # lengths (a device-to-host copy on GPU) in its input distribution.
    per_key = [b * m] * f
    return KeyedJaggedTensor(
        keys=feature_names,
        values=values,
        lengths=lengths,
        stride=b,
        length_per_key=per_key,
        offset_per_key=[k * b * m for k in range(f + 1)],
    )


def pad_empty_batch(batch: Batch) -> Batch:
    """``batch``, or, when it has no rows, one padding row: zero dense features and an empty bag
    for every sparse feature (same keys and dtypes). Its prediction is not a sample's: the caller
    keeps the first ``batch.labels.numel()`` predictions, i.e. none.

    Evaluation hands a rank no rows when the last global batch has fewer rows than there are
    ranks. Every rank still joins the model's collectives, but FBGEMM's CUDA bucketizing of
    row-wise shards (``block_bucketize_sparse_features``, fbgemm-gpu 1.8) launches an empty grid
    on a zero-row batch and fails (pytorch/FBGEMM#3750), so no rank's model is given one.
    """
    if batch.labels.numel() > 0:
        return batch
    kjt = batch.sparse_features
    keys = kjt.keys()
    f = len(keys)
    weights = kjt.weights_or_none()
    return Batch(
        dense_features=batch.dense_features.new_zeros((1, *batch.dense_features.shape[1:])),
        sparse_features=KeyedJaggedTensor(
            keys=keys,
            values=kjt.values().new_empty(0),
            weights=None if weights is None else weights.new_empty(0),
            lengths=kjt.lengths().new_zeros(f),
            stride=1,
            length_per_key=[0] * f,
            offset_per_key=[0] * (f + 1),
        ),
        labels=batch.labels.new_zeros(1),
    )


class InMemorySource:
    """A split held in memory as arrays.

    Args:
        dense: ``(S, num_dense)`` float32 model inputs.
        sparse: ``(S, F, M)`` int ids (``M`` ids per bag).
        labels: ``(S,)`` float32 in {0, 1}.
        feature_names: the ``F`` sparse feature names.
        batch_size: global batch size.
        rank, world_size: this process's share of every global batch.
        shuffle: permute samples every epoch (by ``seed`` and epoch).
        drop_last: drop the final partial global batch (training).
        true_probs: optional ``(S,)`` oracle click probabilities (synthetic data).
    """

    def __init__(
        self,
        dense: np.ndarray,
        sparse: np.ndarray,
        labels: np.ndarray,
        feature_names: list[str],
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        true_probs: np.ndarray | None = None,
    ) -> None:
        if batch_size % world_size and drop_last:
            raise ValueError(
                f"data.batch_size={batch_size} must be divisible by the world size {world_size}"
            )
        self.dense = dense
        self.sparse = sparse if sparse.ndim == 3 else sparse[:, :, None]
        self.labels = labels
        self.feature_names = feature_names
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.true_probs = true_probs

    def __len__(self) -> int:
        return len(self.labels)

    def num_batches(self) -> int:
        n = len(self.labels)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """Global sample order of ``epoch``."""
        if not self.shuffle:
            return np.arange(len(self.labels))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.labels))

    def global_indices(self, epoch: int, batch: int) -> np.ndarray:
        idx = self.order(epoch)[batch * self.batch_size : (batch + 1) * self.batch_size]
        return idx[rank_slice(len(idx), self.rank, self.world_size)]

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        order = self.order(epoch)
        for b in range(start, self.num_batches()):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            idx = idx[rank_slice(len(idx), self.rank, self.world_size)]
            yield Batch(
                dense_features=torch.from_numpy(self.dense[idx]),
                sparse_features=make_kjt(self.feature_names, self.sparse[idx]),
                labels=torch.from_numpy(self.labels[idx]),
            )

    def local_true_probs(self) -> np.ndarray | None:
        """Oracle probabilities in this rank's (unshuffled) iteration order."""
        if self.true_probs is None:
            return None
        assert not self.shuffle, "oracle probabilities are defined for unshuffled (eval) splits"
        return np.concatenate(
            [self.true_probs[self.global_indices(0, b)] for b in range(self.num_batches())]
        )
