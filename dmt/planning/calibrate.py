"""``dmt-plan-calibrate``: fit the step-time model to measured runs, validate it on held-out runs,
and write the fitted cluster as a ``cluster=`` preset.

Input: a directory of ``scripts/calibration_runs.sh`` JSONs, one per emulated cluster (``G`` ranks,
``L`` per host, every host in its own network namespace with its link throttled to a rate, or
``rate: none`` on loopback), each with ``benchmarks/bench_sptt.py --json`` records of the modes
``flat``, ``sptt`` and ``dmt``: the median ms per step and the bytes every collective carried.

The model is :func:`dmt.planning.timing.predict_step_time`, the one ``dmt-plan`` uses, on:

* the collectives of each mode, per rank, from the bytes the run counted (SPTT's
  :class:`~dmt.sptt.comm_stats.CommStats` per step, group and direction; for the flat mode the
  traced world bytes less its dense all-reduce and input all-to-all, which carry what the SPTT run
  of the same model counted for ``dense`` and step ``a``: TorchRec's table-wise lookup sends the
  same ids; the rest is the pooled all-to-all, half forward, half backward);
* the compute of the benchmark's models (:func:`dmt.planning.timing.compute_load`), rebuilt from
  the command line each run recorded by ``benchmarks/bench_sptt.py``'s own builder (so the
  command runs from a source checkout);
* a :class:`~dmt.planning.hardware.ClusterConfig` with ``L`` ranks per host, one NIC per host at
  the run's rate (times a fitted efficiency), and all ranks sharing the machine's ``--cores``.

Fitted (scipy's least squares on ``log(predicted / measured)``): the compute efficiency, the
intra-host (loopback) bandwidth and latency, the NIC's efficiency and latency, the per-collective
and per-step overheads. Runs matching ``--holdout`` (``G=8``, ``rate=2500mbit``, ``batch=1024``,
comma-separated, any may match) are left out of the fit and predicted; ``--holdout each`` predicts
every run from a fit on the others. The preset written (``--out``) is fitted on every run.

Example::

    python -m dmt.planning.calibrate benchmarks/results/calibration --holdout G=8 \\
        --out dmt/conf/cluster/cpu_emulated.yaml --overwrite
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import re
import shlex
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from dmt.planning.collectives import CollectiveBytes
from dmt.planning.hardware import ClusterConfig
from dmt.planning.timing import (
    MODES,
    ComputeLoad,
    ModeWorkload,
    StepTime,
    compute_load,
    predict_modes,
)
from dmt.results import file_in_the_way, output_directory, write_atomic, write_json

GBIT = 1e9
COUNTED_STEPS = {  # CommStats step -> (model step, op, group, overlappable when pipelined)
    "a": ("a", "all_to_all", "world", True),
    "d": ("d", "all_to_all", "tower", False),
    "f": ("f", "all_to_all", "peer", True),
    "tm": ("tower_allreduce", "all_reduce", "tower", True),
    "dense": ("dense_allreduce", "all_reduce", "world", True),
}
# (field, lower bound, upper bound, initial value): what the fit varies (nic_efficiency: the
# fraction of the throttled rate TCP achieves; the rest are ClusterConfig fields)
PARAMS: tuple[tuple[str, float, float, float], ...] = (
    ("compute_efficiency", 1e-4, 1.0, 0.05),
    ("intra_bandwidth_gbps", 0.01, 100.0, 1.0),
    ("intra_latency_us", 0.1, 1e4, 50.0),
    ("nic_efficiency", 0.1, 1.0, 0.9),
    ("nic_latency_us", 0.1, 1e4, 100.0),
    ("collective_overhead_us", 0.1, 1e5, 500.0),
    ("step_overhead_ms", 0.01, 1e3, 10.0),
)


@dataclass(frozen=True)
class Run:
    """One measured emulated cluster: its settings, workloads and median ms per step per mode."""

    name: str
    world_size: int
    local_world_size: int
    rate: str
    """The host links' rate in tc syntax ("1gbit", "2500mbit"), or "none" (loopback)."""
    rate_bit_per_s: float | None
    batch_per_rank: int
    workloads: dict[str, ModeWorkload]
    measured_ms: dict[str, float]


def _per_rank(x: float, world_size: int) -> int:
    """Bytes of the average rank from a count summed over ranks (the benchmark's table-wise
    towers are symmetric: every rank sends as much as the busiest)."""
    return round(x / world_size)


def _sptt_collectives(record: dict[str, Any], world_size: int, local: int) -> list[CollectiveBytes]:
    counted = record["bytes_per_step"]
    keys = {k.rsplit("/", 1)[0] for k in counted if k.endswith("/bytes_sent")}
    out = []
    for key in sorted(keys):
        step, group, direction = key.split("/")
        if step not in COUNTED_STEPS:
            continue
        sent, cross = counted[f"{key}/bytes_sent"], counted[f"{key}/bytes_cross_host"]
        if sent == 0:
            continue
        name, op, model_group, overlappable = COUNTED_STEPS[step]
        size = {"world": world_size, "tower": world_size // _towers(record, world_size, local)}
        size["peer"] = world_size // size["tower"]
        out.append(
            CollectiveBytes(
                name,
                op,
                model_group,
                direction,
                size[model_group],
                _per_rank(sent - cross, world_size),
                _per_rank(cross, world_size),
                overlappable,
            )
        )
    return out


def _towers(record: dict[str, Any], world_size: int, local: int) -> int:
    return world_size // (local * int(record.get("hosts_per_tower", 1)))


def _flat_collectives(
    flat: dict[str, Any], sptt: dict[str, Any], world_size: int
) -> list[CollectiveBytes]:
    traced = flat["traced_bytes_per_step"]
    sent, cross = traced["world/bytes_sent"], traced["world/bytes_cross_host"]
    counted = sptt["bytes_per_step"]
    out = []
    for step, name, op, direction in (
        ("a", "flat_input_a2a", "all_to_all", "forward"),
        ("dense", "dense_allreduce", "all_reduce", "backward"),
    ):
        s = counted[f"{step}/world/{direction}/bytes_sent"]
        c = counted[f"{step}/world/{direction}/bytes_cross_host"]
        sent, cross = sent - s, cross - c
        out.append(
            CollectiveBytes(
                name,
                op,
                "world",
                direction,
                world_size,
                _per_rank(s - c, world_size),
                _per_rank(c, world_size),
                True,
            )
        )
    for direction in ("forward", "backward"):
        out.append(
            CollectiveBytes(
                "flat_output_a2a",
                "all_to_all",
                "world",
                direction,
                world_size,
                _per_rank((sent - cross) / 2, world_size),
                _per_rank(cross / 2, world_size),
                False,
            )
        )
    return out


def _bench_args(command: str) -> argparse.Namespace:
    """The benchmark's arguments from the command line the run recorded."""
    benchmarks = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    import bench_sptt  # benchmarks/ is no package: its model builder is the truth for its runs

    argv = shlex.split(command)
    i = next((i for i, a in enumerate(argv) if a.endswith("bench_sptt.py")), None)
    if i is None:
        raise ValueError(f"its command runs no bench_sptt.py: {command!r}")
    refused = io.StringIO()  # bench_sptt's usage, which would read as this command's
    try:
        with contextlib.redirect_stderr(refused):
            return bench_sptt._parse(argv[i + 1 :])
    except SystemExit:
        why = refused.getvalue().strip().rpartition("error: ")[2]
        raise ValueError(
            f"its command's arguments are not bench_sptt.py's ({why}): {command!r}"
        ) from None


def _compute_loads(args: argparse.Namespace, towers: int) -> dict[str, ComputeLoad]:
    import bench_sptt

    from dmt.optim import sparse_optimizer_name, sparse_optimizer_spec  # noqa: PLC0415 (torch)

    # the average rank's rows, F x hotness: the benchmark records no plan to find its busiest
    # rank's (dmt-plan's sptt_lookup_rows / flat_lookup_rows). Its 26 tables on 4 or 8 ranks put
    # 7 or 4 on the busiest, 8-23% above the average, on a lookup of about 1-2% of these steps;
    # the towers' mean tower-module FLOPs likewise (compute_load's default: at G = 8 the busiest
    # tower's rank computes 1.4% more, at G = 4 the towers are equal)
    ids = args.features * args.hotness
    # the benchmark's tables train with its OPTIM's fused optimizer (row-wise Adagrad)
    sparse = sparse_optimizer_name(sparse_optimizer_spec(bench_sptt.OPTIM)[0])
    return {
        mode: compute_load(
            bench_sptt._model(args, towers, tower), ids_per_sample=ids, sparse_optimizer=sparse
        )
        for mode, tower in (("flat", "passthrough"), ("sptt", "passthrough"), ("dmt", "dlrm"))
    }


STATISTICS = ("min", "median")


def load_run(path: Path, statistic: str = "min", repeats: Sequence[Path] = ()) -> Run:
    """One ``calibration_runs.sh`` JSON as a :class:`Run`; ``statistic``: which of the runs'
    median step times stands for the mode, ``"min"`` (the least disturbed by other load on the
    machine) or ``"median"``, over the runs of ``path`` and of its ``repeats`` (the same cell
    measured again: same settings and bytes)."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic={statistic!r}; expected one of {list(STATISTICS)}")
    try:
        data = json.loads(path.read_text())
        return _run_of(path, data, statistic, repeats)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a bench_sptt.py record ({_why(e)})") from None


def _calibrated(record: dict[str, Any]) -> bool:
    """A record the fit reads: pipelined, fp32 (the model's :func:`predict` steps), step c at
    the output. Records from before ``bench_sptt.py`` wrote a setting had its value of then
    (``pipeline`` on, ``fp32``, ``output``), as ``calibration_runs.sh`` still pins them."""
    return (
        record.get("peer_permute") in (None, "output")
        and record.get("pipeline", True) is True
        and record.get("comm_precision", "fp32") == "fp32"
    )


def _why(error: Exception) -> str:
    """What a record lacks (a key) or why it does not parse."""
    return f"no {error}" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"


def _run_of(path: Path, data: dict[str, Any], statistic: str, repeats: Sequence[Path]) -> Run:
    """:func:`load_run` of ``path``'s parsed ``data``."""
    settings = data["settings"]
    # Figure 7's step c: "output", or no setting (files from before bench_sptt recorded it
    # every time, when "output" was the default and calibration_runs.sh did not pin it)
    records: dict[str, dict[str, Any]] = {}
    for r in data["records"]:
        if not _calibrated(r):
            continue
        if r["mode"] in records:  # two of one cell: which one the fit took would be arbitrary
            raise ValueError(
                f"{path}: two records of mode {r['mode']!r} pipelined at fp32 with "
                "peer_permute 'output'; expected one per mode (calibration_runs.sh's)"
            )
        records[r["mode"]] = r
    missing = [m for m in MODES if m not in records]
    if missing:
        raise ValueError(
            f"{path}: no records of modes {missing} pipelined at fp32 with peer_permute "
            f"'output' (the fit models pipelined fp32 steps with step c at the output: "
            f"bench_sptt.py --pipeline on --comm-precision fp32 --peer-permute output, as "
            f"calibration_runs.sh runs it; has {sorted(records)})"
        )
    try:
        g, local, batch = _shape(settings, records["sptt"])
        runs_ms = {m: _step_times(records[m]) for m in MODES}
        rate_bit_per_s = _rate_of(settings)
    except ValueError as e:
        raise ValueError(f"{path}: not a bench_sptt.py record ({e})") from None
    for repeat in repeats:
        try:
            again = json.loads(repeat.read_text())
            again["settings"], again["records"]  # noqa: B018 (their presence)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{repeat}: not a bench_sptt.py record ({_why(e)})") from None
        if {k: again["settings"].get(k) for k in settings} != settings:
            raise ValueError(f"{repeat}: settings differ from {path}'s; not a repeat of that cell")
        for r in again["records"]:
            if r["mode"] in runs_ms and _calibrated(r):
                try:
                    runs_ms[r["mode"]] += _step_times(r)
                except ValueError as e:
                    raise ValueError(f"{repeat}: not a bench_sptt.py record ({e})") from None
    pick = min if statistic == "min" else statistics.median
    try:
        args = _bench_args(data["command"])
    except ValueError as e:
        raise ValueError(f"{path}: not a bench_sptt.py record ({e})") from None
    loads = _compute_loads(args, _towers(records["sptt"], g, local))
    collectives = {
        "flat": _flat_collectives(records["flat"], records["sptt"], g),
        "sptt": _sptt_collectives(records["sptt"], g, local),
        "dmt": _sptt_collectives(records["dmt"], g, local),
    }
    return Run(
        name=path.stem,
        world_size=g,
        local_world_size=local,
        rate=str(settings["rate"]),
        rate_bit_per_s=rate_bit_per_s,
        batch_per_rank=batch,
        workloads={m: ModeWorkload(collectives[m], loads[m]) for m in MODES},
        measured_ms={m: float(pick(runs_ms[m])) for m in MODES},
    )


def _positive_int(where: str, value: Any) -> int:
    """``value``, an integer >= 1; ``ValueError`` naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}={value!r}, expected an integer >= 1")
    return value


def _shape(settings: dict[str, Any], sptt: dict[str, Any]) -> tuple[int, int, int]:
    """``G``, ``L`` and the batch per rank of a record's ``settings`` (its ``sptt`` record's
    ``hosts_per_tower``), checked: ``L`` hosts' worth of ranks, towers of whole hosts."""
    g = _positive_int("settings.world_size", settings["world_size"])
    local = _positive_int("settings.local_world_size", settings["local_world_size"])
    batch = _positive_int("settings.batch_per_rank", settings["batch_per_rank"])
    k = _positive_int("hosts_per_tower of mode 'sptt'", sptt.get("hosts_per_tower", 1))
    if g % (local * k):
        raise ValueError(
            f"settings.world_size={g} is not a multiple of settings.local_world_size={local} "
            f"x hosts_per_tower={k} (towers of whole hosts)"
        )
    return g, local, batch


def _step_times(record: dict[str, Any]) -> list[float]:
    """A mode's ``ms_per_step_runs``: one or more positive, finite step times (ms)."""
    times = record["ms_per_step_runs"]
    if not (
        isinstance(times, list)
        and times
        and all(
            isinstance(t, int | float) and not isinstance(t, bool) and 0 < t < math.inf
            for t in times
        )
    ):
        raise ValueError(
            f"mode {record['mode']!r}: ms_per_step_runs={times!r}, expected a non-empty list of "
            "positive step times (ms)"
        )
    return [float(t) for t in times]


def _rate_of(settings: dict[str, Any]) -> float | None:
    """The host links' rate (bit/s) of a throttled run, None on loopback."""
    if not settings.get("throttled"):
        return None
    rate = settings["rate_bit_per_s"]
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf:
        raise ValueError(
            f"settings.rate_bit_per_s={rate!r} of a throttled run, expected a positive rate in "
            "bit/s"
        )
    return float(rate)


def run_cluster(base: ClusterConfig, run: Run, nic_efficiency: float) -> ClusterConfig:
    """``base`` shaped as ``run``'s emulated cluster: ``L`` ranks per host, one NIC per host at
    the run's rate times ``nic_efficiency``; on loopback (no rate) cross-host traffic uses the
    intra-host link."""
    shaped = replace(
        base,
        hosts=run.world_size // run.local_world_size,
        gpus_per_host=run.local_world_size,
        ranks_per_nic=run.local_world_size,
    )
    if run.rate_bit_per_s is None:
        return replace(
            shaped,
            nic_bandwidth_gbps=base.intra_bandwidth_gbps,
            nic_latency_us=base.intra_latency_us,
            ranks_per_nic=1,
        )
    return replace(shaped, nic_bandwidth_gbps=run.rate_bit_per_s / 8 / GBIT * nic_efficiency)


def _with_params(base: ClusterConfig, x: Sequence[float]) -> tuple[ClusterConfig, float]:
    values: dict[str, Any] = dict(zip([p[0] for p in PARAMS], x, strict=True))
    nic_efficiency = values.pop("nic_efficiency")
    return replace(base, **values), nic_efficiency


def predict(base: ClusterConfig, nic_efficiency: float, run: Run) -> dict[str, StepTime]:
    """Predicted step time of every mode of ``run`` on the fitted cluster."""
    return predict_modes(
        run.workloads, run.batch_per_rank, run_cluster(base, run, nic_efficiency), pipelined=True
    )


def fit(base: ClusterConfig, runs: Sequence[Run]) -> tuple[ClusterConfig, float, float]:
    """Least-squares fit of :data:`PARAMS` on ``log(predicted / measured)`` over every mode of
    ``runs``; returns the fitted cluster, the NIC efficiency and the RMS log residual."""
    if not runs:
        raise ValueError("no runs to fit: the holdout selection left none")
    lo = np.log([p[1] for p in PARAMS])
    hi = np.log([p[2] for p in PARAMS])
    x0 = np.log([p[3] for p in PARAMS])

    def residuals(logx: np.ndarray) -> np.ndarray:
        cluster, eff = _with_params(base, np.exp(logx).tolist())
        out = []
        for run in runs:
            times = predict(cluster, eff, run)
            out += [math.log(times[m].total_ms / run.measured_ms[m]) for m in MODES]
        return np.asarray(out)

    result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0)
    cluster, eff = _with_params(base, np.exp(result.x).tolist())
    rms = float(np.sqrt(np.mean(result.fun**2)))
    return cluster, eff, rms


def _rate_bits_per_s(rate: str) -> float:
    """``--rate`` (tc's spelling: ``1gbit``, ``2500mbit``) in bit/s; ``ValueError`` otherwise."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)([kmg]?)bit", rate)
    if m is None or not float(m[1]) > 0:
        raise ValueError(f"--rate {rate!r}: expected a positive rate, e.g. 1gbit, 2500mbit")
    return float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]]


def _matches(run: Run, holdout: str) -> bool:
    for term in filter(None, (t.strip() for t in holdout.split(","))):
        key, _, value = term.partition("=")
        actual = {
            "G": str(run.world_size),
            "rate": run.rate,
            "batch": str(run.batch_per_rank),
            "name": run.name,
        }
        if key not in actual:
            raise ValueError(
                f"--holdout term {term!r}: expected KEY=VALUE with KEY one of {sorted(actual)}"
            )
        if actual[key] == value:
            return True
    return False


@dataclass(frozen=True)
class Prediction:
    """One run predicted by a fitted cluster; ``held_out``: the fit did not see the run."""

    run: Run
    times: dict[str, StepTime]
    held_out: bool


def table(
    predictions: Sequence[Prediction], breakdown: bool = False
) -> tuple[str, dict[str, list[float]]]:
    """Predicted vs measured ms per step and DMT/flat speed-up per run; and the relative errors
    of the held-out and fitted runs (step times of every mode, and the speed-ups)."""
    head = (
        f"{'run':<22} {'set':<7} "
        + " ".join(f"{m + ' meas/pred ms':>20}" for m in MODES)
        + f" {'dmt/flat meas/pred':>19}"
    )
    lines = [head, "-" * len(head)]
    errors: dict[str, list[float]] = {
        "holdout": [],
        "fit": [],
        "holdout_speedup": [],
        "fit_speedup": [],
    }
    for p in predictions:
        run, times = p.run, p.times
        which = "holdout" if p.held_out else "fit"
        cells = []
        for m in MODES:
            pred, meas = times[m].total_ms, run.measured_ms[m]
            errors[which].append(abs(pred / meas - 1))
            cells.append(f"{meas:>9.1f} /{pred:>8.1f}")
        meas_speedup = run.measured_ms["flat"] / run.measured_ms["dmt"]
        pred_speedup = times["flat"].total_ms / times["dmt"].total_ms
        errors[f"{which}_speedup"].append(abs(pred_speedup / meas_speedup - 1))
        lines.append(
            f"{run.name:<22} {which:<7} "
            + " ".join(f"{c:>20}" for c in cells)
            + f" {meas_speedup:>8.2f} /{pred_speedup:>8.2f}"
        )
        if breakdown:
            for m in MODES:
                t = times[m]
                exposed = ", ".join(f"{k} {v:.1f}" for k, v in t.exposed_by_step().items())
                lines.append(
                    f"    {m}: compute {t.compute_ms:.1f}, lookup {t.lookup_ms:.1f}, overhead "
                    f"{t.overhead_ms:.1f}, exposed [{exposed}], overlapped {t.overlapped_ms:.1f} ms"
                )
    return "\n".join(lines), errors


def _summary(errors: dict[str, list[float]]) -> list[str]:
    out = []
    for key, label in (
        ("holdout", "held-out step times"),
        ("holdout_speedup", "held-out DMT/flat speed-ups"),
        ("fit", "fitted step times"),
        ("fit_speedup", "fitted DMT/flat speed-ups"),
    ):
        e = errors[key]
        if e:
            out.append(
                f"{label}: median abs error {100 * statistics.median(e):.1f}%, "
                f"worst {100 * max(e):.1f}% ({len(e)} points)"
            )
    return out


def write_preset(
    path: Path, cluster: ClusterConfig, eff: float, rate_bit_per_s: float, notes: list[str]
) -> None:
    """Write ``cluster`` as a ``conf/cluster`` YAML (the NIC at ``rate_bit_per_s`` x ``eff``),
    atomically (:func:`dmt.results.write_atomic`)."""
    values = {f.name: getattr(cluster, f.name) for f in fields(cluster)}
    values["nic_bandwidth_gbps"] = rate_bit_per_s / 8 / GBIT * eff
    lines = [
        "# CPU cluster emulated on one machine (gloo over TCP), every host in its own network namespace",
        "# with its link throttled (scripts/netns_throttle.sh); written by dmt-plan-calibrate.",
        f"# NIC: {rate_bit_per_s / GBIT:g} Gbit/s x fitted efficiency {eff:.3f}; override",
        "# cluster.nic_bandwidth_gbps for another rate. Fitted to measured step times only.",
        *(f"# {n}" for n in notes),
        "defaults:",
        "  - base_cluster",
        "  - _self_",
        "",
    ]
    for key, value in values.items():
        if isinstance(value, str):
            lines.append(f"{key}: {json.dumps(value)}")
        elif isinstance(value, float):
            lines.append(f"{key}: {value:.6g}")
        else:
            lines.append(f"{key}: {value}")
    text = "\n".join(lines) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text))


def _base(cores: int, peak_tflops: float, hbm_gbps: float) -> ClusterConfig:
    return ClusterConfig(
        name="cpu_emulated",
        hosts=2,
        gpus_per_host=2,
        gpu_memory_gb=8.0,
        dense_tflops=peak_tflops,
        hbm_bandwidth_gbps=hbm_gbps,
        lookup_efficiency=0.5,
        intra_bandwidth_gbps=1.0,
        nic_bandwidth_gbps=0.125,
        ranks_per_nic=2,
        shared_cores=cores,
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "runs",
        type=Path,
        help="directory of calibration_runs.sh JSONs (and repeats/ of some cells, merged)",
    )
    p.add_argument(
        "--holdout",
        default="G=8",
        help="runs to leave out of the fit and predict: comma-separated KEY=VALUE, KEY of G, "
        "rate, batch, name (default G=8); or 'each': leave each run out in turn",
    )
    p.add_argument(
        "--cores", type=int, default=os.cpu_count() or 1, help="CPU cores all ranks share"
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=0.1,
        help="nominal fp32 peak of one core, TFLOP/s (the fit finds the efficiency against it)",
    )
    p.add_argument(
        "--memory-gbps", type=float, default=10.0, help="memory bandwidth per rank, GB/s"
    )
    p.add_argument(
        "--statistic",
        default="min",
        choices=STATISTICS,
        help="the measured ms per step of a mode: min (default: least disturbed by other load) "
        "or median over the benchmark's runs (each run's median step)",
    )
    p.add_argument("--rate", default="1gbit", help="NIC rate written into the preset")
    p.add_argument("--out", type=Path, default=None, help="write the fitted preset here (YAML)")
    p.add_argument("--breakdown", action="store_true", help="print each prediction's breakdown")
    p.add_argument("--json", type=Path, default=None, help="write the table and errors here")
    p.add_argument("--overwrite", action="store_true", help="replace existing --out/--json files")
    args = p.parse_args(argv)
    # every setting is checked before the fit, so that a typo leaves no --json behind
    try:
        rate = _rate_bits_per_s(args.rate)
    except ValueError as bad:
        p.error(str(bad))
    for name, value, what in (
        ("--peak-tflops", args.peak_tflops, "must be > 0 (TFLOP/s of one core)"),
        ("--memory-gbps", args.memory_gbps, "must be > 0 (GB/s per rank)"),
    ):
        if not value > 0 or not math.isfinite(value):  # NaN too
            p.error(f"{name} {value:g}: {what}")
    if args.cores < 1:
        p.error(f"--cores {args.cores}: must be at least 1")
    if args.json is not None and args.out is not None and args.json.resolve() == args.out.resolve():
        p.error(f"--json and --out are the same file ({args.json}): give each its own")
    for name in ("out", "json"):
        path = getattr(args, name)
        if path is not None and path.exists() and not args.overwrite:
            p.error(f"--{name} {path} exists: pass --overwrite to replace it, or another path")
        if path is not None and path.is_dir():
            p.error(f"--{name} {path} is a directory: give a file")
        if path is not None and (blocking := file_in_the_way(path.absolute().parent)):
            p.error(f"--{name} {path}: {blocking} is not a directory")
    if not args.runs.is_dir():
        p.error(
            f"runs directory {args.runs} does not exist"
            if not args.runs.exists()
            else f"runs directory {args.runs} is not a directory"
        )
    paths = sorted(args.runs.glob("*.json"))
    if not paths:
        p.error(f"no *.json in runs directory {args.runs}")
    measured = {run.resolve() for run in (*paths, *args.runs.glob("repeats/*.json"))}
    for name in ("out", "json"):  # a measured run is never replaced, even with --overwrite
        path = getattr(args, name)
        if path is not None and path.resolve() in measured:
            p.error(f"--{name} {path} is one of the measured runs it reads; write elsewhere")
    try:
        runs = [
            load_run(path, args.statistic, sorted(args.runs.glob(f"repeats/{path.name}")))
            for path in paths
        ]
    except ValueError as bad:
        p.error(str(bad))
    held: set[str] = set()
    if args.holdout == "each" and len(runs) < 2:
        p.error(
            f"--holdout each predicts every run from a fit on the others: it needs at least 2 "
            f"runs, {args.runs} has {len(runs)}"
        )
    if args.holdout != "each":
        try:
            held = {r.name for r in runs if _matches(r, args.holdout)}
        except ValueError as bad:
            p.error(str(bad))
        if not held or len(held) == len(runs):
            p.error(
                f"--holdout {args.holdout!r} leaves {len(held)} of the {len(runs)} runs out: it "
                f"must leave some out and fit on the others (runs: "
                f"{', '.join(r.name for r in runs)})"
            )
    base = _base(args.cores, args.peak_tflops, args.memory_gbps)
    cluster, eff, rms = fit(base, runs)  # the preset: every run
    predictions = []
    if args.holdout == "each":  # leave one out: each run predicted by a fit on the others
        for i, run in enumerate(runs):
            c, e, _ = fit(base, runs[:i] + runs[i + 1 :])
            predictions.append(Prediction(run, predict(c, e, run), True))
        fitted_on = f"each run predicted by a fit on the other {len(runs) - 1}"
    else:
        c, e, r = fit(base, [r for r in runs if r.name not in held])
        predictions = [Prediction(run, predict(c, e, run), run.name in held) for run in runs]
        fitted_on = (
            f"fitted on {len(runs) - len(held)} runs (RMS log residual {r:.3f}); held out: "
            f"{sorted(held)}"
        )
    text, errors = table(predictions, args.breakdown)
    params = [f"{name} = {getattr(cluster, name, eff):.4g}" for name, *_ in PARAMS]
    params[[p[0] for p in PARAMS].index("nic_efficiency")] = f"nic_efficiency = {eff:.4g}"
    summary = _summary(errors)
    print(f"measured: the {args.statistic} over each file's runs of their median ms per step")
    print(text)
    print(f"\n{fitted_on}")
    print("\n".join(summary))
    print(
        f"preset: fitted on all {len(runs)} runs (RMS log residual {rms:.3f}): " + ", ".join(params)
    )
    # --json is staged beside itself and put in place only once the preset is: a failed preset
    # leaves both files as they were (with --overwrite too)
    outputs = contextlib.ExitStack()  # a failure removes the directories made for the outputs
    for path in (args.json, args.out):
        if path is not None:
            outputs.enter_context(output_directory(path.absolute().parent))
    with outputs:
        staged = None
        if args.json is not None:
            staged = write_json(
                args.json.with_name(f".{args.json.name}.staged-{os.getpid()}"),
                {
                    "holdout": args.holdout,
                    "statistic": args.statistic,
                    "validation": fitted_on,
                    "summary": summary,
                    "parameters_all_runs": dict(
                        zip([p[0] for p in PARAMS], [getattr(cluster, n, eff) for n, *_ in PARAMS])
                    ),
                    "runs": [
                        {
                            "run": p.run.name,
                            "held_out": p.held_out,
                            "measured_ms": p.run.measured_ms,
                            "predicted_ms": {m: p.times[m].total_ms for m in MODES},
                            "exposed_ms": {m: p.times[m].exposed_by_step() for m in MODES},
                        }
                        for p in predictions
                    ],
                },
                indent=1,
            )
        try:
            if args.out is not None:
                stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ")
                where = args.runs.as_posix()
                where = where[where.index("benchmarks/") :] if "benchmarks/" in where else where
                cluster = replace(
                    cluster,
                    source=f"dmt-plan-calibrate {where} (fitted on all runs, validated with --holdout {args.holdout}; {stamp}; "
                    f"{len(runs)} runs: {', '.join(r.name for r in runs)})",
                )
                notes = [
                    f"parameters, fitted on all {len(runs)} runs (RMS log residual {rms:.3f}):",
                    *(f"  {p}" for p in params),
                    f"validation (--holdout {args.holdout}, --statistic {args.statistic}): {fitted_on}",
                    *(f"  {line}" for line in summary),
                ]
                write_preset(args.out, cluster, eff, rate, notes)
                print(f"wrote {args.out}")
            if staged is not None:
                os.replace(staged, args.json)
        finally:  # put in place above, or never
            if staged is not None:
                staged.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
