"""Where step c permutes (paper section 3.1.3): the auto rule and when skipping it is valid.

Pure: no process group. The distributed tests check the same orders against TorchRec's
``KJTAllToAll`` and the single-process model.
"""

from __future__ import annotations

import pytest

from dmt.sptt.peer_permute import (
    DEFAULT_PEER_PERMUTE,
    PEER_PERMUTES,
    block_permutation,
    check_peer_permute,
    input_permute_bytes,
    is_identity,
    output_permute_bytes,
    peer_permute_site,
    received_source_order,
    step_a_stagger,
)
from dmt.sptt.topology import Topology
from tests.conftest import typed_config

LAYOUTS = [  # (G, L, K)
    (1, 1, 1),
    (2, 2, 1),
    (4, 2, 1),
    (4, 1, 1),
    (8, 2, 1),
    (8, 2, 2),
    (8, 8, 1),
    (12, 2, 3),
    (24, 4, 2),
    (64, 8, 1),
    (512, 8, 4),
]


# ---- when step c is the identity ---------------------------------------------------------------


def test_received_source_order_follows_torchrec_stagger():
    # TorchRec's _get_recat docstring: _recat(2, 4, 2) = [0, 4, 2, 6, 1, 5, 3, 7], i.e. sources
    # (0, 2, 1, 3) for each of the 2 features
    assert received_source_order(4, 2) == (0, 2, 1, 3)
    assert received_source_order(6, 1) == tuple(range(6))
    assert received_source_order(6, 6) == tuple(range(6))
    assert received_source_order(6, 3) == (0, 2, 4, 1, 3, 5)
    with pytest.raises(ValueError, match="divide world_size"):
        received_source_order(6, 4)


@pytest.mark.parametrize(("G", "stagger"), [(0, 1), (4, 0), (4, -2), (-4, 2)])
def test_received_source_order_needs_a_positive_world_and_stagger(G: int, stagger: int):
    with pytest.raises(
        ValueError, match=rf"world_size={G} and stagger={stagger} must be positive, and stagger"
    ):
        received_source_order(G, stagger)


@pytest.mark.parametrize(("G", "L", "K"), LAYOUTS)
def test_stagger_T_delivers_peer_order_for_every_layout(G: int, L: int, K: int):
    topo = Topology(G, L, K)
    assert received_source_order(G, topo.num_towers) == topo.peer_order
    assert step_a_stagger(topo, "skip") == topo.num_towers
    assert is_identity(block_permutation(topo, step_a_stagger(topo, "skip")))


@pytest.mark.parametrize(("G", "L", "K"), LAYOUTS)
def test_plain_all_to_all_needs_step_c_unless_one_tower_or_one_rank_per_tower(G, L, K):
    topo = Topology(G, L, K)
    for setting in ("output", "input", "auto"):
        assert step_a_stagger(topo, setting) == 1
    order = block_permutation(topo, 1)
    assert order == topo.peer_order  # blocks arrive by source rank
    assert sorted(order) == list(range(G))
    assert is_identity(order) == (topo.num_towers == 1 or topo.tower_size == 1)


def test_paper_example():
    topo = Topology(4, 2)
    assert block_permutation(topo, 1) == (0, 2, 1, 3)
    assert received_source_order(4, step_a_stagger(topo, "skip")) == (0, 2, 1, 3)


# ---- the auto rule ---------------------------------------------------------------------------


def test_byte_estimates():
    # k = 3 shards, G B = 8 samples, 20 ids, int64 lengths and ids
    assert input_permute_bytes(3 * 8, 20) == 24 * 8 + 20 * 8
    assert input_permute_bytes(24, 20, length_size=4, id_size=4) == 24 * 4 + 20 * 4
    # int32 lengths, int64 ids: each count at its own size
    assert input_permute_bytes(24, 20, length_size=4, id_size=8) == 24 * 4 + 20 * 8
    # (G B, W) = (8, 12) float32, forward and backward
    assert output_permute_bytes(8, 12) == 8 * 12 * 4 * 2
    assert output_permute_bytes(8, 12, backward=False) == 8 * 12 * 4
    assert output_permute_bytes(8, 0) == 0


def test_auto_permutes_the_smaller_object():
    assert peer_permute_site("auto", input_bytes=10, output_bytes=11) == "input"
    assert peer_permute_site("auto", input_bytes=12, output_bytes=11) == "output"
    assert peer_permute_site("auto", input_bytes=11, output_bytes=11) == "output"  # tie
    assert peer_permute_site("auto", input_bytes=0, output_bytes=0) == "output"  # no tables


@pytest.mark.parametrize(
    ("hotness", "train", "site"),
    [
        (1, True, "input"),  # 16 B of lengths and ids vs 256 B pooled (128 forward + 128 backward)
        (20, True, "input"),  # 168 B vs 256 B
        (20, False, "output"),  # 168 B vs 128 B: no backward
        (40, True, "output"),  # 328 B vs 256 B
    ],
)
def test_auto_per_sample_one_table_of_dim_32(hotness: int, train: bool, site: str):
    samples, N = 1024, 32
    site_of = peer_permute_site(
        "auto",
        input_bytes=input_permute_bytes(samples, samples * hotness),
        output_bytes=output_permute_bytes(samples, N, backward=train),
    )
    assert site_of == site


def test_input_and_output_are_honoured_whatever_the_bytes():
    assert peer_permute_site("input", input_bytes=100, output_bytes=1) == "input"
    assert peer_permute_site("output", input_bytes=1, output_bytes=100) == "output"
    with pytest.raises(ValueError, match="no site"):
        peer_permute_site("skip", input_bytes=1, output_bytes=1)


# ---- the setting -----------------------------------------------------------------------------


def test_setting_is_checked_with_the_allowed_values():
    for value in PEER_PERMUTES:
        assert check_peer_permute(value) == value
    with pytest.raises(ValueError, match=r"sptt.peer_permute='outptu'.*'output', 'input'"):
        check_peer_permute("outptu", "sptt.peer_permute")
    with pytest.raises(ValueError, match="peer_permute=None"):
        check_peer_permute(None)


@pytest.mark.parametrize("value", PEER_PERMUTES)
def test_config_accepts_every_setting(value: str):
    cfg = typed_config("experiment=dmt_4t_dlrm", "sptt=on", f"sptt.peer_permute={value}")
    assert cfg.sptt.peer_permute == value
    default = typed_config("experiment=dmt_4t_dlrm", "sptt=on").sptt.peer_permute
    assert default == DEFAULT_PEER_PERMUTE == "skip"  # the config's default is the library's


def test_config_rejects_an_unknown_setting():
    with pytest.raises(ValueError, match=r"sptt.peer_permute='both'.*'skip'"):
        typed_config("experiment=dmt_4t_dlrm", "sptt=on", "sptt.peer_permute=both")
