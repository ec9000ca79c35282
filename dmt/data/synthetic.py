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

from dataclasses import dataclass

import numpy as np

from dmt.config import SyntheticConfig

_SPLITS = {"train": 1, "val": 2, "test": 3}
_CHUNK = 1 << 16


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
        self.pairs = sum(len(g) * (len(g) - 1) // 2 for g in self.feature_groups)
        self.bias = 0.0
        self.signal_norm = 1.0
        if cfg.mode == "planted":
            self._calibrate()

    # -- sampling ---------------------------------------------------------------------------
    def _background_ids(
        self, rng: np.random.Generator, i: int, size: tuple[int, ...]
    ) -> np.ndarray:
        card = int(self.cards[i])
        if self.cfg.skew <= 0:
            return rng.integers(0, card, size)
        # Zipf over ranks 0..card-1 by inverse CDF, then a fixed relabeling of ranks to ids.
        ranks = np.arange(1, card + 1, dtype=np.float64)
        cdf = np.cumsum(ranks**-self.cfg.skew)
        cdf /= cdf[-1]
        r = np.minimum(np.searchsorted(cdf, rng.random(size)), card - 1)
        a = int(self.relabel_seeds[i]) | 1  # odd multiplier: a bijection of Z_card only if coprime
        if np.gcd(a, card) != 1:
            a = 1
        return (r * a + int(self.relabel_seeds[i])) % card

    def _sample_inputs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Dense inputs ``(n, num_dense)`` and ids ``(n, F, M)``."""
        cfg = self.cfg
        f, m, c = cfg.num_sparse, cfg.multi_hot, cfg.num_clusters
        counts = np.floor(np.exp(rng.normal(self.dense_mu, self.dense_sigma, (n, cfg.num_dense))))
        dense = np.log1p(counts).astype(np.float32)
        ids = np.empty((n, f, m), dtype=np.int64)
        if cfg.mode == "random":
            for i in range(f):
                ids[:, i, :] = self._background_ids(rng, i, (n, m))
            return dense, ids
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
        """Samples of ``split`` ("train", "val" or "test"); deterministic by seed, chunked."""
        parts = []
        for k, lo in enumerate(range(0, num_samples, _CHUNK)):
            rng = np.random.default_rng([self.cfg.seed, _SPLITS[split], k])
            parts.append(self._sample_chunk(rng, min(_CHUNK, num_samples - lo)))
        probs = (
            None if parts[0].true_probs is None else np.concatenate([p.true_probs for p in parts])
        )
        return SyntheticSplit(
            dense=np.concatenate([p.dense for p in parts]),
            sparse=np.concatenate([p.sparse for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
            true_probs=probs,
        )
