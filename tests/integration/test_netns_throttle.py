"""``scripts/netns_throttle.sh`` leaves nothing behind: no namespace and no process, whether its
commands end or it is stopped (a reproduced bug: a benchmark's spawned ranks outlived a SIGTERM
of the script, in a namespace left without a name). Needs root and iproute2 (``-m cluster``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import REPO, default_sigint

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(os.geteuid() != 0, reason="creates network namespaces (root)"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip and tc"),
]
SCRIPT = REPO / "scripts" / "netns_throttle.sh"


def _namespaces(tag: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith(tag)]


def _alive(marker: str) -> list[str]:
    """The processes whose whole command line is ``marker``."""
    out = subprocess.run(["pgrep", "-f", f"^{marker}$"], capture_output=True, text=True)
    return out.stdout.split()


@contextmanager
def _started(tmp_path: Path, *command: str) -> Iterator[subprocess.Popen[str]]:
    """The script on 2 hosts running ``command``; stopped (and so cleaned up) if the test
    fails before it ends."""
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--hosts", "2", "--", *command],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(REPO)},
        preexec_fn=default_sigint,  # a test stops it with SIGINT
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)


HOSTS_MEET = """
import os, socket, sys
rank = int(os.environ["DMT_NODE_RANK"])
if rank == 0:  # listens on its link's address; host 1 sends its rank and variables
    server = socket.create_server(("10.213.0.1", 29600))
    conn, (addr, _) = server.accept()
    got = conn.makefile().read()
    open(os.path.join(os.environ["OUT"], "heard"), "w").write(f"{addr} {got}")
    sys.exit(3)
for _ in range(100):
    try:
        s = socket.create_connection(("10.213.0.1", 29600), timeout=1)
        break
    except OSError:
        import time; time.sleep(0.1)
s.sendall(f"{os.environ['DMT_NNODES']} {os.environ['GLOO_SOCKET_IFNAME']}".encode())
s.close()
"""


def test_hosts_reach_each_other_and_the_exit_status_is_the_commands(tmp_path: Path) -> None:
    # host 1 connects to host 0 across the bridge; host 0 exits 3: the script's status is 3
    with _started(tmp_path, sys.executable, "-c", HOSTS_MEET) as proc:
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out
    assert (tmp_path / "heard").read_text() == "10.213.0.2 2 eth1"
    assert not _namespaces(f"dmt{proc.pid}")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_run_leaves_no_namespace_and_no_process(
    tmp_path: Path, stop: signal.Signals
) -> None:
    marker = f"{100000 + uuid.uuid4().int % 100000}.5"  # a sleep no one else runs
    # a grandchild its parent does not wait for, as a benchmark's spawned ranks
    command = f'(sleep {marker} &); touch "$OUT/started_$DMT_NODE_RANK"; sleep {marker}'
    with _started(tmp_path, "bash", "-c", command) as proc:
        tag = f"dmt{proc.pid}"
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"started_{h}").exists() for h in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert sorted(_namespaces(tag)) == [f"{tag}h0", f"{tag}h1", f"{tag}sw"]
        assert len(_alive(f"sleep {marker}")) == 4
        proc.send_signal(stop)
        out, _ = proc.communicate(timeout=60)
    # ended by the signal itself (after its clean-up): a calling script stops too, where an
    # exit status of 128 + signal read as a failed command and its loop went on
    assert proc.returncode == -stop, out
    assert not _namespaces(tag)
    assert not _alive(f"sleep {marker}")
    assert not list(Path("/tmp").glob(f"{tag}.*"))  # its rendezvous directory


def test_ctrl_c_stops_a_calibration_study_not_only_its_cell(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) during the first cell of
    ``scripts/calibration_runs.sh``: the study stops there. Before, the throttle script ended
    with a plain exit status of 130, which the study took for a failed cell, and it went on to
    build the next cell's namespaces and benchmark."""
    out = tmp_path / "cells"
    proc = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "calibration_runs.sh"), "--out", str(out), "--cells",
         "4:1gbit:256 4:1gbit:512", "--runs", "3", "--iters", "50", "--warmup", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job
        preexec_fn=default_sigint,  # and SIGINT at its default, as there
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _namespaces("dmt"):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(2)  # the benchmark's ranks are up
        os.killpg(proc.pid, signal.SIGINT)
        log, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0, log
    assert "G4_1gbit_B256" in log and "G4_1gbit_B512" not in log, log  # no second cell
    assert not list(out.glob("*.json")), log
    assert not _namespaces("dmt")
