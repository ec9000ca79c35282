"""Categorical id schemes for Criteo: fitted vocabularies and stable hashing.

Both schemes reserve id 0 as a shared bucket, so every table has a row for "nothing useful":

* **vocab** (default): for each feature, the raw hex values seen at least ``frequency_threshold``
  times in the *training* rows get the contiguous ids ``1..V`` in increasing order of the raw
  value. Empty fields, values rarer than the threshold and values never seen in training (for
  example in validation or test rows) all map to id 0. The table has ``V + 1`` rows.
  With ``missing_id="distinct"`` empty fields get id 1 of their own instead, apart from the rare
  and unseen values (still id 0), and the kept values ``2..V+1``: ``V + 2`` rows (TorchRec's
  Criteo tooling also keeps "missing" apart from "rare").
* **hash**: id ``1 + splitmix64(value, feature) mod (size - 1)`` for a non-empty value, 0 for an
  empty field. Needs no fitting (one pass), is stable across runs and machines, and lets the
  table size be capped (e.g. the 40M rows per table used for Criteo Terabyte). The table has
  ``size`` rows.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

#: Multiplier of Fibonacci hashing (2**64 / golden ratio), used to place keys in hash tables.
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)


def count_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys (sorted uint32) and how often each occurs (int64)."""
    uniq, counts = np.unique(keys, return_counts=True)
    return uniq.astype(np.uint32, copy=False), counts.astype(np.int64, copy=False)


def merge_counts(
    parts: list[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """Merge several ``(sorted keys, counts)`` pairs into one, summing counts of equal keys."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return np.empty(0, np.uint32), np.empty(0, np.int64)
    if len(parts) == 1:
        return parts[0]
    keys = np.concatenate([k for k, _ in parts])
    counts = np.concatenate([c for _, c in parts])
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    first = np.flatnonzero(np.diff(keys, prepend=keys[0] ^ np.uint32(1)) != 0)
    return keys[first], np.add.reduceat(counts, first)


class KeyCounter:
    """Counts of one feature's raw keys, accumulated from partial counts.

    Partial counts are buffered and merged when the buffer outgrows the merged counts, so the
    total merge work stays ``O(n log n)`` and memory stays ``O(distinct keys)``: 12 bytes per
    distinct key, plus the buffer.
    """

    def __init__(self) -> None:
        self._merged: tuple[np.ndarray, np.ndarray] = (
            np.empty(0, np.uint32),
            np.empty(0, np.int64),
        )
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    def add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Add counts for sorted distinct ``keys``."""
        self._pending.append((keys, counts))
        self._pending_size += len(keys)
        if self._pending_size > max(len(self._merged[0]), 1 << 20):
            self._merge()

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """All distinct keys seen (sorted uint32) and their total counts (int64)."""
        self._merge()
        return self._merged

    def _merge(self) -> None:
        if self._pending:
            self._merged = merge_counts([self._merged, *self._pending])
            self._pending, self._pending_size = [], 0


def fit_vocabulary(keys: np.ndarray, counts: np.ndarray, frequency_threshold: int) -> np.ndarray:
    """Keys kept by the threshold (sorted uint32); key ``i`` of the result gets id ``i + 1``."""
    return keys[counts >= frequency_threshold]


class KeyIndex:
    """Maps raw uint32 keys to the ids ``1..V`` of a sorted vocabulary; unknown keys map to 0.

    A vectorized open-addressing hash table (linear probing, load factor <= 1/2): a lookup costs a
    few numpy passes over the queries and about 1.5 random table reads each, instead of the
    ``log2(V)`` dependent reads of a binary search.

    Args:
        vocab (np.ndarray): uint32 ``(V,)`` distinct keys; key ``vocab[i]`` gets id ``i + 1``.
    """

    def __init__(self, vocab: np.ndarray) -> None:
        if len(vocab) >= 1 << 31:
            raise ValueError(f"a vocabulary of {len(vocab)} keys does not fit int32 ids")
        self._bits = max(4, int(2 * len(vocab) - 1).bit_length())
        self._mask = np.int64((1 << self._bits) - 1)
        # A slot holds key << 32 | id; id 0 marks an empty slot.
        self._slots = np.zeros(1 << self._bits, np.uint64)
        packed = (vocab.astype(np.uint64) << np.uint64(32)) | np.arange(
            1, len(vocab) + 1, dtype=np.uint64
        )
        pos = self._home(vocab)
        pending = np.arange(len(vocab))
        while len(pending):
            p = pos[pending]
            free = self._slots[p] == 0
            candidates = pending[free]
            self._slots[pos[candidates]] = packed[candidates]  # one of any colliding writes wins
            won = np.zeros(len(pending), bool)
            won[free] = self._slots[pos[candidates]] == packed[candidates]
            pending = pending[~won]
            pos[pending] = (pos[pending] + 1) & self._mask

    def _home(self, keys: np.ndarray) -> np.ndarray:
        h = keys.astype(np.uint64) * _FIBONACCI
        return (h >> np.uint64(64 - self._bits)).astype(np.int64)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Ids (int32) of uint32 ``keys``: ``1 + position`` in the vocabulary, or 0 if absent."""
        keys = np.ascontiguousarray(keys, dtype=np.uint32)
        ids = np.zeros(len(keys), np.int32)
        pending = np.arange(len(keys))
        pos = self._home(keys)
        want = keys.astype(np.uint64)
        while len(pending):
            slot = self._slots[pos]
            slot_id = (slot & np.uint64(0xFFFFFFFF)).astype(np.int32)
            hit = (slot >> np.uint64(32)) == want
            hit &= slot_id != 0
            ids[pending[hit]] = slot_id[hit]
            go_on = (slot_id != 0) & ~hit
            pending, want = pending[go_on], want[go_on]
            pos = (pos[go_on] + 1) & self._mask
        return ids


def vocab_ids(looked_up: np.ndarray, present: np.ndarray, *, distinct_missing: bool) -> np.ndarray:
    """Vocab-mode ids of one feature from :meth:`KeyIndex.lookup` (``1..V``, 0 when not kept).

    Args:
        looked_up (np.ndarray): int32 ``(R,)`` ids of the raw values.
        present (np.ndarray): bool ``(R,)``, False for empty fields.
        distinct_missing (bool): empty fields get id 1 and kept values ``2..V+1``; otherwise
            empty fields share id 0 with rare and unseen values.
    """
    if not distinct_missing:
        return np.where(present, looked_up, 0).astype(np.int32)
    kept = np.where(looked_up > 0, looked_up + 1, 0)
    return np.where(present, kept, 1).astype(np.int32)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer (a fixed, well-mixed bijection of uint64)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hash_ids(keys: np.ndarray, present: np.ndarray, feature: int, size: int) -> np.ndarray:
    """Stable hashed ids in ``[0, size)`` for one feature; 0 is reserved for empty fields.

    Args:
        keys (np.ndarray): uint32 ``(R,)`` raw values.
        present (np.ndarray): bool ``(R,)``, False for empty fields.
        feature (int): feature index (salts the hash so features do not share collisions).
        size (int): table rows (>= 2).
    """
    assert size >= 2
    salted = keys.astype(np.uint64) | (np.uint64(feature) << np.uint64(32))
    ids = np.uint64(1) + _splitmix64(salted) % np.uint64(size - 1)
    return np.where(present, ids, 0).astype(np.int32)


def vocab_path(directory: str | os.PathLike[str], feature: int) -> Path:
    """Where the vocabulary of categorical feature ``feature`` is stored."""
    return Path(directory) / "vocab" / f"cat_{feature}.npy"
