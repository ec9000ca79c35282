"""Vocabulary pieces: count merging, the hash-table index, stable hashing."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from dmt.data.criteo_vocab import KeyCounter, KeyIndex, count_keys, fit_vocabulary, hash_ids


def test_key_counter_merges_partial_counts() -> None:
    """Totals summed over parts (one large enough to force a merge inside ``add``), and the
    frequency threshold 3 at its edge: totals of 2 are dropped, 3 and 4 kept."""
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 50, size=rng.integers(0, 300)).astype(np.uint32) for _ in range(40)]
    # key -> its occurrences in successive parts: totals 2, 3, 4, 2, 3 (one key only in the part
    # counted before the large one, one only in parts after it)
    edge = {1000: [1, 1], 1001: [1, 1, 1], 1002: [2, 1, 1], 1003: [2], 1004: [0, 0, 3]}
    for i in range(3):
        parts.append(np.repeat(list(edge), [c[i] if i < len(c) else 0 for c in edge.values()]))
        if i == 0:
            # more distinct keys than the buffer holds: add() merges them with what came before
            parts.append(np.arange(2000, 2000 + (1 << 20) + 1))
    parts = [p.astype(np.uint32) for p in parts]
    counter = KeyCounter()
    for p in parts:
        counter.add(*count_keys(p))
    keys, counts = counter.result()
    ref = Counter(int(x) for p in parts for x in p)
    assert [ref[k] for k in edge] == [2, 3, 4, 2, 3]
    assert keys.tolist() == sorted(ref) and counts.tolist() == [ref[k] for k in sorted(ref)]
    vocab = fit_vocabulary(keys, counts, 3)
    assert [k in set(vocab.tolist()) for k in edge] == [False, True, True, False, True]
    np.testing.assert_array_equal(vocab, [k for k in sorted(ref) if ref[k] >= 3])
    assert not (vocab >= 2000).any() and set(range(50)) <= set(vocab.tolist())


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 1000, 50_000])
def test_key_index_matches_a_dict(size: int) -> None:
    rng = np.random.default_rng(size)
    vocab = np.sort(rng.choice(2**32, size=size, replace=False)).astype(np.uint32)
    index = KeyIndex(vocab)
    queries = np.concatenate(
        [vocab, rng.integers(0, 2**32, size=500, dtype=np.uint32), [0, 2**32 - 1]]
    )
    queries = queries.astype(np.uint32)
    rng.shuffle(queries)
    ids = {int(k): i + 1 for i, k in enumerate(vocab)}
    assert index.lookup(queries).tolist() == [ids.get(int(q), 0) for q in queries]


def test_key_index_with_colliding_keys() -> None:
    vocab = (np.arange(1000, dtype=np.uint64) << np.uint64(22)).astype(np.uint32)  # same low bits
    vocab = np.unique(vocab)
    assert KeyIndex(vocab).lookup(vocab).tolist() == list(range(1, len(vocab) + 1))


def test_hash_ids_are_in_range_stable_and_salted() -> None:
    keys = np.arange(10_000, dtype=np.uint32)
    present = keys % 7 != 0
    a = hash_ids(keys, present, feature=3, size=101)
    assert a.dtype == np.int32 and a.min() == 0 and a.max() <= 100
    assert (a[~present] == 0).all() and (a[present] >= 1).all()
    np.testing.assert_array_equal(a, hash_ids(keys, present, feature=3, size=101))
    b = hash_ids(keys, present, feature=4, size=101)
    assert (a[present] != b[present]).mean() > 0.9
    assert len(np.unique(a[present])) == 100  # all non-empty buckets used
