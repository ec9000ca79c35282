"""The alpha-beta collective model (dmt.planning.network) on hand-checked cases."""

from __future__ import annotations

import doctest

import pytest

import dmt.planning.network as network
from dmt.planning.network import LinkSpec, collective_time_s

FAST = LinkSpec(bandwidth_gbps=100.0, latency_us=2.0)  # 1e11 B/s, 2e-6 s
NIC = LinkSpec(bandwidth_gbps=10.0, latency_us=10.0)  # 1e10 B/s, 1e-5 s


def _t(op: str, n: int, local: int, intra: float, cross: float, r: int = 1) -> float:
    return collective_time_s(
        op,
        group_size=n,
        ranks_per_host=local,
        intra_host_bytes=intra,
        cross_host_bytes=cross,
        intra=FAST,
        inter=NIC,
        ranks_per_nic=r,
    )


def test_docstring_example() -> None:
    results = doctest.testmod(network)
    assert results.failed == 0 and results.attempted == 3  # the example's three lines ran


def test_all_to_all_nic_bound() -> None:
    # 4 hosts of 2: 6 remote peers x 10 us + 2 ranks per NIC x 1e8 B / 1e10 B/s = 60 us + 20 ms
    assert _t("all_to_all", 8, 2, 1e6, 1e8, r=2) == pytest.approx(6e-5 + 2e-2)


def test_all_to_all_intra_bound() -> None:
    # one host-mate: 1 x 2 us + 1e9 / 1e11 = 10 ms; NIC: 2 x 10 us + 1e6 / 1e10 = 120 us
    assert _t("all_to_all", 4, 2, 1e9, 1e6) == pytest.approx(2e-6 + 1e-2)


def test_single_host_group_is_intra_only() -> None:
    assert _t("all_to_all", 4, 4, 3e8, 0) == pytest.approx(3 * 2e-6 + 3e-3)


def test_reduce_scatter_and_all_gather_ring_latency() -> None:
    # 4 hosts of 1 rank: 3 ring steps between hosts (not 3 peers' worth of a2a start-ups each)
    for op in ("reduce_scatter", "all_gather"):
        assert _t(op, 4, 1, 0, 3e7) == pytest.approx(3e-5 + 3e-3)
    assert _t("all_to_all", 4, 1, 0, 3e7) == pytest.approx(3e-5 + 3e-3)
    # the a2a pays one start-up per remote peer: 2 hosts of 4 -> 4 peers, the ring 1 step
    assert _t("all_to_all", 8, 4, 0, 1e6) - _t("all_gather", 8, 4, 0, 1e6) == pytest.approx(3e-5)


def test_all_reduce_hierarchical() -> None:
    # n = 8 = 2 hosts x 4, buffer S = 8e6: ring volume V = 2 * 7/8 * S = 1.4e7
    s = 8e6
    v = 2 * 7 / 8 * s
    intra_phase = 2 * 3 * (2e-6 + s / 4 / 1e11)  # reduce-scatter + all-gather of S/4 blocks
    inter_phase = 2 * 1 * (1e-5 + 4 * (s / 4) / 2 / 1e10)  # 4 ranks share the NIC
    # however the ring volume splits between intra and cross, the time is the same
    assert _t("all_reduce", 8, 4, 0, v, r=4) == pytest.approx(intra_phase + inter_phase)
    assert _t("all_reduce", 8, 4, v / 2, v / 2, r=4) == pytest.approx(intra_phase + inter_phase)


def test_all_reduce_one_host_and_one_per_host() -> None:
    s = 4e6
    assert _t("all_reduce", 4, 4, 1.5 * s, 0) == pytest.approx(6 * (2e-6 + s / 4 / 1e11))
    assert _t("all_reduce", 4, 1, 0, 1.5 * s) == pytest.approx(6 * (1e-5 + s / 4 / 1e10))


def test_nothing_to_send_costs_nothing() -> None:
    assert _t("all_to_all", 1, 1, 0, 0) == 0.0
    assert _t("all_reduce", 8, 2, 0, 0) == 0.0


def test_more_ranks_per_nic_is_slower_in_proportion() -> None:
    t1 = _t("all_to_all", 16, 8, 0, 1e9, r=1)
    t8 = _t("all_to_all", 16, 8, 0, 1e9, r=8)
    assert t8 - 8 * 1e-5 == pytest.approx(8 * (t1 - 8 * 1e-5))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"op": "broadcast"},
            "op='broadcast' is not a collective the model knows; expected one of "
            "['all_to_all', 'reduce_scatter', 'all_gather', 'all_reduce']",
        ),
        (
            {"group_size": 6, "ranks_per_host": 4},
            "group_size=6 is not a multiple of ranks_per_host=4 (a group spans whole hosts, "
            "the same number of its ranks on each)",
        ),
        (
            {"group_size": 4, "ranks_per_host": 1, "intra_host_bytes": 5.0},
            "all_to_all: intra_host_bytes=5.0 > 0 but the group has one rank per host "
            "(ranks_per_host=1): there is no same-host peer to send to",
        ),
        (
            {"group_size": 4, "ranks_per_host": 4, "cross_host_bytes": 5.0},
            "all_to_all: cross_host_bytes=5.0 > 0 but the group of 4 ranks lies on one host "
            "(ranks_per_host=4)",
        ),
        (
            {"cross_host_bytes": -1.0},
            "all_to_all: intra_host_bytes=0.0 and cross_host_bytes=-1.0 must be >= 0",
        ),
    ],
)
def test_bad_input(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "op": "all_to_all",
        "group_size": 4,
        "ranks_per_host": 2,
        "intra_host_bytes": 0.0,
        "cross_host_bytes": 0.0,
        "intra": FAST,
        "inter": NIC,
        "ranks_per_nic": 1,
    }
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        collective_time_s(**args)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_link_spec_checks() -> None:
    with pytest.raises(ValueError, match=r"LinkSpec.bandwidth_gbps=0.0 must be > 0 \(GB/s\)"):
        LinkSpec(0.0, 1.0)
    with pytest.raises(ValueError, match=r"LinkSpec.latency_us=-1.0 must be >= 0 \(us\)"):
        LinkSpec(1.0, -1.0)
