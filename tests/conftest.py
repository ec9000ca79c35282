"""Shared test helpers: Hydra composition and the optional ../shared data."""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

__all__ = ["compose_config", "free_port", "torchrun", "typed_config"]
from dmt.train import compose_config, to_config

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# CUDA counts the devices once per process, reading CUDA_VISIBLE_DEVICES then: count them here,
# before a test hides them (below), so that this process keeps seeing every GPU (on an H100 the
# first count fell inside a CPU test and the CUDA tests after it saw none)
torch.cuda.is_available()
#: ``CUDA_VISIBLE_DEVICES`` as the suite found it (``None``: unset)
VISIBLE_AT_START = os.environ.get("CUDA_VISIBLE_DEVICES")


def default_sigint() -> None:
    """``preexec_fn`` of a script that a test stops with SIGINT: SIGINT at its default action, as
    a terminal's job starts. A test run in the background (``nohup``, ``cmd &``) inherits SIGINT
    ignored, and a shell cannot trap a signal ignored on entry (POSIX), so the script's Ctrl-C
    handling never ran and the test failed (reproduced: ``.ci/run`` started with ``&``, where
    Python keeps SIGINT ignored unless some module set a handler of its own before)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def typed_config(*overrides: str):
    return to_config(compose_config(*overrides))


def torchrun(*args: str, nproc: int = 2) -> tuple[list[str], dict[str, str]]:
    """The command and environment of ``torchrun --standalone --nproc-per-node=<nproc> <args>``:
    one thread per rank, this checkout importable, and no rank variables inherited from the
    caller (torchrun sets its own)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*run, f"--nproc-per-node={nproc}", *args], env


def ephemeral_ports() -> range:
    """The kernel's ephemeral port range: the ports that ``bind(0)`` and ``connect`` draw."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        low, high = "32768", "60999"  # Linux's default
    return range(int(low), int(high) + 1)


def two_rank_env(launcher: str, rank: int, port: int) -> dict[str, str]:
    """This process's environment for ``rank`` of a world of 2 on one host at ``MASTER_PORT``
    ``port``, set as a task of an ``srun`` step sets it (``launcher="srun"``) or with torchrun's
    variables by hand (``"env"``): the launchers' own variables of this process left out."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
    }
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), MASTER_PORT=str(port))
    if launcher == "srun":
        env.update(
            SLURM_JOB_ID="7", SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_NTASKS="2",
            SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_TASKS_PER_NODE="2",
            SLURM_JOB_NODELIST="localhost", MASTER_ADDR="127.0.0.1",
        )  # fmt: skip
    else:
        env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        env.update(LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    return env


def free_port() -> int:
    """A free loopback port for a rendezvous (``MASTER_PORT``, ``--rdzv-endpoint``) that a test
    hands to processes it starts, taken outside the ephemeral range (below it, or above a range
    widened down to near 20000) and from this xdist worker's own slice. A port found by binding 0 and closing (the usual recipe) is an ephemeral
    one that the kernel may draw again at once for another process's listener, such as gloo's
    in a test on the other worker, whose ranks then meet this test's store client."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    ephemeral = ephemeral_ports()
    low, high = 20000, min(ephemeral.start, 32768)
    if high - low < 8 * 200:  # a widened ephemeral range: the ports above it
        low, high = ephemeral.stop, 65536
    width = (high - low) // 8
    if width < 1:
        raise RuntimeError(f"no ports outside the ephemeral range {ephemeral} for tests")
    start = low + (int(worker) % 8 if worker.isdigit() else 0) * width
    for port in random.sample(range(start, start + width), min(200, width)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}..{start + width - 1} on 127.0.0.1")


@pytest.fixture(autouse=True)
def root_logger_as_before() -> Iterator[None]:
    """A console script's ``main()`` run in the test process configures the root logger
    (``dmt-preprocess``: ``basicConfig(force=True)``): undone after the test, or every later
    test of this xdist worker logs at INFO into that test's closed capture stream ("Logging
    error ... I/O operation on closed file" in their stderr)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(autouse=True)
def cpu_unless_the_test_is_for_gpus(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine with GPUs, a test of the CPU/gloo path keeps what it starts on the CPU: the
    processes it starts (``dmt-train``, torchrun, spawned ranks) see no GPU, so
    ``trainer.device=auto`` means CPU there and several ranks do not all pick the one GPU (on an
    H100 they did: NCCL on a shared device, and CUDA in forked ranks). Tests of the GPU path
    (``cuda`` in the test's name, or the ``nccl`` backend parameter) see every GPU."""
    callspec = getattr(request.node, "callspec", None)
    nccl = callspec is not None and callspec.params.get("backend") == "nccl"
    if "cuda" not in request.node.originalname and not nccl:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (Criteo samples are not distributed with dmt)")
    return SHARED_DATA


@pytest.fixture
def one_thread():
    """Tiny models: intra-op threads only contend with each other (and with other jobs)."""
    import torch  # noqa: PLC0415

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def load_script(path: Path) -> Any:
    """A script (``scripts/*.py``, ``benchmarks/*.py``) imported as a module, for its ``main``."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
