"""The distributed test harness starts ranks in a way CUDA allows (a bug seen on an H100: ranks
forked from the preloaded forkserver failed with "Cannot re-initialize CUDA in forked
subprocess")."""

from __future__ import annotations

import os

from tests.conftest import VISIBLE_AT_START
from tests.distributed.distributed_harness import start_method_for


def test_nccl_ranks_are_spawned() -> None:
    assert start_method_for("nccl", cuda_available=True) == "spawn"


def test_gloo_ranks_fork_from_the_server_only_without_a_gpu() -> None:
    assert start_method_for("gloo", cuda_available=False) == "forkserver"
    assert start_method_for("gloo", cuda_available=True) == "spawn"


def test_a_cpu_test_hides_the_gpus_from_what_it_starts() -> None:
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_a_cuda_test_sees_them() -> None:
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == VISIBLE_AT_START
