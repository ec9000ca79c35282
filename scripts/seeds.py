#!/usr/bin/env python
"""Repeated seeds and significance (paper §5.2, Table 6): train configs over K seeds, report the
median and standard deviation of a metric, and compare configs with the Mann-Whitney U test.

Each run is ``dmt.train.train`` in this process with ``trainer.seed=<seed>`` (weights and data
order; the synthetic world, ``data.synthetic.seed``, stays fixed), written to
``<out>/<config>/seed_<seed>/metrics.json``. Runs whose ``metrics.json`` exists are read, not
rerun, so an interrupted study resumes, and runs launched elsewhere (``--no-train``) are
collected, e.g. a Hydra multirun on a cluster::

    dmt-train -m experiment=paper_dmt_16t_dlrm trainer.seed='range(9)' \\
        hydra.sweep.dir=study/naive hydra.sweep.subdir='seed_${trainer.seed}'

The first ``--config`` is compared with every other one, or the pairs given with ``--pair A B``. Example (Table 6 on the CPU-sized
DMT-DLRM; ``tp.yaml`` from ``dmt-partition``)::

    python scripts/seeds.py --seeds 9 --out study \\
        --config tp "experiment=dmt_4t_dlrm partition=tp model.partition.path=tp.yaml" \\
        --config naive "experiment=dmt_4t_dlrm"

prints a table and writes ``study/seeds.json`` and ``study/seeds.png`` (a box plot of the metric
per config, every run a point).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scipy.stats import mannwhitneyu

ALTERNATIVES = ("two-sided", "greater", "less")


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median, sample standard deviation (``n - 1``), mean, min and max of one config's runs."""
    v = [float(x) for x in values]
    return {
        "n": len(v),
        "median": statistics.median(v),
        "std": statistics.stdev(v) if len(v) > 1 else float("nan"),
        "mean": statistics.fmean(v),
        "min": min(v),
        "max": max(v),
        "values": v,
    }


def compare(
    a: Sequence[float], b: Sequence[float], alternative: str = "two-sided", method: str = "auto"
) -> dict[str, Any]:
    """Mann-Whitney U test of ``a`` against ``b`` (``greater``: ``a`` tends to be larger).

    ``method`` is SciPy's: ``auto`` (its default) is exact below 8 runs a config without ties and
    the normal approximation with continuity correction otherwise; ``exact`` forces the former.
    """
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative={alternative!r}; expected one of {list(ALTERNATIVES)}")
    if len(a) < 2 or len(b) < 2:
        raise ValueError(
            f"the Mann-Whitney U test needs >= 2 runs a config, got {len(a)} and {len(b)}"
        )
    result = mannwhitneyu(a, b, alternative=alternative, method=method)
    return {
        "u": float(result.statistic),
        "p_value": float(result.pvalue),
        "alternative": alternative,
        "method": method,
        "median_difference": statistics.median(a) - statistics.median(b),
    }


def study(
    configs: dict[str, list[str]],
    seeds: Sequence[int],
    out: Path,
    *,
    metric: str = "test_auc",
    common: Sequence[str] = (),
    train_missing: bool = True,
    alternative: str = "two-sided",
    method: str = "auto",
    pairs: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Run (or read) every config at every seed; summary and comparisons as a JSON-able dict.

    ``pairs`` lists the ``(a, b)`` comparisons; by default the first config against each other.
    """
    names = list(configs)
    unknown = sorted({n for pair in pairs for n in pair} - set(names))
    if unknown:
        raise ValueError(f"--pair names unknown config(s) {unknown}; the configs are {names}")
    from dmt.train import compose_config, train  # noqa: PLC0415  (keeps --help fast)

    results: dict[str, Any] = {}
    for name, overrides in configs.items():
        values = []
        for seed in seeds:
            run_dir = out / name / f"seed_{seed}"
            path = run_dir / "metrics.json"
            if path.exists():
                metrics = json.loads(path.read_text())
            elif train_missing:
                args = [
                    *_quiet(list(common) + overrides),
                    *common,
                    *overrides,
                    f"trainer.seed={seed}",
                ]
                print(f"[{name} seed {seed}] dmt-train {' '.join(args)}", flush=True)
                metrics = train(compose_config(*args), run_dir)
            else:
                raise FileNotFoundError(f"{path} is missing (run without --no-train to train it)")
            if metric not in metrics:
                raise KeyError(f"{path} has no {metric!r} (has {sorted(metrics)})")
            values.append(metrics[metric])
        results[name] = {"overrides": [*common, *overrides], **summarize(values)}
    chosen = list(pairs) or [(names[0], other) for other in names[1:]]
    comparisons = [
        {"a": a, "b": b, **compare(results[a]["values"], results[b]["values"], alternative, method)}
        for a, b in chosen
    ]
    return {"metric": metric, "seeds": list(seeds), "configs": results, "comparisons": comparisons}


def _quiet(overrides: list[str]) -> list[str]:
    """No wandb and no progress bar unless the overrides say otherwise."""
    extra = []
    if not any(o.startswith(("logger=", "logger.")) for o in overrides):
        extra.append("logger=disabled")
    if not any(o.startswith("trainer.progress_bar=") for o in overrides):
        extra.append("trainer.progress_bar=false")
    return extra


def format_report(report: dict[str, Any]) -> str:
    metric = report["metric"]
    width = max(len("config"), *(len(n) for n in report["configs"]))
    lines = [
        f"{'config':{width}s}  {'n':>3s}  {'median ' + metric:>16s}  {'std':>8s}  {'mean':>8s}  {'min':>8s}  {'max':>8s}"
    ]
    for name, r in report["configs"].items():
        lines.append(
            f"{name:{width}s}  {r['n']:3d}  {r['median']:16.4f}  {r['std']:8.4f}  {r['mean']:8.4f}  "
            f"{r['min']:8.4f}  {r['max']:8.4f}"
        )
    for c in report["comparisons"]:
        lines.append(
            f"Mann-Whitney U ({c['alternative']}, {c['method']}) {c['a']} vs {c['b']}: U={c['u']:g}, "
            f"p={c['p_value']:.4g}, median difference {c['median_difference']:+.4f}"
        )
    return "\n".join(lines)


def box_plot(report: dict[str, Any], path: Path) -> None:
    """A box plot of the metric per config (median, quartiles, whiskers to 1.5 IQR), every run
    a point over it; written to ``path`` through a temporary file."""
    from matplotlib.figure import Figure  # noqa: PLC0415 (slow import; no pyplot)

    from dmt.history import save_figure  # noqa: PLC0415

    names = list(report["configs"])
    values = [report["configs"][n]["values"] for n in names]
    fig = Figure(figsize=(max(4.0, 1.4 * len(names) + 2), 4), layout="constrained")
    ax = fig.subplots()
    ax.boxplot(values, tick_labels=names, showfliers=False)
    for i, v in enumerate(values, start=1):
        ax.plot([i] * len(v), v, "o", color="tab:blue", alpha=0.6, markersize=4)
    ax.set_ylabel(report["metric"])
    ax.set_title(f"{report['metric']} per config, {len(report['seeds'])} seeds")
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path)


def parse_seeds(text: str) -> list[int]:
    """``9`` (seeds 0..8), ``3-7`` (3..7) or ``0,4,5``."""
    if "," in text:
        return [int(s) for s in text.split(",")]
    if "-" in text:
        lo, hi = (int(s) for s in text.split("-"))
        return list(range(lo, hi + 1))
    return list(range(int(text)))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        nargs=2,
        action="append",
        metavar=("NAME", "OVERRIDES"),
        required=True,
        help="a config: its name and its Hydra overrides in one quoted string (repeat)",
    )
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=parse_seeds("9"),
        help="K (seeds 0..K-1), LO-HI or a comma list (default 9, as the paper)",
    )
    parser.add_argument("--out", type=Path, required=True, help="study directory")
    parser.add_argument(
        "--common", default="", help="Hydra overrides for every config (one quoted string)"
    )
    parser.add_argument(
        "--metric", default="test_auc", help="metric from metrics.json (default test_auc)"
    )
    parser.add_argument(
        "--alternative",
        choices=ALTERNATIVES,
        default="two-sided",
        help="Mann-Whitney alternative for the first config against each other one",
    )
    parser.add_argument(
        "--pair",
        nargs=2,
        action="append",
        default=[],
        metavar=("A", "B"),
        help="compare config A with config B (repeat); default: the first config with each other",
    )
    parser.add_argument(
        "--method",
        choices=("auto", "exact", "asymptotic"),
        default="auto",
        help="SciPy's Mann-Whitney method (default auto: exact only below 8 runs)",
    )
    parser.add_argument(
        "--no-train", action="store_true", help="only read existing metrics.json files"
    )
    args = parser.parse_args(argv)
    configs = {name: shlex.split(overrides) for name, overrides in args.config}
    if len(configs) != len(args.config):
        parser.error("config names must be unique")
    report = study(
        configs,
        args.seeds,
        args.out,
        metric=args.metric,
        common=shlex.split(args.common),
        train_missing=not args.no_train,
        alternative=args.alternative,
        method=args.method,
        pairs=[tuple(pair) for pair in args.pair],
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seeds.json").write_text(json.dumps(report, indent=2) + "\n")
    box_plot(report, args.out / "seeds.png")
    print(format_report(report))
    print(f"written to {args.out / 'seeds.json'} and {args.out / 'seeds.png'}")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
