"""scripts/gpu_acceptance.sh's test steps select GPU tests, and only those (``slow``).

Each ``pytest_step`` of the script fails when none of its tests ran; on this CPU machine every
selection must collect tests and skip them all: a selection that collects nothing would fail
every GPU run, and one that also picks a CPU test passes there even when its GPU tests all skip
(``-k cuda`` once picked ``test_the_cuda_tests_sptt_plan_on_cpu`` beside the UVM tests).
With GPUs, only that every selection collects tests is checked (running them is the script's).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def _steps() -> list[tuple[str, list[str]]]:
    text = (REPO / "scripts" / "gpu_acceptance.sh").read_text().replace("\\\n", " ")
    steps = []
    for line in text.splitlines():
        m = re.match(r"\s*pytest_step\s+(\w+)\s+(.*)", line)
        if m and m.group(1) != "NAME":
            steps.append((m.group(1), shlex.split(m.group(2), comments=True)))
    return steps


def test_the_script_has_its_test_steps() -> None:
    names = [name for name, _ in _steps()]
    assert len(names) == len(set(names)) >= 15 and "uvm_caching" in names


@pytest.mark.parametrize(("name", "args"), _steps(), ids=[name for name, _ in _steps()])
def test_each_step_selects_gpu_tests_only(name: str, args: list[str]) -> None:
    gpus = torch.cuda.is_available()
    mode = ["--collect-only"] if gpus else ["-rs"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *mode, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = done.stdout.strip().splitlines()[-1]
    if gpus:
        assert re.search(r"\b[1-9]\d* tests? collected\b", last), (name, done.stdout[-2000:])
        return
    # nothing ran on the CPU: every selected test needs a GPU (warnings and times may follow)
    counts = dict((kind, int(n)) for n, kind in re.findall(r"(\d+) (\w+)", last.split(" in ")[0]))
    assert counts.get("skipped", 0) >= 1, (name, last)
    assert not set(counts) - {"skipped", "deselected", "warning", "warnings"}, (name, last)
