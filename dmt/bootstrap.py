"""How much of a difference in AUC between two models is the evaluation rows' own: a paired
bootstrap over the rows.

Seeds (:mod:`dmt.seeds`) measure how a model's AUC varies with its training randomness, on one
fixed block of evaluation rows. They say nothing of the rows: another block of the same period
would give other AUCs, and the two models' difference would move too. Resampling the rows with
replacement, the same rows for every run of both models (paired), and recomputing each run's AUC
and each model's mean over its runs, gives that difference's spread over the rows: a percentile
interval and a two-sided bootstrap p-value.

The inputs are per-row scores of every run on the same rows in the same order
(``dmt-eval --predictions``: ``prob`` and ``label`` arrays). ``scripts/row_bootstrap.py`` is the
command line.

Example::

    labels, runs = load_predictions({"dlrm": dlrm_files, "dmt": dmt_files})
    report = row_bootstrap(runs["dlrm"], runs["dmt"], labels, resamples=2000)
    report["difference"], report["interval"]  # mean AUC of dmt minus dlrm's, and its interval
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dmt.metrics import PROB_EPS
from dmt.seeds import summarize


def _clamped(probs: np.ndarray) -> np.ndarray:
    """``probs`` (float64) clamped as the metrics clamp them (:data:`dmt.metrics.PROB_EPS`)."""
    return np.clip(np.asarray(probs, dtype=np.float64), PROB_EPS, 1 - PROB_EPS)


def _ranked(probs: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's rank among the distinct scores (ascending; equal scores share one), and the
    number of distinct scores."""
    values, inverse = np.unique(probs, return_inverse=True)
    return inverse.reshape(-1), len(values)


def _auc_of_ranked(
    inverse: np.ndarray, distinct: int, positive: np.ndarray, negative: np.ndarray
) -> float:
    """The weighted AUC: the probability that a positive row scores above a negative one, ties
    counting one half; ``positive`` and ``negative``: each row's weight as a positive and as a
    negative (its weight times its label, and times one minus it)."""
    pos = np.bincount(inverse, weights=positive, minlength=distinct)
    neg = np.bincount(inverse, weights=negative, minlength=distinct)
    total_pos, total_neg = pos.sum(), neg.sum()
    if total_pos == 0 or total_neg == 0:
        return float("nan")
    below = np.cumsum(neg) - neg  # negatives scored strictly below each distinct score
    return float((pos @ below + 0.5 * (pos @ neg)) / (total_pos * total_neg))


def auc(probs: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> float:
    """AUC of ``probs`` against 0/1 ``labels``, each row counted ``weights`` times (default once);
    ties count one half, as :func:`sklearn.metrics.roc_auc_score`. NaN when the (weighted) rows
    hold one class only. The probabilities are clamped as :func:`dmt.metrics.click_metrics`
    clamps them (:data:`dmt.metrics.PROB_EPS`), so a predictions file gives dmt-eval's AUC."""
    inverse, distinct = _ranked(_clamped(probs))
    y = np.asarray(labels, dtype=np.float64)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    return _auc_of_ranked(inverse, distinct, w * y, w * (1.0 - y))


def load_predictions(
    groups: Mapping[str, Sequence[str | Path]],
) -> tuple[np.ndarray, dict[str, list[np.ndarray]]]:
    """The labels and every group's per-run scores from ``dmt-eval --predictions`` files.

    Every file must hold the same rows in the same order: the same number of rows and the same
    labels (a file of other rows is refused, naming it and its first differing row). Scores must
    be probabilities (finite, in [0, 1]), labels 0 or 1, and both classes present."""
    labels: np.ndarray | None = None
    first: Path | None = None
    runs: dict[str, list[np.ndarray]] = {}
    group_of: dict[Path, str] = {}
    for name, paths in groups.items():
        if not paths:
            raise ValueError(f"{name}: no predictions files")
        runs[name] = []
        seen: set[Path] = set()
        for path in map(Path, paths):
            if path.resolve() in seen:  # one run counted twice would move the mean and median
                raise ValueError(f"{path} is given twice in {name}")
            seen.add(path.resolve())
            if (other := group_of.setdefault(path.resolve(), name)) != name:
                raise ValueError(f"{path} is a run of both {other} and {name}")
            try:
                with np.load(path) as f:
                    prob, label = f["prob"], f["label"]
            except (OSError, KeyError, ValueError, EOFError, TypeError, AttributeError) as e:
                raise ValueError(
                    f"{path}: not a predictions file (dmt-eval --predictions: an .npz of arrays "
                    f"'prob' and 'label'): {e!r}"
                ) from e
            if prob.shape != label.shape or prob.ndim != 1 or len(prob) == 0:
                raise ValueError(
                    f"{path}: 'prob' {prob.shape} and 'label' {label.shape} must be two "
                    "non-empty vectors of one length"
                )
            bad = np.flatnonzero(~np.isfinite(prob))
            if len(bad):
                raise ValueError(f"{path}: row {bad[0]}: score {prob[bad[0]]} is not finite")
            bad = np.flatnonzero((prob < 0) | (prob > 1))
            if len(bad):  # a logit, say: clamped to PROB_EPS or 1 - PROB_EPS, it would tie
                raise ValueError(
                    f"{path}: row {bad[0]}: score {prob[bad[0]]} is not a probability in [0, 1] "
                    "('prob' holds click probabilities, not logits)"
                )
            if labels is None:
                bad = np.flatnonzero((label != 0) & (label != 1))
                if len(bad):
                    raise ValueError(f"{path}: row {bad[0]}: label {label[bad[0]]} is not 0 or 1")
                if label.min() == label.max():
                    raise ValueError(f"{path}: every label is {label[0]}: AUC needs both classes")
                labels, first = label, path
            elif len(label) != len(labels) or not np.array_equal(label, labels):
                if len(label) != len(labels):
                    why = f"{len(label)} rows where {first} has {len(labels)}"
                else:
                    row = int(np.flatnonzero(label != labels)[0])
                    why = f"row {row} has label {label[row]} where {first} has {labels[row]}"
                raise ValueError(
                    f"{path}: not the rows of {first}: {why} (score every run on the same "
                    "data, in the same order)"
                )
            runs[name].append(prob)
    if labels is None:
        raise ValueError("no groups of predictions files")
    return labels, runs


def row_bootstrap(
    a: Sequence[np.ndarray],
    b: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    block: int = 1,
) -> dict[str, Any]:
    """The difference of mean AUCs over runs, model ``b``'s against model ``a``'s, and its spread
    over the rows.

    Each resample draws ``len(labels)`` rows with replacement (one draw for all runs of both
    models: paired), recomputes every run's AUC on them and each model's mean over its runs.
    ``block > 1`` draws runs of ``block`` consecutive rows instead of single rows (a circular
    moving-block bootstrap): rows close in time are alike (the same hour's traffic), and single
    rows drawn apart take them for independent, which narrows the interval.

    The mean, not the median the seeds' tables report: the resampled rows add noise to every
    run's AUC, which moves the median of a few runs that fall in two clusters towards their mean,
    so a bootstrap of the median difference centres away from the median difference itself
    (by about its rows' std on the sample's validation block). The median difference is
    reported beside it, not resampled.

    Returns:
        ``rows``, ``positives``, ``resamples``, ``seed``, ``level``, ``block``; ``a`` and ``b``:
        :func:`dmt.seeds.summarize` of each run's AUC on the rows as given (``values``,
        ``median``, ``std`` over runs: the seeds' spread, ``mean``, ...); ``difference``: mean of
        ``b`` minus mean of ``a``; ``median_difference``: median of ``b`` minus median of ``a``;
        ``rows_std``: the mean difference's standard deviation over resamples (the rows'
        spread); ``interval``: its central ``level`` percentile interval; ``p_two_sided``: twice
        the smaller share of resamples on either side of 0, each share counted as
        ``(k + 1) / (resamples + 1)`` (never 0; at most 1); ``a_std_resampled``: the median over
        resamples of ``a``'s standard deviation over its runs, and ``within_a_std``: the share of
        resamples where the mean difference is within that resample's standard deviation of
        ``a`` (a criterion such as "within one standard deviation of the base" seen over the
        rows; NaN with one run of ``a``). Resampling repeats rows, which widens the runs' spread
        somewhat.
    """
    if not a or not b:
        raise ValueError("row_bootstrap: both models need at least one run")
    if resamples < 1:
        raise ValueError(f"row_bootstrap: resamples={resamples} must be >= 1")
    if not 0 < level < 1:
        raise ValueError(f"row_bootstrap: level={level} must be between 0 and 1")
    if seed < 0:  # NumPy's own message ("expected non-negative integer") names no seed
        raise ValueError(f"row_bootstrap: seed={seed} must be >= 0")
    y = np.asarray(labels, dtype=np.float64)
    n = len(y)
    if not 1 <= block <= n:
        raise ValueError(f"row_bootstrap: block={block} must be between 1 and the {n} rows")
    for p in (*a, *b):
        if len(p) != n:
            raise ValueError(f"row_bootstrap: a run has {len(p)} scores for {n} labels")
    ranked = [_ranked(_clamped(p)) for p in (*a, *b)]

    def aucs(weights: np.ndarray) -> tuple[list[float], list[float]]:
        positive, negative = weights * y, weights * (1.0 - y)
        values = [_auc_of_ranked(inv, d, positive, negative) for inv, d in ranked]
        return values[: len(a)], values[len(a) :]

    auc_a, auc_b = aucs(np.ones(n))
    rng = np.random.default_rng(seed)
    diffs = np.empty(resamples)
    a_stds = np.full(resamples, np.nan)
    offsets = np.arange(block)
    for i in range(resamples):
        starts = rng.integers(0, n, -(-n // block))  # enough blocks for n rows, cut to n
        rows = ((starts[:, None] + offsets) % n).reshape(-1)[:n]
        drawn = np.bincount(rows, minlength=n).astype(np.float64)
        if not 0 < drawn @ y < n:  # no AUC: its difference would be NaN
            raise ValueError(
                f"row_bootstrap: resample {i} drew rows of one class only ({n} rows, "
                f"{int(y.sum())} positive, block={block}); every resample needs both classes: "
                "use more rows or a smaller block"
            )
        ra, rb = aucs(drawn)
        diffs[i] = statistics.fmean(rb) - statistics.fmean(ra)
        if len(ra) > 1:
            a_stds[i] = statistics.stdev(ra)
    tail = (1 - level) / 2
    low, high = np.quantile(diffs, [tail, 1 - tail])
    below, above = int(np.sum(diffs <= 0)), int(np.sum(diffs >= 0))
    summary_a, summary_b = summarize(auc_a), summarize(auc_b)
    return {
        "rows": n,
        "positives": int(y.sum()),
        "resamples": resamples,
        "seed": seed,
        "level": level,
        "block": block,
        "a": summary_a,
        "b": summary_b,
        "difference": summary_b["mean"] - summary_a["mean"],
        "median_difference": summary_b["median"] - summary_a["median"],
        "rows_std": float(np.std(diffs, ddof=1)) if resamples > 1 else float("nan"),
        "interval": [float(low), float(high)],
        "p_two_sided": min(1.0, 2 * (min(below, above) + 1) / (resamples + 1)),
        "a_std_resampled": float(np.median(a_stds)) if len(a) > 1 else float("nan"),
        "within_a_std": float(np.mean(np.abs(diffs) <= a_stds)) if len(a) > 1 else float("nan"),
    }


def format_report(comparisons: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per comparison (``"B vs A"``: :func:`row_bootstrap`'s report): the means and
    medians, the mean difference, the seeds' and the rows' standard deviations, the interval,
    the p-value and the share of resamples within A's standard deviation."""
    lines = [
        "| comparison | mean A | mean B | B - A (means) | B - A (medians) | seeds' std A / B "
        "| rows' std | interval | p | within A's std |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in comparisons.items():
        std_a, std_b = r["a"]["std"], r["b"]["std"]
        stds = " / ".join("-" if math.isnan(s) else f"{s:.4f}" for s in (std_a, std_b))
        lo, hi = r["interval"]
        within = "-" if math.isnan(r["within_a_std"]) else f"{r['within_a_std']:.0%}"
        lines.append(
            f"| {name} | {r['a']['mean']:.4f} | {r['b']['mean']:.4f} | "
            f"{r['difference']:+.4f} | {r['median_difference']:+.4f} | {stds} | "
            f"{r['rows_std']:.4f} | [{lo:+.4f}, {hi:+.4f}] ({r['level']:.0%}) | "
            f"{r['p_two_sided']:.3g} | {within} |"
        )
    return "\n".join(lines)
