"""dmt.planning.ns3_sim: input checks (no ns-3 needed) and packet-level properties (needs the
optional ``ns3`` package; importing it and compiling the simulation takes tens of seconds, so
those tests are ``slow``)."""

import re

import pytest

from dmt.planning.ns3_sim import (
    NetworkSpec,
    all_to_all_s,
    ring_all_reduce_s,
    simulate_phases,
)

NET = NetworkSpec(rate_gbit=10.0, delay_us=1.0, mtu_bytes=9000)


@pytest.mark.parametrize(
    "hosts, phases, message",
    [
        (1, [[(0, 0, 10)]], "hosts=1 must be >= 2"),
        (2, [], "phases is empty"),
        (2, [[(0, 1, 10), (0, 1, 5)]], "phase 0 sends twice between one host pair"),
        (2, [[(0, 2, 10)]], "phase 0: transfer 0->2 must join two different hosts of 0..1"),
        (2, [[(1, 0, 1)], [(0, 1, 0)]], "phase 1: transfer 0->1 of 0 bytes must be >= 1 byte"),
    ],
)
def test_bad_workloads_are_named(hosts, phases, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        simulate_phases(hosts, phases, NET)


def test_bad_network_is_named():
    with pytest.raises(ValueError, match=re.escape("NetworkSpec.rate_gbit=0 must be > 0")):
        NetworkSpec(rate_gbit=0)
    with pytest.raises(ValueError, match=re.escape("NetworkSpec.mtu_bytes=100 must be in")):
        NetworkSpec(mtu_bytes=100)


def test_goodput_removes_the_headers_of_full_segments():
    # 10 Gbit/s = 1.25e9 B/s on the wire; a 9002-byte frame (PPP) carries 8948 payload bytes
    assert NET.goodput_bytes_per_s == pytest.approx(1.25e9 * 8948 / 9002)


@pytest.mark.slow
def test_one_message_takes_its_serialisation_time_plus_the_path():
    pytest.importorskip("ns")
    nbytes = 4_000_000
    # payload at the goodput, the two links' delays, the switch's store-and-forward of a frame
    expected = nbytes / NET.goodput_bytes_per_s + 2e-6 + 9002 * 8 / 10e9
    (elapsed,) = simulate_phases(2, [[(0, 1, nbytes)]], NET)
    assert elapsed == pytest.approx(expected, rel=0.03)
    # twice the bytes: the serialisation part doubles, the start-up does not
    (twice,) = simulate_phases(2, [[(0, 1, 2 * nbytes)]], NET)
    assert twice - elapsed == pytest.approx(nbytes / NET.goodput_bytes_per_s, rel=0.03)


@pytest.mark.slow
def test_collectives_are_bounded_by_what_one_nic_must_send():
    pytest.importorskip("ns")
    hosts, pair, buffer = 4, 500_000, 2_000_000
    # every host sends (H - 1) M bytes through its one NIC: no schedule is faster
    nic_bound = (hosts - 1) * pair / NET.goodput_bytes_per_s
    a2a = all_to_all_s(hosts, pair, NET)
    assert nic_bound < a2a < 1.5 * nic_bound
    # the ring: 2 (H - 1) steps, each waiting for one S / H chunk over one link
    ring_bound = 2 * (hosts - 1) * (buffer / hosts) / NET.goodput_bytes_per_s
    ring = ring_all_reduce_s(hosts, buffer, NET)
    assert ring_bound < ring < 1.5 * ring_bound
    # phases run one after the other: the ring's steps end in order, the last one is the total
    chunk = buffer // hosts
    step = [(h, (h + 1) % hosts, chunk) for h in range(hosts)]
    ends = simulate_phases(hosts, [step] * (2 * (hosts - 1)), NET)
    assert ends == sorted(ends) and ends[-1] == pytest.approx(ring)
