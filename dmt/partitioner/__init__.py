"""Tower Partitioner (TP, DMT paper §3.3): learned, balanced feature-to-tower assignment.

Pipeline, one module per step, all pure functions over arrays:

1. :mod:`~dmt.partitioner.affinity`: feature affinity ``I = |mean cos(F_i, F_j)|`` of a trained
   model's pooled embeddings (streaming), plus save/load.
2. :mod:`~dmt.partitioner.distance`: ``D = 1 - I`` (coherent) or ``D = I`` (diverse).
3. :mod:`~dmt.partitioner.embedding`: coordinates ``X`` with ``||X_i - X_j|| ~ D_ij`` (Adam).
4. :mod:`~dmt.partitioner.clustering`: constrained K-Means on ``X`` into balanced towers.

:mod:`~dmt.partitioner.partition` chains them (also hierarchically inside pre-groups),
:mod:`~dmt.partitioner.baselines` holds the naive and random partitions,
:mod:`~dmt.partitioner.output` the YAML / heatmap / summary, :mod:`~dmt.partitioner.cli` the
``dmt-partition`` command.

Example::

    >>> from dmt.partitioner import partition_features
    >>> towers = partition_features(affinity, num_towers=8, strategy="coherent")
    >>> towers[0]  # sorted feature indices of the tower holding feature 0
"""

from dmt.partitioner.affinity import (
    AffinityAccumulator,
    check_affinity,
    compute_affinity,
    load_affinity,
    model_affinity,
    save_affinity,
)
from dmt.partitioner.baselines import naive_partition, random_partition
from dmt.partitioner.clustering import balanced_kmeans, tower_size_bounds
from dmt.partitioner.distance import STRATEGIES, affinity_to_distance
from dmt.partitioner.embedding import fit_euclidean_embedding, normalized_stress
from dmt.partitioner.output import (
    format_summary,
    load_partition,
    plot_affinity_heatmap,
    save_partition,
)
from dmt.partitioner.partition import (
    PartitionResult,
    allot_towers,
    check_partition_arguments,
    partition_features,
    partition_hierarchical,
    tower_partition,
)

__all__ = [
    "STRATEGIES",
    "AffinityAccumulator",
    "PartitionResult",
    "affinity_to_distance",
    "allot_towers",
    "balanced_kmeans",
    "check_affinity",
    "check_partition_arguments",
    "compute_affinity",
    "fit_euclidean_embedding",
    "format_summary",
    "load_affinity",
    "load_partition",
    "model_affinity",
    "naive_partition",
    "normalized_stress",
    "partition_features",
    "partition_hierarchical",
    "plot_affinity_heatmap",
    "random_partition",
    "save_affinity",
    "save_partition",
    "tower_partition",
    "tower_size_bounds",
]
