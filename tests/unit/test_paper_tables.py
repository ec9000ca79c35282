"""Paper Tables 3-5 as published: every row dmt reproduces, MFlops/sample and parameters.

dmt's figures come from ``dmt-inspect experiment=...`` (PyTorch's FLOP counter, forward plus
backward of the dense part, on the meta device); the paper's from the PyTorch profiler.
"""

from __future__ import annotations

import re

import pytest

from dmt.inspect import inspect_config
from tests.conftest import REPO, typed_config

# experiment -> (paper MFlops/sample, paper parameters in G); Tables 3, 4 and 5.
TABLE_3 = {
    "paper_dlrm": (14.74, 22.78),
    "paper_sptt_dlrm": (14.74, 22.78),
    "paper_dcn": (96.22, 22.79),
    "paper_sptt_dcn": (96.22, 22.79),
}
TABLE_4 = {
    "paper_dmt_2t_dlrm": (8.95, 22.78),
    "paper_dmt_4t_dlrm": (8.95, 22.78),
    "paper_dmt_8t_dlrm": (8.95, 22.78),
    "paper_dmt_16t_dlrm": (8.75, 22.78),
    "paper_dmt_26t_dlrm": (8.95, 22.78),
    "paper_dmt_2t_dcn": (43.71, 22.81),
    "paper_dmt_4t_dcn": (50.01, 22.79),
    "paper_dmt_8t_dcn": (62.60, 22.81),
    "paper_dmt_16t_dcn": (87.19, 22.79),
    "paper_dmt_26t_dcn": (96.22, 22.79),
}
TABLE_5 = {
    "paper_dmt_8t_dlrm_cr2": (8.95, 22.78),
    "paper_dmt_8t_dlrm_cr4": (7.93, 22.78),
    "paper_dmt_8t_dlrm_cr8": (7.41, 22.78),
    "paper_dmt_8t_dlrm_cr16": (7.16, 22.78),
}
ROWS = {**TABLE_3, **TABLE_4, **TABLE_5}
# Where dmt's parameter count differs from the paper's in the second decimal (G): the DCN rows'
# published counts are not monotonic in T (22.81, 22.79, 22.81, 22.79) while their FLOPs are;
# no tower size fits both. dmt: 22.78, 22.79, 22.79, 22.79.
PARAMS_DIFFER = {"paper_dmt_2t_dcn": 22.78, "paper_dmt_8t_dcn": 22.79}


@pytest.fixture(scope="module")
def reports():
    return {name: inspect_config(typed_config(f"experiment={name}")) for name in ROWS}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_row_matches_the_paper(reports, name):
    mflops, params = ROWS[name]
    report = reports[name]
    # Within 1% (measured: 0.08% on the DCN rows, 0.2% on DCN's base, 0.1% or less elsewhere).
    assert report["train_mflops_per_sample"] == pytest.approx(mflops, rel=0.01)
    assert round(report["num_parameters_g"], 2) == PARAMS_DIFFER.get(name, params)


@pytest.mark.parametrize("name", sorted(TABLE_4) + sorted(TABLE_5))
def test_dmt_rows_cost_no_more_than_their_base(reports, name):
    """§5.2.2: "on par or lower resources"; only 26T-DCN (SPTT alone) costs as much as DCN."""
    base = reports["paper_dcn" if name.endswith("dcn") else "paper_dlrm"]
    flops = reports[name]["train_mflops_per_sample"]
    if name == "paper_dmt_26t_dcn":
        assert flops == base["train_mflops_per_sample"]
    else:
        assert flops < base["train_mflops_per_sample"]


def test_dcn_towers_cost_one_global_vector_each():
    """The Listing-2 reading: each DCN tower adds one D=128 vector to the global CrossNet and top
    MLP (3 * 2 * 512 * 128 + 1024 * 128 MACs, times 6 for training) on top of fixed costs."""
    step = 6 * (3 * 2 * 512 * 128 + 1024 * 128) / 1e6
    flops = [
        inspect_config(typed_config(f"experiment=paper_dmt_{t}t_dcn"))["train_mflops_per_sample"]
        for t in (2, 4, 8)
    ]
    assert flops[1] - flops[0] == pytest.approx(2 * step, rel=1e-6)
    assert flops[2] - flops[1] == pytest.approx(4 * step, rel=1e-6)


def test_readme_figures_with_the_base_top_mlp():
    """README note (1): what the DMT-DLRM rows would cost with the base model's top MLP
    (1024-1024-512-256-1), as ``dmt-inspect`` counts it. A reproduced bug: it gave 15.64 for
    16T (15.04: one more 1024 x 1024 layer, 6.29 MFLOPs, over 8.75)."""
    readme = (REPO / "README.md").read_text()
    stated = re.search(
        r"with the base's top MLP the rows cost ([\d.]+), ([\d.]+) for\s+16T, and ([\d./]+) in "
        r"Table 5",
        readme,
    )
    assert stated is not None, "README's note (1) on the DMT-DLRM top MLP has moved"
    base_top = "model.top_mlp=[1024,1024,512,256,1]"
    rows = ["paper_dmt_2t_dlrm", "paper_dmt_16t_dlrm"]
    rows += [f"paper_dmt_8t_dlrm_cr{r}" for r in (2, 4, 8, 16)]
    counted = [
        f"{inspect_config(typed_config(f'experiment={name}', base_top))['train_mflops_per_sample']:.2f}"
        for name in rows
    ]
    assert [stated[1], stated[2], *stated[3].split("/")] == counted
