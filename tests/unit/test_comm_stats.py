"""CommStats' counters (:mod:`dmt.sptt.comm_stats`), pure: what one rank records, per direction
and in total; the distributed tests compare them with real collectives."""

from __future__ import annotations

from dmt.sptt.comm_stats import CommCounter, CommStats
from dmt.sptt.topology import Topology


def _stats() -> CommStats:
    """Rank 1 of two hosts of two ranks ({0, 1}, {2, 3}): a forward all-to-all to every rank, a
    backward one to its tower, a forward and a backward shuffle."""
    stats = CommStats(Topology(4, 2), rank=1)
    stats.record("a", "world", [0, 1, 2, 3], [10, 20, 30, 40])
    stats.record("d", "tower", [0, 1], [5, 7], direction="backward")
    stats.record_shuffle("c", "input", 100)
    stats.record_shuffle("c", "output", 60, direction="backward")
    return stats


def test_a_rank_counts_what_it_sends_to_others_and_what_crosses_hosts() -> None:
    counters = _stats().counters
    # to itself (rank 1: 20, 7 bytes) nothing goes over a wire; to ranks 2 and 3 it leaves host 0
    assert counters == {
        ("a", "world", "forward"): CommCounter(
            calls=1, bytes_sent=10 + 30 + 40, bytes_cross_host=70
        ),
        ("d", "tower", "backward"): CommCounter(calls=1, bytes_sent=5, bytes_cross_host=0),
        ("c", "input", "forward"): CommCounter(calls=1, bytes_shuffled=100),
        ("c", "output", "backward"): CommCounter(calls=1, bytes_shuffled=60),
    }


def test_total_sums_every_counter_or_one_directions() -> None:
    stats = _stats()
    assert stats.total() == CommCounter(
        calls=4, bytes_sent=80 + 5, bytes_cross_host=70, bytes_shuffled=100 + 60
    )
    assert stats.total(direction="forward") == CommCounter(
        calls=2, bytes_sent=80, bytes_cross_host=70, bytes_shuffled=100
    )
    assert stats.total(direction="backward") == CommCounter(
        calls=2, bytes_sent=5, bytes_cross_host=0, bytes_shuffled=60
    )


def test_as_dict_flattens_every_field_and_reset_forgets_them() -> None:
    stats = _stats()
    assert stats.as_dict() == {
        "a/world/forward/calls": 1,
        "a/world/forward/bytes_sent": 80,
        "a/world/forward/bytes_cross_host": 70,
        "a/world/forward/bytes_shuffled": 0,
        "c/input/forward/calls": 1,
        "c/input/forward/bytes_sent": 0,
        "c/input/forward/bytes_cross_host": 0,
        "c/input/forward/bytes_shuffled": 100,
        "c/output/backward/calls": 1,
        "c/output/backward/bytes_sent": 0,
        "c/output/backward/bytes_cross_host": 0,
        "c/output/backward/bytes_shuffled": 60,
        "d/tower/backward/calls": 1,
        "d/tower/backward/bytes_sent": 5,
        "d/tower/backward/bytes_cross_host": 0,
        "d/tower/backward/bytes_shuffled": 0,
    }
    stats.reset()
    assert stats.counters == {} and stats.total() == CommCounter()
