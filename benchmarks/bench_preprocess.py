"""Benchmark ``dmt-preprocess`` against TorchRec's Criteo preprocessing on the same raw file.

Builds a ~1 GB raw file by repeating the Kaggle sample (``../shared/data``) under ``--workdir``
(``/tmp`` by default, never the repository), then runs, alternating, ``--runs`` times each:

* dmt:      ``python -m dmt.data.preprocess_cli RAW OUT`` (line counts, splits, vocabularies
            fitted on train, ids, manifest; ``--num-workers`` processes);
* torchrec: ``BinaryCriteoUtils.tsv_to_npys`` then ``BinaryCriteoUtils.sparse_to_contiguous``
            (frequency threshold 3), the documented TorchRec path from TSV to contiguous ids.

Each run is a fresh process; the tools' outputs and logs go to a new directory of this
invocation's own, ``<workdir>/run-<date>-<time>-<random>/`` (the logs stay there, named in the
results, and with ``--keep`` each tool's output of the last run, ``out-<tool>/``; never over an
earlier run's or a user's files). The repeated file is reused when one of
that size is there (and then left, even without ``--keep``); a file of that name and another size
is refused, not replaced. Reported: wall time (including interpreter start and imports),
rows/s, peak memory of the whole process tree (PSS, sampled every 50 ms from /proc, so workers
count once each) and the largest single process's peak RSS (``getrusage``). Also the start-up
cost of each command alone. Prints the median of each figure with its range (min-max) over the
runs, the speed ratio of the medians and the machine's load (``os.getloadavg()``) before and
after, and writes all of it to ``--json`` (default ``<workdir>/results.json``) through
:func:`dmt.results.write_json`. An existing ``--json`` file (an earlier run's) is refused when the
command starts, before the raw file is built, unless ``--overwrite``.

``--runs`` must be at least 3 (a median of fewer runs is not a result); ``--smoke`` allows 1 or
2 runs to check that the script runs, says loudly that its figures are not a result and marks
the results file ``"smoke": true``.

Usage::

    python benchmarks/bench_preprocess.py                 # ~1 GB, 3 runs each
    python benchmarks/bench_preprocess.py --size-gb 0.1 --runs 1 --smoke
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from dmt.data.criteo_parse import describe_row_problem, is_gzip
from dmt.results import (
    add_runs_options,
    check_runs,
    existing_output,
    output_directory,
    write_json,
)

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


def sample_problem(sample: Path) -> str | None:
    """What makes ``sample`` no Criteo TSV, by its first line (dmt's own row check,
    :func:`dmt.data.criteo_parse.describe_row_problem`), as ``--sample FILE:1: ...``; ``None``
    if that line is a valid row. A gzip file is refused: the benchmark repeats the sample's
    bytes (:func:`build_raw`)."""
    if is_gzip(sample):
        return (
            f"--sample {sample} is gzip-compressed; this benchmark repeats the sample's bytes: "
            "give it uncompressed (gunzip -k)"
        )
    with open(sample, "rb") as f:
        first = f.readline()
    if not first:
        return f"--sample {sample}: the file is empty; expected rows of Criteo Kaggle TSV"
    problem = describe_row_problem(first.rstrip(b"\n"))
    return None if problem is None else f"--sample {sample}:1: {problem} (Criteo Kaggle TSV)"


RAW_NAME = "kaggle_repeated.tsv"


def _repeat(sample: Path, size_bytes: int) -> tuple[bytes, int]:
    """The bytes of ``sample`` (ending in a newline) and how many copies make ``size_bytes``."""
    data = sample.read_bytes()
    if not data.endswith(b"\n"):
        data += b"\n"
    return data, max(1, -(-size_bytes // len(data)))


def raw_problem(sample: Path, target: Path, size_bytes: int) -> str | None:
    """Why ``target`` may not be (re)built from ``sample``: something of that name that is not
    the repeated file of this size (a file of another size, or not a file) is not replaced, as
    it may not be this benchmark's; ``None`` if ``target`` is missing or may be reused."""
    if not target.exists() and not target.is_symlink():
        return None
    data, copies = _repeat(sample, size_bytes)
    if target.is_file() and not target.is_symlink() and target.stat().st_size == copies * len(data):
        return None
    return (
        f"--workdir {target.parent}: {target.name} exists and is not the {copies * len(data):,} "
        "bytes this --sample and --size-gb repeat to; not replaced (this run did not make it): "
        "remove it, or choose another --workdir"
    )


def build_raw(sample: Path, target: Path, size_bytes: int) -> tuple[Path, int]:
    """Repeat ``sample`` until the file holds at least ``size_bytes``; returns (path, rows). A
    file of that size already there is reused (another is refused first: :func:`raw_problem`);
    the file is written under a fresh temporary name, then renamed."""
    data, copies = _repeat(sample, size_bytes)
    rows = copies * data.count(b"\n")
    if target.is_file() and target.stat().st_size == copies * len(data):
        return target, rows
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            for _ in range(copies):
                f.write(data)
        tmp.rename(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
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


def _load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sample", type=Path, default=SAMPLE, help="raw rows to repeat")
    p.add_argument("--size-gb", type=float, default=1.0, help="size of the benchmark file")
    add_runs_options(p, "runs per tool")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/dmt-bench-preprocess"))
    p.add_argument("--json", type=Path, help="results file (default: <workdir>/results.json)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    p.add_argument("--num-workers", type=int, default=0, help="dmt processes (0: one per core)")
    p.add_argument("--skip-torchrec", action="store_true")
    p.add_argument(
        "--keep", action="store_true", help="keep the raw file and each tool's last outputs"
    )
    args = p.parse_args(argv)
    json_path = args.json if args.json is not None else args.workdir / "results.json"
    if (error := existing_output(json_path, "--json", args.overwrite)) is not None:
        p.error(error)
    check_runs(p, args.runs, args.smoke, " per tool")
    if not args.size_gb > 0:
        p.error(f"--size-gb {args.size_gb}: must be more than 0")
    if args.num_workers < 0:
        p.error(f"--num-workers {args.num_workers}: must be 0 (one per core) or more")
    if not args.sample.is_file():
        p.error(f"--sample {args.sample}: no such file")
    if (problem := sample_problem(args.sample)) is not None:
        p.error(problem)
    if REPO in args.workdir.resolve().parents or args.workdir.resolve() == REPO:
        p.error(f"--workdir {args.workdir}: must be outside the repository (raw Criteo rows)")
    if args.workdir.exists() and not args.workdir.is_dir():
        p.error(f"--workdir {args.workdir} is a file; expected a directory")
    if not args.workdir.exists() and (error := existing_output(args.workdir, "--workdir", False)):
        p.error(error)  # under a file
    if error := raw_problem(args.sample, args.workdir / RAW_NAME, int(args.size_gb * 1e9)):
        p.error(error)
    built: list[Path] = []
    with output_directory(args.workdir):
        try:
            return _run(args, json_path, built)
        except BaseException:
            # a failed run takes away what it made (--keep or not): the repeated file, the
            # tools' outputs and logs (and the directories it created: output_directory);
            # never a file it found there
            for path in built:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            raise


def _run(args: argparse.Namespace, json_path: Path, built: list[Path]) -> int:
    """The benchmark proper, in ``args.workdir``; every file or directory it makes is added to
    ``built`` first (taken away by the caller if the run fails)."""
    load_start = os.getloadavg()
    print(f"load average before: {_load(load_start)}", flush=True)
    target = args.workdir / RAW_NAME
    existed = target.exists()
    if not existed:
        built.append(target)
    raw, rows = build_raw(args.sample, target, int(args.size_gb * 1e9))
    # the tools' outputs and logs: a directory of this run's own, never an earlier run's names
    # (its logs stay beside its results; a user's out-dmt/ in the workdir is not touched)
    run_dir = Path(tempfile.mkdtemp(prefix=time.strftime("run-%Y%m%d-%H%M%S-"), dir=args.workdir))
    built.append(run_dir)
    size_gb = raw.stat().st_size / 1e9
    print(f"raw file: {raw} ({size_gb:.2f} GB, {rows:,} rows)")
    # PYTHONSAFEPATH (Python 3.11+): no dmt/ or torchrec/ of the working directory shadows the real ones
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "PYTHONSAFEPATH": "1",
    }

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
            out = run_dir / f"out-{name}"
            log = run_dir / f"{name}-run{run + 1}.log"
            shutil.rmtree(out, ignore_errors=True)  # this run's own, from its run before
            if name == "torchrec":
                out.mkdir()
            r = measure(tools[name](out), env=env, log=log)
            r["rows_per_s"] = rows / r["wall_s"]
            results[name].append(r)
            print(
                f"run {run + 1} {name:8s} {r['wall_s']:8.1f} s {r['rows_per_s']:>12,.0f} rows/s "
                f"peak PSS tree {r['peak_tree_pss_mb']:8.0f} MB, largest process "
                f"{r['peak_process_rss_mb']:8.0f} MB",
                flush=True,
            )
            if not args.keep or run < args.runs - 1:  # --keep: the last run's outputs stay
                shutil.rmtree(out, ignore_errors=True)

    load_end = os.getloadavg()
    summary: dict[str, dict[str, float]] = {}
    ranges: dict[str, dict[str, list[float]]] = {}
    for name, rs in results.items():
        summary[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        ranges[name] = {k: [min(r[k] for r in rs), max(r[k] for r in rs)] for k in rs[0]}
    print(
        f"\nmedians (range) over {args.runs} runs; load average before {_load(load_start)}, "
        f"after {_load(load_end)}"
    )
    for name, s in summary.items():
        r = ranges[name]
        print(
            f"  {name:8s} {s['wall_s']:8.1f} s ({r['wall_s'][0]:.1f}-{r['wall_s'][1]:.1f}) "
            f"{s['rows_per_s']:>12,.0f} rows/s "
            f"({r['rows_per_s'][0]:,.0f}-{r['rows_per_s'][1]:,.0f})\n"
            f"           peak PSS tree {s['peak_tree_pss_mb']:8.0f} MB "
            f"({r['peak_tree_pss_mb'][0]:.0f}-{r['peak_tree_pss_mb'][1]:.0f}), largest process "
            f"{s['peak_process_rss_mb']:8.0f} MB "
            f"({r['peak_process_rss_mb'][0]:.0f}-{r['peak_process_rss_mb'][1]:.0f})"
        )
    report = {
        "raw_file_gb": size_gb,
        "rows": rows,
        "runs": args.runs,
        "smoke": args.smoke,
        "cpus": len(os.sched_getaffinity(0)),
        "machine": platform.platform(),
        "load_avg_start": list(load_start),
        "load_avg_end": list(load_end),
        "startup_s": startup_s,
        "logs": str(run_dir),
        "results": results,
        "medians": summary,
        "ranges": ranges,
    }
    if "torchrec" in summary:
        ratio = summary["torchrec"]["wall_s"] / summary["dmt"]["wall_s"]
        report["speedup_dmt_vs_torchrec"] = ratio
        print(f"  dmt is {ratio:.1f}x faster than TorchRec (median wall time)")
    write_json(json_path, report, replace=args.overwrite)
    print(f"results: {json_path}; the tools' logs: {run_dir}")
    if args.smoke:
        print("WARNING: --smoke run: not a result", file=sys.stderr)
    if not args.keep and not existed:  # a file an earlier run kept (--keep) stays
        raw.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
