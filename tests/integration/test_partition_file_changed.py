"""A tp run whose partition file is replaced after training (``dmt-partition --overwrite``, an
edit): its checkpoints record the towers it trained with (``model.partition.recorded_towers`` in
their ``config.yaml``). Readers build those, and a resume is refused, naming the file and what
changed.

Reproduced bugs: with the same features in another order within a tower, ``dmt-eval`` loaded the
weights into a model that fed them other features (another AUC, no word of it) and a resume
trained on that way; with other towers, it failed at the tensor names without naming the file.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import yaml

from dmt.evaluate import evaluate, load_model, open_checkpoint, read_config
from dmt.export import export
from dmt.train import train
from tests.conftest import compose_config

NAMES = [f"cat_{i}" for i in range(8)]
TOWERS = [["cat_0", "cat_3", "cat_5", "cat_6"], ["cat_1", "cat_2", "cat_4", "cat_7"]]
PERMUTED = [list(reversed(t)) for t in TOWERS]  # the same towers, another feature order
THREE = [NAMES[0:3], NAMES[3:6], NAMES[6:]]
TINY = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_sparse=8",
    "data.synthetic.num_train=1024",
    "data.synthetic.num_val=256",
    "data.synthetic.num_test=512",
    "data.batch_size=256",
    "data.eval_batch_size=256",
    "trainer.eval_max_batches=-1",
    "experiment=dmt_4t_dlrm",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
    "partition=tp",
    "model.partition.num_towers=null",
]


def _write(path: Path, towers: list[list[str]]) -> None:
    path.write_text(yaml.safe_dump({"towers": towers, "strategy": "coherent"}))


def _train(run: Path, partition: Path, *overrides: str) -> dict[str, float]:
    return train(compose_config(*TINY, f"model.partition.path={partition}", *overrides), run)


@pytest.fixture
def tp_run(tmp_path: Path, one_thread: None) -> tuple[Path, Path]:
    """A 4-step DMT run on the towers of ``tmp_path/tp/partition.yaml``, checkpoints at 2 and 4."""
    partition = tmp_path / "tp" / "partition.yaml"
    partition.parent.mkdir()
    _write(partition, TOWERS)
    _train(tmp_path / "run", partition, "trainer.max_steps=4", "trainer.checkpoint_every=2")
    return tmp_path / "run", partition


def test_a_checkpoint_loads_the_towers_it_trained_with_after_its_file_was_replaced(
    tp_run: tuple[Path, Path], tmp_path: Path
) -> None:
    run, partition = tp_run
    checkpoints = run / "checkpoints"
    trained = evaluate(checkpoints, "test")

    _write(partition, PERMUTED)
    with pytest.warns(UserWarning) as caught:
        model = load_model(open_checkpoint(checkpoints))
    assert model.partition == TOWERS  # was PERMUTED: the weights fed other features
    assert (
        f"partition file {str(partition)!r} no longer holds the towers the run trained with "
        "(tower 0: [cat_0, cat_3, cat_5, cat_6] -> [cat_6, cat_5, cat_3, cat_0] (the same "
        "features in another order); tower 1: [cat_1, cat_2, cat_4, cat_7] -> "
        "[cat_7, cat_4, cat_2, cat_1] (the same features in another order)); building the "
        "towers the run trained with (model.partition.recorded_towers), not the file's"
    ) in [str(w.message) for w in caught]
    with pytest.warns(UserWarning, match="no longer holds the towers the run trained with"):
        assert evaluate(checkpoints, "test") == trained  # was another AUC, logloss, ...
    saved = yaml.safe_load((checkpoints / "step_4" / "config.yaml").read_text())
    assert saved["model"]["partition"]["recorded_towers"] == TOWERS

    _write(partition, THREE)  # other towers: the model loads all the same (it was refused)
    with pytest.warns(UserWarning, match=r"\(2 towers -> 3; tower 0: "):
        assert evaluate(checkpoints, "test") == trained
    # an export's config carries them too: a model rebuilt from it alone has the run's towers
    out = export(checkpoints, tmp_path / "model.pt")
    conf = read_config(out.with_name("model.pt.config.yaml"))
    assert conf.model.partition.recorded_towers == TOWERS


def test_a_resume_whose_partition_file_changed_is_refused_naming_it(
    tp_run: tuple[Path, Path], tmp_path: Path
) -> None:
    run, partition = tp_run
    step_2 = run / "checkpoints" / "step_2"
    resumed = tmp_path / "resumed"
    for towers, change in [
        (
            PERMUTED,
            "tower 0: [cat_0, cat_3, cat_5, cat_6] -> [cat_6, cat_5, cat_3, cat_0] (the same "
            "features in another order); tower 1: ",
        ),
        (THREE, "2 towers -> 3; tower 0: [cat_0, cat_3, cat_5, cat_6] -> [cat_0, cat_1, cat_2]"),
    ]:
        _write(partition, towers)
        with pytest.raises(ValueError) as e:  # the permuted file resumed without a word
            _train(resumed, partition, "trainer.max_steps=4", f"trainer.resume_from={step_2}")
        assert str(e.value).startswith(
            f"cannot resume from {step_2}: this run's config differs from the checkpoint's "
            f"{step_2 / 'config.yaml'} in model.partition.recorded_towers: partition file "
            f"{str(partition)!r} holds other towers than the checkpoint trained ({change}"
        )
        assert not (resumed / "checkpoints").exists()
    _write(partition, TOWERS)  # the file the run trained with: it resumes
    metrics = _train(resumed, partition, "trainer.max_steps=4", f"trainer.resume_from={step_2}")
    assert metrics["num_steps"] == 4


def test_a_checkpoint_of_an_older_dmt_without_recorded_towers(
    tp_run: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its towers come from the file (a warning says so); a file with other towers is named in
    the error. Hydra's record of a run (no recorded towers) is no other config than its
    checkpoint's."""
    run, partition = tp_run
    checkpoints = run / "checkpoints"
    trained = evaluate(checkpoints, "test")
    hydra_like = tmp_path / "config.yaml"  # a config as Hydra records it, before the file is read
    for step in ("step_2", "step_4"):
        config = checkpoints / step / "config.yaml"
        saved = yaml.safe_load(config.read_text())
        del saved["model"]["partition"]["recorded_towers"]
        if step == "step_4":
            shutil.copy(config, tmp_path / "new_config.yaml")
        config.write_text(yaml.safe_dump(saved))
    hydra_like.write_text(yaml.safe_dump(saved))
    older = f"{checkpoints / 'step_4' / 'config.yaml'} does not record the towers of partition file"
    with pytest.warns(UserWarning, match=older):
        model = load_model(open_checkpoint(checkpoints))
    assert model.partition == TOWERS
    _write(partition, THREE)
    with pytest.raises(ValueError) as e, pytest.warns(UserWarning, match=older):
        load_model(open_checkpoint(checkpoints))
    assert str(e.value).endswith(
        f"; the towers come from partition file {partition} (was it replaced since the run "
        "trained?)"
    )
    _write(partition, TOWERS)
    with caplog.at_level(logging.WARNING, logger="dmt.checkpoint"):
        metrics = _train(
            tmp_path / "resumed",
            partition,
            "trainer.max_steps=4",
            f"trainer.resume_from={checkpoints / 'step_2'}",
        )
    assert metrics["num_steps"] == 4
    assert (
        f"checkpoint {checkpoints / 'step_2'} was saved by a dmt that did not record the towers "
        f"of its partition file: {partition} is not checked against them"
    ) in caplog.text

    shutil.copy(tmp_path / "new_config.yaml", checkpoints / "step_4" / "config.yaml")
    ckpt = open_checkpoint(checkpoints, config=hydra_like)  # not refused for them
    assert ckpt.config.model.partition.recorded_towers == TOWERS
    assert evaluate(checkpoints, "test", config=hydra_like) == trained
