"""Dense optimizer state a resume starts fresh (another optimizer than the checkpoint's): after
the dummy step that materializes it for loading, it is reset to a new optimizer's in place
(``dmt.checkpoint._clear_dense_state``), so training on equals a new optimizer's training."""

from __future__ import annotations

import json
import math
import resource
import signal

import pytest
import torch

from dmt.checkpoint import (
    FORMAT,
    META_FILE,
    Checkpointer,
    _check_finite,
    _clear_dense_state,
    _drop,
    _make_way,
    damage,
    latest,
    load_model_state,
    prune,
    read_meta,
    row_wise_state_blocks,
    tensor_keys,
)
from dmt.host_memory import HOST

OPTIMIZERS = {
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.01),
    "SGD momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    # with weight decay, so that the dummy step on zero gradients moves their state
    "Adagrad": lambda ps: torch.optim.Adagrad(
        ps, lr=0.1, initial_accumulator_value=0.1, weight_decay=0.01
    ),
    "RMSprop": lambda ps: torch.optim.RMSprop(
        ps, lr=0.01, momentum=0.5, centered=True, weight_decay=0.01
    ),
    # their new state is not zeros: mu_product 1, eta the lr, the first buffer the gradient
    "NAdam": lambda ps: torch.optim.NAdam(ps, lr=0.01),
    "ASGD": lambda ps: torch.optim.ASGD(ps, lr=0.01, t0=1),
    "SGD dampening": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5),
    "RAdam": lambda ps: torch.optim.RAdam(ps, lr=0.01),
    "Adamax": lambda ps: torch.optim.Adamax(ps, lr=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_fresh_dense_state_trains_as_a_new_optimizer(name: str) -> None:
    make = OPTIMIZERS[name]
    torch.manual_seed(0)
    start = torch.randn(4, 3)
    grads = [torch.randn(4, 3) for _ in range(3)]
    new, resumed = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    opt_new, opt_resumed = make([new]), make([resumed])
    # what a resume does: a dummy step on zero gradients makes the state (to load into), the
    # weights are then loaded, and the state the checkpoint lacks is reset
    resumed.grad = torch.zeros_like(resumed)
    opt_resumed.step()
    with torch.no_grad():
        resumed.copy_(start)
    fresh = [v for v in opt_resumed.state[resumed].values() if isinstance(v, torch.Tensor)]
    _clear_dense_state(opt_resumed, fresh)
    for g in grads:
        for p, opt in ((new, opt_new), (resumed, opt_resumed)):
            p.grad = g.clone()
            opt.step()
    torch.testing.assert_close(resumed, new, rtol=0, atol=1e-7)


def test_a_partly_fresh_state_keeps_what_was_loaded() -> None:
    """Adam's moments from a checkpoint of plain Adam, resumed with ``amsgrad``: the loaded
    moments and step stay, the new ``max_exp_avg_sq`` starts as a new one would (zeros), not as
    the dummy step left it (weight decay makes that step's gradient non-zero)."""
    make = lambda ps, amsgrad: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, amsgrad=amsgrad)  # noqa: E731
    torch.manual_seed(0)
    start = torch.randn(4, 3)
    grads = [torch.randn(4, 3) for _ in range(5)]
    before = torch.nn.Parameter(start.clone())
    opt_before = make([before], False)
    for g in grads[:2]:  # the run that wrote the checkpoint
        before.grad = g.clone()
        opt_before.step()
    saved = {k: v.clone() for k, v in opt_before.state[before].items()}
    # the reference: amsgrad's state as torch makes it, around the loaded moments
    expected = torch.nn.Parameter(before.detach().clone())
    opt_expected = make([expected], True)
    opt_expected.state[expected] = {
        **{k: v.clone() for k, v in saved.items()},
        "max_exp_avg_sq": torch.zeros_like(start),
    }
    # the dummy step runs on the weights before loading (a new model's init: here large, so
    # that what it leaves in max_exp_avg_sq would outweigh the moments of the steps after)
    resumed = torch.nn.Parameter(1000 * start)
    opt_resumed = make([resumed], True)
    resumed.grad = torch.zeros_like(resumed)
    opt_resumed.step()  # the dummy step, then the checkpoint's weights and entries loaded
    state = opt_resumed.state[resumed]
    assert state["max_exp_avg_sq"].abs().sum() > 0
    with torch.no_grad():
        resumed.copy_(before)
        for key, value in saved.items():
            state[key].copy_(value)
    _clear_dense_state(opt_resumed, [state["max_exp_avg_sq"]])
    assert state["step"] == saved["step"]
    for g in grads[2:]:
        for p, opt in ((expected, opt_expected), (resumed, opt_resumed)):
            p.grad = g.clone()
            opt.step()
    torch.testing.assert_close(resumed, expected, rtol=0, atol=0)


def test_state_dropped_whole_leaves_no_empty_subtree() -> None:
    # an optimizer state whose every leaf is dropped goes whole: an empty dict left behind was
    # taken for a tensor by DCP's load plan at 2+ ranks
    tree = {"a": {"x": 1}, "b": {"y": 2, "z": 3}, "c": {}}
    assert _drop(tree, {"a.x", "b.y"}, "") == {"b": {"z": 3}, "c": {}}


def test_an_unfinished_saves_directory_is_moved_aside_not_mixed_in(tmp_path) -> None:
    # a reproduced bug: the files a crashed save left in step_8 (no meta.json) were listed as
    # part of the next step_8, which a later clean-up then made look damaged
    step = tmp_path / "step_8"
    step.mkdir()
    (step / "__3_0.distcp").write_bytes(b"x" * 100)
    assert _make_way(step) is None
    assert not step.exists()
    (aside,) = tmp_path.glob("step_8.incomplete-*")
    assert (aside / "__3_0.distcp").read_bytes() == b"x" * 100  # moved, never deleted
    step.mkdir()  # an empty one (this save's own mkdir) stays
    assert _make_way(step) is None and step.is_dir()
    assert not (step / META_FILE).exists()


def test_a_damaged_tensor_index_is_named(tmp_path) -> None:
    # a reproduced bug: a zero-filled .metadata (its size intact) was a pickle traceback in
    # dmt-eval and dmt-export
    step = tmp_path / "step_4"
    step.mkdir()
    (step / ".metadata").write_bytes(b"\0" * 64)
    meta = {"format": FORMAT, "step": 4, "files": {".metadata": 64}}
    (step / META_FILE).write_text(json.dumps(meta))
    for read in (tensor_keys, load_model_state, row_wise_state_blocks):
        with pytest.raises(ValueError, match=rf"^cannot read {step / '.metadata'}: ") as error:
            read(step)
        assert str(error.value).count("cannot read") == 1  # the resume's said it twice


def test_the_finite_check_reads_every_slice_of_a_tensor_and_only_float_state(
    tmp_path, monkeypatch
) -> None:
    """``_check_finite`` (a resume's, after DCP's load): floats checked in slices along the
    first dimension, the last one included; integer tensors, numbers and the RNG state pass;
    a checkpoint with no complete one before it says so."""
    monkeypatch.setattr("dmt.checkpoint._FINITE_CHUNK", 6)  # 2 rows of 3 at a time
    step = tmp_path / "step_4"
    weight = torch.zeros(5, 3)
    state = {
        "model": {"w": weight, "count": torch.tensor([2**62]), "scale": 1.5},
        "rng": {"rank_0": {"torch": torch.tensor([255], dtype=torch.uint8)}},
    }
    _check_finite(step, 4, state, 1)
    weight[4, 2] = -math.inf  # in the last slice, one row
    with pytest.raises(ValueError) as error:
        _check_finite(step, 4, state, 1)
    assert str(error.value) == (
        f"checkpoint {step} (step 4) holds values that are not finite (NaN or inf), first in "
        "model.w: the run that saved it had diverged, and training on would start from them; "
        f"no complete checkpoint before it is in {str(tmp_path)!r}: start afresh, in a new run "
        "directory (another hydra.run.dir, and another trainer.checkpoint_dir if yours is "
        "absolute), perhaps with a lower learning rate (optim.lr, optim.sparse_lr)"
    )


def test_the_finite_check_takes_no_overflowing_sum_of_finite_values_for_a_diverged_one(
    tmp_path, monkeypatch
) -> None:
    """``_check_finite`` reads a slice's sum first (finite: no NaN or inf in it); a sum that
    overflows is of finite values here, which a value-by-value check then clears, while NaN and
    inf are found whatever their neighbours (``inf - inf`` is NaN, not a finite sum)."""
    monkeypatch.setattr("dmt.checkpoint._FINITE_CHUNK", 4)
    big = torch.finfo(torch.float32).max
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        top = torch.finfo(dtype).max
        weight = torch.full((4, 2), top, dtype=dtype)  # every slice's sum overflows
        assert not torch.isfinite(weight[:2].sum())
        _check_finite(tmp_path / "step_4", 4, {"model": {"w": weight}}, 1)
        for bad in (math.nan, math.inf, -math.inf):
            weight[3, 1] = bad
            with pytest.raises(ValueError, match="first in model.w: the run that saved it"):
                _check_finite(tmp_path / "step_4", 4, {"model": {"w": weight}}, 1)
            weight[3, 1] = top
    mixed = torch.tensor([[big, -big], [math.inf, -math.inf]])
    with pytest.raises(ValueError, match="first in model.w"):
        _check_finite(tmp_path / "step_4", 4, {"model": {"w": mixed}}, 1)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_checkpoint_that_cannot_be_written_is_an_error_naming_it(tmp_path, async_save) -> None:
    """A reproduced bug: a save that failed to write (a full disk; here a file-size limit)
    raised DCP's CheckpointException, a BaseException past Hydra's record of a failed job,
    whose text named neither the checkpoint nor, on a full disk, the cause ("unexpected pos
    704 vs 598"); an asynchronous one at the wait that marks it complete. Its directory stays
    without meta.json: incomplete, never resumed from."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)  # 48 KiB of weights and Adam moments
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    saver = Checkpointer(
        tmp_path, rank=0, world_size=1, async_save=async_save, host_memory=lambda: {HOST: 1 << 40}
    )
    step = tmp_path / "step_2"
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, limits[1]))
        with pytest.raises(ValueError) as error:
            saver.save(model, optimizer, step=2, epoch=0, batch_in_epoch=2)
            assert async_save, "a synchronous save raises at once"
            saver.wait()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    message = str(error.value)
    assert message.startswith(f"cannot write checkpoint {step} ("), message
    assert " bytes free on its file system; trainer.checkpoint_dir sets where" in message
    assert "File too large" in message
    assert damage(step) == f"{step / META_FILE} is missing (the save did not finish)"
    assert latest(tmp_path) is None


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_checkpoint_keep_deletes_only_older_complete_checkpoints_once_a_newer_one_is(
    tmp_path, async_save
) -> None:
    """``trainer.checkpoint_keep``: every checkpoint used to be kept, a long run's filling the
    disk. With ``keep=2``, once a checkpoint is complete (an asynchronous one at its wait, not
    while it is written) the older complete ones beyond the newest 2 are deleted, and nothing
    else: not an incomplete ``step_N`` (no ``meta.json``), not one moved aside, not a file of
    the user's."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.Adam(model.parameters())
    saver = Checkpointer(
        tmp_path,
        rank=0,
        world_size=1,
        async_save=async_save,
        host_memory=lambda: {HOST: 1 << 40},
        keep=2,
    )
    (tmp_path / "step_0").mkdir()  # a save cut short: not dmt's complete checkpoint
    (tmp_path / "step_0" / "__0_0.distcp").write_bytes(b"x")
    (tmp_path / "step_0.damaged-1").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    others = {"step_0", "step_0.damaged-1", "notes.txt"}
    kept = []
    for step in range(1, 6):
        saver.save(model, optimizer, step=step, epoch=0, batch_in_epoch=step)
        if async_save:  # the older ones stay until this one is complete
            assert {p.name for p in tmp_path.iterdir()} == others | {f"step_{n}" for n in kept} | {
                f"step_{step}"
            }
            saver.wait()
        kept = [*kept, step][-2:]
        assert {p.name for p in tmp_path.iterdir()} == others | {f"step_{n}" for n in kept}, step
        assert all(damage(tmp_path / f"step_{n}") is None for n in kept)
    assert latest(tmp_path) == tmp_path / "step_5"
    assert prune(tmp_path, 1, 4) == []  # the step just completed, and newer ones, stay


def test_prune_warns_of_a_checkpoint_that_it_cannot_delete(tmp_path, caplog) -> None:
    """A failure to delete an old checkpoint (rank 0's alone) is a warning naming it, not an
    error: the other ranks would wait for rank 0 in the next collective. What a deletion cut
    short left (``step_N.deleting``) goes with the next one of that step."""
    for n in (1, 2, 3):
        step = tmp_path / f"step_{n}"
        step.mkdir()
        (step / ".metadata").write_bytes(b"m")
        (step / META_FILE).write_text(json.dumps({"format": FORMAT, "files": {".metadata": 1}}))
    (tmp_path / "step_1.deleting").write_text("a file in the way of the rename")
    (tmp_path / "step_2.deleting").mkdir()  # an earlier deletion of step_2, cut short
    (tmp_path / "step_2.deleting" / "__0_0.distcp").write_bytes(b"x")
    with caplog.at_level("WARNING", logger="dmt.checkpoint"):
        assert prune(tmp_path, 1, 3) == [tmp_path / "step_2"]
    assert read_meta(tmp_path / "step_1")["format"] == FORMAT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_1.deleting", "step_3"]
    assert (
        f"cannot delete checkpoint {tmp_path / 'step_1'} (trainer.checkpoint_keep=1): "
        in caplog.text
    )


def test_checkpoint_keep_leaves_a_link_to_a_checkpoint_elsewhere_as_it_is(tmp_path) -> None:
    """Reproduced: a ``step_N`` that is the user's link to a checkpoint elsewhere (to resume
    it with ``trainer.resume_from=auto``) was renamed to ``step_N.deleting`` and then not
    deleted ("Cannot call rmtree on a symbolic link"): the user's link was moved, and ``auto``
    no longer saw it. dmt did not make it: it stays, named as it was, and so does its target."""
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.Adam(model.parameters())
    archive, root = tmp_path / "archive", tmp_path / "run" / "checkpoints"
    Checkpointer(archive, rank=0, world_size=1).save(
        model, optimizer, step=1, epoch=0, batch_in_epoch=1
    )
    root.mkdir(parents=True)
    (root / "step_1").symlink_to(archive / "step_1")
    saver = Checkpointer(root, rank=0, world_size=1, keep=1, run_dir=tmp_path / "run")
    saver.save(model, optimizer, step=2, epoch=0, batch_in_epoch=2)
    saver.save(model, optimizer, step=3, epoch=0, batch_in_epoch=3)
    assert sorted(p.name for p in root.iterdir()) == ["step_1", "step_3"]
    assert (root / "step_1").is_symlink() and damage(root / "step_1") is None
    assert damage(archive / "step_1") is None


def test_a_resume_may_change_the_dense_optimizers_implementation():
    """``optim.dense_fused`` (fused or looping kernels, the same update) changes on a resume
    without ``trainer.resume_allow_config_change``, also from a checkpoint saved before the
    setting existed; the optimizer itself may not."""
    from dmt.checkpoint import config_differences

    saved = {"optim": {"dense": {"_target_": "torch.optim.Adam"}, "lr": 0.1}}
    for now in (True, False):
        current = {"optim": {"dense": {"_target_": "torch.optim.Adam"}, "lr": 0.1}}
        current["optim"]["dense_fused"] = now
        assert config_differences(saved, current, allow_change=False) == []
        fused = {"optim": {**saved["optim"], "dense_fused": not now}}
        assert config_differences(fused, current, allow_change=False) == []
    other = {"optim": {"dense": {"_target_": "torch.optim.AdamW"}, "lr": 0.1, "dense_fused": True}}
    assert config_differences(saved, other, allow_change=False) == [
        "optim.dense._target_: 'torch.optim.Adam' -> 'torch.optim.AdamW'"
    ]


def test_prune_deletes_only_dmts_checkpoints_of_this_run_and_damage_names_each_fault(
    tmp_path,
) -> None:
    """Mutation-tested: ``prune`` kept no ``format``/``owner`` filter under test, nor
    :func:`damage` its size, listed-files and ``.metadata`` checks."""

    def step(n: int, meta: dict, size: int = 1) -> None:
        (tmp_path / f"step_{n}").mkdir()
        (tmp_path / f"step_{n}" / ".metadata").write_bytes(b"m" * size)
        (tmp_path / f"step_{n}" / META_FILE).write_text(json.dumps(meta))

    mine = {"format": FORMAT, "files": {".metadata": 1}, "run_dir": "/runs/a"}
    step(1, {**mine, "format": "dcp-0"})  # another format: never dmt's to delete
    step(2, {**mine, "run_dir": "/runs/b"})  # another run's
    step(3, mine)
    step(4, mine)
    assert prune(tmp_path, 1, 4, owner="/runs/a") == [tmp_path / "step_3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_2", "step_4"]
    step(5, mine, size=2)
    assert damage(tmp_path / "step_5") == (
        f"{tmp_path / 'step_5' / '.metadata'} has 2 bytes, {META_FILE} says 1"
    )
    step(6, {"format": FORMAT})
    assert damage(tmp_path / "step_6") == (
        f"{tmp_path / 'step_6' / META_FILE} lists no files (written by an older dmt; "
        "not a DCP checkpoint)"
    )
    step(7, {**mine, "files": {}})
    (tmp_path / "step_7" / ".metadata").unlink()
    assert damage(tmp_path / "step_7") == (
        f"{tmp_path / 'step_7' / '.metadata'} (DCP's index of the tensors) is missing; a copy "
        "that skips dotfiles (cp dir/*) leaves it behind"
    )
