"""Benchmark ``dmt-preprocess`` against TorchRec's Criteo preprocessing on the same raw file.

Builds a ~1 GB raw file by repeating the Kaggle sample (``../shared/data``) under ``--workdir``
(``/tmp`` by default, never the repository), then runs, alternating, ``--runs`` times each:

* dmt:      ``python -m dmt.data.preprocess_cli RAW OUT`` (line counts, splits, vocabularies
            fitted on train, ids, manifest; ``--num-workers`` processes);
* torchrec: ``BinaryCriteoUtils.tsv_to_npys`` then ``BinaryCriteoUtils.sparse_to_contiguous``
            (frequency threshold 3), the documented TorchRec path from TSV to contiguous ids.

Each run is a fresh process. Reported: wall time (including interpreter start and imports),
rows/s, peak memory of the whole process tree (PSS, sampled every 50 ms from /proc, so workers
count once each) and the largest single process's peak RSS (``getrusage``). Also the start-up
cost of each command alone. Prints medians and the speed ratio, and writes ``results.json``.

Usage::

    python benchmarks/bench_preprocess.py                 # ~1 GB, 3 runs each
    python benchmarks/bench_preprocess.py --size-gb 0.1 --runs 1
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from dmt.results import write_json

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / ".." / "shared" / "data" / "criteo-kaggle-sample" / "train.tsv"

TORCHREC_SCRIPT = """
import sys
from torchrec.datasets.criteo import BinaryCriteoUtils
raw, out = sys.argv[1], sys.argv[2]
BinaryCriteoUtils.tsv_to_npys(raw, out + "/day_0_dense.npy", out + "/day_0_sparse.npy",
                              out + "/day_0_labels.npy", dataset_name="criteo_kaggle")
BinaryCriteoUtils.sparse_to_contiguous([out + "/day_0_sparse.npy"], out, frequency_threshold=3)
"""


def build_raw(sample: Path, target: Path, size_bytes: int) -> tuple[Path, int]:
    """Repeat ``sample`` until the file holds at least ``size_bytes``; returns (path, rows)."""
    data = sample.read_bytes()
    if not data.endswith(b"\n"):
        data += b"\n"
    copies = max(1, -(-size_bytes // len(data)))
    rows = copies * data.count(b"\n")
    if not (target.is_file() and target.stat().st_size == copies * len(data)):
        tmp = target.with_suffix(".partial")
        with open(tmp, "wb") as f:
            for _ in range(copies):
                f.write(data)
        tmp.rename(target)
    return target, rows


def _tree_pss_bytes(root: int) -> int:
    """Proportional set size (PSS) of ``root`` and all its descendants, from /proc.

    PSS splits shared pages (forked workers, shared libraries) among the processes sharing
    them, so the sum is the tree's real footprint; a plain RSS sum would count them repeatedly.
    """
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for child, pp in parent.items():
            if pp == p and child not in tree:
                tree.add(child)
                frontier.append(child)
    total = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def measure(cmd: list[str], *, env: dict[str, str], log: Path) -> dict[str, float]:
    """Run ``cmd``; wall seconds, sampled peak tree RSS and getrusage peak of one process."""
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_pss_bytes(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # wait4, unlike Popen.wait, returns the rusage of the child and its reaped descendants
    # (ru_maxrss: the peak of the largest single process among them).
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{log.read_text(errors='replace')[-4000:]}")
    return {
        "wall_s": wall,
        "peak_tree_pss_mb": peak / 2**20,
        "peak_process_rss_mb": usage.ru_maxrss / 1024,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sample", type=Path, default=SAMPLE, help="raw rows to repeat")
    p.add_argument("--size-gb", type=float, default=1.0, help="size of the benchmark file")
    p.add_argument("--runs", type=int, default=3, help="runs per tool")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/dmt-bench-preprocess"))
    p.add_argument("--num-workers", type=int, default=0, help="dmt processes (0: one per core)")
    p.add_argument("--skip-torchrec", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the raw file and outputs")
    args = p.parse_args(argv)
    if not args.sample.is_file():
        print(f"no sample at {args.sample}; pass --sample", file=sys.stderr)
        return 1
    if REPO in args.workdir.resolve().parents or args.workdir.resolve() == REPO:
        print("--workdir must be outside the repository (raw Criteo rows)", file=sys.stderr)
        return 1
    args.workdir.mkdir(parents=True, exist_ok=True)
    raw, rows = build_raw(
        args.sample, args.workdir / "kaggle_repeated.tsv", int(args.size_gb * 1e9)
    )
    size_gb = raw.stat().st_size / 1e9
    print(f"raw file: {raw} ({size_gb:.2f} GB, {rows:,} rows)")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    tools = {
        "dmt": lambda out: [
            sys.executable, "-m", "dmt.data.preprocess_cli", str(raw), str(out),
            "--no-progress", "--num-workers", str(args.num_workers),
        ],
        "torchrec": lambda out: [sys.executable, "-c", TORCHREC_SCRIPT, str(raw), str(out)],
    }  # fmt: skip
    if args.skip_torchrec:
        del tools["torchrec"]
    startup = {
        "dmt": [sys.executable, "-m", "dmt.data.preprocess_cli", "--help"],
        "torchrec": [sys.executable, "-c", "import torchrec.datasets.criteo"],
    }
    startup_s = {}
    for name in tools:
        t = time.perf_counter()
        subprocess.run(startup[name], env=env, check=True, capture_output=True)
        startup_s[name] = time.perf_counter() - t
        print(f"start-up (imports) {name:8s} {startup_s[name]:6.1f} s")
    results: dict[str, list[dict[str, float]]] = {t: [] for t in tools}
    for run in range(args.runs):
        for name in tools if run % 2 == 0 else reversed(list(tools)):
            out = args.workdir / f"out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            if name == "torchrec":
                out.mkdir()
            r = measure(tools[name](out), env=env, log=args.workdir / f"{name}-run{run + 1}.log")
            r["rows_per_s"] = rows / r["wall_s"]
            results[name].append(r)
            print(
                f"run {run + 1} {name:8s} {r['wall_s']:8.1f} s {r['rows_per_s']:>12,.0f} rows/s "
                f"peak PSS tree {r['peak_tree_pss_mb']:8.0f} MB, largest process "
                f"{r['peak_process_rss_mb']:8.0f} MB",
                flush=True,
            )
            shutil.rmtree(out, ignore_errors=True)

    summary: dict[str, dict[str, float]] = {}
    for name, rs in results.items():
        summary[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    print("\nmedians over", args.runs, "runs")
    for name, s in summary.items():
        print(
            f"  {name:8s} {s['wall_s']:8.1f} s {s['rows_per_s']:>12,.0f} rows/s "
            f"peak PSS tree {s['peak_tree_pss_mb']:8.0f} MB, largest process {s['peak_process_rss_mb']:8.0f} MB"
        )
    report = {
        "raw_file_gb": size_gb,
        "rows": rows,
        "runs": args.runs,
        "cpus": len(os.sched_getaffinity(0)),
        "machine": platform.platform(),
        "startup_s": startup_s,
        "results": results,
        "medians": summary,
    }
    if "torchrec" in summary:
        ratio = summary["torchrec"]["wall_s"] / summary["dmt"]["wall_s"]
        report["speedup_dmt_vs_torchrec"] = ratio
        print(f"  dmt is {ratio:.1f}x faster than TorchRec (median wall time)")
    write_json(args.workdir / "results.json", report)
    print(f"results: {args.workdir / 'results.json'}")
    if not args.keep:
        raw.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
