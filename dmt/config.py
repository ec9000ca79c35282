"""Typed Hydra configs: one dataclass schema per config group, registered in the ConfigStore.

YAML files in ``conf/<group>/`` are merged onto these schemas, so a misspelt key or a value of the
wrong type fails at composition time. Semantic checks (positive sizes, known names, matching dims)
live in :func:`validate` and run before any training starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from dmt.results import file_in_the_way
from dmt.run_dir import register_resolvers

PARTITION_KINDS = ("none", "naive", "tp", "per_feature", "explicit")
LR_DECAYS = ("none", "linear", "cosine")
POOLINGS = ("sum", "mean")
DATA_KINDS = ("synthetic", "criteo")
SYNTHETIC_MODES = ("planted", "random")
WANDB_MODES = ("online", "offline", "disabled")
WandbMode = Literal["online", "offline", "disabled"]  # logger.mode once validated


@dataclass
class TowerConfig:
    """Schema of a tower module (paper §4, Listings 1-2), ``(B, F_t, N) -> (B, V_t, D)``:
    ``_target_`` names a :class:`~dmt.models.tower_modules.TowerModule` class and the other
    fields are its keyword arguments; the model builder adds ``num_features`` (``F_t``) and
    ``embedding_dim`` (``N``) per tower. ``conf/tower/<name>.yaml`` picks one (``tower=<name>``).

    A new tower module is its class plus a YAML file in ``conf/tower/`` (``docs/tower_modules.md``);
    a dataclass schema like the ones below is optional and adds type checks at composition.
    """

    _target_: str = MISSING  # the TowerModule class, e.g. dmt.models.tower_modules.DLRMTowerModule


@dataclass
class PassThroughTowerConfig(TowerConfig):
    """Pass-through towers: SPTT alone (paper Table 3), ``V_t = F_t``, ``D = N``."""

    _target_: str = "dmt.models.tower_modules.PassThrough"


@dataclass
class DLRMTowerConfig(TowerConfig):
    """DLRM tower module (Listing 1): ``c`` vectors of size ``D`` per feature plus ``p`` per tower."""

    _target_: str = "dmt.models.tower_modules.DLRMTowerModule"
    dim: int = 64  # D: size of every output vector
    c: int = 1  # output vectors per feature (projection N -> c*D of each embedding)
    p: int = 0  # output vectors per tower (linear F_t*N -> p*D of the flattened embeddings)
    skip_square: bool = False  # leave out a square linear (the tower linear: over one feature)
    init: str = "default"  # the linears' init: default (PyTorch's) or isometric (orthogonal, keeps dot products on average, zero bias)
    bias: bool = True  # the linears' bias (shared by the tower's features)


@dataclass
class DCNTowerConfig(TowerConfig):
    """DCN tower module (Listing 2): a low-rank CrossNet over the tower's flattened embeddings,
    then ``Linear(F_t*N -> (c F_t + p) D)``. ``conf/tower/dcn.yaml`` takes the CrossNet sizes from
    ``model.dcn_num_layers`` and ``model.dcn_low_rank`` unless set."""

    _target_: str = "dmt.models.tower_modules.DCNTowerModule"
    dim: int = 128  # D: size of every output vector
    dcn_num_layers: int = 3  # cross layers of the tower's CrossNet
    dcn_low_rank: int = 64  # rank of each of its layers
    c: int = 1  # output vectors per feature (Listing 2 as printed: c=1, p=0)
    p: int = 0  # output vectors per tower
    skip_square: bool = False  # leave out a one-feature tower's projection when N = O_t


@dataclass
class InteractionConfig:
    """Schema of a global feature interaction: ``_target_`` names the class; the model builder
    adds ``num_vectors`` (``V``: pooled embeddings or tower output vectors), ``dim`` (``D``, their
    size) and ``dense_dim`` (the bottom MLP's output size)."""

    _target_: str = MISSING  # the interaction class, e.g. dmt.models.interaction.DotInteraction


@dataclass
class DotInteractionConfig(InteractionConfig):
    """DLRM's pairwise dot products (the dense vector joins them: bottom_mlp[-1] must be D)."""

    _target_: str = "dmt.models.interaction.DotInteraction"


@dataclass
class CrossInteractionConfig(InteractionConfig):
    """DCNv2's low-rank CrossNet over ``[dense, flattened sparse vectors]``. ``conf/model/dcn.yaml``
    sets its sizes from ``model.dcn_num_layers`` and ``model.dcn_low_rank``."""

    _target_: str = "dmt.models.interaction.CrossInteraction"
    num_layers: int = 3  # cross layers
    low_rank: int = 64  # rank of each cross layer


@dataclass
class PartitionConfig:
    """How the sparse features are grouped into towers; kind "none" builds the base model."""

    kind: str = (
        "none"  # "none" (no towers), "naive" (strided), "tp" (YAML file), "per_feature", "explicit"
    )
    num_towers: int | None = (
        None  # T: naive: required; other kinds: checked against the partition if set
    )
    path: str | None = (
        None  # tp: partition YAML with ``towers: [[feature names...], ...]`` (dmt-partition)
    )
    towers: list[list[str]] | None = None  # explicit: feature names of each tower
    recorded_towers: list[list[str]] | None = (
        None  # tp: the file's towers as the run trained them (dmt-train records them in its checkpoints' config.yaml); set: the towers built, the file only checked against them
    )


@dataclass
class ModelConfig:
    """Base model over one embedding table per sparse feature (bottom MLP, ``interaction``, top
    MLP: DLRM, DCNv2, or any interaction), or its DMT form (``partition.kind != "none"``:
    per-tower tables and ``tower`` modules, then the same global arch)."""

    _target_: str = (
        "dmt.models.factory.build_rec_model"  # the model's builder (see dmt.models.build_model)
    )
    name: str = (
        MISSING  # the model's name in reports and logs ("dlrm", "dcn", ...); selects no code
    )
    interaction: Any = MISSING  # global interaction: an InteractionConfig (``_target_`` + settings)
    embedding_dim: int = 16  # N: embedding dimension of every table
    num_embeddings_per_feature: list[int] | None = None  # rows per table; None: from the data
    bottom_mlp: list[int] = field(
        default_factory=lambda: [64, 16]
    )  # dense arch sizes; DLRM: last == embedding_dim
    top_mlp: list[int] = field(
        default_factory=lambda: [256, 128, 1]
    )  # over arch sizes; last must be 1
    bottom_final_activation: bool = (
        False  # ReLU after the last bottom layer (TorchRec's default; can kill dense outputs)
    )
    dropout: float = 0.0  # dropout probability after every ReLU of the bottom and top MLPs (0: none; evaluation never drops)
    dcn_num_layers: int = (
        3  # DCN: cross layers (conf/model/dcn.yaml's interaction and conf/tower/dcn.yaml read it)
    )
    dcn_low_rank: int = 64  # DCN: rank of each cross layer (likewise)
    pooling: str = "sum"  # multi-hot pooling: "sum" or "mean"
    # DMT: tower module of every tower, a TowerConfig (``_target_`` + settings); Any, so that a
    # tower module's YAML may bring its own schema (conf/tower/*.yaml) or none (checked when built)
    tower: Any = field(default_factory=lambda: {"_target_": PassThroughTowerConfig._target_})
    partition: PartitionConfig = field(
        default_factory=PartitionConfig
    )  # DMT: features of each tower


@dataclass
class SyntheticConfig:
    """dmt's own click-log generator (Criteo schema by default) with planted feature groups."""

    mode: str = (
        "planted"  # "planted" (known click function, oracle AUC) or "random" (throughput runs)
    )
    num_dense: int = 13  # dense features
    num_sparse: int = 26  # categorical features
    cardinality: int = 100  # rows per categorical feature (used when cardinalities is None)
    cardinalities: list[int] | None = None  # per-feature cardinalities (overrides cardinality)
    multi_hot: int = 1  # ids per bag (pooling factor) of every feature
    skew: float = 1.1  # Zipf exponent of background (untied) ids; 0 = uniform
    num_groups: int = 4  # planted latent feature groups (interactions only inside a group)
    num_clusters: int = 16  # latent states per group
    tie_prob: float = 0.8  # probability that a feature's id follows its group's latent state
    latent_dim: int = 4  # dimension of the planted interaction vectors
    signal_scale: float = 1.0  # scale of the in-group interaction part of the logit
    dense_scale: float = 0.5  # scale of the dense part of the logit
    click_rate: float = 0.25  # target mean click rate (sets the logit bias)
    num_train: int = 500_000  # training samples
    num_val: int = 20_000  # validation samples
    num_test: int = 20_000  # test samples
    seed: int = 0  # generator seed (the world: groups, tables, weights, samples)


# --- Criteo data (preprocessing and loaders) ---

#: Default Kaggle split: the first 85% of the lines train, then 7.5% validation, 7.5% test.
DEFAULT_SPLIT_FRACTIONS = (0.85, 0.075, 0.075)
#: Default Terabyte split: days 0..22 train, day 23 is cut in halves for validation and test
#: (``val_day`` makes a whole day the validation split instead; ``val_split`` false leaves none).
DEFAULT_TRAIN_DAYS = tuple(range(23))
DEFAULT_EVAL_DAY = 23
CATEGORICAL_MODES = ("vocab", "hash")
#: The largest ``data.criteo.hash_sizes`` entry: ids (up to size - 1) are stored as int32.
MAX_HASH_SIZE = 1 << 31
MISSING_IDS = ("shared", "distinct")


@dataclass
class CriteoConfig:
    """Where the Criteo data lives, how it is preprocessed and how it is read.

    Batch sizes, training shuffle on/off and the seed come from ``DataConfig`` and the trainer.
    """

    raw_path: str | None = None
    """Raw TSV for ``dmt-preprocess`` (loaders need only ``preprocessed_dir``): one file (Kaggle ``train.txt``, plain or gzip) or a directory of ``day_<d>`` files."""
    preprocessed_dir: str = MISSING
    """Directory of the preprocessed arrays: written by ``dmt-preprocess``, read by the loaders."""
    split_fractions: list[float] = field(default_factory=lambda: list(DEFAULT_SPLIT_FRACTIONS))
    """Single-file input: chronological train/val/test fractions of the lines (sum to 1)."""
    train_days: list[int] = field(default_factory=lambda: list(DEFAULT_TRAIN_DAYS))
    """Directory input: the days whose rows form the training split."""
    eval_day: int = DEFAULT_EVAL_DAY
    """Directory input: the test day; cut in halves (first validation, second test) unless ``val_day`` is set or ``val_split`` is false."""
    val_day: int | None = None
    """Directory input: a whole day of validation rows (``eval_day`` is then all test); None halves ``eval_day``."""
    val_split: bool = True
    """False: no validation rows. Directory input: ``eval_day`` is all test, ``val_day`` must be None (the forward protocol's refit: the settings chosen on ``val_day``, trained again with that day in ``train_days``). A single file says it with ``split_fractions[1] = 0``."""
    categorical_mode: str = "vocab"
    """``vocab``: ids fitted on train with a frequency threshold; ``hash``: stable hashing."""
    frequency_threshold: int = 3
    """vocab mode: training occurrences a value needs for its own id (rarer ones share id 0)."""
    missing_id: str = "shared"
    """vocab mode: empty fields share id 0 with rare and unseen values (``shared``) or get id 1 of their own (``distinct``: kept values start at 2, tables grow by a row). Hash mode always gives empty fields id 0 of their own."""
    hash_sizes: list[int] = field(default_factory=list)
    """hash mode: rows per categorical table, one value for all 26 features or 26 values."""
    skip_bad_rows: bool = False
    """Drop and count malformed rows (and keep a truncated gzip's complete lines) instead of failing."""
    num_workers: int = 0
    """Preprocessing processes; 0 means one per available CPU core."""
    test_path: str | None = None
    """Extra raw TSV used as the test split, mapped through the training vocabularies."""
    shuffle_window_rows: int | None = None
    """Rows shuffled together: None shuffles the whole split, N permutes N-row windows and the rows inside each."""
    in_memory: bool = False
    """Load the arrays into RAM; False memory-maps them and reads batch by batch (bounded memory)."""
    prefetch_batches: int = 4
    """Batches prepared ahead by a background thread (0 disables the thread)."""
    auto_preprocess: bool = True
    """Training with ``raw_path`` set runs ``dmt-preprocess`` first (a no-op when
    ``preprocessed_dir`` is up to date, also when ``raw_path`` only moved or was touched since, a
    rebuild when it is damaged; an error when it was made with other settings or rows)."""

    def validate(self) -> None:
        """Raise ``ValueError`` on settings that cannot work."""
        if len(self.split_fractions) != 3 or not all(
            math.isfinite(f) and f >= 0 for f in self.split_fractions
        ):
            raise ValueError(
                f"split_fractions must be 3 finite non-negative numbers (train, val, test); "
                f"got {list(self.split_fractions)}"
            )
        if abs(sum(self.split_fractions) - 1.0) > 1e-6:
            raise ValueError(
                f"split_fractions must sum to 1; got {list(self.split_fractions)} "
                f"(sum {sum(self.split_fractions)})"
            )
        if self.split_fractions[0] <= 0:
            raise ValueError(
                "split_fractions[0] (train) must be > 0: vocabularies are fitted on train"
            )
        if self.eval_day in self.train_days:
            raise ValueError(
                f"eval_day {self.eval_day} is also in train_days {list(self.train_days)}; "
                "validation and test rows must not be trained on"
            )
        if not self.train_days:
            raise ValueError("train_days must name at least one day")
        if twice := sorted({d for d in self.train_days if list(self.train_days).count(d) > 1}):
            raise ValueError(
                f"train_days {list(self.train_days)} names day(s) {twice} more than once; a "
                "day's rows are read once, so name each day once"
            )
        if self.val_day is not None:
            if self.val_day in self.train_days:
                raise ValueError(
                    f"val_day {self.val_day} is also in train_days {list(self.train_days)}; "
                    "validation rows must not be trained on"
                )
            if self.val_day == self.eval_day:
                raise ValueError(
                    f"val_day {self.val_day} equals eval_day {self.eval_day}; the validation day "
                    "must be another day than the test day (or val_day None, to halve eval_day)"
                )
            if not self.val_split:
                raise ValueError(
                    f"val_split is false (no validation rows) but val_day {self.val_day} is set; "
                    f"set val_day to null, and put day {self.val_day} into train_days to train "
                    "on it"
                )
        if self.categorical_mode not in CATEGORICAL_MODES:
            raise ValueError(
                f"categorical_mode must be one of {CATEGORICAL_MODES}; got {self.categorical_mode!r}"
            )
        if self.missing_id not in MISSING_IDS:
            raise ValueError(
                f"missing_id must be one of {MISSING_IDS} (empty fields share id 0 with rare "
                f"values, or get id 1 of their own); got {self.missing_id!r}"
            )
        if self.frequency_threshold < 1:
            raise ValueError(f"frequency_threshold must be >= 1; got {self.frequency_threshold}")
        if self.categorical_mode == "hash":
            if len(self.hash_sizes) not in (1, 26):
                raise ValueError(
                    "hash mode needs hash_sizes: one table size for every feature or 26 sizes; "
                    f"got {list(self.hash_sizes)}"
                )
            if any(s < 2 for s in self.hash_sizes):
                raise ValueError(
                    f"hash_sizes must be >= 2 (id 0 is the empty bucket); got {list(self.hash_sizes)}"
                )
            if any(s > MAX_HASH_SIZE for s in self.hash_sizes):
                raise ValueError(
                    f"hash_sizes must be <= {MAX_HASH_SIZE} (ids are stored as int32); "
                    f"got {list(self.hash_sizes)}"
                )
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0; got {self.num_workers}")
        if self.shuffle_window_rows is not None and self.shuffle_window_rows < 1:
            raise ValueError(
                f"shuffle_window_rows must be None or >= 1; got {self.shuffle_window_rows}"
            )
        if self.prefetch_batches < 0:
            raise ValueError(f"prefetch_batches must be >= 0; got {self.prefetch_batches}")

    def table_hash_sizes(self) -> list[int]:
        """hash mode: the 26 table sizes."""
        sizes = list(self.hash_sizes)
        return sizes * 26 if len(sizes) == 1 else sizes


@dataclass
class DataConfig:
    """Which data to train on and how it is batched."""

    kind: str = "synthetic"  # "synthetic" or "criteo"
    batch_size: int = 512  # global training batch size (split evenly over ranks)
    eval_batch_size: int = 8192  # global evaluation batch size
    shuffle: bool = True  # reshuffle the training set every epoch (by trainer.seed and epoch)
    synthetic: SyntheticConfig = field(
        default_factory=SyntheticConfig
    )  # used when kind == synthetic
    criteo: CriteoConfig | None = None  # used when kind == criteo (see dmt/data/criteo_config.py)


@dataclass
class OptimConfig:
    """Sparse (fused, in-backward) and dense optimizers and the LR schedule, each a component
    config built from its ``_target_`` by :mod:`dmt.optim` (a new optimizer or schedule is a
    config, not code). ``conf/optim/<name>.yaml`` picks a combination (``optim=<name>``).

    Example (``conf/optim/default.yaml``)::

        lr: 0.003
        sparse_lr: 0.1
        sparse: {_target_: torchrec.optim.RowWiseAdagrad, _partial_: true, lr: ${..sparse_lr}, eps: 1e-8}
        dense: {_target_: torch.optim.Adam, _partial_: true, lr: ${..lr}, betas: [0.9, 0.999]}
        schedule: {_target_: dmt.optim.warmup_decay_schedule, warmup_steps: 0, decay: none}
    """

    lr: float = 0.003  # peak learning rate of the dense parameters (optim.dense.lr reads it)
    sparse_lr: float = 0.1  # peak learning rate of the embedding tables (optim.sparse.lr reads it)
    # DMT tower modules' dense learning rate as a multiple of the rest's (a second param group of
    # optim.dense, scheduled alike; 0 freezes them at their init); 1: one group, as without towers
    tower_lr_scale: float = 1.0
    # the dense optimizer's fused implementation (torch's fused=True: one kernel updates every
    # parameter, where the default loops over them, several kernels each), where its class
    # offers one (Adam, AdamW, Adagrad, SGD) and optim.dense sets neither fused nor foreach: the
    # same update, to float rounding; false: torch's default implementation
    dense_fused: bool = True
    # The components are Any, so that each optimizer brings its own kwargs; their defaults hold
    # only what every optimizer takes (a YAML's fields are merged onto them).
    # fused embedding optimizer: _target_ a class TorchRec fuses into FBGEMM's kernels
    # (torchrec.optim.RowWiseAdagrad, torch.optim.Adagrad/SGD; torch.optim.Adam on CUDA only),
    # _partial_: true, and the kernel's kwargs (lr, eps, beta1/beta2, ...; weight_decay on CUDA
    # only, for row-wise Adagrad with weight_decay_mode: l2 or decouple, for Adam with decouple,
    # since FBGEMM's CPU kernels and its SGD and Adagrad kernels ignore it)
    sparse: Any = field(
        default_factory=lambda: {
            "_target_": "torchrec.optim.RowWiseAdagrad",
            "_partial_": True,
            "lr": "${..sparse_lr}",
        }
    )
    # dense optimizer: _target_ a torch.optim.Optimizer class, _partial_: true, and its kwargs
    # (dense_fused: its fused implementation where it has one)
    dense: Any = field(
        default_factory=lambda: {"_target_": "torch.optim.Adam", "_partial_": True, "lr": "${..lr}"}
    )
    # LR schedule: _target_ a factory (optimizer, total_steps, **kwargs) -> torch LRScheduler;
    # dmt.optim.warmup_decay_schedule takes warmup_steps, decay (none, linear, cosine),
    # decay_start, decay_steps (0: until the end of training) and min_lr_ratio
    schedule: Any = field(default_factory=lambda: {"_target_": "dmt.optim.warmup_decay_schedule"})


@dataclass
class TrainerConfig:
    """Training loop settings."""

    epochs: int = 1  # passes over the training set
    max_steps: int = -1  # stop after this many steps, or at the end of trainer.epochs if that comes first (<= 0: run all epochs)
    eval_every: int = 0  # evaluate on validation every N steps (0: only at the end)
    log_every: int = 50  # log training loss every N steps
    checkpoint_every: int = (
        0  # save a checkpoint every N steps (0: only at the end if checkpoint is on)
    )
    checkpoint: bool = False  # save a checkpoint at the end of training
    checkpoint_dir: str = "checkpoints"  # relative to the run's output directory, or absolute
    checkpoint_keep: int = 0  # keep the newest N complete checkpoints (step_N) of checkpoint_dir: once one is complete, rank 0 deletes the older ones beyond N (0: keep all)
    resume_from: str | None = (
        None  # "auto" (newest complete checkpoint of this run, else fresh), a step_N directory or its parent (newest)
    )
    resume_allow_config_change: bool = False  # let a resume change optim.* keys (model, data settings, partition must match) and train on other rows than the checkpoint's (data.criteo.raw_path/preprocessed_dir), with a warning
    checkpoint_async: bool = False  # write checkpoints in the background (DCP async_save over a dedicated gloo group): large tables on GPU; on small models staging costs more than it saves. The staging copy of every rank's state (dmt.host_memory.staged_bytes) must fit in its host's free memory, else that checkpoint is written synchronously, with a warning
    pipeline: bool = True  # TorchRec's training pipeline (overlaps batch i+1's copy and input all-to-all with batch i) whenever there are 2+ ranks; a world of one (one process) runs the plain loop, faster there (one H100: 1.2-1.3x; nothing to overlap); false: the plain loop everywhere, for debugging
    pipeline_world_of_one: bool = False  # with trainer.pipeline, pipeline a world of one too (to compare or test the pipeline in one process; slower there)
    seed: int = 0  # seed of weights init, data order and dropout masks (with 2+ ranks each rank draws its own, from the seed and its rank)
    progress_bar: bool = True  # tqdm progress bar on rank 0; false (a cluster job's log): rank 0 logs each log step's training loss and each evaluation's metrics instead
    device: str = "auto"  # "auto" (cuda when available), "cpu" or "cuda"
    optimize_metric: str = "val_auc"  # metric returned to a Hydra sweeper
    eval_max_batches: int = -1  # cap evaluation batches (<= 0: all)
    ema_decay: float | None = (
        None  # evaluate an exponential moving average of the dense weights (MLPs, interaction, tower modules; not the tables), avg = decay * avg + (1 - decay) * w after every step, e.g. 0.999; training goes on from the raw weights (None: off)
    )
    reuse_host_memory: bool = True  # keep host memory freed between steps for the next step (glibc: mallopt's M_MMAP_THRESHOLD 32 MiB and M_TRIM_THRESHOLD 256 MiB for the process, dmt.host_malloc): glibc's adapting defaults can return a step's temporaries to the system and page-fault them back every step (dmt-train, DLRM at batch 512 on a CPU: 1.12x; how much depends on what the process allocated before); the process keeps about its peak host memory, and the setting lasts as long as the process (a multirun's later jobs too); false: glibc's defaults. Nothing changes where the environment sets those thresholds (MALLOC_{MMAP_THRESHOLD,TRIM_THRESHOLD,TOP_PAD,MMAP_MAX}_ or their GLIBC_TUNABLES), with another C library, or where another allocator serves malloc (jemalloc, tcmalloc preloaded)
    collective_timeout_s: float = 600.0  # timeout of every process group dmt creates (flat and SPTT; TorchRec's own table-row-wise groups keep torch's default); a rank silent this long ends the job


def use_pipeline(trainer: TrainerConfig, world_size: int) -> bool:
    """Whether to train through TorchRec's pipeline: with ``trainer.pipeline``, in a world of 2+
    ranks, where it overlaps batch ``i+1``'s input all-to-all with batch ``i``. A world of one has
    no input distribution to overlap, only the batch copy, and the pipeline's own host work per
    step costs more than that saves: the plain loop gave 1.2-1.3x its samples/s on one H100, and
    1.25x on this repository's CPU with a step small enough to be host-bound
    (``benchmarks/bench_torchrec_dlrm.py``). ``trainer.pipeline_world_of_one`` pipelines it
    anyway."""
    return trainer.pipeline and (world_size > 1 or trainer.pipeline_world_of_one)


@dataclass
class LoggerConfig:
    """Weights & Biases logging (rank 0 only)."""

    mode: str = "offline"  # online, offline or disabled (conf/logger/wandb.yaml: WANDB_MODE if set)
    project: str | None = None  # wandb project (None: the environment's WANDB_PROJECT, else dmt)
    entity: str | None = None  # wandb entity (team; None: WANDB_ENTITY, else wandb's default)
    name: str | None = None  # run name (default: wandb's)
    group: str | None = None  # run group (default: the sweep directory in a Hydra multirun)
    tags: list[str] = field(default_factory=list)  # run tags


@dataclass
class SPTTConfig:
    """SPTT (paper §3.1): train a DMT model with towers on hosts instead of flat TorchRec sharding."""

    enabled: bool = False  # sptt=on: shard with dmt.sptt.dmt_sharding.shard_dmt (needs a DMT model)
    hosts_per_tower: int = 1  # K: hosts per tower; T = G / (K L) must equal the model's towers
    local_world_size: int | None = (
        None  # L: ranks per host (None: torchrun's LOCAL_WORLD_SIZE); set to emulate hosts
    )
    sharding_type: str = "table_wise"  # tables inside a tower: table_wise, column_wise or row_wise
    peer_permute: str = "skip"  # step c (§3.1.3): "skip" (step a delivers peer order: no step c, the cheapest), permute the pooled "output" (Figure 7), the sparse "input" (b, c swapped) or "auto" (fewer bytes); all train the same
    comm_precision: str = "fp32"  # dtype of the pooled-embedding collectives on the wire, forward and backward: fp32, bf16 or fp16 (bytes halve); SPTT steps d and f, and TorchRec's QCommsConfig for the flat baseline (read with sptt=off too)
    timeout_s: float | None = (
        None  # removed: trainer.collective_timeout_s sets every group's timeout (setting this is an error)
    )


@dataclass
class ShardingConfig:
    """Per-rank memory budget of the embedding tables and their optimizer state (flat and SPTT).

    On CUDA a rank's tables go to HBM while they fit in ``hbm_gb``; the rest are cached in HBM
    (``FUSED_UVM_CACHING``: ``uvm_cache_load_factor`` of their rows) and live in host memory,
    within ``ddr_gb``. On CPU there is no HBM: every table lives in host memory, within ``ddr_gb``.
    """

    hbm_gb: float | None = None
    """GPU memory (GiB) per rank for tables plus optimizer state, on both paths; must not exceed the GPU's memory. None: 80% of the smallest GPU of the job (the rest is for the dense model, activations and communication buffers). Ignored on CPU."""
    ddr_gb: float = 128.0
    """Host memory (GiB) per rank for tables plus optimizer state (UVM-cached tables on CUDA, all tables on CPU)."""
    uvm_cache_load_factor: float = 0.2
    """Fraction of a UVM-cached table's rows kept in HBM (strictly between 0 and 1). Ignored on CPU."""


@dataclass
class Config:
    """Root config: one field per config group."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    sptt: SPTTConfig = field(default_factory=SPTTConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)


#: :func:`schema_default`'s answer for a key without a default in the schema
NO_DEFAULT: Any = object()


def schema_default(key: str, root: type = Config) -> Any:
    """The schema's default of a dotted leaf key (``data.criteo.val_split``: ``True``).

    What a run made before the key existed had: a setting is added with the default that keeps
    the earlier behaviour. :data:`NO_DEFAULT` when the schema has no such key, or no default for
    it (``???``, or below a field that is not one dataclass, e.g. ``model.tower.*``)."""
    cls: Any = root
    parts = key.split(".")
    for i, name in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return NO_DEFAULT
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name not in fields:
            return NO_DEFAULT
        f = fields[name]
        if i == len(parts) - 1:
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                return NO_DEFAULT
            return NO_DEFAULT if value == MISSING or dataclasses.is_dataclass(value) else value
        hint = typing.get_type_hints(cls)[name]
        schemas = [a for a in typing.get_args(hint) or (hint,) if dataclasses.is_dataclass(a)]
        cls = schemas[0] if len(schemas) == 1 else None
    return NO_DEFAULT


def component_default(key: str, target: str) -> Any:
    """The default of field ``key`` (its last dotted part) in the component schema whose
    ``_target_`` is ``target`` (``model.tower.bias`` of ``dmt.models.tower_modules.DLRMTowerModule``:
    ``True``), for the keys :func:`schema_default` cannot answer because their node is a
    component chosen by ``_target_``. :data:`NO_DEFAULT` when no schema of this module has that
    target, or no default for that field."""
    name = key.rsplit(".", 1)[-1]
    for cls in _component_schemas():
        if schema_default("_target_", cls) == target:
            return schema_default(name, cls)
    return NO_DEFAULT


def _component_schemas() -> list[type]:
    """The dataclasses of this module with a ``_target_`` default: the component schemas."""
    return [
        obj
        for obj in list(globals().values())
        if isinstance(obj, type)
        and dataclasses.is_dataclass(obj)
        and isinstance(schema_default("_target_", obj), str)
    ]


def register_configs() -> None:
    """Register the schemas: the root as ``base_config`` and each group's as ``base_<group>``
    (and the resolvers the YAML files use)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(group="model", name="base_model", node=ModelConfig)
    for name, node in (
        ("base_passthrough", PassThroughTowerConfig),
        ("base_dlrm", DLRMTowerConfig),
        ("base_dcn", DCNTowerConfig),
    ):  # the schemas conf/tower/*.yaml extend
        cs.store(group="tower", name=name, node=node, package="model.tower")
    for name, spec in (("base_dot", DotInteractionConfig), ("base_cross", CrossInteractionConfig)):
        cs.store(group="model/interaction", name=name, node=spec, package="model.interaction")
    cs.store(
        group="partition", name="base_partition", node=PartitionConfig, package="model.partition"
    )
    cs.store(group="data", name="base_data", node=DataConfig)
    cs.store(group="optim", name="base_optim", node=OptimConfig)
    cs.store(group="trainer", name="base_trainer", node=TrainerConfig)
    cs.store(group="logger", name="base_logger", node=LoggerConfig)
    cs.store(group="sptt", name="base_sptt", node=SPTTConfig, package="sptt")
    cs.store(group="sharding", name="base_sharding", node=ShardingConfig, package="sharding")
    register_resolvers()  # ${dmt.run_stamp:} of conf/config.yaml's run directories


WANDB_MODE_RESOLVER = "dmt.wandb_mode"
# wandb's other names of its modes (wandb_settings.py)
_WANDB_MODE_ALIASES = {"dryrun": "offline", "run": "online"}
# the values of WANDB_MODE wandb starts with (its Settings.mode), whatever mode it is given
_WANDB_ENV_MODES = (*WANDB_MODES, *_WANDB_MODE_ALIASES, "shared")


def wandb_mode_env() -> str | None:
    """The environment variable ``WANDB_MODE``, None when unset. wandb reads it whatever mode
    ``wandb.init`` is given and does not start on a value it does not know (an empty one too),
    so such a value is a ``ValueError`` naming it, not a run that goes on without wandb."""
    value = os.environ.get("WANDB_MODE")
    if value is not None and value not in _WANDB_ENV_MODES:
        raise ValueError(
            f"the environment variable WANDB_MODE={value!r} is not one of "
            f"{list(_WANDB_ENV_MODES)}: wandb reads it whatever logger.mode says, and would not "
            "start; unset it or set one of those (logger=disabled: no wandb)"
        )
    return value


def wandb_mode_from_env() -> str:
    """``${dmt.wandb_mode:}``, ``conf/logger/wandb.yaml``'s ``mode``: the environment variable
    ``WANDB_MODE`` (:func:`wandb_mode_env`; wandb's ``dryrun`` is ``offline``, ``run`` is
    ``online``), else offline."""
    value = wandb_mode_env()
    if value is None:
        return "offline"
    mode = _WANDB_MODE_ALIASES.get(value, value)
    if mode not in WANDB_MODES:  # wandb's shared
        raise ValueError(
            f"the environment variable WANDB_MODE={value!r} (logger.mode's default) is not one "
            f"of {list(WANDB_MODES)} (or wandb's dryrun, run); unset it or set logger.mode"
        )
    return mode


def _choice(setting: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{setting}={value!r} is not supported; expected one of {list(allowed)}")


def _positive(setting: str, value: Any) -> None:
    if isinstance(value, list | tuple):
        if len(value) == 0:
            raise ValueError(f"{setting} must be a non-empty list of positive integers, got []")
        for i, v in enumerate(value):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(
                    f"{setting}[{i}]={v!r} must be a positive integer (got {list(value)})"
                )
    elif value is None or not value > 0:  # NaN too
        raise ValueError(f"{setting}={value!r} must be positive")
    elif not math.isfinite(value):
        raise ValueError(f"{setting}={value!r} must be finite")


#: the partition settings only some kinds read: those kinds, and how to choose one
_PARTITION_READERS = {
    "num_towers": ("naive, tp, per_feature and explicit", "partition=naive|tp"),
    "path": ("tp", "partition=tp"),
    "towers": ("explicit", "model.partition.kind=explicit"),
    "recorded_towers": ("tp", "partition=tp"),
}


def unread_partition_settings(p: PartitionConfig) -> list[str]:
    """The settings of ``model.partition`` that are set but that its kind does not read."""
    return [
        name
        for name, (kinds, _) in _PARTITION_READERS.items()
        if getattr(p, name) is not None and p.kind not in kinds.replace(",", "").split()
    ]


def validate_towers(m: ModelConfig) -> None:
    """Check ``model.partition`` (the features themselves are checked when the model is built,
    against the data's feature names) and that tower modules other than pass-through have towers."""
    p = m.partition
    _choice("model.partition.kind", p.kind, PARTITION_KINDS)
    # a setting of another kind is an error, not ignored (towers meant, the base model trained)
    for name in unread_partition_settings(p):
        kinds, choose = _PARTITION_READERS[name]
        raise ValueError(
            f"model.partition.{name}={getattr(p, name)!r} is set, but model.partition.kind="
            f"{p.kind!r} does not read it (kinds that do: {kinds}); choose the kind ({choose}; "
            f"+partition=... where the experiment has no partition) or set "
            f"model.partition.{name}=null"
        )
    if p.kind == "none":
        target = _target(m.tower)
        if target != PassThroughTowerConfig._target_:
            raise ValueError(
                f"model.tower ({target}) needs towers, but model.partition.kind='none'; "
                "pick a partition (+partition=naive|tp|per_feature)"
            )
        return
    if p.num_towers is not None:
        _positive("model.partition.num_towers", p.num_towers)
    if p.kind == "naive" and p.num_towers is None:
        raise ValueError("model.partition.kind='naive' needs model.partition.num_towers")
    if p.kind == "tp" and not p.path:
        raise ValueError("model.partition.kind='tp' needs model.partition.path (a partition YAML)")
    if p.kind == "explicit" and not p.towers:
        raise ValueError(
            "model.partition.kind='explicit' needs model.partition.towers (lists of feature names)"
        )


def _target(node: Any) -> Any:
    """``_target_`` of a component config (a dataclass or, for a schema-less YAML, a dict)."""
    return node.get("_target_") if isinstance(node, dict) else getattr(node, "_target_", None)


def validate_sharding(s: ShardingConfig) -> None:
    """Check the memory budget: positive sizes, a load factor strictly between 0 and 1."""
    for name in ("hbm_gb", "ddr_gb"):
        value = getattr(s, name)
        if value is None and name == "hbm_gb":
            continue
        if not (value * 2**30 >= 1 and math.isfinite(value)):  # at least a byte (NaN fails)
            raise ValueError(
                f"sharding.{name}={value!r} must be a positive number of GiB per rank "
                "(tables plus optimizer state)"
            )
    if not 0.0 < s.uvm_cache_load_factor < 1.0:
        raise ValueError(
            f"sharding.uvm_cache_load_factor={s.uvm_cache_load_factor!r} must be strictly between "
            "0 and 1 (the fraction of a UVM-cached table's rows kept in HBM, e.g. 0.2)"
        )


def config_yaml(cfg: Config) -> str:
    """``cfg`` as the YAML a checkpoint saves and a resume compares with
    (:func:`dmt.checkpoint.check_config`)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _no_unknown_keys(node: Any, path: str) -> None:
    """Raise for a key that a ``+`` override added to a typed group: OmegaConf keeps it on the
    dataclass, and nothing reads it (``+trainer.epoch=2`` would train 1 epoch). Nodes that are
    not dataclasses (``optim.sparse``, a ``_target_`` node without a schema) take any key."""
    fields = [f.name for f in dataclasses.fields(node)]
    for key in vars(node):
        if key not in fields:
            name = f"{path}.{key}" if path else key
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {path + '.' if path else ''}{close[0]}?" if close else ""
            raise ValueError(
                f"{name} is not a setting of {type(node).__name__} (a + override adds keys only "
                f"where the config takes any key, e.g. optim.sparse){hint}"
            )
    for name in fields:
        value = getattr(node, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _no_unknown_keys(value, f"{path}.{name}" if path else name)


def validate(cfg: Config) -> None:
    """Check semantics the schema cannot express. Raises ValueError naming the setting."""
    _no_unknown_keys(cfg, "")
    m = cfg.model
    if not isinstance(m.name, str) or not m.name:
        raise ValueError(
            f"model.name={m.name!r} must be a non-empty name (it labels reports and logs)"
        )
    _choice("model.pooling", m.pooling, POOLINGS)
    _positive("model.embedding_dim", m.embedding_dim)
    _positive("model.bottom_mlp", list(m.bottom_mlp))
    _positive("model.top_mlp", list(m.top_mlp))
    if m.top_mlp[-1] != 1:
        raise ValueError(f"model.top_mlp must end in 1 (one logit), got {list(m.top_mlp)}")
    if not 0.0 <= m.dropout < 1.0:
        raise ValueError(
            f"model.dropout={m.dropout!r} must be in [0, 1) (the probability of zeroing an MLP "
            "activation; 0 turns dropout off)"
        )
    _positive("model.dcn_num_layers", m.dcn_num_layers)
    _positive("model.dcn_low_rank", m.dcn_low_rank)
    validate_towers(m)
    # The components' own checks (sizes, c/p, dims that must agree), before any data is read.
    from dmt.data import config_feature_names  # noqa: PLC0415 (dmt.data imports this module)
    from dmt.models.factory import check_components  # noqa: PLC0415 (torch; dmt.models imports this module)

    check_components(m, config_feature_names(cfg.data))
    if m.num_embeddings_per_feature is not None:
        _positive("model.num_embeddings_per_feature", list(m.num_embeddings_per_feature))

    d = cfg.data
    _choice("data.kind", d.kind, DATA_KINDS)
    _positive("data.batch_size", d.batch_size)
    _positive("data.eval_batch_size", d.eval_batch_size)
    if d.kind == "synthetic":
        s = d.synthetic
        _choice("data.synthetic.mode", s.mode, SYNTHETIC_MODES)
        for name in (
            "num_dense",
            "num_sparse",
            "cardinality",
            "multi_hot",
            "num_groups",
            "num_clusters",
            "latent_dim",
            "num_train",
            "num_val",
            "num_test",
        ):
            _positive(f"data.synthetic.{name}", getattr(s, name))
        if s.cardinalities is not None:
            _positive("data.synthetic.cardinalities", list(s.cardinalities))
            if len(s.cardinalities) != s.num_sparse:
                raise ValueError(
                    f"data.synthetic.cardinalities has {len(s.cardinalities)} entries but "
                    f"data.synthetic.num_sparse={s.num_sparse}"
                )
        if s.mode == "planted" and s.num_groups > s.num_sparse:  # random mode plants no groups
            raise ValueError(
                f"data.synthetic.num_groups={s.num_groups} exceeds num_sparse={s.num_sparse}"
            )
        if not 0.0 <= s.tie_prob <= 1.0:
            raise ValueError(f"data.synthetic.tie_prob={s.tie_prob} must be in [0, 1]")
        if not 0.0 < s.click_rate < 1.0:
            raise ValueError(f"data.synthetic.click_rate={s.click_rate} must be in (0, 1)")
        if not s.skew >= 0:  # NaN too
            raise ValueError(f"data.synthetic.skew={s.skew} must be >= 0")
        # a NaN skew drew ids of no Zipf law; a NaN or infinite scale labelled every row 0
        for name in ("skew", "signal_scale", "dense_scale"):
            if not math.isfinite(getattr(s, name)):
                raise ValueError(f"data.synthetic.{name}={getattr(s, name)} must be finite")
        # numpy refuses a negative seed; a larger one is several seed words, whose generators
        # are other seeds' (2**32's first training rows come from seed 0's rows 65,536 on)
        if not 0 <= s.seed < 2**32:
            raise ValueError(f"data.synthetic.seed={s.seed} must be in [0, 2**32 - 1]")
    elif d.criteo is None:
        raise ValueError(
            "data.kind=criteo needs a data.criteo section (use data=criteo_kaggle, criteo_1tb or criteo_sample)"
        )
    else:  # before the runtime and the logger start, not when the data is first read
        try:
            d.criteo.validate()
        except ValueError as e:
            raise ValueError(f"data.criteo: {e}") from None

    _positive("optim.lr", cfg.optim.lr)
    _positive("optim.sparse_lr", cfg.optim.sparse_lr)
    # the optimizers' and the schedule's own checks (kwargs, ranges), before any data is read
    from dmt.optim import check_optim  # noqa: PLC0415 (torch; dmt.optim imports this module)

    check_optim(cfg.optim)

    t = cfg.trainer
    if not 0 <= t.seed < 2**32:  # numpy's and torch's seeds
        raise ValueError(f"trainer.seed={t.seed} must be in [0, 2**32 - 1]")
    _positive("trainer.epochs", t.epochs)
    _choice("trainer.device", t.device, ("auto", "cpu", "cuda"))
    _positive("trainer.log_every", t.log_every)
    for key in ("eval_every", "checkpoint_every"):
        if getattr(t, key) < 0:
            raise ValueError(f"trainer.{key}={getattr(t, key)} must be >= 0 (0: only at the end)")
    if t.checkpoint_keep < 0:
        raise ValueError(
            f"trainer.checkpoint_keep={t.checkpoint_keep} must be >= 0 (the newest checkpoints "
            "to keep; 0: keep all)"
        )
    _positive("trainer.collective_timeout_s", t.collective_timeout_s)
    _check_checkpoint_dir(t.checkpoint_dir)
    if t.ema_decay is not None and not 0.0 <= t.ema_decay < 1.0:
        raise ValueError(
            f"trainer.ema_decay={t.ema_decay!r} must be in [0, 1) (the weight of the old average, "
            "e.g. 0.999), or null to evaluate the raw weights"
        )
    _choice("logger.mode", cfg.logger.mode, WANDB_MODES)
    validate_sharding(cfg.sharding)
    sp = cfg.sptt
    if sp.timeout_s is not None:
        raise ValueError(
            f"sptt.timeout_s={sp.timeout_s} was replaced by trainer.collective_timeout_s, the timeout "
            f"of every process group (flat and SPTT): set trainer.collective_timeout_s={sp.timeout_s} instead"
        )
    _choice("sptt.comm_precision", sp.comm_precision, ("fp32", "bf16", "fp16"))
    # checked with sptt=off too: a mistyped value there is a mistake all the same
    _positive("sptt.hosts_per_tower", sp.hosts_per_tower)
    if sp.local_world_size is not None:
        _positive("sptt.local_world_size", sp.local_world_size)
    _choice("sptt.sharding_type", sp.sharding_type, ("table_wise", "column_wise", "row_wise"))
    _choice("sptt.peer_permute", sp.peer_permute, ("output", "input", "auto", "skip"))
    if sp.enabled:
        if cfg.model.partition.kind == "none":
            raise ValueError(
                "sptt=on needs a DMT model: set model.partition (e.g. +partition=naive model.partition.num_towers=T)"
            )
        if sp.sharding_type == "row_wise" and cfg.model.pooling != "sum":
            raise ValueError(
                f"sptt.sharding_type=row_wise needs model.pooling=sum, got model.pooling="
                f"{cfg.model.pooling}: step d adds each row shard's partial sums, and partial "
                "means do not add up to the mean; use sptt.sharding_type=table_wise or "
                "column_wise for mean pooling"
            )
        check_row_wise_rows(cfg)


def _config_rows(cfg: Config) -> tuple[list[int], str] | None:
    """Rows of each feature's table where the config gives them, and the setting that does:
    ``model.num_embeddings_per_feature``, else synthetic data's cardinalities (None for Criteo,
    whose rows come from its data)."""
    m, d = cfg.model, cfg.data
    if m.num_embeddings_per_feature is not None:
        return list(m.num_embeddings_per_feature), "model.num_embeddings_per_feature"
    if d.kind != "synthetic":
        return None
    if d.synthetic.cardinalities is not None:
        return list(d.synthetic.cardinalities), "data.synthetic.cardinalities"
    return [d.synthetic.cardinality] * d.synthetic.num_sparse, "data.synthetic.cardinality"


def check_row_wise_rows(
    cfg: Config, local_world_size: int | None = None, local_setting: str = "LOCAL_WORLD_SIZE"
) -> None:
    """With ``sptt=on`` and ``sptt.sharding_type=row_wise`` every rank of a tower holds a row
    block of each of its tables: refuse a table with fewer rows than the tower's ``K*L`` ranks
    (``sptt.hosts_per_tower`` times ``sptt.local_world_size``, or ``local_world_size``, the
    launcher's ranks per host, which ``local_setting`` names; one where neither is known, which
    refuses only what every world refuses), where the config gives its rows
    (:func:`_config_rows`)."""
    sp = cfg.sptt
    found = _config_rows(cfg)
    if not (sp.enabled and sp.sharding_type == "row_wise") or found is None:
        return
    if sp.local_world_size is not None:
        L, per_host = sp.local_world_size, f"sptt.local_world_size={sp.local_world_size}"
    elif local_world_size is not None:
        L, per_host = local_world_size, f"L={local_world_size} ranks per host ({local_setting})"
    else:
        L, per_host = 1, "at least L=1 rank per host"
    from dmt.data import sparse_feature_names  # noqa: PLC0415 (dmt.data imports this module)

    ranks = sp.hosts_per_tower * L
    rows, setting = found
    for i, (name, n) in enumerate(zip(sparse_feature_names(len(rows)), rows)):
        if n < ranks:
            value = f"{setting}={n}" if setting.endswith("cardinality") else f"{setting}[{i}]={n}"
            raise ValueError(
                f"sptt.sharding_type=row_wise puts a row block of every table on each of the "
                f"K*L={ranks} ranks of its tower (sptt.hosts_per_tower={sp.hosts_per_tower}, "
                f"{per_host}), but the table of feature {name} has {n} row"
                f"{'' if n == 1 else 's'} ({value}): a row-wise table needs at least {ranks} "
                "rows; give it more, or use sptt.sharding_type=table_wise or column_wise"
            )


def _check_checkpoint_dir(path: str) -> None:
    """``trainer.checkpoint_dir`` must name a directory of the checkpoints' own: not the run
    directory itself (an empty or ``.`` path) and not the file system's root."""
    normal = os.path.normpath(path) if path else ""
    if normal in ("", "."):
        raise ValueError(
            f"trainer.checkpoint_dir={path!r} is the run directory itself; it must name a "
            "directory of the checkpoints' own, relative to the run directory (e.g. checkpoints, "
            "the default) or absolute"
        )
    if os.path.isabs(normal) and os.path.dirname(normal) == normal:
        raise ValueError(
            f"trainer.checkpoint_dir={path!r} is the file system's root; it must name a "
            "directory of the checkpoints' own, relative to the run directory (e.g. checkpoints, "
            "the default) or absolute"
        )
    # (a relative one is made in the new run's directory)
    if os.path.isabs(normal) and (blocking := file_in_the_way(normal)) is not None:
        raise ValueError(
            f"trainer.checkpoint_dir={path!r}: {blocking} is not a directory (the run would "
            "train, then fail at its first checkpoint)"
        )


def ignored_settings(cfg: Config, *, world_size: int, total_steps: int, device: str) -> list[str]:
    """The settings of ``cfg`` that a ``dmt-train`` run of ``total_steps`` steps on
    ``world_size`` ranks of ``device`` (``"cpu"`` or ``"cuda"``, the runtime's device type)
    never acts on, one message each (the trainer warns of them): a setting is set when it
    differs from the schema's default (:func:`schema_default`)."""
    return [
        *_beyond_run(cfg.trainer, total_steps),
        *_unread_by_flat(cfg, world_size),
        *_unread_dcn_sizes(cfg.model),
        *_unread_data(cfg.data),
        *_unread_on_cpu(cfg.sharding, device),
    ]


def _set(path: str, node: Any, names: Iterable[str]) -> list[str]:
    """``path.name=value`` of each of ``names`` whose value in ``node`` is not its default."""
    return [
        f"{path}.{name}={getattr(node, name)!r}"
        for name in names
        if getattr(node, name) != schema_default(f"{path}.{name}")
    ]


def _listed(settings: list[str]) -> str:
    return f"{', '.join(settings)} {'is' if len(settings) == 1 else 'are'} set"


def _beyond_run(t: TrainerConfig, total_steps: int) -> list[str]:
    run = f"longer than the run ({total_steps} steps: trainer.epochs, trainer.max_steps)"
    out = []
    if t.max_steps > total_steps:  # trainer.epochs ended the run first, after equal epochs
        per_epoch = max(total_steps // t.epochs, 1)
        out.append(
            f"trainer.max_steps={t.max_steps} is {run}: trainer.epochs={t.epochs} ends it first "
            f"({per_epoch} steps per epoch); trainer.epochs={-(-t.max_steps // per_epoch)} "
            f"trains {t.max_steps} steps"
        )
    if t.log_every > total_steps:
        out.append(
            f"trainer.log_every={t.log_every} is {run}: no training loss is logged "
            "(history.jsonl, wandb)"
        )
    if t.eval_every > total_steps:
        out.append(f"trainer.eval_every={t.eval_every} is {run}: validation runs only at the end")
    if t.checkpoint_every > total_steps:
        out.append(
            f"trainer.checkpoint_every={t.checkpoint_every} is {run}: "
            + (
                "the only checkpoint is the one at the end (trainer.checkpoint=true)"
                if t.checkpoint
                else "the run writes no checkpoint (trainer.checkpoint=true writes one at the end)"
            )
        )
    if t.resume_allow_config_change and not t.resume_from:
        out.append(
            "trainer.resume_allow_config_change=true has no effect without trainer.resume_from: "
            "the run starts fresh, and no checkpoint's config is compared with its own"
        )
    return out


#: the sptt settings only SPTT reads (sptt.comm_precision sets the flat baseline's too)
_SPTT_ONLY = ("hosts_per_tower", "local_world_size", "sharding_type", "peer_permute")


def _unread_by_flat(cfg: Config, world_size: int) -> list[str]:
    sp = cfg.sptt
    if sp.enabled:
        return []
    out = []
    if given := _set("sptt", sp, _SPTT_ONLY):
        out.append(
            f"{_listed(given)}, but sptt.enabled=false (flat TorchRec sharding) reads none of "
            f"sptt.{', sptt.'.join(_SPTT_ONLY)}: sptt=on trains with them"
        )
    if world_size == 1 and sp.comm_precision != "fp32":
        out.append(
            f"sptt.comm_precision={sp.comm_precision} has no effect on a flat run "
            "(sptt.enabled=false) in a world of one: TorchRec's collectives of one rank send "
            f"nothing, so no pooled embedding is rounded to {sp.comm_precision} (sptt=on "
            "rounds in its collectives at any world size)"
        )
    return out


def _unread_dcn_sizes(m: ModelConfig) -> list[str]:
    """``model.dcn_*`` size what conf/model/dcn.yaml and conf/tower/dcn.yaml build."""
    readers = (CrossInteractionConfig._target_, DCNTowerConfig._target_)
    if _target(m.interaction) in readers or _target(m.tower) in readers:
        return []
    given = _set("model", m, ("dcn_num_layers", "dcn_low_rank"))
    if not given:
        return []
    return [
        f"{_listed(given)}, but this model has no CrossNet (interaction "
        f"{_target(m.interaction)}, tower module {_target(m.tower)}): model.dcn_num_layers and "
        "model.dcn_low_rank size the DCN interaction (model=dcn) and DCN tower modules (tower=dcn)"
    ]


#: the sharding settings only CUDA reads (on CPU every table lives in host memory: ddr_gb)
_CUDA_ONLY = ("hbm_gb", "uvm_cache_load_factor")


def _unread_on_cpu(s: ShardingConfig, device: str) -> list[str]:
    given = _set("sharding", s, _CUDA_ONLY) if device == "cpu" else []
    if not given:
        return []
    return [
        f"{_listed(given)}, but this run trains on CPU, which has no HBM and caches no table, "
        f"and reads none of sharding.{', sharding.'.join(_CUDA_ONLY)}: every table lives in "
        "host memory, within sharding.ddr_gb (a CUDA run budgets its HBM with them)"
    ]


#: the data.synthetic settings only its planted mode reads
_PLANTED_ONLY = ("tie_prob", "signal_scale", "dense_scale")


def _unread_data(d: DataConfig) -> list[str]:
    out = []
    synthetic = _set(
        "data.synthetic", d.synthetic, [f.name for f in dataclasses.fields(d.synthetic)]
    )
    if d.kind == "criteo" and synthetic:
        out.append(
            f"{_listed(synthetic)}, but data.kind='criteo' reads none of data.synthetic (the "
            "synthetic generator's settings)"
        )
    if d.kind == "synthetic" and d.criteo is not None:
        out.append(
            f"data.criteo is set (data.criteo.preprocessed_dir={d.criteo.preprocessed_dir!r}), "
            "but data.kind='synthetic' trains on generated data and reads none of data.criteo: "
            "data.kind=criteo trains on it"
        )
    card = _set("data.synthetic", d.synthetic, ["cardinality"])
    if d.kind == "synthetic" and d.synthetic.cardinalities is not None and card:
        out.append(
            f"{_listed(card)}, but data.synthetic.cardinalities gives every table's rows "
            f"({len(d.synthetic.cardinalities)} entries) and overrides it: "
            "data.synthetic.cardinalities=null gives every table data.synthetic.cardinality rows"
        )
    planted = _set("data.synthetic", d.synthetic, _PLANTED_ONLY)
    if d.kind == "synthetic" and d.synthetic.mode == "random" and planted:
        out.append(
            f"{_listed(planted)}, but data.synthetic.mode='random' reads none of "
            f"data.synthetic.{', data.synthetic.'.join(_PLANTED_ONLY)} (ids and labels are drawn "
            "independently, without a planted signal): data.synthetic.mode=planted plants one"
        )
    c = d.criteo
    if d.kind == "criteo" and c is not None and c.shuffle_window_rows is not None and not d.shuffle:
        out.append(
            f"data.criteo.shuffle_window_rows={c.shuffle_window_rows} has no effect with "
            "data.shuffle=false: the training rows are read in their order"
        )
    return out


# on import: every reader of a run's .hydra/config.yaml (dmt-eval, dmt-partition) resolves it
if not OmegaConf.has_resolver(WANDB_MODE_RESOLVER):
    OmegaConf.register_new_resolver(WANDB_MODE_RESOLVER, wandb_mode_from_env)
