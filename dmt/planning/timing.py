"""Predicted time of one training step per mode (``flat``, ``sptt``, ``dmt``), with its breakdown.

A step of one rank is its dense compute (bottom MLP, tower modules, interaction, top MLP, forward
and backward), its embedding lookup (rows read forward, rows and the fused optimizer's state read
and written backward, bound by memory bandwidth: :func:`lookup_passes`), and the collectives of its plan
(:class:`dmt.planning.collectives.CollectiveBytes`, the busiest rank's bytes), each timed by
:func:`dmt.planning.network.collective_time_s`. Collectives run one after another on one
communication stream; what the pipelined schedule (README "Pipelined training") can hide, it hides
behind a *budget* of compute:

* ``prefetch``: the input all-to-all of batch ``i + 1`` (SPTT step ``a``, TorchRec's
  ``flat_input_a2a``) runs while batch ``i`` computes (``TrainPipelineSparseDist``): its budget is
  the whole step's dense compute and lookup;
* ``bottom``: SPTT step ``f`` runs while the bottom MLP computes, its forward behind the bottom
  MLP's forward and its backward behind the bottom MLP's backward;
* ``backward``: gradient all-reduces (``dense_allreduce``, ``tower_allreduce``) overlap the
  backward pass (DDP's buckets): the dense compute less its forward (about two thirds of it: the
  bottom MLP's first layer computes no gradient of the dense input).

Only collectives marked ``overlappable`` draw on a budget, and only when ``pipelined``; the
collectives of one budget share it in the order given, and what exceeds it is exposed. The budgets
are parts of one step's compute and the collectives share one stream, so every hidden
millisecond also comes out of the ``prefetch`` budget: a step never hides more communication than
it computes. Everything
else (SPTT step ``d``, TorchRec's ``flat_output_a2a``) is exposed. The step time is

    total = compute + lookup + sum(exposed) + collectives x collective_overhead + step_overhead

Emulated clusters run all ranks on ``cluster.shared_cores`` CPU cores: all of a rank's own work
(compute, lookup, the fixed overheads, and its intra-host transfers, which are copies through the
loopback TCP stack) then runs at ``min(1, shared_cores / G)`` of a core's speed (:func:`core_share`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from dmt.memory import VALUE_BYTES, optimizer_state_bytes
from dmt.models.accounting import bottom_flops, dense_flops, tower_flops
from dmt.models.dmt import DMTModel
from dmt.models.rec_model import RecModel
from dmt.planning.collectives import CollectiveBytes
from dmt.planning.hardware import ClusterConfig
from dmt.planning.network import collective_time_s

MODES = ("flat", "sptt", "dmt")
FORWARD_FRACTION = 1 / 3  # of a layer's training FLOPs: forward 1, backward 2 (weights + inputs)
BUDGET_OF_STEP: dict[str, str | None] = {
    "a": "prefetch",
    "flat_input_a2a": "prefetch",
    "f": "bottom",
    "dense_allreduce": "backward",
    "tower_allreduce": "backward",
    "d": None,
    "flat_output_a2a": None,
}
"""Which compute budget a step's collective can hide behind when pipelined (None: none)."""


@dataclass(frozen=True)
class ComputeLoad:
    """Compute of one rank per sample of its local batch ``B``."""

    dense_mflops_per_sample: float
    """Training (forward + backward) MFLOPs per sample of the dense part the rank runs: bottom
    MLP, tower modules, interaction, top MLP (:func:`dmt.models.accounting.model_stats`)."""
    bottom_mflops_per_sample: float = 0.0
    """Training MFLOPs per sample of the bottom MLP (part of ``dense_mflops_per_sample``)."""
    lookup_bytes_per_sample: float = 0.0
    """Bytes of embedding rows and optimizer state the rank reads and writes, forward and
    backward, per sample of its local batch (its tables serve ``G B`` samples)."""
    bottom_forward_mflops_per_sample: float | None = None
    """Forward MFLOPs per sample of the bottom MLP (part of ``bottom_mflops_per_sample``); None:
    :data:`FORWARD_FRACTION` of it."""
    dense_forward_mflops_per_sample: float | None = None
    """Forward MFLOPs per sample of the dense part (part of ``dense_mflops_per_sample``; the
    rest is the backward the gradient all-reduces overlap); None: :data:`FORWARD_FRACTION` of
    it."""

    def __post_init__(self) -> None:
        for name in (
            "dense_mflops_per_sample",
            "bottom_mflops_per_sample",
            "lookup_bytes_per_sample",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ComputeLoad.{name}={getattr(self, name)!r} must be >= 0")
        if self.bottom_mflops_per_sample > self.dense_mflops_per_sample:
            raise ValueError(
                f"ComputeLoad.bottom_mflops_per_sample={self.bottom_mflops_per_sample} exceeds "
                f"dense_mflops_per_sample={self.dense_mflops_per_sample} (it is a part of it)"
            )
        forward = self.bottom_forward_mflops_per_sample
        if forward is not None and not 0 <= forward <= self.bottom_mflops_per_sample:
            raise ValueError(
                f"ComputeLoad.bottom_forward_mflops_per_sample={forward!r} must be >= 0 and at "
                f"most bottom_mflops_per_sample={self.bottom_mflops_per_sample} (it is a part of it)"
            )
        forward = self.dense_forward_mflops_per_sample
        if forward is not None and not 0 <= forward <= self.dense_mflops_per_sample:
            raise ValueError(
                f"ComputeLoad.dense_forward_mflops_per_sample={forward!r} must be >= 0 and at "
                f"most dense_mflops_per_sample={self.dense_mflops_per_sample} (it is a part of it)"
            )


LOOKUP_PASSES = 3.0
"""Row traffic of one looked-up id per step without per-element optimizer state, in rows: read
forward, read and written backward (the fused optimizer's update)."""


def lookup_passes(sparse_optimizer: str) -> float:
    """Passes over an embedding row per looked-up id and step with the fused sparse optimizer
    ``sparse_optimizer`` (:func:`dmt.optim.sparse_optimizer_name`: ``"sgd"``, ``"adagrad"``,
    ``"rowwise_adagrad"``, ``"adam"``): ``3 + 2 s``, the row read forward and read and written
    backward (:data:`LOOKUP_PASSES`), and each of the ``s`` state tensors of the row's shape the
    optimizer keeps (:func:`dmt.memory.optimizer_state_bytes`: SGD and row-wise Adagrad 0,
    Adagrad 1, Adam 2) read and written backward: SGD and row-wise Adagrad 3, Adagrad 5, Adam 7.
    Per-row state (row-wise Adagrad's one value per row, ``1 / D`` of a row) is left out."""
    per_element = (
        optimizer_state_bytes(sparse_optimizer, 1, 1)
        - optimizer_state_bytes(sparse_optimizer, 1, 0)
    ) // VALUE_BYTES
    return LOOKUP_PASSES + 2 * per_element


def compute_load(
    model: RecModel | DMTModel,
    *,
    ids_per_sample: float,
    sparse_optimizer: str,
    element_bytes: int = 4,
    busiest_tower: bool = False,
) -> ComputeLoad:
    """The :class:`ComputeLoad` of ``model``: dense training FLOPs measured by
    :func:`dmt.models.accounting.dense_flops` (bottom MLP, tower modules, interaction, top MLP;
    per rank per local sample: a tower's ranks run its module over ``T`` times their local
    batch, which for towers of equal modules is ``1 / T`` of the towers' FLOPs) and their
    forward (the rest is the backward, which the gradient all-reduces overlap), the bottom
    MLP's share and its forward (:func:`~dmt.models.accounting.bottom_flops`: its first layer
    computes no gradient of the dense input), and the embedding rows touched
    (``ids_per_sample`` ids of ``embedding_dim`` elements, :func:`lookup_passes` of
    ``sparse_optimizer`` times).

    ``busiest_tower``: the tower modules' FLOPs of a rank of the tower whose module computes
    the most (``T`` times its FLOPs per sample, :func:`~dmt.models.accounting.tower_train_flops`),
    which the step waits for (step f), in place of their mean, in the training FLOPs and in
    their forward (that tower's); ``dmt-plan`` counts it, as it counts the busiest rank's lookup.

    ``ids_per_sample``: rows of ``embedding_dim`` the rank looks up per sample of its local
    batch ``B``: its shards serve all ``G`` local batches, so the busiest rank's (``dmt-plan``:
    :func:`~dmt.planning.collectives.sptt_lookup_rows`, :func:`~dmt.planning.collectives.flat_lookup_rows`
    over ``B``) can be far above the average, ``F`` x hotness.
    ``sparse_optimizer``: the fused sparse optimizer's state layout
    (:func:`dmt.optim.sparse_optimizer_name`).
    """
    if not ids_per_sample >= 0:
        raise ValueError(f"ids_per_sample={ids_per_sample!r} must be >= 0")
    passes = lookup_passes(sparse_optimizer)
    forward, train = dense_flops(model)
    if busiest_tower and isinstance(model, DMTModel):
        towers = tower_flops(model)
        busiest = max(towers, key=lambda flops: flops[1])
        forward += len(towers) * busiest[0] - sum(f for f, _ in towers)
        train += len(towers) * busiest[1] - sum(t for _, t in towers)
    bottom_forward, bottom = bottom_flops(model)
    return ComputeLoad(
        dense_mflops_per_sample=train / 1e6,
        bottom_mflops_per_sample=bottom / 1e6,
        lookup_bytes_per_sample=ids_per_sample * model.embedding_dim * element_bytes * passes,
        bottom_forward_mflops_per_sample=bottom_forward / 1e6,
        dense_forward_mflops_per_sample=forward / 1e6,
    )


@dataclass(frozen=True)
class CollectiveTime:
    """One collective of the step: its time and the part of it the step waits for."""

    step: str
    op: str
    group: str
    direction: str
    time_ms: float
    """Duration on the wire (:func:`~dmt.planning.network.collective_time_s`)."""
    exposed_ms: float
    """What the step waits for: ``time_ms`` minus what compute hides."""


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one step of one mode, in ms."""

    mode: str
    compute_ms: float
    """Dense compute, forward and backward."""
    lookup_ms: float
    """Embedding lookup and its update."""
    overhead_ms: float
    """Fixed costs: per step and per collective issued."""
    collectives: tuple[CollectiveTime, ...]
    total_ms: float
    speedup_over_flat: float | None = None
    """``flat.total_ms / total_ms`` when the flat mode was predicted alongside."""

    @property
    def communication_ms(self) -> float:
        """Sum of the collectives' durations."""
        return sum(c.time_ms for c in self.collectives)

    @property
    def exposed_ms(self) -> float:
        """Communication the step waits for."""
        return sum(c.exposed_ms for c in self.collectives)

    @property
    def overlapped_ms(self) -> float:
        """Communication hidden behind compute by the pipelined schedule."""
        return self.communication_ms - self.exposed_ms

    def exposed_by_step(self) -> dict[str, float]:
        """Exposed ms per step name (``"a"``, ``"f"``, ``"flat_output_a2a"``, ...)."""
        out: dict[str, float] = {}
        for c in self.collectives:
            out[c.step] = out.get(c.step, 0.0) + c.exposed_ms
        return out


def group_ranks_per_host(group: str, group_size: int, gpus_per_host: int) -> int:
    """Members of a process group on each of its hosts: a peer group (the same position in every
    tower) and a cross group (the same local rank on every host: TorchRec's table-row-wise
    output) have one rank per host; world, tower and host groups fill their hosts."""
    if group in ("peer", "cross"):
        return 1
    if group in ("world", "tower", "host"):
        return min(group_size, gpus_per_host)
    raise ValueError(
        f"group={group!r} is unknown to the time model; expected peer, cross, world, tower or host"
    )


def core_share(cluster: ClusterConfig) -> float:
    """Fraction of its processor a rank has: ``min(1, shared_cores / G)`` on an emulated cluster
    whose ``G`` ranks share ``shared_cores`` CPU cores, else 1."""
    if cluster.shared_cores > 0:
        return min(1.0, cluster.shared_cores / cluster.world_size)
    return 1.0


def rank_tflops(cluster: ClusterConfig) -> float:
    """Achieved TFLOP/s of one rank."""
    return cluster.dense_tflops * cluster.compute_efficiency * core_share(cluster)


def _budgets(
    compute: ComputeLoad, batch: int, cluster: ClusterConfig, lookup_s: float
) -> dict[str, float]:
    flops_s = rank_tflops(cluster) * 1e12
    dense_s = compute.dense_mflops_per_sample * 1e6 * batch / flops_s
    bottom_s = compute.bottom_mflops_per_sample * 1e6 * batch / flops_s
    forward = compute.bottom_forward_mflops_per_sample
    if forward is None:
        forward = compute.bottom_mflops_per_sample * FORWARD_FRACTION
    bottom_forward_s = forward * 1e6 * batch / flops_s
    dense_forward = compute.dense_forward_mflops_per_sample
    if dense_forward is None:
        dense_forward = compute.dense_mflops_per_sample * FORWARD_FRACTION
    dense_forward_s = dense_forward * 1e6 * batch / flops_s
    return {
        "prefetch": dense_s + lookup_s,
        "bottom/forward": bottom_forward_s,
        "bottom/backward": bottom_s - bottom_forward_s,
        "backward": dense_s - dense_forward_s,
    }


def _transpose_bound(collectives: Sequence[CollectiveBytes]) -> dict[int, tuple[float, float]]:
    """The (intra, cross) bytes each collective is timed with, keyed by ``id``.

    An all-to-all lasts as long as its busiest rank *sends or receives*, and ``collectives``
    holds the busiest senders. A step's backward all-to-all is the transpose of its forward one
    (SPTT ``d`` and ``f``, flat ``flat_output_a2a``): what a rank receives in one direction it
    sends in the other. So both directions of a step are timed with the larger bytes of the two
    (per link class). Without this, a rank that holds a whole table for its tower (table-wise
    towers spanning several hosts) would count its forward send but not its backward receive.
    Step ``a`` and the flat input all-to-all have no backward; their busiest receiver's bytes
    (``received_*``, from the plan) bound them instead.
    """
    largest: dict[tuple[str, str, str, str], tuple[float, float]] = {}
    for c in collectives:
        key = (c.step, c.op, c.group, c.direction)
        intra, cross = largest.get(key, (0.0, 0.0))
        largest[key] = (max(intra, c.intra_host_bytes), max(cross, c.cross_host_bytes))
    out: dict[int, tuple[float, float]] = {}
    for c in collectives:
        own: tuple[float, float] = (
            max(c.intra_host_bytes, c.received_intra_host_bytes),
            max(c.cross_host_bytes, c.received_cross_host_bytes),
        )
        if c.op == "all_to_all":
            other = "backward" if c.direction == "forward" else "forward"
            intra, cross = largest.get((c.step, c.op, c.group, other), (0.0, 0.0))
            own = (max(own[0], intra), max(own[1], cross))
        out[id(c)] = own
    return out


def predict_step_time(
    mode: str,
    collectives: Sequence[CollectiveBytes],
    compute: ComputeLoad,
    batch_per_rank: int,
    cluster: ClusterConfig,
    *,
    pipelined: bool = True,
) -> StepTime:
    """Predicted step time of one mode on ``cluster`` (see the module docstring).

    Args:
        mode: ``"flat"``, ``"sptt"`` or ``"dmt"`` (a label; the collectives say what runs).
        collectives: the busiest rank's collectives of one step (forward and backward).
        compute: the rank's dense FLOPs and lookup bytes per sample.
        batch_per_rank: ``B``, local batch.
        cluster: hardware, links and fixed overheads.
        pipelined: TorchRec's train pipeline (overlap as described) or the plain loop (none).
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; expected one of {list(MODES)}")
    if batch_per_rank < 1:
        raise ValueError(f"batch_per_rank={batch_per_rank} must be >= 1")
    flops_s = rank_tflops(cluster) * 1e12
    compute_s = compute.dense_mflops_per_sample * 1e6 * batch_per_rank / flops_s
    lookup_s = (
        compute.lookup_bytes_per_sample
        * batch_per_rank
        / (cluster.hbm_bandwidth_gbps * 1e9 * cluster.lookup_efficiency * core_share(cluster))
    )
    budgets = _budgets(compute, batch_per_rank, cluster, lookup_s)
    # an emulated host's "link" is the CPU copying through loopback: shared like compute
    intra = replace(
        cluster.intra, bandwidth_gbps=cluster.intra_bandwidth_gbps * core_share(cluster)
    )
    timed = []
    wire = _transpose_bound(collectives)
    for c in collectives:
        intra_bytes, cross_bytes = wire[id(c)]
        if c.step not in BUDGET_OF_STEP:
            raise ValueError(
                f"collective step={c.step!r} is unknown to the time model; expected one of "
                f"{list(BUDGET_OF_STEP)}"
            )
        t = collective_time_s(
            c.op,
            group_size=c.group_size,
            ranks_per_host=group_ranks_per_host(c.group, c.group_size, cluster.gpus_per_host),
            intra_host_bytes=intra_bytes,
            cross_host_bytes=cross_bytes,
            intra=intra,
            inter=cluster.inter,
            ranks_per_nic=cluster.ranks_per_nic,
        )
        budget = BUDGET_OF_STEP[c.step]
        hidden = 0.0
        if pipelined and c.overlappable and budget is not None:
            key = f"{budget}/{c.direction}" if budget == "bottom" else budget
            # one communication stream: whatever the budget, hidden time comes out of the
            # step's compute ("prefetch" is all of it)
            hidden = min(t, budgets[key], budgets["prefetch"])
            budgets[key] -= hidden
            if key != "prefetch":
                budgets["prefetch"] -= hidden
        timed.append(
            CollectiveTime(c.step, c.op, c.group, c.direction, t * 1e3, (t - hidden) * 1e3)
        )
    issued = sum(1 for c in collectives if c.intra_host_bytes + c.cross_host_bytes > 0)
    overhead_ms = (
        cluster.step_overhead_ms + issued * cluster.collective_overhead_us * 1e-3
    ) / core_share(cluster)
    total = compute_s * 1e3 + lookup_s * 1e3 + overhead_ms + sum(c.exposed_ms for c in timed)
    return StepTime(mode, compute_s * 1e3, lookup_s * 1e3, overhead_ms, tuple(timed), total)


def with_speedups(times: Mapping[str, StepTime]) -> dict[str, StepTime]:
    """The same predictions, each with ``speedup_over_flat`` set (needs ``times["flat"]``)."""
    if "flat" not in times:
        raise ValueError(f"speed-ups need the flat mode; got modes {sorted(times)}")
    flat = times["flat"].total_ms
    return {m: replace(t, speedup_over_flat=flat / t.total_ms) for m, t in times.items()}


@dataclass(frozen=True)
class ModeWorkload:
    """What one mode runs per step on its busiest rank: collectives and compute."""

    collectives: Sequence[CollectiveBytes] = field(default_factory=tuple)
    compute: ComputeLoad = field(default_factory=lambda: ComputeLoad(0.0))


def predict_modes(
    workloads: Mapping[str, ModeWorkload],
    batch_per_rank: int,
    cluster: ClusterConfig,
    *,
    pipelined: bool = True,
) -> dict[str, StepTime]:
    """:func:`predict_step_time` of every mode, with speed-ups over flat when flat is among them."""
    times = {
        m: predict_step_time(
            m, w.collectives, w.compute, batch_per_rank, cluster, pipelined=pipelined
        )
        for m, w in workloads.items()
    }
    return with_speedups(times) if "flat" in times else times
