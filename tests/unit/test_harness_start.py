"""The distributed test harness starts ranks in a way CUDA allows (a bug seen on an H100: ranks
forked from the preloaded forkserver failed with "Cannot re-initialize CUDA in forked
subprocess")."""

from __future__ import annotations

import logging
import os
import socket

import pytest

from tests.conftest import VISIBLE_AT_START, ephemeral_ports, free_port
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


@pytest.mark.parametrize("worker", ["gw0", "gw1", "gw9"])
def test_a_rendezvous_port_is_never_one_the_kernel_draws(
    worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a port found by binding 0 and closing may be drawn again at once for a listener (gloo's)
    # in a test on the other xdist worker, which this test's store client would then talk to
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    ports = {free_port() for _ in range(20)}
    assert all(p not in ephemeral_ports() for p in ports), ports
    assert len(ports) > 1, ports  # drawn at random within the slice, not always the first
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))  # free


def test_each_xdist_worker_has_its_own_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        drawn[worker] = {free_port() for _ in range(50)}
    assert max(drawn["gw0"]) < min(drawn["gw1"]), drawn


# a console script's main() run in the test process (dmt-preprocess: basicConfig(force=True))
# left the root logger writing into that test's closed capture stream, for every later test of
# the xdist worker: these two run in this order, the second after the first's teardown


def test_a_cli_that_configures_logging(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    from dmt.data.preprocess_cli import main  # noqa: PLC0415

    assert main([str(tmp_path / "absent.tsv"), str(tmp_path / "out")]) == 1
    assert "absent.tsv" in capsys.readouterr().err


def test_a_later_test_logs_into_its_own_capture(capsys: pytest.CaptureFixture[str]) -> None:
    logging.getLogger("dmt.probe").warning("this test's own record")
    assert "Logging error" not in capsys.readouterr().err


@pytest.mark.parametrize("widened", [range(1024, 65000), range(21000, 61000)])
def test_a_widened_ephemeral_range_leaves_the_ports_above_it(
    widened: range, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a reproduced bug: a range starting below about 21,600 made free_port's slice empty
    # ("Sample larger than population or is negative")
    monkeypatch.setattr("tests.conftest.ephemeral_ports", lambda: widened)
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        assert all(widened.stop <= free_port() < 65536 for _ in range(10))
