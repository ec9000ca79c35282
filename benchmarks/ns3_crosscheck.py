"""Cross-check the alpha-beta collective model (:func:`dmt.planning.network.collective_time_s`)
against ns-3's packet-level simulation (:mod:`dmt.planning.ns3_sim`; needs ``pip install
dmt[sim]``) on a full-bisection network of 4-16 hosts, one NIC each, one rank per NIC.

Cases (message sizes of the paper's DLRM, ``F = 26`` tables of dim ``N = 128``, table-wise over
``H`` hosts, ``B`` samples per host):

* ``all_to_all``: the pooled-embedding exchange of a flat plan: each host sends
  ``M = B F N 4 / H`` bytes to each other host (its ``F / H`` tables' vectors of the other host's
  ``B`` samples); ``/cr4`` the same at DMT's compression ratio 4 (tower outputs, step f);
* ``all_reduce``: a ring all-reduce of the DLRM's dense parameters (``S`` = 9.5 MB, fp32) and of a
  1 MB buffer.

The model gets the link as a user would describe it: ``bandwidth_gbps`` = the NIC rate / 8
(``nominal``), and, to separate the headers from everything else, the payload rate of full
segments (``goodput``: rate less the IP/TCP/PPP headers); ``latency_us`` = one host-to-host path
(two link delays and the switch's store-and-forward of one packet). Relative error
``(model - ns3) / ns3``. Results go to ``--json`` (default: the repository's
``benchmarks/results/ns3_crosscheck.json``, wherever the command runs from), written atomically
(:func:`dmt.results.write_json`). An existing file is refused when the command starts, before any
simulation, unless ``--overwrite`` (the repository's file is committed: git keeps its earlier
versions)::

    PYTHONPATH=$PWD python benchmarks/ns3_crosscheck.py [--quick] [--json FILE] [--overwrite]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmt.planning.network import LinkSpec, collective_time_s
from dmt.planning.ns3_sim import NetworkSpec, all_to_all_s, ring_all_reduce_s
from dmt.results import existing_output, write_json

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JSON = REPO / "benchmarks" / "results" / "ns3_crosscheck.json"

FEATURES, DIM, FP32 = 26, 128, 4
DENSE_PARAM_BYTES = 9_500_000  # paper_dlrm's bottom + top MLP, fp32 (~2.4 M parameters)


@dataclass(frozen=True)
class Case:
    op: str  # "all_to_all" | "all_reduce"
    hosts: int
    nbytes: int  # all_to_all: M per host pair; all_reduce: the buffer S
    rate_gbit: float
    label: str

    @property
    def cross_host_bytes(self) -> int:
        """Bytes one host sends (the model's ``cross_host_bytes``, CommTrace's convention)."""
        if self.op == "all_to_all":
            return (self.hosts - 1) * self.nbytes
        return 2 * (self.hosts - 1) * self.nbytes // self.hosts


def cases(quick: bool) -> list[Case]:
    out = []
    for hosts, batches in ((4, (2048, 8192)), (8, (2048, 8192)), (16, (256, 2048))):
        for batch in batches:
            pair = batch * FEATURES * DIM * FP32 // hosts
            out.append(Case("all_to_all", hosts, pair, 100.0, f"flat B={batch}"))
            out.append(Case("all_to_all", hosts, pair // 4, 100.0, f"cr4 B={batch}"))
        out.append(Case("all_reduce", hosts, DENSE_PARAM_BYTES, 100.0, "dense 9.5MB"))
        out.append(Case("all_reduce", hosts, 1_000_000, 100.0, "1MB"))
    out.append(Case("all_to_all", 8, 2048 * FEATURES * DIM * FP32 // 8, 25.0, "flat B=2048"))
    out.append(Case("all_reduce", 8, DENSE_PARAM_BYTES, 25.0, "dense 9.5MB"))
    if quick:
        out = [c for c in out if c.hosts <= 8 and c.rate_gbit == 100.0][::3]
    return out


def _model_s(case: Case, net: NetworkSpec, bytes_per_s: float) -> float:
    path_latency_us = 2 * net.delay_us + (net.mtu_bytes + 2) * 8 / (net.rate_gbit * 1e3)
    nic = LinkSpec(bandwidth_gbps=bytes_per_s / 1e9, latency_us=path_latency_us)
    return collective_time_s(
        case.op,
        group_size=case.hosts,
        ranks_per_host=1,
        intra_host_bytes=0,
        cross_host_bytes=case.cross_host_bytes,
        intra=nic,  # unused: one rank per host
        inter=nic,
        ranks_per_nic=1,
    )


def run(quick: bool, delay_us: float, mtu: int) -> list[dict[str, Any]]:
    rows = []
    for case in cases(quick):
        net = NetworkSpec(rate_gbit=case.rate_gbit, delay_us=delay_us, mtu_bytes=mtu)
        start = time.perf_counter()
        if case.op == "all_to_all":
            sim = all_to_all_s(case.hosts, case.nbytes, net)
        else:
            sim = ring_all_reduce_s(case.hosts, case.nbytes, net)
        wall = time.perf_counter() - start
        nominal = _model_s(case, net, case.rate_gbit * 1e9 / 8)
        goodput = _model_s(case, net, net.goodput_bytes_per_s)
        rows.append(
            {
                "op": case.op,
                "label": case.label,
                "hosts": case.hosts,
                "bytes": case.nbytes,
                "cross_host_bytes_per_host": case.cross_host_bytes,
                "rate_gbit": case.rate_gbit,
                "delay_us": delay_us,
                "mtu_bytes": mtu,
                "ns3_ms": sim * 1e3,
                "model_nominal_ms": nominal * 1e3,
                "model_goodput_ms": goodput * 1e3,
                "rel_err_nominal": (nominal - sim) / sim,
                "rel_err_goodput": (goodput - sim) / sim,
                "sim_wall_s": wall,
            }
        )
        print(_line(rows[-1]), flush=True)
    return rows


def _line(r: dict[str, Any]) -> str:
    return (
        f"{r['op']:10s} {r['label']:12s} {r['hosts']:3d} {r['rate_gbit']:5.0f} "
        f"{r['bytes'] / 1e6:9.3f} {r['ns3_ms']:9.3f} {r['model_nominal_ms']:9.3f} "
        f"{100 * r['rel_err_nominal']:+7.1f}% {r['model_goodput_ms']:9.3f} "
        f"{100 * r['rel_err_goodput']:+7.1f}% {r['sim_wall_s']:6.1f}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few small cases")
    p.add_argument("--delay-us", type=float, default=1.0, help="one-way delay of one link")
    p.add_argument("--mtu", type=int, default=9000, help="IP MTU of every link")
    p.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        help="results file (default: the repository's benchmarks/results/ns3_crosscheck.json)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    args = p.parse_args(argv)
    if (error := existing_output(args.json, "--json", args.overwrite)) is not None:
        p.error(error)
    if not (math.isfinite(args.delay_us) and args.delay_us >= 0):
        p.error(f"--delay-us {args.delay_us}: must be a finite number >= 0 (microseconds)")
    if not 576 <= args.mtu <= 65535:
        p.error(f"--mtu {args.mtu}: must be in 576..65535 (bytes)")
    if importlib.util.find_spec("ns") is None:  # what dmt.planning.ns3_sim imports, first use
        p.error("needs ns-3's Python bindings (the ns3 package): pip install 'dmt[sim]' (or ns3)")
    print(
        f"{'op':10s} {'case':12s} {'H':>3s} {'Gbit':>5s} {'MB':>9s} {'ns3 ms':>9s} "
        f"{'nominal':>9s} {'err':>8s} {'goodput':>9s} {'err':>8s} {'wall s':>6s}"
        "\n(MB: per host pair for all_to_all, the buffer for all_reduce; err = (model - ns3)/ns3)",
        flush=True,
    )
    start = time.perf_counter()
    rows = run(args.quick, args.delay_us, args.mtu)
    summary = {
        key: {
            "median_abs": statistics.median(abs(r[key]) for r in rows),
            "max_abs": max(abs(r[key]) for r in rows),
        }
        for key in ("rel_err_nominal", "rel_err_goodput")
    }
    for key, s in summary.items():
        print(f"{key}: median |err| {100 * s['median_abs']:.1f}%, max {100 * s['max_abs']:.1f}%")
    write_json(
        args.json,
        {
            "cases": rows,
            "summary": summary,
            "network": "H hosts, one point-to-point NIC link each to a non-blocking switch "
            "node; persistent TCP (ns-3 default congestion control) per host pair; "
            "FqCoDel queue discs",
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": time.perf_counter() - start,
        },
        indent=1,
        replace=args.overwrite,  # never over a file that appeared since the check at the start
    )
    print(f"results: {args.json}")


if __name__ == "__main__":
    main()
