"""Synthetic click logs with planted feature groups and a known click probability.

The *world* (drawn once from ``seed``):

- the ``F`` categorical features are split at random into ``num_groups`` latent groups
  (``feature_groups``);
- every group ``g`` has ``C = num_clusters`` latent states with vectors ``U_g[c]`` in
  ``R^latent_dim``; id ``v`` of a feature in group ``g`` carries the vector ``h(v) = U_g[v % C]``;
- dense features are log-normal counts; a weight vector ``w`` scores their ``log1p``.

A *sample*: every group draws a state ``c_g``; each id of a feature in that group is *tied*
(``v % C == c_g``) with probability ``tie_prob``, otherwise a Zipf(``skew``) background id. The
click logit is

    logit = bias + signal_scale * sum_g sum_{i < j in g} <h_i, h_j> / s + dense_scale * w . z

where ``h_i`` is the mean of ``h`` over feature ``i``'s bag, ``z`` the standardized ``log1p`` of
the dense counts and ``s`` normalizes the interaction part to unit scale. Features interact only
inside their group, so the groups are what a Tower Partitioner should recover, and
``sigmoid(logit)`` is the exact click probability: its AUC on a split is the oracle AUC.

``mode="random"`` draws ids and labels independently (no signal): for throughput runs.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dmt.config import SyntheticConfig

_SPLITS = {"train": 1, "val": 2, "test": 3}
_CHUNK = 1 << 16
#: planted mode keeps the exact Zipf CDF of tables up to this many rows (8 bytes a row)
_CDF_CACHE_ROWS = 1 << 22
#: ``ZipfSampler``: ranks below this are drawn from the exact discrete CDF
_ZIPF_HEAD = 1 << 12
#: ``ZipfSampler``: cells of the guide table over the head's CDF
_ZIPF_GUIDE = 1 << 16
#: random mode: rows processed at a time after drawing a chunk's uniforms (temporaries in cache)
_BLOCK_ROWS = 2048


@dataclass(frozen=True)
class SyntheticSplit:
    """One generated split (arrays ready for :class:`dmt.data.source.InMemorySource`)."""

    dense: np.ndarray  # (S, num_dense) float32, log1p of the counts
    sparse: np.ndarray  # (S, F, M) int64 ids
    labels: np.ndarray  # (S,) float32
    true_probs: np.ndarray | None  # (S,) float64 oracle click probabilities (planted mode)


def cardinalities(cfg: SyntheticConfig) -> list[int]:
    return (
        list(cfg.cardinalities)
        if cfg.cardinalities is not None
        else [cfg.cardinality] * cfg.num_sparse
    )


def zipf_cdf(card: int, skew: float) -> np.ndarray:
    """The exact normalized CDF of Zipf(``skew``) over ranks ``1..card`` (8 bytes a row)."""
    cdf = np.cumsum(np.arange(1, card + 1, dtype=np.float64) ** -skew)
    cdf /= cdf[-1]
    return cdf


class ZipfSampler:
    """Zipf(``skew``) ranks over tables of any size, in O(1) memory per table and O(1) time a draw.

    Rank ``k = 1..card`` (returned 0-based, ``k - 1``) has probability ``p_k`` proportional to

    - ``k^-skew`` for ``k <= K`` (the head, ``K = 4096``), drawn by inverse CDF through a guide
      table (every cell of ``[0, H)`` starts at its first rank, a few steps finish the search: the
      exact inverse, with no search over the table);
    - ``int_{k-1/2}^{k+1/2} x^-skew dx`` for ``k > K`` (the tail), drawn by inverting that
      integral in closed form. It differs from ``k^-skew`` by a factor ``1 + skew (skew + 1) /
      (24 k^2) + ...``, below ``1e-7`` relative for ``k > K``.

    The head's cumulative sums ``H_k = sum_{j <= k} j^-skew`` are the same for every table, so one
    table of ``K`` values serves all features, and a feature's normalizer ``Z`` is ``H_card``
    (``card <= K``) or ``H_K`` plus the tail integral up to ``card + 1/2``. Memory and time no
    longer grow with the table size (the exact CDF of a 48M-row table is 384 MB and a search
    of it per draw).

    Args:
        cards: ``(F,)`` rows per feature.
        skew: the Zipf exponent, ``> 0``.
    """

    def __init__(self, cards: np.ndarray, skew: float) -> None:
        if skew <= 0:
            raise ValueError(f"ZipfSampler needs skew > 0, got {skew}")
        self.skew = float(skew)
        self.cards = np.asarray(cards, dtype=np.int64)
        k = int(min(_ZIPF_HEAD, self.cards.max()))
        self.head = np.cumsum(np.arange(1, k + 1, dtype=np.float64) ** -self.skew)  # H_1..H_K
        self.head_sum = float(self.head[-1])
        self.a = k + 0.5  # the tail starts at rank K + 1, whose cell is [K + 1/2, K + 3/2)
        self.norm = np.array(
            [
                self.head[c - 1] if c <= k else self.head_sum + self._tail_mass(c + 0.5)
                for c in self.cards
            ]
        )
        # guide[j]: the rank whose CDF interval holds j * H_K / G, the lower end of cell j
        self.scale = _ZIPF_GUIDE / self.head_sum
        self.guide = np.searchsorted(
            self.head, np.arange(_ZIPF_GUIDE) / self.scale, side="right"
        ).astype(np.int64)
        ends = np.searchsorted(self.head, (np.arange(_ZIPF_GUIDE) + 1) / self.scale, side="right")
        self.steps = int((np.minimum(ends, k - 1) - self.guide).max())  # ranks a cell can span
        self.head_padded = np.append(self.head, np.inf)

    def _tail_mass(self, y: float | np.ndarray) -> float | np.ndarray:
        """``int_a^y x^-skew dx``."""
        if self.skew == 1.0:
            return np.log(y / self.a)
        e = 1.0 - self.skew
        return (y**e - self.a**e) / e

    def _tail_inverse(self, v: np.ndarray) -> np.ndarray:
        """The ``y`` whose ``_tail_mass`` is ``v``."""
        if self.skew == 1.0:
            return self.a * np.exp(v)
        e = 1.0 - self.skew
        return (self.a**e + e * v) ** (1.0 / e)

    def sample(
        self, rng: np.random.Generator, size: tuple[int, int, int], out: np.ndarray | None = None
    ) -> np.ndarray:
        """0-based ranks ``(n, F, M)`` (into ``out`` if given): ``[:, f]`` follows feature
        ``f``'s Zipf."""
        x = rng.random(size)
        ranks = np.empty(size, dtype=np.int64) if out is None else out
        for lo in range(0, size[0], _BLOCK_ROWS):  # blocks whose temporaries stay in cache
            self._ranks(x[lo : lo + _BLOCK_ROWS], ranks[lo : lo + _BLOCK_ROWS])
        return ranks

    def _ranks(self, x: np.ndarray, out: np.ndarray) -> None:
        """``out[:] =`` the ranks of uniforms ``x`` ``(b, F, M)`` (``x`` is overwritten)."""
        assert out.flags.c_contiguous  # the tail is written through out.ravel(), a view
        x *= self.norm[None, :, None]  # uniform over [0, Z_f)
        # the head's inverse for every draw (a tail draw stops at rank <= K - 1: overwritten below)
        cell = (x * self.scale).astype(np.int64)
        np.minimum(cell, _ZIPF_GUIDE - 1, out=cell)
        np.take(self.guide, cell, out=out)
        for _ in range(self.steps):
            out += self.head_padded[out] <= x
        tail = np.flatnonzero(x >= self.head_sum)
        if tail.size:
            cards = self.cards[tail // x.shape[2] % x.shape[1]]
            y = self._tail_inverse(x.ravel()[tail] - self.head_sum)
            # rank k holds [k - 1/2, k + 1/2): 0-based k - 1 = floor(y - 1/2)
            out.ravel()[tail] = np.clip(
                np.floor(y - 0.5).astype(np.int64), len(self.head), cards - 1
            )


class SyntheticWorld:
    """The fixed part of the generator: groups, latent tables, weights, bias."""

    def __init__(self, cfg: SyntheticConfig) -> None:
        self.cfg = cfg
        self.cards = np.asarray(cardinalities(cfg), dtype=np.int64)
        rng = np.random.default_rng([cfg.seed, 0])
        f = cfg.num_sparse
        perm = rng.permutation(f)
        self.feature_groups: list[list[int]] = [
            sorted(int(i) for i in part) for part in np.array_split(perm, cfg.num_groups)
        ]
        self.group_of = np.empty(f, dtype=np.int64)
        for g, feats in enumerate(self.feature_groups):
            self.group_of[feats] = g
        self.latent = rng.standard_normal((cfg.num_groups, cfg.num_clusters, cfg.latent_dim))
        self.dense_mu = rng.uniform(0.0, 3.0, cfg.num_dense)
        self.dense_sigma = rng.uniform(0.5, 1.5, cfg.num_dense)
        self.dense_w = rng.standard_normal(cfg.num_dense) / np.sqrt(cfg.num_dense)
        # A per-feature random relabeling so that popular background ids are not 0, 1, 2, ...
        self.relabel_seeds = rng.integers(0, 2**31, f)
        # odd multipliers: rank -> rank * a + seed is a bijection of Z_card only if coprime
        self.relabel_mult = np.array(
            [a if np.gcd(a, c) == 1 else 1 for a, c in zip(self.relabel_seeds | 1, self.cards)],
            dtype=np.int64,
        )
        self._cdfs: dict[int, np.ndarray] = {}  # planted mode: feature -> Zipf CDF, built once
        self._zipf = (
            ZipfSampler(self.cards, cfg.skew) if cfg.mode == "random" and cfg.skew > 0 else None
        )
        self.pairs = sum(len(g) * (len(g) - 1) // 2 for g in self.feature_groups)
        self.bias = 0.0
        self.signal_norm = 1.0
        if cfg.mode == "planted":
            self._calibrate()

    # -- sampling ---------------------------------------------------------------------------
    def _relabel(self, i: int, ranks: np.ndarray) -> np.ndarray:
        """Feature ``i``'s id of each 0-based Zipf rank: a fixed bijection of ``Z_card``."""
        return (ranks * int(self.relabel_mult[i]) + int(self.relabel_seeds[i])) % int(self.cards[i])

    def background_id_of_rank(self, i: int, ranks: np.ndarray) -> np.ndarray:
        """Feature ``i``'s background id of 0-based Zipf ranks (rank 0 is the most frequent)."""
        return self._relabel(i, np.asarray(ranks, dtype=np.int64))

    def _background_ids(
        self, rng: np.random.Generator, i: int, size: tuple[int, ...]
    ) -> np.ndarray:
        card = int(self.cards[i])
        if self.cfg.skew <= 0:
            return rng.integers(0, card, size)
        # Zipf over ranks 0..card-1 by inverse CDF, then a fixed relabeling of ranks to ids.
        cdf = self._cdfs.get(i)
        if cdf is None:
            cdf = zipf_cdf(card, self.cfg.skew)
            if card <= _CDF_CACHE_ROWS:
                self._cdfs[i] = cdf
        r = np.minimum(np.searchsorted(cdf, rng.random(size)), card - 1)
        return self._relabel(i, r)

    def _random_dense(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Dense inputs ``(n, num_dense)`` of random mode: the planted mode's log-normal counts,
        drawn in float32 (``log(1 + count)`` is ``log1p`` of an integer count, and vectorized)."""
        z = rng.standard_normal((n, self.cfg.num_dense), dtype=np.float32)
        z *= self.dense_sigma.astype(np.float32)
        z += self.dense_mu.astype(np.float32)
        np.exp(z, out=z)
        np.floor(z, out=z)
        z += 1.0
        return np.log(z, out=z)

    def _random_ids(
        self, rng: np.random.Generator, n: int, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Independent background ids ``(n, F, M)`` of every feature at once (random mode),
        into ``out`` if given."""
        size = (n, self.cfg.num_sparse, self.cfg.multi_hot)
        cards = self.cards[None, :, None]
        ranks = np.empty(size, dtype=np.int64) if out is None else out
        if self._zipf is None:
            np.minimum((rng.random(size) * cards).astype(np.int64), cards - 1, out=ranks)
        else:
            self._zipf.sample(rng, size, out=ranks)
        for lo in range(0, n, _BLOCK_ROWS):
            block = ranks[lo : lo + _BLOCK_ROWS]
            block *= self.relabel_mult[None, :, None]
            block += self.relabel_seeds[None, :, None]
            block %= cards
        return ranks

    def _sample_inputs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Dense inputs ``(n, num_dense)`` and ids ``(n, F, M)``."""
        cfg = self.cfg
        f, m, c = cfg.num_sparse, cfg.multi_hot, cfg.num_clusters
        if cfg.mode == "random":
            return self._random_dense(rng, n), self._random_ids(rng, n)
        counts = np.floor(np.exp(rng.normal(self.dense_mu, self.dense_sigma, (n, cfg.num_dense))))
        dense = np.log1p(counts).astype(np.float32)
        ids = np.empty((n, f, m), dtype=np.int64)
        states = rng.integers(0, c, (n, cfg.num_groups))
        for i in range(f):
            card = int(self.cards[i])
            state = states[:, self.group_of[i]][:, None]  # (n, 1)
            # a tied id is state + C * r, r uniform over the ids of that residue class
            per_class = np.maximum((card - 1 - state) // c + 1, 1)
            tied = np.minimum(state + c * (rng.integers(0, 1 << 30, (n, m)) % per_class), card - 1)
            background = self._background_ids(rng, i, (n, m))
            ids[:, i, :] = np.where(rng.random((n, m)) < cfg.tie_prob, tied, background)
        return dense, ids

    def _sample_chunk(self, rng: np.random.Generator, n: int) -> SyntheticSplit:
        dense, ids = self._sample_inputs(rng, n)
        if self.cfg.mode == "random":
            labels = (rng.random(n) < self.cfg.click_rate).astype(np.float32)
            return SyntheticSplit(dense, ids, labels, None)
        probs = 1.0 / (1.0 + np.exp(-self.logit(dense, ids)))
        labels = (rng.random(n) < probs).astype(np.float32)
        return SyntheticSplit(dense, ids, labels, probs)

    def _interaction(self, ids: np.ndarray) -> np.ndarray:
        c = self.cfg.num_clusters
        total = np.zeros(ids.shape[0])
        for g, feats in enumerate(self.feature_groups):
            h = self.latent[g][ids[:, feats, :] % c].mean(axis=2)  # (n, |g|, k)
            s = h.sum(axis=1)
            total += 0.5 * ((s * s).sum(axis=1) - (h * h).sum(axis=(1, 2)))
        return total

    def logit(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The true click logit of inputs (planted mode)."""
        z = (dense - self.dense_mu_log) / self.dense_sd_log
        inter = (self._interaction(ids) - self.signal_mean) / self.signal_norm
        return self.bias + self.cfg.signal_scale * inter + self.cfg.dense_scale * z @ self.dense_w

    def _calibrate(self) -> None:
        """Standardize the dense and interaction parts on a pilot sample, then bisect the bias
        so that the mean click probability is ``click_rate``."""
        self.dense_mu_log, self.dense_sd_log = 0.0, 1.0
        self.signal_mean, self.signal_norm = 0.0, 1.0
        dense, ids = self._sample_inputs(np.random.default_rng([self.cfg.seed, 99]), 20_000)
        self.dense_mu_log = dense.mean(axis=0)
        self.dense_sd_log = dense.std(axis=0) + 1e-6
        inter = self._interaction(ids)
        self.signal_mean, self.signal_norm = float(inter.mean()), float(inter.std() + 1e-12)
        base = self.logit(dense, ids)
        lo, hi = -30.0, 30.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            rate = np.mean(1.0 / (1.0 + np.exp(-(base + mid))))
            lo, hi = (mid, hi) if rate < self.cfg.click_rate else (lo, mid)
        self.bias = 0.5 * (lo + hi)

    def generate(self, split: str, num_samples: int) -> SyntheticSplit:
        """Samples of ``split`` ("train", "val" or "test"); deterministic by seed.

        Chunk ``k`` of ``65,536`` rows is drawn from its own generator, seeded by ``(seed, split,
        k)``, so chunks are generated in parallel threads (numpy releases the GIL) with the
        same result as in sequence.
        """
        cfg = self.cfg
        out = SyntheticSplit(
            dense=np.empty((num_samples, cfg.num_dense), dtype=np.float32),
            sparse=np.empty((num_samples, cfg.num_sparse, cfg.multi_hot), dtype=np.int64),
            labels=np.empty(num_samples, dtype=np.float32),
            true_probs=None if cfg.mode == "random" else np.empty(num_samples),
        )

        def fill(k: int) -> None:
            lo, hi = k * _CHUNK, min((k + 1) * _CHUNK, num_samples)
            rng = np.random.default_rng([cfg.seed, _SPLITS[split], k])
            if cfg.mode == "random":  # _sample_chunk's draws (dense, ids, labels), in place
                out.dense[lo:hi] = self._random_dense(rng, hi - lo)
                self._random_ids(rng, hi - lo, out=out.sparse[lo:hi])
                out.labels[lo:hi] = rng.random(hi - lo) < cfg.click_rate
                return
            part = self._sample_chunk(rng, hi - lo)
            out.dense[lo:hi] = part.dense
            out.sparse[lo:hi] = part.sparse
            out.labels[lo:hi] = part.labels
            if out.true_probs is not None:
                out.true_probs[lo:hi] = part.true_probs

        chunks = -(-num_samples // _CHUNK)
        workers = min(chunks, len(os.sched_getaffinity(0)))
        if workers <= 1:
            for k in range(chunks):
                fill(k)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(fill, range(chunks)))
        return out
