"""Planning at scale without a cluster: what a training step moves and holds at 16-512 GPUs.

* :mod:`dmt.planning.collectives`: bytes per step, collective and process group (intra-host /
  cross-host) of flat TorchRec sharding and of SPTT/DMT, from the split sizes the real dataflow
  uses (:mod:`dmt.sptt.splits`) and TorchRec's ``ShardingPlan``;
* :mod:`dmt.planning.memory`: per-GPU memory (tables, optimizer state, UVM caches, dense state,
  activations);
* :mod:`dmt.planning.hardware`: the ``cluster`` config group's schema;
* :mod:`dmt.planning.app`: the ``dmt-plan`` Hydra app (``plan.json`` and a table).
"""
