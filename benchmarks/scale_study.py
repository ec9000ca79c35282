"""The paper's scale study (section 5.3, Figures 10-13), predicted by ``dmt-plan``'s model.

For V100, A100 and H100 clusters (``cluster=v100|a100|h100``, 8 GPUs per host) from 16 to 512
GPUs, DLRM and DCN with the paper's tower counts, this plans every mode (flat TorchRec, SPTT with
pass-through towers, DMT with tower modules) with :func:`dmt.planning.app.plan`, the code behind
``dmt-plan``, at the paper's local batch (16K per GPU), and writes:

* ``results.json``: every point's plan summary (predicted ms per step and its breakdown,
  bytes, memory) or the error that stopped it;
* ``table.md``: the speed-ups beside the paper's reported points;
* ``fig10_speedup_vs_gpus.png`` (DMT over flat, per hardware), ``fig11_tm_over_sptt.png`` (DMT
  over SPTT, DLRM), ``fig12_compression_ratio.png`` (DMT 8T-DLRM over SPTT vs compression ratio,
  64 H100), ``fig13_components_64_h100.png`` (DCN vs DMT-DCN step components, 64 H100).

Towers: ``T`` = hosts up to 16 (2T at 16 GPUs ... 16T at 128), then 16 towers of ``K`` = hosts /
16 hosts (256 and 512 GPUs); 26T at 208 GPUs (26 hosts) as well. The paper's V100 cluster stops at
16 hosts (its footnote 2), so does this study's.

Usage (outside the test suite; about a minute per point on 2 cores with the full flat search,
seconds with ``--flat-search uniform``)::

    python benchmarks/scale_study.py --out scale_study
    bash scripts/scale_study.sh            # the same, into outputs/scale_study/<date>-<time>
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dmt.results import config_options, existing_output, output_directory, write_json
from dmt.sptt.plan import SHARDING_KINDS

PAPER = {
    "fig10": "up to 1.9x (DLRM) and 1.8x (DCN) over the strong baseline across V100/A100/H100 at "
    "16-64 hosts; DLRM's speed-up grows with scale, DCN's is largest at small scale",
    "fig11": "tower modules add up to 1.4x over SPTT alone (DLRM, 16-512 GPUs), growing with scale",
    "fig12": "DMT 8T-DLRM over DMT-SPTT grows with the compression ratio, up to 2x at 16",
    "fig13": "64 H100, DMT-DCN vs DCN: compute 1.4x faster, exposed embedding communication 4.6x less",
}
"""What the paper reports (its figures' values are not in the text; these are its sentences)."""

PAPER_POINTS = {
    ("fig10", "dlrm"): 1.9,
    ("fig10", "dcn"): 1.8,
    ("fig11", "dlrm"): 1.4,
    ("fig12", "16"): 2.0,
    ("fig13", "compute"): 1.4,
    ("fig13", "exposed_embedding"): 4.6,
}
"""The paper's quoted maxima, for the table (speed-ups; fig13: DCN time / DMT-DCN time)."""

GPUS_PER_HOST = 8
LOCAL_BATCH = 16384
EMBEDDING_STEPS = ("a", "d", "f", "flat_input_a2a", "flat_output_a2a")


def towers_for(gpus: int) -> tuple[int, int]:
    """``(T, K)``: the paper's tower count for ``gpus`` GPUs and the hosts per tower."""
    hosts = gpus // GPUS_PER_HOST
    if hosts == 26:
        return 26, 1
    towers = min(hosts, 16)
    return towers, hosts // towers


OUTPUTS = (
    "results.json",
    "table.md",
    "fig10_speedup_vs_gpus.png",
    "fig11_tm_over_sptt.png",
    "fig12_compression_ratio.png",
    "fig13_components_64_h100.png",
)
"""What the study writes into ``--out``."""


def _entries(parser: argparse.ArgumentParser, option: str, value: str) -> list[str]:
    """The comma-separated entries of ``option``; an empty or repeated one is refused."""
    entries = [e.strip() for e in value.split(",")]
    if "" in entries:
        parser.error(f"{option} {value!r}: an empty entry (expected comma-separated entries)")
    if len(set(entries)) < len(entries):
        parser.error(f"{option} {value!r} names an entry twice")
    return entries


def scale_points(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> list[tuple[str, str, int, str, int]]:
    """The scale study's points, ``(preset, model, gpus, experiment, K)``, every entry of
    ``--presets``, ``--models``, ``--gpus`` and ``--sptt-sharding`` checked against what exists
    (``parser.error`` otherwise), before the first point is planned and before ``--out`` is
    made: one typo would otherwise stop a study of hours midway, or fill it with errors."""
    presets = _entries(parser, "--presets", args.presets)
    have = config_options("cluster")
    if unknown := [p for p in presets if p not in have]:
        parser.error(
            f"--presets {unknown[0]}: no dmt/conf/cluster/{unknown[0]}.yaml (have {', '.join(have)})"
        )
    for sharding in _entries(parser, "--sptt-sharding", args.sptt_sharding):
        if sharding not in SHARDING_KINDS:
            parser.error(
                f"--sptt-sharding {sharding}: expected {', '.join(SHARDING_KINDS[:-1])} or "
                f"{SHARDING_KINDS[-1]} (sptt.sharding_type)"
            )
    gpu_counts = []
    for entry in _entries(parser, "--gpus", args.gpus):
        try:
            gpus = int(entry)
        except ValueError:
            parser.error(f"--gpus {entry}: expected comma-separated GPU counts, e.g. 16,32,64")
        if gpus < GPUS_PER_HOST or gpus % GPUS_PER_HOST:
            parser.error(
                f"--gpus {gpus}: needs whole hosts of {GPUS_PER_HOST} GPUs (a multiple of "
                f"{GPUS_PER_HOST}, at least one host)"
            )
        towers, hosts_per_tower = towers_for(gpus)
        if towers * hosts_per_tower != gpus // GPUS_PER_HOST:
            parser.error(
                f"--gpus {gpus}: {gpus // GPUS_PER_HOST} hosts do not make {towers} towers of "
                "equal whole hosts (the paper's tower counts: up to 16 hosts, one tower each; "
                "then 16 towers)"
            )
        gpu_counts.append(gpus)
    towers_of: dict[str, list[int]] = {}  # model: the tower counts of its paper experiments
    for name in config_options("experiment"):
        if match := re.fullmatch(r"paper_dmt_(\d+)t_([a-z]+)", name):
            towers_of.setdefault(match[2], []).append(int(match[1]))
    models = _entries(parser, "--models", args.models)
    if unknown := [m for m in models if m not in towers_of]:
        parser.error(
            f"--models {unknown[0]}: no experiment paper_dmt_<T>t_{unknown[0]} in "
            f"dmt/conf/experiment (models: {', '.join(sorted(towers_of))})"
        )
    points = []
    for preset in presets:
        for model in models:
            for gpus in gpu_counts:
                if preset == "v100" and gpus > 128:
                    continue  # the paper's V100 cluster had 16 hosts
                towers, hosts_per_tower = towers_for(gpus)
                experiment = f"paper_dmt_{towers}t_{model}"
                if towers not in towers_of[model]:
                    counts = ", ".join(map(str, sorted(towers_of[model])))
                    parser.error(
                        f"--gpus {gpus} ({gpus // GPUS_PER_HOST} hosts of {GPUS_PER_HOST}): no "
                        f"paper tower count (no experiment {experiment}); {model} has "
                        f"{counts} towers (one host per tower up to 16 hosts, then 16 towers of "
                        "whole hosts)"
                    )
                points.append((preset, model, gpus, experiment, hosts_per_tower))
    return points


def _plan(overrides: Sequence[str]) -> dict[str, Any]:
    from hydra import compose, initialize_config_module  # noqa: PLC0415

    from dmt.planning.app import PlanConfig, plan  # noqa: PLC0415

    with initialize_config_module("dmt.conf", version_base="1.3"):
        cfg = compose("plan", overrides=list(overrides))
    conf = OmegaConf.to_object(cfg)
    assert isinstance(conf, PlanConfig)
    return plan(conf)


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    modes = {}
    for mode, m in report["modes"].items():
        modes[mode] = {
            k: m[k]
            for k in (
                "predicted_ms_per_step",
                "speedup_over_flat",
                "cross_host_mb",
                "intra_host_mb",
                "max_rank_memory_gb",
                "breakdown",
            )
            if k in m
        }
    return {
        "world_size": report["world_size"],
        "num_towers": report["num_towers"],
        "hosts_per_tower": report["hosts_per_tower"],
        "local_batch": report["local_batch"],
        "planning_seconds": report["planning_seconds"],
        "modes": modes,
    }


def run_point(
    preset: str,
    experiment: str,
    gpus: int,
    hosts_per_tower: int,
    flat_search: str,
    sptt_sharding: Sequence[str],
) -> dict[str, Any]:
    """Plan one point once per SPTT sharding type in ``sptt_sharding`` and keep, for ``sptt``
    and ``dmt`` each, the fastest (as TorchRec's planner picks flat's sharding); flat is the same
    in every plan."""
    hosts = gpus // GPUS_PER_HOST
    overrides = [
        f"experiment={experiment}",
        f"cluster={preset}",
        f"cluster.hosts={hosts}",
        f"cluster.gpus_per_host={GPUS_PER_HOST}",
        f"sptt.hosts_per_tower={hosts_per_tower}",
        f"data.batch_size={LOCAL_BATCH * gpus}",
        f"flat_search={flat_search}",
    ]
    point: dict[str, Any] = {
        "preset": preset,
        "experiment": experiment,
        "gpus": gpus,
        "overrides": overrides,
    }
    started = time.perf_counter()
    plans, errors = {}, {}
    for sharding in sptt_sharding:
        try:
            plans[sharding] = _summary(_plan([*overrides, f"sptt.sharding_type={sharding}"]))
        except ValueError as e:
            errors[sharding] = str(e)
    if not plans:
        point["error"] = "; ".join(f"{k}: {v}" for k, v in errors.items())
    else:
        best = next(iter(plans.values()))
        point.update(best)
        point["sptt_sharding"] = {}
        for mode in ("sptt", "dmt"):
            choice = min(plans, key=lambda k: plans[k]["modes"][mode]["predicted_ms_per_step"])
            point["modes"][mode] = plans[choice]["modes"][mode]
            point["sptt_sharding"][mode] = choice
        flat_ms = point["modes"]["flat"]["predicted_ms_per_step"]
        for m in point["modes"].values():
            m["speedup_over_flat"] = flat_ms / m["predicted_ms_per_step"]
        point["sptt_sharding_errors"] = errors
    point["seconds"] = round(time.perf_counter() - started, 1)
    return point


def _ms(point: dict[str, Any], mode: str) -> float:
    if "error" in point:
        return math.nan
    return float(point["modes"][mode]["predicted_ms_per_step"])


def _ratio(point: dict[str, Any], num: str, den: str) -> float:
    return _ms(point, num) / _ms(point, den)


def _component(point: dict[str, Any], mode: str) -> dict[str, float]:
    b = point["modes"][mode]["breakdown"]
    exposed = b["exposed_ms_by_step"]
    embedding = sum(v for k, v in exposed.items() if k in EMBEDDING_STEPS)
    return {
        "compute": b["compute_ms"],
        "lookup": b["lookup_ms"],
        "exposed_embedding": embedding,
        "exposed_allreduce": sum(v for k, v in exposed.items() if k not in EMBEDDING_STEPS),
        "overhead": b["overhead_ms"],
    }


def _speedup_per_preset(
    ax: Any, scale: list[dict[str, Any]], model: str, baseline: str, paper: float
) -> None:
    """One line per hardware preset: DMT's predicted speed-up over ``baseline`` against GPUs,
    with the paper's reported maximum."""
    for preset in ("v100", "a100", "h100"):
        pts = [
            p for p in scale if p["model"] == model and p["preset"] == preset and "error" not in p
        ]
        if pts:
            ax.plot(
                [p["gpus"] for p in pts],
                [_ratio(p, baseline, "dmt") for p in pts],
                marker="o",
                label=preset,
            )
    ax.axhline(paper, ls="--", c="gray", label="paper's maximum")
    ax.axhline(1.0, c="black", lw=0.5)
    ax.set_xscale("log", base=2)


def write_outputs(points: list[dict[str, Any]], out: Path) -> str:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    lines = ["# Scale study, predicted by dmt-plan (local batch 16K per GPU)", ""]
    lines += [f"- paper, {k}: {v}" for k, v in PAPER.items()]
    lines += [
        "",
        "| hardware | model | GPUs | T | K | flat ms | SPTT ms | DMT ms | DMT/flat | SPTT/flat | DMT over SPTT | SPTT/DMT tables |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    scale = [p for p in points if p["study"] == "scale"]
    for p in scale:
        if "error" in p:
            lines.append(
                f"| {p['preset']} | {p['model']} | {p['gpus']} | | | error: {p['error'][:120]} | | | | | | |"
            )
            continue
        lines.append(
            f"| {p['preset']} | {p['model']} | {p['gpus']} | {p['num_towers']} | "
            f"{p['hosts_per_tower']} | {_ms(p, 'flat'):.1f} | {_ms(p, 'sptt'):.1f} | "
            f"{_ms(p, 'dmt'):.1f} | {_ratio(p, 'flat', 'dmt'):.2f}x | "
            f"{_ratio(p, 'flat', 'sptt'):.2f}x | {_ratio(p, 'sptt', 'dmt'):.2f}x | "
            f"{p['sptt_sharding']['sptt']}/{p['sptt_sharding']['dmt']} |"
        )

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, model in zip(axes, ("dlrm", "dcn")):
        _speedup_per_preset(ax, scale, model, "flat", PAPER_POINTS[("fig10", model)])
        ax.set_title(f"Fig. 10: DMT over flat, {model.upper()}")
        ax.set_xlabel("GPUs")
        ax.legend()
    axes[0].set_ylabel("predicted speed-up")
    fig.tight_layout()
    fig.savefig(out / "fig10_speedup_vs_gpus.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    _speedup_per_preset(ax, scale, "dlrm", "sptt", PAPER_POINTS[("fig11", "dlrm")])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("DMT over SPTT (predicted)")
    ax.set_title("Fig. 11: tower modules over SPTT, DLRM")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fig11_tm_over_sptt.png", dpi=120)
    plt.close(fig)

    lines += ["", "## Compression ratio (DMT 8T-DLRM, 64 H100): DMT over SPTT", ""]
    lines += ["| CR | DMT ms | SPTT ms | DMT over SPTT | DMT over flat |", "|---|---|---|---|---|"]
    crs = [p for p in points if p["study"] == "cr" and "error" not in p]
    for p in crs:
        lines.append(
            f"| {p['cr']} | {_ms(p, 'dmt'):.1f} | {_ms(p, 'sptt'):.1f} | "
            f"{_ratio(p, 'sptt', 'dmt'):.2f}x | {_ratio(p, 'flat', 'dmt'):.2f}x |"
        )
    if crs:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([p["cr"] for p in crs], [_ratio(p, "sptt", "dmt") for p in crs], marker="o")
        ax.scatter([16], [PAPER_POINTS[("fig12", "16")]], c="gray", label="paper (CR 16)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("compression ratio")
        ax.set_ylabel("DMT 8T-DLRM over DMT-SPTT (predicted)")
        ax.set_title("Fig. 12: compression ratio, 64 H100")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "fig12_compression_ratio.png", dpi=120)
        plt.close(fig)

    comp = [p for p in points if p["study"] == "components" and "error" not in p]
    if comp:
        p = comp[0]
        flat, dmt = _component(p, "flat"), _component(p, "dmt")
        lines += ["", "## Components, DCN vs DMT-DCN on 64 H100 (ms per step)", ""]
        lines += ["| component | DCN | DMT-DCN | DCN / DMT | paper |", "|---|---|---|---|---|"]
        for k in flat:
            paper = PAPER_POINTS.get(("fig13", k))
            ratio = f"{flat[k] / dmt[k]:.2f}x" if dmt[k] > 0 else "-"
            lines.append(
                f"| {k} | {flat[k]:.2f} | {dmt[k]:.2f} | {ratio} | "
                f"{'' if paper is None else f'{paper}x'} |"
            )
        fig, ax = plt.subplots(figsize=(7, 4))
        keys = list(flat)
        x = range(len(keys))
        ax.bar([i - 0.2 for i in x], [flat[k] for k in keys], width=0.4, label="DCN (flat)")
        ax.bar([i + 0.2 for i in x], [dmt[k] for k in keys], width=0.4, label="DMT 8T-DCN")
        ax.set_xticks(list(x), keys, rotation=15)
        ax.set_ylabel("predicted ms per step")
        ax.set_title("Fig. 13: step components, 64 H100")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "fig13_components_64_h100.png", dpi=120)
        plt.close(fig)
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a new directory for the outputs")
    parser.add_argument("--presets", default="v100,a100,h100")
    parser.add_argument("--models", default="dlrm,dcn")
    parser.add_argument("--gpus", default="16,32,64,128,208,256,512")
    parser.add_argument(
        "--sptt-sharding",
        default="table_wise,column_wise",
        help="SPTT sharding types to plan; each mode keeps its fastest (sptt.sharding_type)",
    )
    parser.add_argument(
        "--flat-search",
        default="auto",
        choices=("auto", "full", "uniform"),
        help="TorchRec planner search for flat (dmt-plan's flat_search)",
    )
    args = parser.parse_args(argv)
    if args.out.is_file() or (args.out.exists() and not args.out.is_dir()):
        parser.error(f"--out {args.out} is a file: give a new directory")
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out} exists and is not empty: give a new directory")
    if not args.out.exists() and (error := existing_output(args.out, "--out", False)):
        parser.error(error)  # under a file: it could not be made, after the arguments passed
    points_to_plan = scale_points(parser, args)
    with output_directory(args.out):
        try:
            _study(args, points_to_plan)
        except BaseException:
            # a study that fails (an interrupt, an error hours in) keeps the points it planned:
            # results.json is rewritten whole after each; the table and figures of the end go
            # (and the directories it made, if nothing stays: output_directory)
            results = args.out / OUTPUTS[0]
            for name in OUTPUTS[1:]:
                (args.out / name).unlink(missing_ok=True)
            if results.exists():
                print(f"(the points planned before the failure are in {results})", file=sys.stderr)
            raise
    return 0


def _study(args: argparse.Namespace, scale: list[tuple[str, str, int, str, int]]) -> None:
    """Plan the ``scale`` points (:func:`scale_points`), then the compression-ratio and component
    points, writing ``results.json`` after each and the table and figures at the end."""
    points: list[dict[str, Any]] = []
    sharding = [e.strip() for e in args.sptt_sharding.split(",")]

    def record(point: dict[str, Any], **tags: Any) -> None:
        point.update(tags)
        points.append(point)
        status = point.get("error") or " ".join(
            f"{m}={v['predicted_ms_per_step']:.1f}ms" for m, v in point["modes"].items()
        )
        print(f"[{point['seconds']:6.1f}s] {tags} {point['gpus']} GPUs: {status}", flush=True)
        write_json(args.out / "results.json", points)

    for preset, model, gpus, experiment, hosts_per_tower in scale:
        point = run_point(preset, experiment, gpus, hosts_per_tower, args.flat_search, sharding)
        record(point, study="scale", model=model)
    for cr in (2, 4, 8, 16):
        experiment = f"paper_dmt_8t_dlrm_cr{cr}"
        point = run_point("h100", experiment, 64, 1, args.flat_search, sharding)
        record(point, study="cr", cr=cr)
    point = run_point("h100", "paper_dmt_8t_dcn", 64, 1, args.flat_search, sharding)
    record(point, study="components")
    print(write_outputs(points, args.out))
    print(f"written to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
