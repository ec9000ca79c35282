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
assert ctypes.CDLL(None).prctl(41, 1, 0, 0, 0) == 0  # PR_SET_THP_DISABLE: 4 KiB faults
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


def _faults_after(setup: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in host_malloc.USER_SETTINGS}
    res = subprocess.run(
        [sys.executable, "-c", STEPS.format(setup=setup)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return int(json.loads(res.stdout.strip().splitlines()[-1]))


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_glibc_defaults_fault_every_step_and_reuse_does_not():
    # about a tensor's pages per step under the defaults (6,680-7,514 over 8 steps measured)
    assert _faults_after("") >= 4 * PAGES  # the problem, reproduced
    setup = "from dmt.host_malloc import reuse_host_memory\nassert reuse_host_memory()"
    assert _faults_after(setup) < 0.05 * PAGES  # none: a stray page at most


def test_the_users_own_malloc_settings_are_left_alone(caplog):
    env = {
        "MALLOC_ARENA_MAX": "2",
        "GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512:glibc.malloc.hugetlb=1",
        "PATH": "/usr/bin",
    }
    assert host_malloc.user_settings(env) == [
        "MALLOC_ARENA_MAX=2",
        "GLIBC_TUNABLES=glibc.malloc.hugetlb=1",
    ]
    assert host_malloc.user_settings({"GLIBC_TUNABLES": "glibc.rtld.nns=2", "HOME": "/"}) == []
    was = host_malloc.applied()
    with caplog.at_level(logging.INFO, logger="dmt.host_malloc"):
        assert host_malloc.reuse_host_memory(env) is False
    assert host_malloc.applied() is was
    assert caplog.messages == [
        "host memory: malloc as the environment sets it (MALLOC_ARENA_MAX=2, "
        "GLIBC_TUNABLES=glibc.malloc.hugetlb=1)"
    ]


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_an_environment_setting_keeps_glibcs_own_behaviour():
    """With MALLOC_ARENA_MAX set by the user, reuse_host_memory changes nothing: the steps
    fault as under glibc's defaults."""
    setup = (
        "import os\nos.environ['MALLOC_ARENA_MAX'] = '8'\n"
        "from dmt.host_malloc import reuse_host_memory\nassert not reuse_host_memory()"
    )
    assert _faults_after(setup) >= 4 * PAGES


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
    monkeypatch.setattr(host_malloc, "reuse_host_memory", lambda: calls.append(None))
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
