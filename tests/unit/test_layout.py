"""The package layout the README and STYLE.md describe stays true."""

from __future__ import annotations

import ast
import importlib.metadata
import itertools
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()

#: what dmt/models/ must never import: the partitioner depends on the models, not the reverse;
#: models are plain modules (STYLE.md: no torch.distributed; TorchRec's sharded side neither)
FORBIDDEN_IN_MODELS = ("dmt.partitioner", "torch.distributed", "torchrec.distributed")


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module an ``import`` anywhere in ``path`` names (``from a import b`` gives ``a`` and
    ``a.b``; relative imports resolved against ``path``'s package under ``root``)."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parent = package[: len(package) - node.level + 1] if node.level else ()
            base = ".".join([*parent, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def test_imported_modules_sees_every_spelling(tmp_path):
    models = tmp_path / "dmt" / "models"
    models.mkdir(parents=True)
    f = models / "x.py"
    f.write_text(
        "import torch.distributed as dist\n"
        "from torch import distributed\n"
        "def g():\n"
        "    from ..partitioner import baselines\n"
        "    from .partition import strided_towers\n"
    )
    assert {
        "torch.distributed",
        "dmt.partitioner.baselines",
        "dmt.models.partition.strided_towers",
    } <= imported_modules(f, tmp_path)


def test_models_import_neither_the_partitioner_nor_torch_distributed():
    files = sorted((ROOT / "dmt" / "models").rglob("*.py"))
    assert len(files) > 5
    bad = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in files
        for module in imported_modules(path)
        if any(module == p or module.startswith(p + ".") for p in FORBIDDEN_IN_MODELS)
    }
    assert not bad, f"dmt/models imports what it must not: {sorted(bad)}"


def test_importing_the_models_loads_no_partitioner():
    code = "import sys, dmt.models; print(sorted(m for m in sys.modules if m.startswith('dmt.')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "dmt.models" in out and "dmt.partitioner" not in out, out


def _expand_braces(token: str) -> list[str]:
    """``a_{1,2}_b`` -> ``a_1_b``, ``a_2_b`` (every brace group, as bash does)."""
    parts = re.split(r"\{([^{}]*)\}", token)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def readme_config_table() -> dict[str, set[str]]:
    """The README's config-group table: group -> every backticked name in its options cell."""
    start = README.index("| group | options |")
    rows = README[start:].split("\n\n", 1)[0].splitlines()[2:]
    table: dict[str, set[str]] = {}
    for row in rows:
        group_cell, options_cell = row.strip("|").split("|", 1)
        group = group_cell.strip().strip("`")
        table[group] = {
            name
            for token in re.findall(r"`([^`]+)`", options_cell)
            for name in _expand_braces(token)
        }
    return table


def conf_groups() -> dict[str, set[str]]:
    """Every config group under dmt/conf/ (nested ones as ``hydra/launcher``) and its options."""
    conf = ROOT / "dmt" / "conf"
    return {
        str(d.relative_to(conf)): {f.stem for f in d.glob("*.yaml")}
        for d in sorted(conf.rglob("*"))
        if d.is_dir() and any(d.glob("*.yaml"))
    }


def test_readme_config_table_names_every_group_and_option():
    table, groups = readme_config_table(), conf_groups()
    assert set(table) == set(groups), "README's config-group table and dmt/conf/ disagree on groups"
    for group, options in groups.items():
        missing = options - table[group]
        assert not missing, f"README's config-group table misses dmt/conf/{group}/{sorted(missing)}"


def test_brace_expansion():
    assert _expand_braces("paper_dmt_{2,4}t_{a,b}") == [
        "paper_dmt_2t_a",
        "paper_dmt_2t_b",
        "paper_dmt_4t_a",
        "paper_dmt_4t_b",
    ]


@pytest.mark.parametrize("section", ["## Layout"])
def test_readme_layout_paths_exist(section):
    block = README[README.index(section) :].split("```")[1]
    paths = re.findall(r"\b(?:dmt|scripts|benchmarks|tests)/[\w./]*", block)
    assert len(paths) > 10
    missing = [p for p in paths if not (ROOT / p.rstrip(".")).exists()]
    assert not missing, f"README's Layout names paths that do not exist: {missing}"


def test_readme_names_every_data_config_of_the_kaggle_sample():
    """Reproduced: the README said the Kaggle sample has three data configs (``criteo_sample``,
    ``_tune``, ``_holdout``); dmt/conf/data/ has five: the forward protocol's two as well."""
    paragraph = next(p for p in README.split("\n\n") if p.startswith("The Kaggle sample"))
    text = " ".join(paragraph.split())
    configs = {f.stem for f in (ROOT / "dmt" / "conf" / "data").glob("criteo_sample*.yaml")}
    stated = re.search(r"has (\w+) data configs", text)
    assert stated is not None, "the README's paragraph on the Kaggle sample has moved"
    counts = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
    assert counts.get(stated.group(1)) == len(configs), (stated.group(0), sorted(configs))
    missing = configs - set(re.findall(r"`(criteo_sample\w*)`", text))
    assert not missing, f"the README's paragraph on the Kaggle sample misses {sorted(missing)}"


def test_python_minimum_admits_every_pinned_requirement():
    """Reproduced: the README and pyproject.toml said Python 3.10+, but requirements/common.txt
    pins numpy 2.4.6, scipy 1.17.1, scikit-learn 1.9.1 and matplotlib 3.11.2, which need 3.11:
    ``scripts/setup.sh`` with Python 3.10 failed at ``pip install -r requirements/common.txt``
    ("No matching distribution found for numpy==2.4.6"), and dmt itself uses ``datetime.UTC``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = Version(project["requires-python"].removeprefix(">="))
    checked = []
    for line in (ROOT / "requirements").glob("*.txt"):
        for name, pinned in re.findall(r"^([\w.-]+)==(\S+)", line.read_text(), re.M):
            try:
                dist = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            requires = dist.metadata["Requires-Python"]
            if Version(dist.version) == Version(pinned) and requires:
                checked.append(name)
                assert minimum in SpecifierSet(requires), (name, pinned, requires, str(minimum))
    assert {"numpy", "scipy", "scikit-learn", "matplotlib"} <= set(checked)
    assert f"makes `.venv/` with Python {minimum}+" in README
    assert f"\nMIN_PYTHON={minimum}\n" in (ROOT / "scripts" / "setup.sh").read_text()
