"""Repeated seeds and significance (paper §5.2, Table 6), as a library: train configs over K seeds,
summarize a metric per config (median, standard deviation), compare configs with the Mann-Whitney
U test, and draw a box plot. ``scripts/seeds.py`` is its command line; ``scripts/confirm_trials.py``
uses it to run a sweep's best trials again.

Each run is ``dmt.train.train`` in this process with ``trainer.seed=<seed>``, written to
``<out>/<config>/seed_<seed>/metrics.json``, with the overrides it trained with in
``seed_run.json`` beside it (written before the run trains; with a ``tp`` partition file, that
file's towers too). Runs whose ``metrics.json`` exists are read back, not rerun, and only if they
trained with the same overrides (a study's config given other settings is refused, not reported
with the old run's figures; a run without ``seed_run.json``, e.g. of a Hydra multirun, is checked
by its ``.hydra/config.yaml``) and, with a ``tp`` partition, the towers its file holds now (a
file replaced since, by ``dmt-partition --overwrite`` or an edit, is refused too; a run whose
towers are not recorded, in ``seed_run.json``, ``metrics.json`` or a checkpoint's
``config.yaml``, is read with a warning); a run that has
``seed_run.json`` (or a Hydra multirun's job: ``.hydra/config.yaml``) and a checkpoint but no
``metrics.json`` (the call stopped while it trained) goes on from its latest checkpoint
(``trainer.resume_from=auto``, unless its overrides set ``trainer.resume_from``), under the same
check; without a checkpoint it starts afresh. A run directory with outputs but neither record is
refused before any run trains.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from scipy.stats import mannwhitneyu

from dmt.results import _one_line, existing_output, write_json
from dmt.run_dir import outputs_of
from dmt.trials import divergence

ALTERNATIVES = ("two-sided", "greater", "less")
#: beside each run's metrics.json: the overrides it trained with
RUN_FILE = "seed_run.json"
#: a run of a Hydra multirun (no RUN_FILE): the config it ran
HYDRA_RECORD = ".hydra/config.yaml"
#: in RUN_FILE: the tp partition file that gave the run's towers and those towers (None: none did)
PARTITION_KEY = "partition"
#: settings a resume may change (:func:`dmt.checkpoint.config_differences`) that change what a
#: run's evaluation reports: a run collected by its Hydra record must match them too
READ_BY_EVALUATION = ("trainer.eval_max_batches", "trainer.ema_decay")


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median, sample standard deviation (``n - 1``), mean, min and max of one config's runs.

    A run whose metric is not finite (it diverged: NaN) makes them all NaN, and ``non_finite``
    counts such runs: a config that does not always train is not summarized by the rest."""
    v = [float(x) for x in values]
    bad = sum(not math.isfinite(x) for x in v)
    if bad:
        nan = float("nan")
        stats = dict.fromkeys(("median", "std", "mean", "min", "max"), nan)
        return {"n": len(v), **stats, "non_finite": bad, "values": v}
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

    ``method`` is SciPy's: ``auto`` (its default) is exact when either config has at most 8 runs
    and no value is tied, and the normal approximation with continuity correction otherwise (9
    seeds against 9: the approximation); ``exact`` forces the former.
    """
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative={alternative!r}; expected one of {list(ALTERNATIVES)}")
    if len(a) < 2 or len(b) < 2:
        raise ValueError(
            f"the Mann-Whitney U test needs >= 2 runs a config, got {len(a)} and {len(b)}"
        )
    if not all(math.isfinite(float(x)) for x in [*a, *b]):  # a diverged run: no ranks
        nan = float("nan")
        keys = ("u", "p_value", "median_difference")
        return {**dict.fromkeys(keys, nan), "alternative": alternative, "method": method}
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
    Every run is checked before the first one trains: the runs found are read back (same
    settings, the metric present), and the config of every missing one is composed and validated
    (``ValueError``, one line, for a bad override or setting, a ``metric`` its runs do not
    report or would all report as NaN (a validation metric of data without validation rows), or
    a config name that is not a single directory name), so that a mistake in a later config does
    not stop the study after the earlier ones trained.
    """
    names = list(configs)
    for name in names:
        if not is_directory_name(name):
            raise ValueError(
                f"config name {name!r}: its runs go to {out}/<name>/; give a single directory "
                "name (no '/', not '.' or '..')"
            )
    unknown = sorted({n for pair in pairs for n in pair} - set(names))
    if unknown:
        raise ValueError(f"--pair names unknown config(s) {unknown}; the configs are {names}")
    if not seeds:
        raise ValueError("no seeds to run")
    if len(seeds) < 2 and (pairs or len(names) > 1):  # before any training, not after it
        raise ValueError(
            f"seeds {list(seeds)}: comparing configs (Mann-Whitney U) needs at least 2 seeds"
        )
    from dmt.train import train  # noqa: PLC0415  (keeps --help fast)

    runs = []  # a loop, not a comprehension: _check_same_run's warning names study's caller
    for name, overrides in configs.items():
        for seed in seeds:
            runs.append(_plan_run(name, overrides, seed, out, metric, common, train_missing))
    values: dict[str, list[float]] = {name: [] for name in names}
    for run in runs:
        metrics = run.metrics
        if metrics is None:  # to train (checked above with every other run)
            assert run.cfg is not None
            if not run.resume:  # nothing trained here yet (or nothing kept): the run's settings
                record = {"config": run.name, "overrides": run.settings}
                write_json(run.run_dir / RUN_FILE, {**record, PARTITION_KEY: _file_towers(run)})
            print(f"[{run.name} seed {run.seed}] dmt-train {' '.join(run.args)}", flush=True)
            metrics = train(run.cfg, run.run_dir)
            if metric not in metrics:
                path = run.run_dir / "metrics.json"
                raise ValueError(f"{path} has no {metric!r} (has {sorted(metrics)})")
        values[run.name].append(_value(run, metrics, metric))
    results: dict[str, Any] = {
        name: {"overrides": [*common, *overrides], **summarize(values[name])}
        for name, overrides in configs.items()
    }
    chosen = list(pairs) or [(names[0], other) for other in names[1:]]
    comparisons = [
        {"a": a, "b": b, **compare(results[a]["values"], results[b]["values"], alternative, method)}
        for a, b in chosen
    ]
    return {"metric": metric, "seeds": list(seeds), "configs": results, "comparisons": comparisons}


def _value(run: _Run, metrics: dict[str, Any], metric: str) -> float:
    """The run's ``metric``, NaN for a run that diverged (:func:`dmt.trials.divergence`: its last
    training loss or its predictions not finite) even where the metric is finite (a saturated
    model's AUC of 0.5 beside an infinite loss), as the sweepers and the trials table count it:
    :func:`summarize` then counts it among the runs that are not finite."""
    evidence = divergence(metrics, metric)
    if evidence is None:
        return float(metrics[metric])
    print(
        f"[{run.name} seed {run.seed}] diverged ({evidence}): its {metric} "
        f"{metrics[metric]} is no result, counted as not finite",
        flush=True,
    )
    return math.nan


def check_seeds_argument(argv: Sequence[str]) -> None:
    """``python -c '...' SCRIPT SEEDS [CONFIGS]`` of the study scripts: exit with ``SCRIPT: SEEDS
    'TEXT': why`` when :func:`parse_seeds` refuses ``SEEDS``, or when a study of more than one
    config (``CONFIGS``, default 2) gets one seed, which :func:`study` refuses (before their
    expensive steps: the base training and the partitions)."""
    script, text, *configs = argv
    try:
        seeds = parse_seeds(text)
    except ValueError as e:  # "--seeds TEXT: why"
        raise SystemExit(f"{script}: SEEDS {text!r}: {str(e).partition(': ')[2] or e}") from None
    if len(seeds) < 2 and int(configs[0] if configs else 2) > 1:
        raise SystemExit(
            f"{script}: SEEDS {text!r}: seeds {seeds}: comparing configs (Mann-Whitney U) needs "
            "at least 2 seeds"
        )


def check_scored_runs(argv: Sequence[str]) -> None:
    """``python -c '...' SCRIPT OUT SEEDS NAME...`` of ``dmt_projection_study.sh`` with
    ``ROWS=1``, before it trains: exit with ``SCRIPT: why`` where a run's ``pred_val.npz`` or
    ``pred_test.npz`` in ``OUT/NAME/seed_<S>``, which the study reads rather than scores again,
    is not that run's scores on its whole split as it ended (:func:`scored_predictions_problem`)."""
    script, out, text, *names = argv
    for name in names:
        for seed in parse_seeds(text):
            for split in ("val", "test"):
                why = scored_predictions_problem(Path(out) / name / f"seed_{seed}", split)
                if why is not None:
                    raise SystemExit(f"{script}: {why}")


def scored_predictions_problem(run_dir: Path, split: str) -> str | None:
    """Why ``run_dir/pred_<split>.npz`` is not the run's scores on its whole ``split`` as it
    ended (``dmt-eval --predictions`` of its final checkpoint), by the ``eval_<split>.json``
    dmt-eval wrote with it and the run's ``metrics.json``: the same file, split (``test`` of a
    run with ``data.criteo.test_path`` is recorded as ``test (<that file>)``), step
    (``num_steps``), rows (``<split>_num_samples``) and a checkpoint in the run's own checkpoint
    directory (:func:`_run_checkpoint_dir`); None where it is, or where there is none."""
    pred = run_dir / f"pred_{split}.npz"
    if not pred.exists():
        return None
    report_path = run_dir / f"eval_{split}.json"
    again = f"move {pred} and {report_path} away to score the run again"
    if not (run_dir / "metrics.json").exists():
        return (
            f"{pred} is of a run that has not ended (no {run_dir / 'metrics.json'}): it is not "
            f"the scores of the run's last checkpoint; {again}"
        )
    try:
        report = json.loads(report_path.read_text())
        metrics = _read_metrics(run_dir / "metrics.json")
        if not isinstance(report, dict):
            raise ValueError(f"expected a JSON object, found {type(report).__name__}")
    except (OSError, ValueError) as e:  # missing, JSONDecodeError, UnicodeDecodeError
        return (
            f"{pred}: what it scored cannot be checked ({report_path}, written with it by "
            f"dmt-eval: {type(e).__name__}: {e}); {again}"
        )
    data = report.get("data")
    found = {
        "predictions": Path(str(report.get("predictions"))).name,
        "data": split if _names_split(data, split) else data,
        "step": report.get("step"),
        "rows": report.get("rows"),
    }
    wanted = {
        "predictions": pred.name,
        "data": split,
        "step": metrics.get("num_steps"),  # the step of the run's last checkpoint
        "rows": metrics.get(f"{split}_num_samples"),
    }
    differences = [
        f"{key} {_count(found[key])} (the run's: {_count(want)})"
        for key, want in wanted.items()
        if want is not None and found[key] != want
    ]
    scored = report.get("checkpoint")
    own = (
        None
        if _in_checkpoint_dir(scored, run_dir / "checkpoints")
        else _run_checkpoint_dir(run_dir)
    )
    if own is not None and not _in_checkpoint_dir(scored, own, run_dir):
        differences.append(f"checkpoint {scored!r} (the run's: a step_N in {str(own)!r})")
    if not differences:
        return None
    return (
        f"{pred} is not run {run_dir}'s scores on its whole {split} split as it ended: "
        f"{report_path} records {', '.join(differences)}; {again}"
    )


def _in_checkpoint_dir(scored: Any, own: Path, run_dir: Path | None = None) -> bool:
    """Whether dmt-eval's recorded ``checkpoint`` ``scored`` is a step directory in ``own``, the
    run's checkpoint directory; with ``run_dir``, also where the run directory was moved since
    (``scored`` is gone) and ``own`` is inside it: ``scored`` ends in the run directory's name and
    ``own``'s path in it (another run's directory has another name)."""
    if not isinstance(scored, str):
        return False
    parent = Path(scored).parent
    if parent.resolve() == own.resolve():
        return True
    if run_dir is None or Path(scored).exists() or not own.is_relative_to(run_dir):
        return False
    tail = (run_dir.name, *own.relative_to(run_dir).parts)
    return parent.parts[-len(tail) :] == tail


def _run_checkpoint_dir(run_dir: Path) -> Path | None:
    """The directory the run in ``run_dir`` wrote its checkpoints to: its
    ``trainer.checkpoint_dir`` (relative to ``run_dir``, or absolute) as its :data:`RUN_FILE`'s
    overrides compose it, or as its Hydra record ``.hydra/config.yaml`` holds it (the default,
    ``checkpoints``, where it has neither); None where its overrides no longer compose."""
    from dmt.checkpoint import flatten_keys  # noqa: PLC0415

    config: dict[str, Any] = {}
    try:
        if (run_dir / RUN_FILE).is_file():
            overrides = json.loads((run_dir / RUN_FILE).read_text()).get("overrides")
            config = _config_of(str(run_dir), list(overrides))
        elif (run_dir / HYDRA_RECORD).is_file():
            config = yaml.safe_load((run_dir / HYDRA_RECORD).read_text()) or {}
    except (OSError, TypeError, ValueError, AttributeError, yaml.YAMLError):
        return None  # unreadable or an older dmt's: what it ran cannot be read
    return run_dir / str(flatten_keys(config).get("trainer.checkpoint_dir", "checkpoints"))


def _names_split(data: Any, split: str) -> bool:
    """Whether ``data`` of a dmt-eval report is the run's own ``split`` (``--data split``): its
    name, or, for ``test`` of a Criteo run with ``data.criteo.test_path``, ``test (<the file>)``
    (:func:`dmt.evaluate.open_data`; data named by a path is recorded as that path)."""
    if data == split:
        return True
    return (
        split == "test"
        and isinstance(data, str)
        and data.startswith("test (")
        and data.endswith(")")
    )


def _count(value: Any) -> str:
    """A JSON count as it reads (``343.0``: ``343``), anything else as ``repr``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)


def is_directory_name(name: str) -> bool:
    """Whether ``name`` is one directory's name inside another (no ``/``, not ``.`` or ``..``,
    not empty): a config's runs go to ``<out>/<name>/``, never outside ``<out>``."""
    return name not in ("", ".", "..") and "/" not in name and "\x00" not in name


@dataclass
class _Run:
    """One run of a study: read back (``metrics``) or to train (``cfg``, composed and checked)."""

    name: str
    seed: int
    run_dir: Path
    settings: list[str]
    metrics: dict[str, Any] | None = None
    cfg: Any = None
    args: list[str] = field(default_factory=list)
    resume: bool = False
    partition_file: str | None = None  # the tp partition file its towers come from


def _plan_run(
    name: str,
    overrides: list[str],
    seed: int,
    out: Path,
    metric: str,
    common: Sequence[str],
    train_missing: bool,
) -> _Run:
    """Config ``name``'s run at ``seed``, checked (``ValueError``) before any run trains."""
    run_dir = out / name / f"seed_{seed}"
    path = run_dir / "metrics.json"
    settings = [*common, *overrides, f"trainer.seed={seed}"]
    run = _Run(name, seed, run_dir, settings)
    if path.exists():
        _check_same_run(run_dir, name, settings)
        run.metrics = _read_metrics(path)
        if metric not in run.metrics:
            raise ValueError(f"{path} has no {metric!r} (has {sorted(run.metrics)})")
        return run
    if not train_missing:
        raise ValueError(f"{path} is missing (run without --no-train to train it)")
    from hydra.errors import HydraException  # noqa: PLC0415  (keeps --help fast)
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    from dmt.train import (  # noqa: PLC0415
        compose_config,
        run_metric_names,
        to_config,
        undefined_metric,
    )

    run.args = [*_quiet(list(common) + overrides), *settings]
    try:  # a bad override or setting fails before anything is written or trained
        run.cfg = compose_config(*run.args)
        conf = to_config(run.cfg)
    except (ValueError, HydraException, OmegaConfBaseException) as e:  # Hydra's: many lines
        raise ValueError(f"{_one_line(e)} (config {name!r})") from e
    partition = conf.model.partition
    if partition.kind == "tp" and partition.recorded_towers is None:
        run.partition_file = partition.path
    known = run_metric_names(conf)
    if metric not in known:  # before the run trains, not after it
        raise ValueError(
            f"--metric {metric!r} is not a metric of config {name}'s runs; choose "
            f"one of {sorted(known)}"
        )
    if (why := undefined_metric(conf, metric)) is not None:  # NaN in every run, after training
        raise ValueError(
            f"--metric {metric!r} with config {name!r}: {why}, so it would be NaN in every run; "
            "choose a metric this data defines, e.g. --metric test_auc"
        )
    ckpt = str(run.cfg.trainer.checkpoint_dir)
    if found := outputs_of(run_dir, ckpt):
        # an earlier call (or a Hydra multirun's job) stopped in this run: go on from its latest
        # checkpoint, if it ran these settings
        if not (run_dir / RUN_FILE).exists() and not (run_dir / HYDRA_RECORD).is_file():
            raise ValueError(
                f"{run_dir} holds a run's outputs ({', '.join(found)}) but no {RUN_FILE} or "
                f"{HYDRA_RECORD} that says what it ran (config {name!r}): not a run of this "
                "study to go on with; move it out of the study's directory, or choose another "
                "--out"
            )
        _check_same_run(run_dir, name, settings)
        run.resume = True
        if run.cfg.trainer.resume_from is None:
            run.cfg.trainer.resume_from = "auto"
            run.args.append("trainer.resume_from=auto")
    return run


def _read_metrics(path: Path) -> dict[str, Any]:
    """A run's ``metrics.json``; ``ValueError`` naming the file if it is not a JSON object."""
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: not a readable metrics.json ({type(e).__name__}: {e})") from e
    if not isinstance(metrics, dict):
        raise ValueError(
            f"{path}: expected a JSON object of metrics, found {type(metrics).__name__}"
        )
    return metrics


class StaleRun(ValueError):
    """A run directory of the study holds a run of other settings than its config's now."""


def _check_same_run(run_dir: Path, name: str, settings: list[str]) -> None:
    """Raise :class:`StaleRun` unless the run in ``run_dir`` trained with ``settings``: its
    :data:`RUN_FILE`'s overrides, or else (a run of a Hydra multirun, or of an older dmt) its
    Hydra record ``.hydra/config.yaml`` against the config ``settings`` compose, in what a
    resume may not change (:func:`dmt.checkpoint.config_differences`); and with a ``tp``
    partition file, on the towers that file holds now (:func:`_check_towers`)."""
    record = run_dir / RUN_FILE
    if not record.exists():
        hydra_record = run_dir / HYDRA_RECORD
        if hydra_record.is_file():
            ran = _check_hydra_record(hydra_record, run_dir, name, settings)
            _check_towers(run_dir, name, _checkpoint_towers(run_dir, ran))
            return
        warnings.warn(
            f"{run_dir} has no {RUN_FILE} and no .hydra/config.yaml: its settings cannot be "
            f"checked against config {name!r}'s; its metrics are read as they are",
            stacklevel=4,  # the caller of study()
        )
        return
    written = json.loads(record.read_text())
    ran = written.get("overrides")
    if ran != settings:
        raise StaleRun(
            f"{run_dir} trained with {ran}, but config {name!r} is now {settings}: its metrics "
            "are not this config's; choose another --out (or another config name)"
        )
    if PARTITION_KEY not in written:  # an older dmt's record: the towers its checkpoints hold
        try:
            config = _config_of(name, settings)
        except ValueError as e:  # settings of an older dmt, read as they are (as they were)
            warnings.warn(
                f"{run_dir}: its settings do not compose now ({e}): the towers it trained with "
                "cannot be checked; its metrics are read as they are",
                stacklevel=4,  # the caller of study()
            )
            return
        _check_towers(run_dir, name, _checkpoint_towers(run_dir, config))
    elif (partition := written[PARTITION_KEY]) is not None:
        _check_towers(run_dir, name, (partition["path"], partition["towers"], str(record)))


def _file_towers(run: _Run) -> dict[str, Any] | None:
    """For :data:`RUN_FILE`, just before ``run`` trains: its tp partition file and the towers
    the file holds (what the trainer builds), or None."""
    from dmt.models.partition import load_partition_file  # noqa: PLC0415

    if run.partition_file is None:
        return None
    return {"path": run.partition_file, "towers": load_partition_file(run.partition_file)}


def _checkpoint_towers(
    run_dir: Path, config: dict[str, Any]
) -> tuple[str, list[list[str]] | None, str] | None:
    """For a run of ``config`` (a config as YAML data) whose towers a tp partition file gave:
    the file, the towers the run's ``metrics.json`` records (a run of this dmt: with or without
    checkpoints) or else its newest checkpoint's ``config.yaml`` (None: neither records them),
    and that file; None for a run of other towers."""
    from dmt.checkpoint import CONFIG_FILE, RECORDED_TOWERS, flatten_keys, latest  # noqa: PLC0415

    flat = flatten_keys(config)
    if flat.get("model.partition.kind") != "tp" or flat.get(RECORDED_TOWERS) is not None:
        return None
    path = str(flat.get("model.partition.path"))
    metrics = run_dir / "metrics.json"
    if metrics.is_file() and (towers := _read_metrics(metrics).get(RECORDED_TOWERS)) is not None:
        return path, towers, str(metrics)
    newest = latest(run_dir / str(flat.get("trainer.checkpoint_dir", "checkpoints")))
    if newest is None:
        return path, None, ""
    try:
        saved = flatten_keys(yaml.safe_load((newest / CONFIG_FILE).read_text()) or {})
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return path, None, ""
    return path, saved.get(RECORDED_TOWERS), str(newest / CONFIG_FILE)


def _check_towers(
    run_dir: Path, name: str, trained: tuple[str, list[list[str]] | None, str] | None
) -> None:
    """Raise :class:`StaleRun` if the run in ``run_dir`` trained (``trained``: its partition
    file, the towers it held then and the record of them) on other towers than the file holds
    now: replaced since (``dmt-partition --overwrite``) or edited. A warning where they cannot be
    compared: not recorded, or the file is not readable now."""
    from dmt.models.partition import describe_towers_change, load_partition_file  # noqa: PLC0415

    if trained is None:
        return
    path, towers, source = trained
    if towers is None:
        why = f"no {RUN_FILE}, metrics.json or checkpoint records the towers it trained with"
    else:
        try:
            now = load_partition_file(path)
        except ValueError as e:  # e.g. moved away since: the run's figures are still its own
            why = str(e)
        else:
            if now == towers:
                return
            raise StaleRun(
                f"{run_dir} trained with other towers than partition file {path!r} holds now "
                f"({source}: {describe_towers_change(towers, now)}): its metrics are not config "
                f"{name!r}'s; choose another --out (or another config name), or put the file's "
                "towers back"
            )
    warnings.warn(
        f"{run_dir}: {why}: its towers cannot be checked against partition file {path!r} of "
        f"config {name!r}; its metrics are read as they are",
        stacklevel=5,  # the caller of study()
    )


def _config_of(name: str, settings: list[str]) -> dict[str, Any]:
    """The config ``settings`` compose, as YAML data; a bad one is a ``ValueError`` naming the
    config."""
    from hydra.errors import HydraException  # noqa: PLC0415  (keeps --help fast)
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    from dmt.config import config_yaml  # noqa: PLC0415
    from dmt.train import compose_config, to_config  # noqa: PLC0415

    try:
        return dict(yaml.safe_load(config_yaml(to_config(compose_config(*settings)))))
    except (ValueError, HydraException, OmegaConfBaseException) as e:  # Hydra's: many lines
        raise ValueError(f"{_one_line(e)} (config {name!r})") from e


def _check_hydra_record(
    record: Path, run_dir: Path, name: str, settings: list[str]
) -> dict[str, Any]:
    """Raise :class:`StaleRun` where the Hydra record ``record`` differs from the config of
    ``settings``; the config it records, as YAML data."""
    from dmt.checkpoint import config_differences, flatten_keys  # noqa: PLC0415
    from dmt.config import config_yaml  # noqa: PLC0415
    from dmt.evaluate import read_config  # noqa: PLC0415

    ran = yaml.safe_load(config_yaml(read_config(record)))  # ValueError naming the file
    now = _config_of(name, settings)
    differences = config_differences(ran, now, allow_change=False)
    # free for a resume (the weights are the same), not for the metrics a study reads
    was, then = flatten_keys(ran), flatten_keys(now)
    for key in READ_BY_EVALUATION:
        if was.get(key) != then.get(key):
            differences.append(f"{key}: {was.get(key)!r} -> {then.get(key)!r}")
    if differences:
        raise StaleRun(
            f"{run_dir} trained with another config than {name!r}'s ({record}: "
            + "; ".join(differences)
            + "): its metrics are not this config's; choose another --out (or another config "
            "name)"
        )
    return dict(ran)


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
            + (f"  ({r['non_finite']} of {r['n']} runs not finite)" if r.get("non_finite") else "")
        )
    for c in report["comparisons"]:
        lines.append(
            f"Mann-Whitney U ({c['alternative']}, {c['method']}) {c['a']} vs {c['b']}: U={c['u']:g}, "
            f"p={c['p_value']:.4g}, median difference {c['median_difference']:+.4f}"
        )
    return "\n".join(lines)


def box_plot(report: dict[str, Any], path: Path, *, replace: bool = True) -> None:
    """A box plot of the metric per config (median, quartiles, whiskers to 1.5 IQR), every run
    a point over it; written to ``path`` through a temporary file (``replace=False``: never over
    an existing file)."""
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
    save_figure(fig, path, replace=replace)


def split_overrides(parser: argparse.ArgumentParser, option: str, text: str) -> list[str]:
    """The Hydra overrides in ``text`` (one quoted string of ``option``), split as a shell
    would; an unclosed quote is ``parser.error`` (exit 2, one line), not a traceback."""
    try:
        return shlex.split(text)
    except ValueError as e:  # "No closing quotation", "No escaped character"
        parser.error(f"{option} {text!r}: {e}; expected Hydra overrides in one string")


def output_dir_problem(path: Path, option: str) -> str | None:
    """Why ``path`` (given as ``option``) cannot be a command's output directory: it is a file,
    or lies under one; ``None`` if it is a directory or can be made."""
    if path.exists() and not path.is_dir():
        return f"{option} {path} is a file; expected a directory"
    if not path.exists():
        return existing_output(path, option, False)  # a parent that is a file
    return None


def seeds_option(text: str) -> list[int]:
    """:func:`parse_seeds` as an ``argparse`` type: its message in the usage error."""
    try:
        return parse_seeds(text)
    except ValueError as e:  # argparse names the option itself
        raise argparse.ArgumentTypeError(str(e).removeprefix("--seeds ")) from None


def parse_seeds(text: str) -> list[int]:
    """``9`` (seeds 0..8), ``3-7`` (3..7), ``0,4,5``, or a list of both (``0-8,18-26``).

    Raises:
        ValueError: an empty set, a range that ends before it starts, a negative seed, or a
            seed given twice (its run would be counted twice in the median and the test).
    """
    try:
        if "," not in text and "-" not in text:
            count = int(text)
            if count < 1:
                raise ValueError(f"--seeds {text}: give at least 1 seed")
            return list(range(count))
        seeds: list[int] = []
        for part in text.split(","):
            lo, sep, hi = part.partition("-")
            first, last = (int(lo), int(hi)) if sep else (int(part), int(part))
            if first < 0 or last < first:
                raise ValueError(
                    f"--seeds {text}: {part!r} is not a seed or a range LO-HI with 0 <= LO <= HI"
                )
            seeds.extend(range(first, last + 1))
    except ValueError as e:
        if str(e).startswith("--seeds"):
            raise
        raise ValueError(
            f"--seeds {text}: expected K, LO-HI, a comma list, or a list of both"
        ) from None
    twice = sorted(s for s, count in Counter(seeds).items() if count > 1)
    if twice:
        raise ValueError(f"--seeds {text}: seed(s) {twice} given twice")
    return seeds
