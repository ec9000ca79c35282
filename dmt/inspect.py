"""``dmt-inspect <hydra overrides>``: parameters and training MFLOPs/sample of a model config;
for DMT models also the towers' output sizes ``O_t`` and the compression ratio ``|F| N / sum_t O_t``.

The model is built on the meta device, so paper-sized models (22G parameters) cost no memory.
Writes ``inspect.json`` in the Hydra run directory. A run directory that holds a training run's
outputs is refused, one that holds an earlier ``inspect.json`` too unless ``overwrite=true``, as
``dmt-plan`` does (:mod:`dmt.planning.run_dir`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dmt.config import Config, register_configs
from dmt.data.synthetic import cardinalities
from dmt.models import DMTModel, build_model
from dmt.models.accounting import model_stats
from dmt.planning.run_dir import PlanRunDirGuard, RunOutput, one_line_errors, write_run_output
from dmt.train import CONF_PATH, to_config

INSPECT = RunOutput("inspect.json", "report", "dmt-inspect")


@dataclass
class InspectConfig(Config):
    """``dmt-inspect``'s root config: the training config, and whether to replace a report."""

    overwrite: bool = False  # replace an earlier inspect.json in hydra.run.dir (a training run's directory is always refused: dmt.planning.run_dir)


def register_inspect_configs() -> None:
    """Register the training schemas and ``base_inspect_config``."""
    register_configs()
    ConfigStore.instance().store(name="base_inspect_config", node=InspectConfig)


register_inspect_configs()


class InspectRunDirGuard(PlanRunDirGuard):
    """:class:`~dmt.planning.run_dir.PlanRunDirGuard` for ``inspect.json`` (``conf/inspect.yaml``):
    a training run's directory, or an earlier report's unless ``overwrite=true``, is refused
    before Hydra writes there."""

    output = INSPECT

    def check_config(self, conf: Any) -> None:
        """The whole report, without writing it (the model on ``meta``: a fraction of a
        second): the training config's checks, the data's schema, the towers."""
        inspect_config(to_config(conf))


def schema(conf: Config) -> tuple[list[str], list[int], int]:
    """Feature names, table sizes and dense count, without loading any data."""
    d = conf.data
    if d.kind == "synthetic":
        names = [f"cat_{i}" for i in range(d.synthetic.num_sparse)]
        return names, cardinalities(d.synthetic), d.synthetic.num_dense
    from dmt.data.criteo_dataset import criteo_schema  # noqa: PLC0415

    return criteo_schema(d)


def inspect_config(conf: Config) -> dict[str, Any]:
    names, cards, num_dense = schema(conf)
    model = build_model(
        conf.model,
        feature_names=names,
        cardinalities=cards,
        num_dense=num_dense,
        table_device="meta",
        dense_device="meta",
    )
    report: dict[str, Any] = {
        "model": conf.model.name,
        "interaction": type(model.interaction).__name__,
        "num_features": len(names),
    }
    if isinstance(model, DMTModel):  # model.partition.kind != "none"
        report["tower_module"] = type(model.towers[0].tower_module).__name__
        report["partition"] = conf.model.partition.kind
    report.update({k: v for k, v in asdict(model_stats(model)).items() if v is not None})
    report["num_parameters_g"] = report["num_parameters"] / 1e9
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"{k:28s} {v:,.4f}" if isinstance(v, float) else f"{k:28s} {v}" for k, v in report.items()
    ]
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path=CONF_PATH, config_name="inspect")
def main(cfg: DictConfig) -> None:
    conf = OmegaConf.to_object(cfg)
    assert isinstance(conf, InspectConfig)
    out = Path(HydraConfig.get().runtime.output_dir)
    # InspectRunDirGuard checked a run's directory before Hydra wrote there; a sweep's job is
    # checked here, and an earlier report replaced only by the new one (write_run_output)
    with one_line_errors():
        report = write_run_output(
            out,
            lambda: inspect_config(to_config(conf)),
            overwrite=conf.overwrite,
            checkpoint_dir=conf.trainer.checkpoint_dir,
            output=INSPECT,
        )
    print(format_report(report))
    print(f"written to {out / INSPECT.file}")


if __name__ == "__main__":
    main()
