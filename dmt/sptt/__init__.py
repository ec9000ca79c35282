"""Semantic-preserving tower transform (SPTT): topology math and the sharded embedding dataflow.

* :mod:`dmt.sptt.topology`: hosts, towers, peers, peer order (pure).
* :mod:`dmt.sptt.plan`: table shards inside towers and the feature layouts of steps a-f (pure).
* :mod:`dmt.sptt.peer_permute`: where step c permutes, the byte rule of ``"auto"`` and when it
  can be skipped (pure).
* :mod:`dmt.sptt.process_groups`: the world, intra-tower and peer process groups.
* :mod:`dmt.sptt.dataflow`: steps a-f of one rank, with the tower-module hook.
* :mod:`dmt.sptt.collectives`: autograd all-to-all (also asynchronous) and reduce-scatter with
  exact backward.
* :mod:`dmt.sptt.sharded_towers`: ``ShardedTowers``, the towers of one rank as a TorchRec sharded
  module (input dist = step a, compute = b-e and the tower module, output dist = step f).
* :mod:`dmt.sptt.comm_stats`: bytes per step and group, and how many cross hosts.
* :mod:`dmt.sptt.dmt_sharding`: ``DMTSharder`` / ``ShardedDMT``: a DMT model trained with SPTT
  (tower modules replicated inside their tower, the rest data-parallel), and ``shard_dmt``,
  the trainer's entry point.
"""

from dmt.sptt.plan import SPTTPlan, TableShard, build_plan
from dmt.sptt.topology import Topology

__all__ = ["SPTTPlan", "TableShard", "Topology", "build_plan"]
