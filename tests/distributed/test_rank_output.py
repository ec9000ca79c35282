"""What a multi-rank run says, as a cluster job's log gathers every rank's: no warning that dmt's
own calls cause and the user cannot act on, and rank 0's record of where each checkpoint went."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch

from dmt.runtime import Runtime
from dmt.train import to_config
from dmt.trainer import Trainer
from tests.conftest import compose_config
from tests.distributed.distributed_harness import run_on_ranks

# real 2-rank trainings, flat and SPTT, with a resume (25 s in all): the slow tier
pytestmark = pytest.mark.slow

TINY = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=2048",
    "data.synthetic.num_val=512",
    "data.synthetic.num_test=512",
    "data.batch_size=256",
    "trainer.max_steps=4",
    "trainer.log_every=2",
    "trainer.eval_every=2",
    "trainer.checkpoint_every=2",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
]
SPTT = [
    "experiment=dmt_4t_dlrm",
    "model.partition.num_towers=2",
    "sptt=on",
    "sptt.local_world_size=1",
]


class _Messages(logging.Handler):
    """The messages ``dmt``'s loggers emit at INFO and above (``caplog`` sees no other process)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _train_and_resume_worker(
    rank: int, world_size: int, out: str, extra: list[str]
) -> tuple[list[str], list[str]]:
    """Train with checkpoints, then resume from the first in a second run: every warning either
    raised (``warnings``, as Python prints them to stderr), and dmt's log messages."""
    rt = Runtime(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")
    logger = logging.getLogger("dmt")
    level = logger.level
    said = _Messages()
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Trainer(to_config(compose_config(*TINY, *extra)), rt, Path(out)).fit()
            resume = f"trainer.resume_from={out}/checkpoints/step_2"  # into a run of its own
            Trainer(to_config(compose_config(*TINY, *extra, resume)), rt, Path(out) / "on").fit()
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    return [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught], (
        said.messages
    )


@pytest.fixture(scope="module", params=["flat", "sptt"])
def two_ranks(request, tmp_path_factory) -> tuple[Path, list[tuple[list[str], list[str]]]]:
    """A flat or SPTT run on two ranks and its resume: the run directory, each rank's output."""
    out = tmp_path_factory.mktemp(request.param)
    extra = SPTT if request.param == "sptt" else []
    return out, run_on_ranks(_train_and_resume_worker, 2, str(out), extra, timeout_s=240)


def _warned(caught: list[str], text: str) -> list[str]:
    return [w for w in caught if text in w]


def test_no_rank_warns_of_the_ddp_argument_torchrec_passes(two_ranks) -> None:
    """Every rank of a flat run of 2+ ranks printed TorchRec's DDP wrapper's FutureWarning that
    ``broadcast_buffers`` is deprecated: an argument TorchRec passes, that no setting reaches."""
    for rank, (caught, _) in enumerate(two_ranks[1]):
        assert not _warned(caught, "`broadcast_buffers` is deprecated"), rank


def test_no_rank_warns_that_torchrecs_sharded_tables_are_deprecated(two_ranks) -> None:
    """Every rank printed at every resume ``Please use DTensor instead and we are deprecating
    ShardedTensor`` three times: once from dmt's own ``size()`` of a sharded table's state
    (dmt/checkpoint.py), twice from DCP reading TorchRec's tables (nothing a user can change)."""
    for rank, (caught, _) in enumerate(two_ranks[1]):
        assert not _warned(caught, "deprecating ShardedTensor"), (rank, caught)
    assert any("resumed from" in m for m in two_ranks[1][0][1])  # it did resume


def test_rank_0_says_where_each_checkpoint_went(two_ranks) -> None:
    """Checkpoints were written without a word: the log never said where (or that) one was."""
    out, results = two_ranks
    said = results[0][1]
    for step in (2, 4):  # the run's, then the resumed run's of step 4 in a run directory of its own
        assert (
            said.count(f"checkpoint of step {step} written to {out / 'checkpoints'}/step_{step}")
            == 1
        ), said
    assert said.count(f"checkpoint of step 4 written to {out / 'on' / 'checkpoints'}/step_4") == 1
    assert not [m for m in results[1][1] if m.startswith("checkpoint of step")]  # rank 0's
