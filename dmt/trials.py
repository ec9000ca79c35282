"""The trials of a sweep side by side: ``trials.csv``, ``trials.md`` and ``trials.png``.

A Hydra multirun (``dmt-train -m ...``, e.g. ``hparams_search=criteo_forward_dlrm``, an Optuna
sweep) leaves one run directory per trial in its sweep directory, each with ``metrics.json`` and
``.hydra/overrides.yaml``. :class:`TrialsTable` (a Hydra callback, ``conf/config.yaml``) reads
them after every job and when the multirun ends (a sweep the Optuna sweeper stops early, e.g.
when every trial failed, keeps its table) and writes, into the sweep directory:

- ``trials.csv``: one row per trial, in trial order: ``trial`` (``hydra.job.num``: Optuna's
  trial number in a new study), ``status`` (``ok``, or ``failed``: no ``metrics.json``, no
  finite value of the metric, or a run that diverged, :func:`divergence`: its last training
  loss or its predictions not finite), the metric the sweep optimizes (``trainer.optimize_metric``),
  ``best_so_far``, the sampled settings (the keys the sweep sweeps, and any other override that
  differs between trials; the sweep's fixed command line is the same in every trial and left
  out), then the trial's other validation metrics (logloss, NE, calibration) and its training
  throughput. Test metrics are left out on purpose: settings are chosen on validation rows only
  (each trial's ``metrics.json`` still has them). Two multiruns in one sweep directory (seeds
  added by a second one) number their jobs alike: a ``run`` column then names each trial's
  directory.
- ``trials.md``: the same table in Markdown, under a line naming the best trial and its settings.
- ``trials.png``: the metric per trial and the best so far.

The Optuna sweeper writes the best settings to ``optimization_results.yaml`` beside them.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from dmt.history import save_figure
from dmt.results import write_atomic
from dmt.run_dir import METRICS_FILE, launch_rank

log = logging.getLogger(__name__)

TRIALS_CSV = "trials.csv"
TRIALS_MD = "trials.md"
TRIALS_PNG = "trials.png"
#: a trial's run directory holds these (Hydra writes them before the trial runs)
OVERRIDES_FILE = ".hydra/overrides.yaml"
HYDRA_FILE = ".hydra/hydra.yaml"
#: other metrics of a trial in the table (besides its other ``val_*`` ones)
EXTRA_METRICS = ("train_samples_per_s",)


@dataclass(frozen=True)
class Trial:
    """One run of a sweep, as its directory records it."""

    number: int
    """``hydra.job.num``: the job's index in the sweep (Optuna's trial number in a new study)."""
    directory: Path
    """The trial's run directory."""
    overrides: dict[str, str]
    """Its Hydra overrides, ``key -> value`` (``.hydra/overrides.yaml``), in their order."""
    metrics: dict[str, float] | None
    """Its ``metrics.json``; None when it wrote none (it failed before the end)."""

    def value(self, metric: str) -> float | None:
        """The trial's ``metric``; None if it has none, it is not finite, or the run diverged
        (:func:`divergence`: a saturated model's finite AUC is no result): a failed trial."""
        v = None if self.metrics is None else self.metrics.get(metric)
        if not isinstance(v, int | float) or not math.isfinite(v):
            return None
        return None if divergence(self.metrics or {}, metric) is not None else float(v)


def reads_the_model(metric: str) -> bool:
    """Whether ``metric`` measures what the model learned (a split's metric, the training loss),
    which a run that diverged leaves without meaning; its throughput or step count keep theirs."""
    return metric.startswith(("val_", "test_")) or metric == "train_loss_last"


def divergence(metrics: Mapping[str, Any], metric: str | None = None) -> str | None:
    """What shows that a run diverged, or None: its last training loss is not finite, or a
    split's logloss is NaN over rows (predictions that were not finite: a finite one's logloss
    is finite, clamped; :func:`dmt.metrics.click_metrics`). The loss alone misses a run whose
    last step made the weights NaN: that step's loss was computed before it. A NaN loss beside
    a NaN ``train_samples_per_s`` is none: an attempt that trained nothing, whose checkpoint
    (an earlier dmt's) recorded neither figure. Values that are not numbers show nothing.
    With ``metric``: None where that metric does not read the model (:func:`reads_the_model`:
    ``train_samples_per_s`` of a diverged run is still its throughput)."""
    if metric is not None and not reads_the_model(metric):
        return None

    def number(key: str) -> float:
        value = metrics.get(key)
        return float(value) if isinstance(value, int | float) else 0.0

    loss = number("train_loss_last")
    unknown = math.isnan(loss) and math.isnan(number("train_samples_per_s"))
    if not math.isfinite(loss) and not unknown:
        return f"train_loss_last={loss}"
    for split in ("val", "test"):
        rows = number(f"{split}_num_samples")
        if rows > 0 and math.isnan(number(f"{split}_logloss")):
            return (
                f"train_loss_last={loss}, but {split}_logloss=nan over {rows:.0f} rows: its "
                "predictions are not finite"
            )
    return None


def read_trials(sweep_dir: str | Path) -> list[Trial]:
    """The trials under ``sweep_dir`` (every directory with ``.hydra/overrides.yaml``), sorted by
    trial number."""
    sweep_dir = Path(sweep_dir)
    trials = []
    for overrides_file in sweep_dir.glob(f"**/{OVERRIDES_FILE}"):
        run_dir = overrides_file.parent.parent
        overrides: dict[str, str] = {}
        try:
            items = yaml.safe_load(overrides_file.read_text()) or []
        except (OSError, ValueError, yaml.YAMLError) as e:
            items = e
        if not isinstance(items, list):  # a damaged file: named, not a traceback from yaml
            raise ValueError(
                f"{overrides_file}: expected Hydra's YAML list of overrides, found "
                f"{type(items).__name__}: {' '.join(str(items).split())}"
            )
        for item in items:
            key, _, value = str(item).partition("=")
            overrides[key] = value
        hydra_file = run_dir / HYDRA_FILE
        try:
            number = (
                int(yaml.safe_load(hydra_file.read_text())["hydra"]["job"]["num"])
                if hydra_file.is_file()
                else int(run_dir.name)
            )
        except (KeyError, TypeError, ValueError, yaml.YAMLError) as e:
            raise ValueError(
                f"{run_dir}: holds {OVERRIDES_FILE} but no trial number (expected hydra.job.num "
                f"in {HYDRA_FILE}, or a directory named by the number): {type(e).__name__}: "
                f"{' '.join(str(e).split())}; "
                "move what is not a trial of the sweep out of its directory"
            ) from e
        metrics_file = run_dir / METRICS_FILE
        metrics = _read_metrics(metrics_file) if metrics_file.is_file() else None
        trials.append(Trial(number, run_dir, overrides, metrics))
    return sorted(trials, key=lambda t: (t.number, str(t.directory)))


def _read_metrics(path: Path) -> dict[str, float]:
    """A trial's ``metrics.json``; ``ValueError`` naming the file when it is not a JSON object
    (a damaged file failed with a bare ``JSONDecodeError`` that named no file)."""
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(
            f"{path}: not a readable metrics.json ({type(e).__name__}: {e}); move it, or the "
            "trial's directory, out of the sweep"
        ) from e
    if not isinstance(metrics, dict):
        raise ValueError(
            f"{path}: expected a JSON object of metrics, found {type(metrics).__name__}"
        )
    return metrics


def varying_overrides(trials: list[Trial], swept: Collection[str] = ()) -> list[str]:
    """The override keys whose values differ between ``trials`` (or that some trials lack), and
    the ``swept`` ones (the sweep's search space, :func:`swept_keys`: a setting every trial drew
    alike, or the only trial's, is still a sampled setting), in the order they first appear."""
    keys: dict[str, None] = {}
    for t in trials:
        keys.update(dict.fromkeys(t.overrides))
    return [k for k in keys if k in swept or len({t.overrides.get(k) for t in trials}) > 1]


def swept_keys(config: DictConfig) -> list[str]:
    """The keys a multirun sweeps: its sweeper's search space (``hydra.sweeper.params``, e.g.
    Optuna's) and the sweep overrides of its command line (``key=a,b``, ``key=choice(...)``: a
    multirun's ``hydra.overrides.task``; a job's holds its own single values)."""
    keys = [str(k) for k in OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}]
    # unresolved: an override's own interpolation (``dir=/data/t${.frequency_threshold}``) is
    # the job's to resolve; resolved here, relative to the list, it raised
    node = OmegaConf.select(config, "hydra.overrides.task", default=None)
    raw = OmegaConf.to_container(node) if OmegaConf.is_list(node) else []
    task = [str(o) for o in raw] if isinstance(raw, list) else []
    try:
        parsed = OverridesParser.create().parse_overrides(task)
    except Exception as e:  # noqa: BLE001 - a table without those columns, not a failed sweep
        log.warning("could not read the sweep's overrides %s: %s", task, e)
        parsed = []
    keys += [o.get_key_element() for o in parsed if o.is_sweep_override()]
    return list(dict.fromkeys(keys))


def trial_names(trials: list[Trial], sweep_dir: str | Path) -> list[str]:
    """A name per trial: ``trial<N>``, or, when two trials share a number (two multiruns wrote
    into one sweep directory, e.g. seeds added by a second one), its directory under
    ``sweep_dir`` (``/`` as ``_``) for every trial."""
    numbers = [t.number for t in trials]
    if len(set(numbers)) == len(numbers):
        return [f"trial{n}" for n in numbers]
    root = Path(sweep_dir).resolve()
    return [str(t.directory.resolve().relative_to(root)).replace("/", "_") for t in trials]


def trials_table(
    trials: list[Trial],
    metric: str,
    *,
    maximize: bool = True,
    swept: Collection[str] = (),
    sweep_dir: str | Path | None = None,
) -> tuple[list[str], list[dict[str, Any]]]:
    """The table's columns and rows (one per trial, in the order of ``trials``).

    ``best_so_far`` is the best ``metric`` of this trial and those before it (None until a trial
    succeeds); failed trials have None for every metric. When two trials share a number (two
    multiruns in one sweep directory, :func:`trial_names`), a ``run`` column names each trial's
    directory under ``sweep_dir``.
    """
    params = varying_overrides(trials, swept)
    runs = None
    if sweep_dir is not None and len({t.number for t in trials}) < len(trials):
        runs = trial_names(trials, sweep_dir)
    others = sorted(
        {
            k
            for t in trials
            for k in (t.metrics or {})
            if k != metric
            and ((k.startswith("val_") and not k.endswith("num_samples")) or k in EXTRA_METRICS)
        }
    )
    columns = ["trial", *(["run"] if runs else []), "status", metric, "best_so_far"]
    columns += [*params, *others]
    rows = []
    best: float | None = None
    for i, t in enumerate(trials):
        value = t.value(metric)
        if value is not None and (best is None or (value > best if maximize else value < best)):
            best = value
        row: dict[str, Any] = {"trial": t.number}
        if runs:
            row["run"] = runs[i]
        row |= {
            "status": "ok" if value is not None else "failed",
            metric: value,
            "best_so_far": best,
        }
        row.update({k: t.overrides.get(k) for k in params})
        row.update({k: t.value(k) if value is not None else None for k in others})
        rows.append(row)
    return columns, rows


def best_row(rows: list[dict[str, Any]], metric: str, *, maximize: bool = True) -> dict[str, Any]:
    """The row with the best ``metric`` (the first of equal ones).

    Raises:
        ValueError: no trial has a value of ``metric``.
    """
    ok = [r for r in rows if r[metric] is not None]
    if not ok:
        raise ValueError(f"no trial has a value of {metric!r}: every trial failed")
    sign = 1.0 if maximize else -1.0
    return max(ok, key=lambda r: sign * r[metric])


def _no_value(metric: str, metrics: list[dict[str, float] | None]) -> str:
    """Why no trial has a value of ``metric``: no ``metrics.json`` has that key (a mistyped
    name, naming those it has), or every trial that has one failed (not finite)."""
    written = [m for m in metrics if m is not None]
    if written and not any(metric in m for m in written):
        keys = sorted(set().union(*written))
        return f"no trial's metrics.json has {metric!r}; they have {keys}"
    return f"no trial has a value of {metric!r}: every trial failed"


def top_trials(trials: list[Trial], metric: str, k: int, *, maximize: bool = True) -> list[Trial]:
    """The ``k`` trials with the best ``metric``, best first (ties: lower trial number first);
    failed trials are left out.

    A sweep's best single-seed value flatters its trial (the winner's curse: with ~40 trials,
    seed noise of ~0.001 AUC picks a lucky draw), so ``scripts/confirm_trials.py`` runs these again
    over more seeds and chooses on their median.

    Raises:
        ValueError: ``k < 1``, or no trial has a value of ``metric``.
    """
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    ok = [t for t in trials if t.value(metric) is not None]
    if not ok:
        raise ValueError(_no_value(metric, [t.metrics for t in trials]))
    sign = -1.0 if maximize else 1.0
    return sorted(ok, key=lambda t: (sign * (t.value(metric) or 0.0), t.number))[:k]


def override_list(trial: Trial) -> list[str]:
    """The trial's Hydra overrides as ``key=value`` strings, in their order: enough to run it
    again (``dmt-train <overrides> trainer.seed=<seed>``)."""
    return [f"{key}={value}" for key, value in trial.overrides.items()]


def write_trials(
    sweep_dir: str | Path,
    metric: str,
    *,
    maximize: bool = True,
    title: str | None = None,
    swept: Collection[str] = (),
) -> list[Path]:
    """Write ``trials.csv``, ``trials.md`` and ``trials.png`` into ``sweep_dir``, each whole or
    not at all (a temporary file, then a rename: a job's table and the multirun's may overlap).

    Args:
        sweep_dir: the sweep directory (``hydra.sweep.dir``).
        metric: the metric the sweep optimizes (``trainer.optimize_metric``).
        maximize: whether higher values of ``metric`` are better.
        title: the plot's title (default: the sweep directory's path).
        swept: the sweep's swept keys (:func:`swept_keys`), columns even where every trial has
            the same value.

    Returns:
        list[Path]: the files written; none when ``sweep_dir`` holds no trial.
    """
    sweep_dir = Path(sweep_dir)
    trials = read_trials(sweep_dir)
    if not trials:
        log.warning("no trials (run directories with %s) in %s", OVERRIDES_FILE, sweep_dir)
        return []
    columns, rows = trials_table(
        trials, metric, maximize=maximize, swept=swept, sweep_dir=sweep_dir
    )

    def write_csv(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)

    params = varying_overrides(trials, swept)
    markdown = _markdown(columns, rows, metric, params, maximize=maximize)
    return [
        write_atomic(sweep_dir / TRIALS_CSV, write_csv),
        write_atomic(sweep_dir / TRIALS_MD, lambda tmp: tmp.write_text(markdown)),
        _plot(rows, metric, sweep_dir / TRIALS_PNG, title=title or str(sweep_dir)),
    ]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 100 else f"{value:.0f}"  # AUCs; throughputs
    return str(value).replace("|", "\\|")


def _markdown(
    columns: list[str],
    rows: list[dict[str, Any]],
    metric: str,
    params: list[str],
    *,
    maximize: bool,
) -> str:
    failed = sum(r["status"] != "ok" for r in rows)
    try:
        best = best_row(rows, metric, maximize=maximize)
        # a column another multirun in the sweep directory set is None in trials without it
        settings = ", ".join(f"`{k}={best[k]}`" for k in params if best[k] is not None)
        which = f"trial {best['trial']}" + (f" ({best['run']})" if "run" in best else "")
        summary = (
            f"Best of {len(rows)} trials ({failed} failed): {which}, "
            f"{metric} {best[metric]:.4f}" + (f": {settings}" if settings else "")
        )
    except ValueError as e:
        summary = str(e)
    lines = [
        summary,
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in rows),
    ]
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict[str, Any]], metric: str, path: Path, *, title: str) -> Path:
    from matplotlib.figure import Figure  # noqa: PLC0415 - only when a multirun ends
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    ok = [r for r in rows if r[metric] is not None]
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot([r["trial"] for r in ok], [r[metric] for r in ok], "o", label=f"{metric} per trial")
    ax.step(
        [r["trial"] for r in ok],
        [r["best_so_far"] for r in ok],
        where="post",
        label="best so far",
    )
    failed = [r["trial"] for r in rows if r[metric] is None]
    if failed:
        for x in failed:
            ax.axvline(x, color="tab:red", alpha=0.3, lw=1)
        ax.plot([], [], color="tab:red", alpha=0.3, label=f"failed ({len(failed)})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    save_figure(fig, path, dpi=120)
    return path


def _maximize(config: DictConfig) -> bool:
    """The sweeper's direction (Optuna's ``hydra.sweeper.direction``); maximize without one."""
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    if isinstance(direction, list | tuple) or OmegaConf.is_list(direction):
        direction = direction[0] if len(direction) else None
    name = getattr(direction, "name", direction)
    return str(name).lower() != "minimize"


class TrialsTable(Callback):
    """Hydra callback: after every job of a multirun and when the multirun ends, write its
    ``trials.csv``, ``trials.md`` and ``trials.png`` into the sweep directory
    (:func:`write_trials`), for ``trainer.optimize_metric``, in the sweeper's direction (maximize
    when it has none). After every job too: a sweep that stops before its end (the Optuna
    sweeper raises when every trial failed, or too many did) keeps the table of its trials."""

    def __init__(self) -> None:
        #: the multirun's swept keys, from its own config (a job's config holds only the job's
        #: values of keys swept on the command line); travels with the callback to the jobs
        self.swept: list[str] | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.swept = swept_keys(config)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        mode = OmegaConf.select(config, "hydra.mode", default=None)
        if getattr(mode, "name", mode) != RunMode.MULTIRUN.name:  # an enum, or its name
            return
        self._write(config, announce=False)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._write(config, announce=True)

    def _write(self, config: DictConfig, *, announce: bool) -> None:
        if launch_rank() != 0:
            # every rank of a multi-process sweep runs the callback; rank 0 alone writes the
            # table, after the last trial's metrics.json, which it writes itself
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        metric = str(OmegaConf.select(config, "trainer.optimize_metric", default="val_auc"))
        swept = [*(self.swept or []), *swept_keys(config)]
        written = write_trials(sweep_dir, metric, maximize=_maximize(config), swept=swept)
        if written and announce:
            log.info("trials of the sweep: %s", ", ".join(str(p) for p in written))
