"""Freed host memory kept for the next step (:mod:`dmt.host_malloc`).

On glibc, steps whose live temporaries outgrow glibc's adapted thresholds page-fault memory back
every step under glibc's defaults, and not after :func:`~dmt.host_malloc.reuse_host_memory`. The
fault counts run in processes of their own (the setting is the process's, and glibc's adapted
thresholds depend on what the process allocated before), with transparent huge pages off for
them (``prctl``), so that a fault is one 4 KiB page whatever the machine's THP mode, and without
the user's malloc variables. ``dmt-train`` applies it unless ``trainer.reuse_host_memory=false``,
and leaves malloc alone where the environment sets it."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import subprocess
import sys

import pytest

from dmt import host_malloc
from dmt.train import train
from tests.conftest import REPO, compose_config

GLIBC = hasattr(ctypes.CDLL(None), "gnu_get_libc_version")

# six live tensors of about 3.4 MB (the size of DLRM's interaction input at batch 512), freed
# together, as a step's temporaries are; the minor page faults of steps 8-15
STEPS = """
import ctypes, json, resource, sys, torch
if ctypes.CDLL(None).prctl(41, 1, 0, 0, 0) != 0:  # PR_SET_THP_DISABLE: 4 KiB faults
    print(json.dumps("no prctl"))
    sys.exit(0)
{setup}
def step():
    live = [torch.ones(850_000 + k * 1000) for k in range(6)]
    del live
faults = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(sum(faults[8:])))
"""
PAGES = 3.4e6 / 4096  # one tensor's pages


def _faults_after(setup: str, **env_vars: str) -> int:
    drop = (*host_malloc.USER_SETTINGS, "GLIBC_TUNABLES", "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if k not in drop} | env_vars
    res = subprocess.run(
        [sys.executable, "-c", STEPS.format(setup=setup)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    faults = json.loads(res.stdout.strip().splitlines()[-1])
    if faults == "no prctl":
        pytest.skip("transparent huge pages cannot be turned off here (prctl refused)")
    return int(faults)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_glibc_defaults_fault_every_step_and_reuse_does_not():
    # about a tensor's pages per step under the defaults (6,680-7,514 over 8 steps measured;
    # glibc's adaptation depends on the process's history: over steps 16-39 CI once saw none)
    assert _faults_after("") >= 4 * PAGES  # the problem, reproduced
    setup = "from dmt.host_malloc import reuse_host_memory\nassert reuse_host_memory()"
    # none, or one late growth of the heap: one tensor's pages once (in 2 of 12 processes
    # under load, at step 9; CI once counted it), never again
    assert _faults_after(setup) < 2 * PAGES


def test_the_users_own_thresholds_are_left_alone(caplog):
    env = {
        "MALLOC_TRIM_THRESHOLD_": "1000000",
        "MALLOC_ARENA_MAX": "2",  # not a threshold: dmt's setting still applies beside it
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=65536",
        "PATH": "/usr/bin",
    }
    assert host_malloc.user_settings(env) == [
        "MALLOC_TRIM_THRESHOLD_=1000000",
        "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536",
    ]
    assert host_malloc.user_settings({"MALLOC_ARENA_MAX": "2", "GLIBC_TUNABLES": "a.b=1"}) == []
    was = host_malloc.applied()
    with caplog.at_level(logging.INFO, logger="dmt.host_malloc"):
        assert host_malloc.reuse_host_memory(env) is False
    assert host_malloc.applied() is was
    assert caplog.messages == [
        "host memory: malloc's thresholds as the environment sets them "
        "(MALLOC_TRIM_THRESHOLD_=1000000, GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536)"
    ]


def test_startup_environment_is_the_one_glibc_read(monkeypatch):
    monkeypatch.setenv("MALLOC_TOP_PAD_", "4096")  # set after start: glibc never saw it
    started = host_malloc.startup_environ()
    assert "MALLOC_TOP_PAD_" not in started and started.get("PATH") == os.environ["PATH"]


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_a_threshold_tunable_after_another_tunable_is_left_alone():
    """glibc (before 2.39) ends each tunable it takes from GLIBC_TUNABLES with a NUL in the
    process's own environment block, so /proc/self/environ read ``arena_max=2`` alone: the
    trim threshold that glibc set from the second entry was overridden."""
    tunables = "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=1000000"
    script = (
        "from dmt.host_malloc import reuse_host_memory, startup_environ, user_settings\n"
        "print(user_settings(startup_environ()), reuse_host_memory())"
    )
    drop = (*host_malloc.USER_SETTINGS, "GLIBC_TUNABLES", "LD_PRELOAD")
    res = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k not in drop} | {"GLIBC_TUNABLES": tunables},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "['GLIBC_TUNABLES=glibc.malloc.trim_threshold=1000000'] False"


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_an_environment_threshold_keeps_glibcs_own_behaviour():
    """With MALLOC_TOP_PAD_ in the environment the process starts with, reuse_host_memory
    changes nothing: the steps fault as glibc makes them (more: that variable alone stops its
    adaptation)."""
    setup = "from dmt.host_malloc import reuse_host_memory\nassert not reuse_host_memory()"
    assert _faults_after(setup, MALLOC_TOP_PAD_="131072") >= 4 * PAGES


def test_no_glibc_malloc_or_a_refused_threshold_changes_nothing(monkeypatch):
    monkeypatch.setattr(host_malloc, "_applied", False)
    monkeypatch.setattr(host_malloc, "_glibc_mallopt", lambda: None)  # e.g. jemalloc preloaded
    assert host_malloc.reuse_host_memory({}) is False and not host_malloc.applied()
    calls: list[tuple[int, int]] = []

    def refusing(param: int, value: int) -> int:
        calls.append((param, value))
        return 0

    monkeypatch.setattr(host_malloc, "_glibc_mallopt", lambda: refusing)
    assert host_malloc.reuse_host_memory({}) is False and not host_malloc.applied()
    # the mmap threshold first, and nothing after its refusal: the trim threshold alone would
    # stop glibc's adaptation with the mmap threshold left at 128 KiB
    assert calls == [(host_malloc.M_MMAP_THRESHOLD, host_malloc.MMAP_THRESHOLD)]


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_glibc_serves_this_processs_malloc():
    """The check that glibc's allocator serves ``malloc`` (its counters see the block) holds
    in a plain process."""
    assert host_malloc._glibc_mallopt() is not None


PRELOADS = [
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",  # Debian: libjemalloc2
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",  # libtcmalloc-minimal4
]


@pytest.mark.parametrize("library", PRELOADS, ids=["jemalloc", "tcmalloc"])
def test_a_preloaded_allocator_is_left_alone(library):
    """Under LD_PRELOAD the process's malloc is that allocator's (tcmalloc's mallopt even
    answers 1): glibc's counters do not see its blocks, so dmt changes nothing. Runs where
    the Debian packages are installed (checked so by hand on 2026-12-06)."""
    if not os.path.exists(library):
        pytest.skip(f"{library} is not installed")
    script = "from dmt.host_malloc import reuse_host_memory\nprint(reuse_host_memory())"
    res = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "LD_PRELOAD": library},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "False"


TINY = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "trainer=smoke",
    "data.synthetic.num_train=1024",
    "data.synthetic.num_val=256",
    "data.synthetic.num_test=256",
    "data.batch_size=256",
]


@pytest.mark.parametrize(("reuse", "earlier"), [(True, False), (False, False), (False, True)])
def test_train_applies_trainer_reuse_host_memory(tmp_path, monkeypatch, caplog, reuse, earlier):
    """``train`` calls it with the setting on (this process's malloc is left as it is: the
    call is recorded); off, it warns when an earlier run of the process applied it, which
    lasts (a multirun's jobs share their process)."""
    calls: list[None] = []
    monkeypatch.setattr(host_malloc, "reuse_host_memory", lambda **_: calls.append(None))
    monkeypatch.setattr(host_malloc, "applied", lambda: earlier)
    with caplog.at_level(logging.WARNING, logger="dmt.train"):
        train(compose_config(*TINY, f"trainer.reuse_host_memory={reuse}"), tmp_path)
    assert len(calls) == int(reuse)
    lasting = [m for m in caplog.messages if "trainer.reuse_host_memory=false" in m]
    assert lasting == (
        [
            "trainer.reuse_host_memory=false, but an earlier run in this process kept freed "
            "host memory for reuse, which lasts as long as the process: this run does too"
        ]
        if earlier
        else []
    )
