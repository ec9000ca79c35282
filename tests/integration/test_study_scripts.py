"""The study and launcher scripts' own logic: where a relative path the caller gives lands, bad
settings refused with a one-line message before anything runs or is made, a rerun that goes on.
Each script runs from a copy of it in a stand-in checkout (``the repo``, with a space) whose
``.venv/bin`` tools only record how they were called; SLURM's and iproute2's commands are
stand-ins on ``PATH``: nothing trains, no job is submitted and no namespace is made."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"

# every .venv tool of the stand-in checkout: records its name, arguments and directory in
# $CALLS (and makes the hydra.run.dir it is given); fails (status 1, output "boom") when its first argument is $FAIL; `python -c` (the
# scripts' own checks) runs for real
TOOL = f"""#!{sys.executable}
import json, os, sys
if sys.argv[1:2] == ["-c"]:
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
call = {{"tool": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "cwd": os.getcwd()}}
for arg in sys.argv[1:]:  # a training makes its run directory
    if arg.startswith("hydra.run.dir="):
        os.makedirs(arg.partition("=")[2], exist_ok=True)
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps(call) + "\\n")
if sys.argv[1:2] == [os.environ.get("FAIL")]:
    print("boom")
    sys.exit(1)
"""


def _checkout(tmp_path: Path, *scripts: str) -> Path:
    """A stand-in checkout holding copies of ``scripts`` and recording tools."""
    root = tmp_path / "the repo"
    (root / "scripts").mkdir(parents=True)
    for name in scripts:
        shutil.copy(SCRIPTS / name, root / "scripts" / name)
    (root / "scripts" / "setup.sh").write_text("exit 0\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    for tool in ("python", "dmt-train", "dmt-partition", "dmt-eval"):
        (root / ".venv" / "bin" / tool).write_text(TOOL)
        (root / ".venv" / "bin" / tool).chmod(0o755)
    return root


def _run(
    tmp_path: Path, script: Path, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """``bash script args`` in ``cwd``; its result and the tools' calls."""
    calls = tmp_path / "calls.jsonl"
    cwd.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["bash", str(script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "CALLS": str(calls), "PYTHONPATH": str(REPO), **(env or {})},
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return result, [json.loads(line) for line in lines]


def _value(argv: list[str], option: str) -> str:
    return argv[argv.index(option) + 1]


def test_scale_study_takes_a_relative_out_from_the_callers_directory(tmp_path: Path) -> None:
    """Reproduced: the script ran the study with its default --out and the caller's relative
    one, which then named a directory in the repository."""
    root = _checkout(tmp_path, "scale_study.sh")
    caller = tmp_path / "call dir"
    script = root / "scripts" / "scale_study.sh"
    for given in (["--out", "my study"], ["--out=my study"]):
        result, calls = _run(tmp_path, script, *given, "--presets", "h100", cwd=caller)
        assert result.returncode == 0, result.stderr
        assert calls[-1]["argv"] == [
            "benchmarks/scale_study.py", "--out", f"{caller}/my study", "--presets", "h100"
        ]  # fmt: skip
        assert calls[-1]["cwd"] == str(root)
    result, calls = _run(tmp_path, script, "--gpus", "64", cwd=caller)  # the default: in the repo
    argv = calls[-1]["argv"]
    assert _value(argv, "--out").startswith("outputs/scale_study/") and argv[-2:] == [
        "--gpus",
        "64",
    ]
    assert argv.count("--out") == 1


def test_scale_study_default_out_is_the_directory_the_readme_names(tmp_path: Path) -> None:
    """Reproduced: the README said the study went into outputs/scale_study/<date>/, but the
    script names the directory by date and time (outputs/scale_study/2026-12-06-213900)."""
    root = _checkout(tmp_path, "scale_study.sh")
    result, calls = _run(tmp_path, root / "scripts" / "scale_study.sh", cwd=tmp_path / "caller")
    assert result.returncode == 0, result.stderr
    out = _value(calls[-1]["argv"], "--out")
    assert re.fullmatch(r"outputs/scale_study/\d{4}-\d{2}-\d{2}-\d{6}", out), out
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "`bash scripts/scale_study.sh` predicts" in readme
    assert "into `outputs/scale_study/<date>-<time>/`" in readme


def _study_calls(calls: list[dict]) -> tuple[list[str], list[dict], list[dict]]:
    """The base training's arguments, the dmt-partition calls and the seeds.py calls."""
    (train,) = [c["argv"] for c in calls if c["argv"][:2] == ["-m", "dmt.train"]]
    partition = [c for c in calls if c["tool"] == "dmt-partition"]
    seeds = [c for c in calls if c["argv"][:1] == ["scripts/seeds.py"]]
    return train, partition, seeds


@pytest.mark.parametrize("script", ["criteo_sample_study.sh", "dmt_projection_study.sh"])
def test_study_takes_a_relative_out_dir_from_the_callers_directory(
    tmp_path: Path, script: str
) -> None:
    """Reproduced: ``criteo_sample_study.sh myout`` trained into <repo>/myout. The base training
    resumes its own interrupted run (reproduced: a rerun after an interrupted base training was
    refused by dmt-train, as a directory holding another run's history.jsonl)."""
    root = _checkout(tmp_path, script)
    caller = tmp_path / "caller"
    env = {"ONLY": "base tp4_d16"}  # (dmt_projection_study.sh: two configs)
    result, calls = _run(tmp_path, root / "scripts" / script, "myout", "2", cwd=caller, env=env)
    assert result.returncode == 0, result.stderr
    out = caller / "myout"
    train, partition, seeds = _study_calls(calls)
    assert f"hydra.run.dir={out}/base_ckpt" in train
    assert "trainer.resume_from=auto" in train and "trainer.checkpoint=true" in train
    assert partition and all(
        _value(c["argv"], "--checkpoint") == f"{out}/base_ckpt/checkpoints"
        and _value(c["argv"], "--out").startswith(f"{out}/tp")
        for c in partition
    )
    assert seeds and all(_value(c["argv"], "--out") == str(out) for c in seeds)
    assert all(_value(c["argv"], "--seeds") == "2" for c in seeds)
    assert any(
        f"model.partition.path={out}/tp4/partition.yaml" in a for c in seeds for a in c["argv"]
    )
    assert not (root / "myout").exists()


@pytest.mark.parametrize("script", ["criteo_sample_study.sh", "dmt_projection_study.sh"])
@pytest.mark.parametrize("seeds", ["0-", "0", "3-1", "a,b", "1", "5-5"])
def test_study_refuses_bad_seeds_before_training(tmp_path: Path, script: str, seeds: str) -> None:
    """Reproduced: ``criteo_sample_study.sh myout 0-`` trained the base model and ran
    dmt-partition three times before seeds.py refused ``--seeds 0-``; so did one seed (``1``,
    ``5-5``), which seeds.py refuses for a study that compares configs."""
    root = _checkout(tmp_path, script)
    result, calls = _run(tmp_path, root / "scripts" / script, "out", seeds, cwd=tmp_path / "c")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"{script}: SEEDS {seeds!r}: ")
    assert result.stderr.count("\n") == 1
    assert calls == []
    assert list((tmp_path / "c").iterdir()) == []


def test_projection_study_of_one_config_takes_one_seed(tmp_path: Path) -> None:
    """One seed is refused only where configs are compared: ``ONLY=base`` runs with it."""
    root = _checkout(tmp_path, "dmt_projection_study.sh")
    result, calls = _run(
        tmp_path,
        root / "scripts" / "dmt_projection_study.sh",
        "out",
        "1",
        cwd=tmp_path / "c",
        env={"ONLY": "base"},
    )
    assert result.returncode == 0, result.stderr
    _, _, seeds = _study_calls(calls)
    assert seeds and all(_value(c["argv"], "--seeds") == "1" for c in seeds)


def test_readme_runs_the_holdout_study_with_the_holdout_protocol() -> None:
    """Reproduced: the README gave ``bash scripts/criteo_sample_study.sh`` (5 seeds) as the study
    of its ``criteo_sample_holdout`` table; the script's defaults are the forward protocol and 9
    seeds, another study. The command before that table names the protocol and the seeds."""
    script = (SCRIPTS / "criteo_sample_study.sh").read_text()
    assert "PROTOCOL=${PROTOCOL:-forward}" in script and "SEEDS=${2:-9}" in script
    readme = (REPO / "README.md").read_text()
    before_table = readme[: readme.index("Measured on a 2-core CPU (`data=criteo_sample_holdout`")]
    paragraph = " ".join(before_table.rstrip().rsplit("\n\n", 1)[-1].split())
    commands = re.findall(r"`([^`]*scripts/criteo_sample_study\.sh[^`]*)`", paragraph)
    assert commands == [
        "PROTOCOL=holdout bash scripts/criteo_sample_study.sh study/criteo_holdout 5"
    ]


def test_study_refuses_an_out_dir_with_whitespace(tmp_path: Path) -> None:
    """The caller's directory is part of a relative OUT_DIR: one with a space is refused (the
    study's configs name paths in it), before anything runs."""
    root = _checkout(tmp_path, "criteo_sample_study.sh")
    caller = tmp_path / "a b"
    result, calls = _run(tmp_path, root / "scripts" / "criteo_sample_study.sh", "o", cwd=caller)
    assert result.returncode == 2
    assert result.stderr == (
        f"OUT_DIR '{caller}/o' has whitespace; the study's configs name paths in it: choose one "
        "without\n"
    )
    assert calls == []


def test_projection_study_shows_the_tail_of_both_training_logs(tmp_path: Path) -> None:
    """Reproduced: with both training processes failed, ``tail -5`` of the two logs failed
    itself (tail: option used in invalid context -- 5) instead of showing them."""
    root = _checkout(tmp_path, "dmt_projection_study.sh")
    caller = tmp_path / "caller"
    result, _ = _run(
        tmp_path,
        root / "scripts" / "dmt_projection_study.sh",
        "out",
        "2",
        cwd=caller,
        env={"ONLY": "base tp4_d16", "FAIL": "scripts/seeds.py"},
    )
    assert result.returncode == 1
    out = caller / "out"
    assert result.stderr == (
        f"training failed: see {out}/train_a.log and {out}/train_b.log\n"
        f"==> {out}/train_a.log <==\nboom\n\n==> {out}/train_b.log <==\nboom\n"
    )


# a Python interpreter of version $FAKE_VERSION that only records its calls: `-m venv DIR` makes
# DIR/bin/python (a copy of it), pip and every check succeed
FAKE_PYTHON = """#!/bin/sh
echo "$0 $*" >> "$CALLS"
if [ "$1" = -c ]; then
  case "$2" in *version_info*) echo "$FAKE_VERSION" ;; esac
elif [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$4/bin" && cp "$0" "$4/bin/python"
fi
exit 0
"""


@pytest.mark.parametrize("existing_venv", [False, True])
@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12"])
def test_setup_refuses_a_python_older_than_the_pinned_stack_needs(
    tmp_path: Path, version: str, existing_venv: bool
) -> None:
    """Reproduced: ``PYTHON=python3.10 bash scripts/setup.sh`` made .venv/ with 3.10 and installed
    torch and TorchRec, then failed at requirements/common.txt: "No matching distribution found
    for numpy==2.4.6" (it and scipy, scikit-learn, matplotlib need 3.11). An interpreter, or an
    existing .venv, older than 3.11 is now refused first, naming it; 3.11+ goes on."""
    root = tmp_path / "the repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPTS / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    shutil.copytree(REPO / "requirements", root / "requirements")
    python = tmp_path / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    if existing_venv:
        (root / ".venv" / "bin").mkdir(parents=True)
        shutil.copy(python, root / ".venv" / "bin" / "python")
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "CALLS": str(calls), "FAKE_VERSION": version, "PYTHON": str(python)}
    result = subprocess.run(
        ["bash", str(root / "scripts" / "setup.sh")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    pip_calls = [c for c in calls.read_text().splitlines() if " -m pip install " in c]
    if version != "3.10":
        assert result.returncode == 0, result.stderr
        assert pip_calls and (root / ".venv" / ".dmt-setup-cpu").exists()
        return
    assert result.returncode == 2, result.stdout + result.stderr
    if existing_venv:
        assert result.stderr == (
            f"{root}/.venv is Python 3.10; dmt needs Python 3.11 or newer: remove it, then run "
            "PYTHON=python3.11 (or newer) bash scripts/setup.sh\n"
        )
    else:
        assert result.stderr == (
            f"PYTHON={python} is Python 3.10; dmt needs Python 3.11 or newer: set "
            "PYTHON=python3.11 (or a newer interpreter)\n"
        )
        assert not (root / ".venv").exists()
    assert not pip_calls


def test_quickstart_takes_a_relative_run_directory_from_the_callers_directory(
    tmp_path: Path,
) -> None:
    """The job runs in the repository (its outputs/ and the configs' data paths, README Quick
    start); a relative hydra.run.dir / hydra.sweep.dir the caller gives is the caller's, quoted
    for Hydra (the caller's directory may hold spaces, commas or quotes)."""
    root = _checkout(tmp_path, "quickstart.sh")
    caller = tmp_path / "it's, here"
    args = ["model=dcn", "hydra.run.dir=my run", "++hydra.sweep.dir=s/${now:%H}"]
    args += ["hydra.run.dir='a b'", "hydra.run.dir=/abs", "hydra.run.dir=${oc.env:HOME}"]
    result, calls = _run(tmp_path, root / "scripts" / "quickstart.sh", *args, cwd=caller)
    assert result.returncode == 0, result.stderr
    (call,) = calls
    assert call["tool"] == "dmt-train" and call["cwd"] == str(root)
    argv = call["argv"]
    assert argv[0] == "model=dcn" and argv[4:] == args[4:]  # absolute, interpolated: as given
    parser = OverridesParser.create()
    assert parser.parse_override(argv[1]).value() == f"{caller}/my run"
    assert parser.parse_override(argv[2]).value() == f"{caller}/s/${{now:%H}}"
    assert parser.parse_override(argv[3]).value() == f"{caller}/a b"
    result, calls = _run(tmp_path, root / "scripts" / "quickstart.sh", cwd=caller)
    assert calls[-1]["argv"] == []  # the default run directory: outputs/ in the repository


# netns_throttle.sh: only its arguments are checked here. Stand-ins for ip and tc record any
# call and fail, so that no namespace is made whatever the script does.
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hosts"], "--hosts needs a value"),  # reproduced: "$2: unbound variable"
        (["--rate"], "--rate needs a value"),
        (["--rate", "--", "true"], "--rate needs a value"),
        (["--burst"], "--burst needs a value"),
        (["--hosts", "0", "--", "true"], "--hosts must be an integer from 1 to 200, got '0'"),
        (
            ["--hosts", "18446744073709551617", "--", "true"],
            "--hosts must be an integer from 1 to 200, got '18446744073709551617'",
        ),  # fmt: skip
        # reproduced: refused by tc only after the namespaces were made
        (
            ["--rate", "1gbt", "--", "true"],
            "--rate must be a rate in tc's form, a number above 0 with a unit (1gbit, 2500mbit, "
            "500kbit, 100mbps), got '1gbt'",
        ),
        (
            ["--rate", "0mbit", "--", "true"],
            "--rate must be a rate in tc's form, a number above 0 with a unit (1gbit, 2500mbit, "
            "500kbit, 100mbps), got '0mbit'",
        ),
        (
            ["--burst", "512 kb", "--", "true"],
            "--burst must be a size in tc's form, a number above 0 of bytes or with a unit (512kb, "
            "1mb, 64kbit), got '512 kb'",
        ),
    ],
)
def test_netns_throttle_refuses_bad_arguments_before_anything(
    tmp_path: Path, args: list[str], message: str
) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("ip", "tc"):
        (bin_ / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >>"{tmp_path}/net_calls"\nexit 1\n')
        (bin_ / tool).chmod(0o755)
    result = subprocess.run(
        ["bash", str(SCRIPTS / "netns_throttle.sh"), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"netns_throttle.sh: {message}\n"
    assert not (tmp_path / "net_calls").exists()


def _slurm_stand_ins(tmp_path: Path) -> dict[str, str]:
    """srun and scancel that do nothing, and a timeout (the script's way into every step) that
    records its directory and arguments and fails, saying so (its log): the script ends at its
    first step."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_ / "scancel").write_text("#!/bin/sh\nexit 0\n")
    (bin_ / "timeout").write_text(
        f'#!/bin/sh\npwd >"{tmp_path}/step"\nprintf "%s\\n" "$@" >>"{tmp_path}/step"\n'
        "echo 'stand-in step failed'\nexit 1\n"
    )
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{bin_}:{os.environ['PATH']}"}


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"NODES": "2x"}, "NODES must be an integer from 1 to 100000, got '2x'"),
        ({"NODES": "0"}, "NODES must be an integer from 1 to 100000, got '0'"),  # division by 0
        (
            {"NODES": "99999999999999999999"},
            "NODES must be an integer from 1 to 100000, got '99999999999999999999'",
        ),  # fmt: skip
        (
            {"GPUS_PER_NODE": "abc"},
            "GPUS_PER_NODE must be an integer from 0 (CPU) to 1024, got 'abc'",
        ),  # fmt: skip
        ({"CPUS_PER_TASK": "0"}, "CPUS_PER_TASK must be an integer from 1 to 100000, got '0'"),
        (
            {"TIMEOUT_S": "ten"},
            "TIMEOUT_S must be a duration above 0 in seconds (or timeout(1)'s 10m, 1h), got 'ten'",
        ),  # fmt: skip
    ],
)
def test_slurm_acceptance_refuses_bad_settings_before_anything(
    tmp_path: Path, setting: dict[str, str], message: str
) -> None:
    """Reproduced: NODES=2x ("value too great for base"), NODES=0 (division by 0) and
    GPUS_PER_NODE=abc (unbound variable) failed after DMT_SLURM_WORK/log was made."""
    root = _checkout(tmp_path, "slurm_acceptance.sh")
    work = tmp_path / "work"
    env = {**_slurm_stand_ins(tmp_path), "DMT_SLURM_WORK": str(work), **setting}
    result, _ = _run(tmp_path, root / "scripts" / "slurm_acceptance.sh", cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"slurm_acceptance.sh: {message}\n"
    assert not work.exists() and not (tmp_path / "step").exists()


def test_readme_names_every_check_of_slurm_acceptance() -> None:
    """Reproduced: the README said slurm_acceptance.sh runs (1) a sweep, (2) a multirun in one job
    step and (3) a preempted job, and slurm_smoke.sh runs it with one task per node; the script
    also runs (4), ``srun --distribution=cyclic`` with 2 tasks per node on CPU."""
    script = (SCRIPTS / "slurm_acceptance.sh").read_text()
    header = script.split("\nset -euo pipefail", 1)[0]
    checks = re.findall(r"^#\s+(\d+)\. ", header, re.M)
    assert checks == ["1", "2", "3", "4"]
    assert 'if [[ "$GPUS" == 0 ]]; then per_node=2;' in script  # check 4's tasks per node on CPU
    readme = (REPO / "README.md").read_text()
    paragraph = " ".join(
        next(p for p in readme.split("\n\n") if p.startswith("It runs (1)")).split()
    )
    assert sorted(set(re.findall(r"\((\d+)\) ", paragraph)), key=int) == checks
    assert "(4) `srun --distribution=cyclic` with 2 or more tasks per node (2 on CPU;" in paragraph
    smoke = " ".join(
        next(
            p for p in readme.split("\n\n") if p.startswith("`bash scripts/slurm_smoke.sh`")
        ).split()
    )
    assert "(one task per node, two in check (4);" in smoke


def test_slurm_acceptance_takes_a_relative_work_directory_from_the_caller(tmp_path: Path) -> None:
    """Reproduced: DMT_SLURM_WORK=work ran each step in work/ and named its sweep directory
    work/multirun there: work/work/multirun."""
    root = _checkout(tmp_path, "slurm_acceptance.sh")
    caller = tmp_path / "caller"
    env = {**_slurm_stand_ins(tmp_path), "DMT_SLURM_WORK": "work"}
    result, _ = _run(tmp_path, root / "scripts" / "slurm_acceptance.sh", cwd=caller, env=env)
    assert result.returncode == 1  # the first step failed (the stand-in timeout)
    assert "FAIL: dmt-train -m hydra/launcher=slurm failed" in result.stderr
    assert "stand-in step failed" in result.stdout
    cwd, *argv = (tmp_path / "step").read_text().splitlines()
    assert cwd == str(caller / "work")
    assert f"hydra.sweep.dir={caller}/work/multirun" in argv
    assert (caller / "work" / "log" / "sweep.log").exists()


def test_slurm_acceptance_cancels_only_the_jobs_it_submitted(tmp_path: Path) -> None:
    """Reproduced: in a reused DMT_SLURM_WORK the script's exit scancelled every job id that
    submitit's folders there named, an earlier run's too (111_0, 222_0), ids that SLURM may since
    have given to other jobs. Now only the job this run submitted (333_0), and its job name."""
    root = _checkout(tmp_path, "slurm_acceptance.sh")
    work = tmp_path / "work"
    for earlier in ("multirun/.submitit/111_0", "preempted/.submitit/222_0"):
        (work / earlier).mkdir(parents=True)
    env = {**_slurm_stand_ins(tmp_path), "DMT_SLURM_WORK": str(work)}
    bin_ = tmp_path / "bin"
    (bin_ / "scancel").write_text(f'#!/bin/sh\necho "$*" >>"{tmp_path}/scancel"\n')
    (bin_ / "timeout").write_text(  # the sweep submits job 333 (its point 0), then fails
        "#!/bin/sh\nmkdir -p multirun/.submitit/333_0\necho 'stand-in step failed'\nexit 1\n"
    )
    result, _ = _run(tmp_path, root / "scripts" / "slurm_acceptance.sh", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "FAIL: dmt-train -m hydra/launcher=slurm failed" in result.stderr
    name = re.search(r"--name=(dmt-acceptance-\d+)", (tmp_path / "scancel").read_text())
    assert name is not None
    assert (tmp_path / "scancel").read_text().splitlines() == [
        "--quiet 333_0",
        f"--quiet --name={name[1]}",
    ]


def _scored_run(run: Path, split: str, **report: object) -> None:
    """A finished run of 343 steps (11,000 rows a split), scored on ``split`` by dmt-eval: its
    ``pred_<split>.npz`` and the ``eval_<split>.json`` written with it (``report`` changes it)."""
    run.mkdir(parents=True, exist_ok=True)
    metrics = {"val_auc": 0.77, "test_auc": 0.76, "num_steps": 343.0}
    metrics |= {"val_num_samples": 11000.0, "test_num_samples": 11000.0}
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / f"pred_{split}.npz").write_bytes(b"PK")
    written = {"checkpoint": str(run / "checkpoints" / "step_343"), "step": 343, "data": split}
    written |= {"auc": 0.76, "rows": 11000, "predictions": str(run / f"pred_{split}.npz")}
    (run / f"eval_{split}.json").write_text(json.dumps({**written, **report}))


def _rows_study(
    tmp_path: Path, seeds: str, only: str, rows: str = "1"
) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """``ONLY=only ROWS=rows dmt_projection_study.sh out SEEDS`` of a checkout of its own, run
    in ``tmp_path/caller``; its result and the tools' calls."""
    root = _checkout(tmp_path, "dmt_projection_study.sh")
    script = root / "scripts" / "dmt_projection_study.sh"
    env = {"ONLY": only, "ROWS": rows}
    return _run(tmp_path, script, "out", seeds, cwd=tmp_path / "caller", env=env)


@pytest.mark.parametrize(
    ("report", "why"),
    [
        # reproduced: scored by hand with --max-rows 3000, then read by the study (ROWS=1) as the
        # run's scores: the row table's difference of the two configs changed sign
        ({"rows": 3000}, "{eval} records rows 3000 (the run's: 11000)"),
        ({"step": 100}, "{eval} records step 100 (the run's: 343)"),  # an earlier checkpoint
        ({"data": "val"}, "{eval} records data 'val' (the run's: 'test')"),
        ({"predictions": None}, "{eval} records predictions 'None' (the run's: 'pred_test.npz')"),
    ],
    ids=["max_rows", "earlier_step", "other_split", "no_predictions"],
)
def test_projection_study_refuses_predictions_of_other_rows_or_checkpoints(
    tmp_path: Path, report: dict[str, object], why: str
) -> None:
    """Reproduced: with ROWS=1 a run's pred_{val,test}.npz was read back whenever it existed,
    whatever checkpoint and rows it scored. One that its eval_<split>.json does not record as
    the run's last step on the whole split is refused, naming it, before anything trains."""
    run = tmp_path / "caller" / "out" / "tp4_d16" / "seed_1"
    _scored_run(run, "test", **report)
    result, calls = _rows_study(tmp_path, "2", "base tp4_d16")
    assert result.returncode == 2, result.stderr
    pred, eval_ = run / "pred_test.npz", run / "eval_test.json"
    assert result.stderr == (
        f"dmt_projection_study.sh: {pred} is not run {run}'s scores on its whole test split as "
        f"it ended: {why.format(eval=eval_)}; move {pred} and {eval_} away to score the run "
        "again\n"
    )
    assert calls == []


def test_projection_study_refuses_predictions_it_cannot_check(tmp_path: Path) -> None:
    """A pred_<split>.npz without the eval_<split>.json dmt-eval writes with it, or of a run
    that has not ended (no metrics.json: its last checkpoint is yet to come), is refused too."""
    root = _checkout(tmp_path, "dmt_projection_study.sh")
    caller = tmp_path / "caller"
    script = root / "scripts" / "dmt_projection_study.sh"
    env = {"ONLY": "base tp4_d16", "ROWS": "1"}
    run = caller / "out" / "base" / "seed_0"
    _scored_run(run, "val")
    (run / "eval_val.json").unlink()
    result, calls = _run(tmp_path, script, "out", "2", cwd=caller, env=env)
    assert result.returncode == 2 and calls == []
    pred, eval_ = run / "pred_val.npz", run / "eval_val.json"
    assert result.stderr.startswith(
        f"dmt_projection_study.sh: {pred}: what it scored cannot be checked ({eval_}, written "
        "with it by dmt-eval: FileNotFoundError: "
    )
    (run / "metrics.json").unlink()
    result, calls = _run(tmp_path, script, "out", "2", cwd=caller, env=env)
    assert result.returncode == 2 and calls == []
    assert result.stderr == (
        f"dmt_projection_study.sh: {pred} is of a run that has not ended (no {run}/metrics.json):"
        f" it is not the scores of the run's last checkpoint; move {pred} and {eval_} away to "
        "score the run again\n"
    )


def test_projection_study_reads_back_the_predictions_of_its_runs(tmp_path: Path) -> None:
    """A rerun scores only the runs and splits without predictions; those of a run as it ended,
    on its whole split, are read back (row_bootstrap.py gets every run's file)."""
    out = tmp_path / "caller" / "out"
    _scored_run(out / "base" / "seed_0", "test")
    result, calls = _rows_study(tmp_path, "2", "base tp4_d16")
    assert result.returncode == 0, result.stderr
    scored = [_value(c["argv"], "--predictions") for c in calls if c["tool"] == "dmt-eval"]
    runs = [f"{out}/{name}/seed_{seed}" for name in ("base", "tp4_d16") for seed in (0, 1)]
    expected = [f"{run}/pred_{split}.npz" for run in runs for split in ("val", "test")]
    assert scored == [p for p in expected if p != f"{out}/base/seed_0/pred_test.npz"]
    bootstrap = [c["argv"] for c in calls if c["argv"][:1] == ["scripts/row_bootstrap.py"]]
    assert [argv[argv.index("--group") + 2] for argv in bootstrap] == [
        f"{out}/base/seed_0/pred_val.npz",
        f"{out}/base/seed_0/pred_test.npz",
    ]


def test_projection_study_refuses_rows_of_one_config_before_training(tmp_path: Path) -> None:
    """Reproduced: ``ROWS=1 ONLY=base ... out 1`` trained the base and scored its runs, then
    stopped at row_bootstrap.py ("give two --group (or more), or --pair")."""
    result, calls = _rows_study(tmp_path, "1", "base")
    assert result.returncode == 2
    assert result.stderr == (
        "ROWS=1 compares configs over the rows (scripts/row_bootstrap.py); ONLY='base' names "
        "one: name two or more\n"
    )
    assert calls == []


@pytest.mark.skipif(os.geteuid() != 0, reason="slurm_smoke.sh needs root (its first check)")
def test_slurm_smoke_cancels_no_job_of_the_callers_cluster(tmp_path: Path) -> None:
    """Reproduced: with the caller's SLURM_CONF (a real cluster's) in the environment, a failure
    before the script's own cluster was configured (here: munged did not start) ran ``scancel
    --quiet --user=root`` and squeue on the caller's cluster, cancelling every root job there.
    SLURM's and MUNGE's commands are stand-ins that only record their calls."""
    root = _checkout(tmp_path, "slurm_smoke.sh")
    (root / ".venv" / "bin" / "python").unlink()
    (root / ".venv" / "bin" / "python").symlink_to(sys.executable)  # the free ports, for real
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("slurmctld", "slurmd", "munged", "scancel", "squeue", "sinfo"):
        (bin_ / tool).write_text(
            f'#!/bin/sh\necho "{tool} $*" >>"{tmp_path}/slurm_calls"\n'
            f'[ "$1" = -V ] && echo "{tool} 22.05"\nexit 0\n'
        )
        (bin_ / tool).chmod(0o755)
    conf = tmp_path / "their slurm.conf"
    conf.write_text("ClusterName=theirs\n")
    env = {"PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_CONF": str(conf)}
    result, _ = _run(tmp_path, root / "scripts" / "slurm_smoke.sh", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "[slurm_smoke] FAIL: munged did not start" in result.stderr
    tools = [line.split()[0] for line in (tmp_path / "slurm_calls").read_text().splitlines()]
    assert tools == ["slurmctld", "munged", "munged"]  # -V twice, then the daemon


@pytest.mark.parametrize(("rows", "checkpoints"), [("0", False), ("", False), ("1", True)])
def test_projection_study_rows_0_is_a_study_without_row_tables(
    tmp_path: Path, rows: str, checkpoints: bool
) -> None:
    """Reproduced: ``ROWS=0`` ran the row study (any ROWS but an empty one did): its runs
    trained with trainer.checkpoint=true (other settings than the study without it: its runs
    refused as another config's), were scored and resampled."""
    result, calls = _rows_study(tmp_path, "2", "base tp4_d16", rows)
    assert result.returncode == 0, result.stderr
    _, _, seeds = _study_calls(calls)
    assert all(
        ("trainer.checkpoint=true" in _value(c["argv"], "--common")) is checkpoints for c in seeds
    )
    assert any(c["tool"] == "dmt-eval" for c in calls) is checkpoints


def test_projection_study_refuses_a_rows_other_than_0_or_1(tmp_path: Path) -> None:
    root = _checkout(tmp_path, "dmt_projection_study.sh")
    script = root / "scripts" / "dmt_projection_study.sh"
    result, calls = _run(tmp_path, script, "out", "2", cwd=tmp_path / "c", env={"ROWS": "yes"})
    assert result.returncode == 2
    assert result.stderr == "ROWS='yes': expected 1 (the row tables) or 0 (none, as unset)\n"
    assert calls == []
