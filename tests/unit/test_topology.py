"""Pure topology math of SPTT for many (G, L, K), no process groups."""

from __future__ import annotations

import itertools

import pytest

from dmt.sptt.topology import Topology


def _all_topologies(max_world_size: int = 512) -> list[Topology]:
    topologies = []
    for local_world_size in (1, 2, 4, 8):
        for hosts_per_tower in (1, 2, 4):
            tower_size = local_world_size * hosts_per_tower
            for num_towers in (1, 2, 3, 4, 8, 16, 26, 32, 64):
                world_size = tower_size * num_towers
                if world_size <= max_world_size:
                    topologies.append(Topology(world_size, local_world_size, hosts_per_tower))
    return topologies


TOPOLOGIES = _all_topologies()


def _id(topo: Topology) -> str:
    return f"G{topo.world_size}-L{topo.local_world_size}-K{topo.hosts_per_tower}"


def test_paper_example_peer_order() -> None:
    # Section 3.1.1: G = 4 GPUs, L = 2 per host, one host per tower -> peer order (0, 2, 1, 3).
    topo = Topology(world_size=4, local_world_size=2)
    assert topo.num_towers == 2
    assert topo.peer_order == (0, 2, 1, 3)
    assert topo.tower_groups == ((0, 1), (2, 3))
    assert topo.peer_groups == ((0, 2), (1, 3))


def test_paper_key_when_towers_equal_ranks_per_host() -> None:
    # The paper's key (g % T, g // L) agrees with ours whenever T == L (as in its example).
    for local_world_size in (1, 2, 4, 8):
        topo = Topology(local_world_size * local_world_size, local_world_size)
        paper = sorted(
            range(topo.world_size),
            key=lambda g: (g % topo.num_towers, g // topo.local_world_size),
        )
        assert topo.peer_order == tuple(paper)


def test_peer_order_k1_is_paper_key_with_l() -> None:
    topo = Topology(world_size=8, local_world_size=2)  # T = 4 != L
    assert topo.peer_order == (0, 2, 4, 6, 1, 3, 5, 7)
    assert topo.peer_order == tuple(sorted(range(8), key=lambda g: (g % 2, g // 2)))


def test_two_hosts_per_tower() -> None:
    topo = Topology(world_size=8, local_world_size=2, hosts_per_tower=2)
    assert (topo.num_hosts, topo.num_towers, topo.tower_size) == (4, 2, 4)
    assert topo.tower_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert topo.peer_groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert topo.peer_order == (0, 4, 1, 5, 2, 6, 3, 7)
    assert [topo.host_of(g) for g in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert topo.crosses_host(1, 2) and not topo.crosses_host(2, 3)


@pytest.mark.parametrize("topo", TOPOLOGIES, ids=_id)
def test_local_rank_is_the_index_on_the_host(topo: Topology) -> None:
    """``local_rank_of`` is the index in ``host_ranks`` (not in the tower, which spans ``K``
    hosts)."""
    for h in range(topo.num_hosts):
        for i, g in enumerate(topo.host_ranks(h)):
            assert (topo.host_of(g), topo.local_rank_of(g)) == (h, i)


@pytest.mark.parametrize("topo", TOPOLOGIES, ids=_id)
def test_invariants(topo: Topology) -> None:
    G, L, K, T = topo.world_size, topo.local_world_size, topo.hosts_per_tower, topo.num_towers
    assert T * K * L == G and topo.tower_size == K * L and topo.num_hosts == G // L

    # every rank in exactly one tower, one host, one peer group
    for groups, size, count in (
        (topo.tower_groups, K * L, T),
        (topo.peer_groups, T, K * L),
        (tuple(topo.host_ranks(h) for h in range(topo.num_hosts)), L, G // L),
    ):
        assert len(groups) == count
        assert all(len(g) == size for g in groups)
        flat = list(itertools.chain.from_iterable(groups))
        assert sorted(flat) == list(range(G))

    for g in range(G):
        t, p, h = topo.tower_of(g), topo.position_of(g), topo.host_of(g)
        assert g in topo.tower_ranks(t) and topo.tower_ranks(t)[p] == g
        assert topo.rank_at(t, p) == g
        assert g in topo.host_ranks(h)
        # a tower is K whole hosts
        assert h // K == t
        peers = topo.peers_of(g)
        assert g in peers and peers == topo.peer_groups[p]
        assert peers[t] == g

    # peer groups hold one rank per tower, at the same position; all peers of a rank (other
    # than itself) live on other hosts
    for p, peers in enumerate(topo.peer_groups):
        assert [topo.tower_of(g) for g in peers] == list(range(T))
        assert {topo.position_of(g) for g in peers} == {p}
        assert len({topo.host_of(g) for g in peers}) == T

    # towers: every tower's ranks on its K hosts only
    for t, ranks in enumerate(topo.tower_groups):
        assert {topo.host_of(g) for g in ranks} == set(range(t * K, (t + 1) * K))

    # peer order: permutation; block p is peer group p; sorted by (g % KL, g // KL)
    order = topo.peer_order
    assert sorted(order) == list(range(G))
    for p in range(K * L):
        assert order[p * T : (p + 1) * T] == topo.peer_groups[p]
    assert list(order) == sorted(range(G), key=lambda g: (g % (K * L), g // (K * L)))
    assert topo.world_ranks == tuple(range(G))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"world_size": 0, "local_world_size": 1}, "world_size must be positive"),
        ({"world_size": 4, "local_world_size": 0}, "local_world_size must be positive"),
        ({"world_size": 4, "local_world_size": 2, "hosts_per_tower": -1}, "hosts_per_tower"),
        ({"world_size": 6, "local_world_size": 4}, "multiple of local_world_size"),
        ({"world_size": 6, "local_world_size": 2, "hosts_per_tower": 2}, "multiple of K\\*L"),
    ],
)
def test_validation(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Topology(**kwargs)


def test_type_validation() -> None:
    with pytest.raises(TypeError):
        Topology(world_size=4.0, local_world_size=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Topology(world_size=True, local_world_size=1)  # type: ignore[arg-type]


def test_rank_range_checks() -> None:
    topo = Topology(world_size=4, local_world_size=2)
    for fn in (topo.host_of, topo.tower_of, topo.position_of, topo.peers_of):
        with pytest.raises(ValueError, match="outside"):
            fn(4)
    with pytest.raises(ValueError, match="tower"):
        topo.tower_ranks(2)
    with pytest.raises(ValueError, match="position"):
        topo.peer_group(2)


def test_frozen() -> None:
    topo = Topology(world_size=4, local_world_size=2)
    with pytest.raises(AttributeError):
        topo.world_size = 8  # type: ignore[misc]
