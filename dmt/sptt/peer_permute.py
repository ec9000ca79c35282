"""Where step c, the peer permute, happens (paper section 3.1.3): pure rules, no ``torch``.

Step a delivers every rank its shards' features for the global batch as ``G`` blocks of ``B``
samples; steps d-f need the blocks in peer order (:attr:`~dmt.sptt.topology.Topology.peer_order`).
Step c can reorder either object that holds the blocks (``peer_permute``, one of
:data:`PEER_PERMUTES`):

* ``"output"`` (paper Figure 7, step c as drawn): the pooled lookup output, ``(G B, W_r + R_t N)`` floats, after
  step b; the backward permutes its gradient back, so a training step moves it twice;
* ``"input"`` (steps b and c swapped): the received sparse input before step b, the lengths
  ``(k, G B)`` and the ids of the rank's ``k`` shards; ids carry no gradient, so nothing moves in
  the backward. Smaller than the output when the pooling factors are small next to the pooled
  width (an id costs 8 bytes, a pooled table ``4 N`` bytes forward and again backward);
* ``"auto"``: per batch and rank, whichever of the two moves fewer bytes
  (:func:`peer_permute_site`);
* ``"skip"``: no step c, because step a already delivers the blocks in peer order. TorchRec's
  ``KJTAllToAll`` always reorders what it receives from (source, key) to (key, source) blocks;
  with ``stagger = s`` it lists the sources as ``x + (G / s) y`` for ``x < G / s``, ``y < s``
  (:func:`received_source_order`), and ``s = T`` gives ``p + K L t``, position-major, i.e. the
  peer order. That is the paper's virtual process group "where the GPUs are already in the peer
  order", folded into a reordering step a does anyway and with no extra communicator
  (``new_group`` numbers members by ascending rank, so a peer-ordered group cannot be built).

Whatever the setting, :func:`block_permutation` derives the permutation left after step a; when
it is the identity (``"skip"``, or ``T = 1`` or ``K L = 1`` with the plain all-to-all) step c is
skipped. ``"skip"`` checks that it is, rather than assuming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from dmt.sptt.topology import Topology

PeerPermute = Literal["output", "input", "auto", "skip"]
PEER_PERMUTES: tuple[str, ...] = ("output", "input", "auto", "skip")
"""Settings of ``peer_permute``; ``"output"`` is the paper's Figure 7."""

DEFAULT_PEER_PERMUTE = "skip"
"""The default (``sptt.peer_permute``): section 3.1.3's variant that omits step c. It computes
the same numbers as the other settings (tests/distributed) and never does more work: step a's
all-to-all reorders what it receives whatever its ``stagger``, so delivering peer order costs
nothing, while ``"output"`` copies the pooled output, and its gradient, once more per step."""


def check_peer_permute(value: object, setting: str = "peer_permute") -> str:
    """Return ``value`` if it is one of :data:`PEER_PERMUTES`, else raise ``ValueError``."""
    if not isinstance(value, str) or value not in PEER_PERMUTES:
        raise ValueError(
            f"{setting}={value!r} is not supported; expected one of {list(PEER_PERMUTES)} "
            '("output": permute the pooled lookup output, "input": permute the sparse input '
            'before the lookup, "auto": the smaller of the two, "skip": receive in peer order)'
        )
    return value


# ---- the order step a delivers ---------------------------------------------------------------


def step_a_stagger(topology: Topology, peer_permute: str) -> int:
    """``stagger`` of step a's ``KJTAllToAll``: ``T`` for ``"skip"`` (peer order), else 1."""
    return topology.num_towers if check_peer_permute(peer_permute) == "skip" else 1


def received_source_order(world_size: int, stagger: int = 1) -> tuple[int, ...]:
    """Source ranks of the sample blocks that TorchRec's ``KJTAllToAll(pg, splits, stagger)``
    delivers, in order: ``x + (G / s) y`` for ``x`` in ``range(G / s)``, ``y`` in ``range(s)``
    (its ``_get_recat``). ``stagger = 1`` gives the source ranks in ascending order."""
    if world_size <= 0 or stagger <= 0 or world_size % stagger:
        raise ValueError(
            f"world_size={world_size} and stagger={stagger} must be positive, and stagger must "
            "divide world_size"
        )
    n = world_size // stagger
    return tuple(x + n * y for x in range(n) for y in range(stagger))


def block_permutation(topology: Topology, stagger: int = 1) -> tuple[int, ...]:
    """Step c's permutation: entry ``j`` is the index, among the blocks step a delivered with
    ``stagger``, of the block the peer order puts at ``j``."""
    index = {rank: i for i, rank in enumerate(received_source_order(topology.world_size, stagger))}
    return tuple(index[rank] for rank in topology.peer_order)


def is_identity(permutation: Sequence[int]) -> bool:
    """Whether ``permutation`` leaves every position in place (step c does nothing)."""
    return all(i == p for i, p in enumerate(permutation))


# ---- the auto rule ---------------------------------------------------------------------------


def input_permute_bytes(
    num_lengths: int, num_ids: int, *, length_size: int = 8, id_size: int = 8
) -> int:
    """Bytes the input permute moves: the received lengths (``k G B``) and ids, forward only."""
    return num_lengths * length_size + num_ids * id_size


def output_permute_bytes(
    num_samples: int, width: int, *, value_size: int = 4, backward: bool = True
) -> int:
    """Bytes the output permute moves: the pooled ``(G B, W)`` output, twice if a backward
    permutes its gradient too."""
    return num_samples * width * value_size * (2 if backward else 1)


def peer_permute_site(
    peer_permute: str, *, input_bytes: int, output_bytes: int
) -> Literal["input", "output"]:
    """Which object step c permutes: the setting itself for ``"input"``/``"output"``; for
    ``"auto"`` the input iff it moves strictly fewer bytes (:func:`input_permute_bytes` vs
    :func:`output_permute_bytes`), the output on a tie (the paper's order)."""
    mode = check_peer_permute(peer_permute)
    if mode == "skip":
        raise ValueError('peer_permute="skip" permutes nothing; it has no site')
    if mode == "auto":
        return "input" if input_bytes < output_bytes else "output"
    return "input" if mode == "input" else "output"
