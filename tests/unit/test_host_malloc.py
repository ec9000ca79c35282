"""Freed host memory kept for the next step (:mod:`dmt.host_malloc`): on glibc, a step whose live
temporaries add up to more than twice its largest one page-faults them back every step under
glibc's defaults, and not after :func:`~dmt.host_malloc.reuse_host_memory`; ``dmt-train`` applies
it unless ``trainer.reuse_host_memory=false``. Each case runs in its own process: the setting is
the process's, and glibc's adapted thresholds depend on what the process allocated before."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"), reason="glibc's malloc only"
)

# six live tensors of about 3.4 MB (the size of DLRM's interaction input at batch 512), freed
# together: glibc's adapted trim threshold is about twice the largest chunk freed, so the 20 MB
# at the heap's top go back to the system at the end of each step; the page faults of steps 8-15
STEPS = """
import json, resource, sys, torch
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


def _faults_after(setup: str) -> int:
    script = setup + "\n" + STEPS
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return int(json.loads(res.stdout.strip().splitlines()[-1]))


PAGES_PER_STEP = 3.4e6 / 4096  # one tensor's pages


def test_glibc_defaults_fault_every_step_and_reuse_does_not():
    # a tensor's pages in about every step under the defaults (6,680-7,514 measured), none after
    assert _faults_after("") >= 4 * PAGES_PER_STEP  # the problem, reproduced
    setup = "from dmt.host_malloc import reuse_host_memory\nassert reuse_host_memory()"
    assert _faults_after(setup) < 0.05 * PAGES_PER_STEP  # none: a stray page at most


TRAIN = """
import sys
from dmt.train import train
from tests.conftest import compose_config
train(compose_config("logger=disabled", "trainer.progress_bar=false", "trainer=smoke",
                     "data.synthetic.num_train=1024", "data.synthetic.num_val=256",
                     "data.synthetic.num_test=256", "data.batch_size=256",
                     "trainer.reuse_host_memory=" + sys.argv[1]), sys.argv[2])
"""


@pytest.mark.parametrize("reuse", [True, False])
def test_train_applies_trainer_reuse_host_memory(tmp_path, reuse):
    setup = f"import sys\nsys.argv = ['train', {str(reuse).lower()!r}, {str(tmp_path)!r}]\n" + TRAIN
    faults = _faults_after(setup)
    if reuse:
        assert faults < 0.05 * PAGES_PER_STEP
    else:
        assert faults >= 4 * PAGES_PER_STEP
