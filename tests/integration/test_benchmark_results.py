"""A benchmark refuses an earlier run's --json file when it starts, before any work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("bench", ["bench_sptt", "bench_torchrec_dlrm", "bench_checkpoint"])
def test_a_benchmark_refuses_an_earlier_runs_results_before_it_runs(tmp_path, bench):
    earlier = tmp_path / "earlier.json"
    earlier.write_text('{"earlier": true}\n')
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{bench}.py"), "--json", str(earlier)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(
        f"{bench}.py: error: --json {earlier} exists already (an earlier run's results); choose "
        "another file, or pass --overwrite to replace it"
    )
    assert earlier.read_text() == '{"earlier": true}\n'
