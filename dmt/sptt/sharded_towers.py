"""SPTT's towers on one rank as a TorchRec sharded module: input dist = step a, compute = steps b-e
and the tower module, output dist = step f.

Following TorchRec's contract (``ShardedEmbeddingBagCollection``: ``input_dist`` returns awaitables,
``compute``, ``output_dist`` returns a ``LazyAwaitable``) is what lets TorchRec's
``TrainPipelineSparseDist`` run step a of batch ``i+1`` while batch ``i`` trains, exactly as it
runs the flat model's input all-to-all. Step f is asynchronous: the dense part computes its bottom
MLP while the towers' outputs travel (``DMTModel.interact`` touches them last), and their gradient's
all-to-all runs during the bottom MLP's backward.

Shape legend: ``B`` local batch, ``T`` towers, ``K L`` ranks per tower, ``G = T K L``, ``F_t``
features of this rank's tower ``t``, ``N`` embedding dim, ``(V_t, D_t)`` its module's output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchrec.distributed.embedding_sharding import KJTListSplitsAwaitable
from torchrec.distributed.embedding_types import KJTList
from torchrec.distributed.types import LazyAwaitable, ShardedModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Multistreamable

from dmt.sptt.collectives import scale_grad
from dmt.sptt.dataflow import SPTTDataflow

__all__ = ["SPTTContext", "ShardedTowers"]


@dataclass
class SPTTContext(Multistreamable):
    """What one batch's input dist tells its compute: the local batch size ``B``."""

    batch_size: int = 0

    def record_stream(self, stream: torch.Stream) -> None:
        """Nothing to record: the context holds no tensor."""


class ShardedTowers(ShardedModule[KJTList, torch.Tensor, list[torch.Tensor], SPTTContext]):
    """The towers of a DMT model on this rank under SPTT; built by
    :class:`~dmt.sptt.dmt_sharding.ShardedDMT`.

    ``forward(features: KJT of the F features of the local batch) -> LazyAwaitable`` of every
    tower's output for the local samples, ``T`` tensors ``(B, V_t, D_t)`` by tower.

    Args:
        dataflow: this rank's table shards and steps a-f.
        tower_module: this rank's replica of its tower's module (DDP over the tower group when
            it has parameters), or ``None`` for a pass-through tower.
        trainable: whether ``tower_module`` has trainable parameters.

    Gradients (see :mod:`dmt.sptt.dmt_sharding`): a trainable tower module's output is scaled by
    ``1 / T`` and its input by ``T``, so that steps d and e carry the unscaled gradient; the
    lookup's output (before step d's wire in the backward) is scaled by ``1 / G``.
    """

    def __init__(
        self, dataflow: SPTTDataflow, tower_module: nn.Module | None, *, trainable: bool
    ) -> None:
        super().__init__()
        self.dataflow = dataflow
        self.tower_module = tower_module
        self._trainable = trainable

    @property
    def unsharded_module_type(self) -> type[nn.Module]:
        """The plain model's ``towers``: an ``nn.ModuleList`` of ``dmt.models.dmt.Tower``."""
        return nn.ModuleList

    def create_context(self) -> SPTTContext:
        return SPTTContext()

    def input_dist(
        self, ctx: SPTTContext, features: KeyedJaggedTensor
    ) -> KJTListSplitsAwaitable[SPTTContext]:
        """Step a: starts the KJT all-to-all of the local batch's ids to the ranks of their
        tables' shards."""
        ctx.batch_size = features.stride()
        return KJTListSplitsAwaitable([self.dataflow.start_input_dist(features)], ctx)

    def compute(self, ctx: SPTTContext, dist_input: KJTList) -> torch.Tensor:
        """Steps b-e, then the tower module: ``(T B, V_t, D_t)`` for this rank's ``T`` peers."""
        (received,) = dist_input
        self.dataflow.check_received(received, ctx.batch_size)
        topo = self.dataflow.plan.topology
        towers = topo.num_towers if self._trainable else 1
        embeddings = self.dataflow.tower_input(
            received, lookup_grad_scale=1 / topo.world_size, grad_scale=float(towers)
        )
        if self.tower_module is None:
            return embeddings
        return scale_grad(self.tower_module(embeddings), 1.0 / towers)

    def output_dist(
        self, ctx: SPTTContext, output: torch.Tensor
    ) -> LazyAwaitable[list[torch.Tensor]]:
        """Step f, started: every tower's output for the local samples once waited for."""
        return self.dataflow.start_peer_exchange(output)
