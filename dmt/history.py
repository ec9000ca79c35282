"""What a person looks at after a run: ``history.jsonl`` and ``curves.png`` (rank 0).

``history.jsonl`` holds one JSON object a line, appended and flushed as the run goes:

- at every ``trainer.log_every`` step: ``{"step", "samples", "train/loss", "train/lr",
  "train/samples_per_s"}``; ``train/lr`` lists the LR of each optimizer param group for that
  step's update (TorchRec's fused embedding group first, then the dense one);
  ``train/samples_per_s`` is the throughput since the previous record (a resumed attempt's
  first: since its checkpoint's step, which need not be a log step), training time only, and
  left out when no training time passed (not measured, which a ``null`` would not say);
- at every evaluation: ``{"step", "samples", "val/auc", "val/logloss", "val/ne",
  "val/calibration", "val/num_samples"}``, and at the end ``test/...`` the same way.

``samples`` is ``step * data.batch_size`` (global batches); values that are not finite (the AUC
of a split without rows or clicks) are ``null``. The names are the ones logged to wandb.
``curves.png`` plots training loss, validation AUC and throughput against samples seen; it is
redrawn at every validation and at the end where a training record came after the last drawing
(test records are not drawn), written to a temporary file and renamed, so it is never
half-written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any

from dmt.results import write_atomic

HISTORY_FILE = "history.jsonl"
CURVES_FILE = "curves.png"


class RunHistory:
    """Appends a run's log steps and evaluations to ``history.jsonl`` and draws ``curves.png``.

    Args:
        output_dir (Path): the run directory.
        batch_size (int): the global batch (``data.batch_size``): samples per step.
        start_step (int): the step training starts from (a resumed run's checkpoint step). Records
            of an earlier run in the same directory after that step (written after its last
            checkpoint) are dropped, so the file holds one history.

    Example::

        history = RunHistory(run_dir, batch_size=512)
        history.log_train(step=50, loss=0.47, lrs=[0.1, 0.003], train_time_s=1.2)
        history.log_eval(step=50, metrics={"auc": 0.71, "logloss": 0.47}, split="val")
        history.close()  # draws curves.png where the evaluation's drawing lacks a record
    """

    def __init__(self, output_dir: Path, *, batch_size: int, start_step: int = 0) -> None:
        self.path = Path(output_dir) / HISTORY_FILE
        self.curves_path = Path(output_dir) / CURVES_FILE
        self.batch_size = batch_size
        self.records = [r for r in read_history(self.path) if r["step"] <= start_step]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(self.path, "".join(json.dumps(r) + "\n" for r in self.records))
        self._file: IO[str] = self.path.open("a", encoding="utf-8")
        self._last_step = start_step  # throughput since the previous training record
        self._last_time = 0.0
        self._undrawn = True  # curves.png lacks a record it draws (or was not drawn by this run)

    def log_train(
        self, *, step: int, loss: float, lrs: list[float], train_time_s: float
    ) -> dict[str, Any]:
        """Record a log step; ``train_time_s`` is this process's training time so far (not
        counting evaluations and checkpoints). Returns the record."""
        elapsed = train_time_s - self._last_time
        values: dict[str, Any] = {"train/loss": loss, "train/lr": list(lrs)}
        if elapsed > 0:  # else not measured: no value rather than null, which reads as not finite
            values["train/samples_per_s"] = (step - self._last_step) * self.batch_size / elapsed
        self._last_step, self._last_time = step, train_time_s
        self._undrawn = True
        return self._append(values, step)

    def has_eval(self, step: int, split: str) -> bool:
        """An evaluation of ``split`` at ``step`` is recorded (an earlier attempt's, when a
        resumed run had ended there)."""
        return bool(self._evals_at(step, split))

    def _evals_at(self, step: int, split: str) -> list[int]:
        """The indices in :attr:`records` of evaluations of ``split`` at ``step``."""
        prefix = f"{split}/"
        return [
            i
            for i, r in enumerate(self.records)
            if r["step"] == step and any(k.startswith(prefix) for k in r)
        ]

    def log_eval(self, *, step: int, metrics: dict[str, float], split: str) -> dict[str, Any]:
        """Record an evaluation of ``split`` (``val`` or ``test``); a validation redraws
        ``curves.png`` (which draws no test records). It replaces an earlier attempt's
        evaluation of ``split`` at ``step`` (a resumed run that had ended there is evaluated
        again): one evaluation per split and step."""
        values = {f"{split}/{k}": v for k, v in metrics.items()}
        earlier = self._evals_at(step, split)
        if not earlier:
            record = self._append(values, step)
        else:  # in the earlier one's place
            record = self._record(values, step)
            self.records[earlier[0]] = _finite(record)
            self.records = [r for i, r in enumerate(self.records) if i not in earlier[1:]]
            self._file.close()
            _write_atomically(self.path, "".join(json.dumps(r) + "\n" for r in self.records))
            self._file = self.path.open("a", encoding="utf-8")
        if split == "val":
            self.plot()
        return record

    def plot(self) -> None:
        """Draw ``curves.png`` from the records so far (atomically)."""
        save_figure(curves_figure(self.records), self.curves_path)
        self._undrawn = False

    def close(self) -> None:
        """Close ``history.jsonl`` and draw ``curves.png`` if a record it draws came after the
        last drawing (a figure takes about a second: it is not drawn again for nothing)."""
        if not self._file.closed:
            self._file.close()
            if self._undrawn:
                self.plot()

    def _record(self, values: dict[str, Any], step: int) -> dict[str, Any]:
        return {"step": step, "samples": step * self.batch_size, **values}

    def _append(self, values: dict[str, Any], step: int) -> dict[str, Any]:
        """Write a record; the returned one keeps its NaN/inf (wandb's charts show them), the
        file and :attr:`records` have ``null`` in their place."""
        record = self._record(values, step)
        self.records.append(_finite(record))
        self._file.write(json.dumps(self.records[-1]) + "\n")
        self._file.flush()
        return record


def start_history(output_dir: Path) -> None:
    """Make ``output_dir`` and an empty ``history.jsonl`` in it where there is none (a history
    there is left as it is: :class:`RunHistory` keeps its records up to the resumed step). A
    run makes it before its first other output: a ``curves.png`` or ``sharding_plan.txt``
    beside no history is a user's own (:func:`dmt.run_dir.check_outputs`)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / HISTORY_FILE).touch()


def read_history(path: Path) -> list[dict[str, Any]]:
    """The records of a ``history.jsonl`` (none if absent); a last line cut off by a crash is
    skipped."""
    if not Path(path).exists():
        return []
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def curves_figure(records: list[dict[str, Any]]) -> Any:
    """Training loss, validation AUC and training throughput against samples seen."""
    from matplotlib.figure import Figure  # noqa: PLC0415 (slow import; no pyplot, no global state)

    # fixed margins: a constrained layout measured every label again, 40% of a tiny run's figure
    fig = Figure(figsize=(15, 4))
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.14, top=0.91, wspace=0.2)
    panels = (
        ("train/loss", "training loss", "tab:blue"),
        ("val/auc", "validation AUC", "tab:green"),
        ("train/samples_per_s", "training samples/s", "tab:orange"),
    )
    for ax, (key, title, color) in zip(fig.subplots(1, 3), panels, strict=True):
        points = [(r["samples"], r[key]) for r in records if r.get(key) is not None]
        nulls = [r for r in records if key in r and r[key] is None]
        # logged but not finite (written as null): a diverged run, not a missing curve; unless
        # the split leaves the metric undefined (no rows, one class), which is no divergence
        lost = [r["samples"] for r in nulls if _undefined(r, key) is None]
        undefined = sorted({why for r in nulls if (why := _undefined(r, key)) is not None})
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o" if len(points) < 30 else None, markersize=3, color=color)
        if undefined and not lost and not points:
            text = f"undefined: {'; '.join(undefined)}"
            ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
        elif lost:
            ax.axvline(lost[0], color="tab:red", linestyle="--")
            ax.text(
                0.5,
                0.5,
                f"not finite from {lost[0]:,} samples",
                ha="center",
                va="center",
                color="tab:red",
                transform=ax.transAxes,
            )
        elif not points:
            ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("samples seen")
        ax.grid(alpha=0.3)
    return fig


def _undefined(record: dict[str, Any], key: str) -> str | None:
    """Why the null ``key`` of an evaluation ``record`` is a metric its split does not define
    (:func:`dmt.metrics.click_metrics`), or None (a value that is not finite: a diverged run).
    A split without rows leaves every metric undefined; one with rows of one class its AUC and
    NE (and calibration without clicks), while its logloss stays finite unless the predictions
    are not."""
    split = key.split("/", 1)[0]
    if split not in ("val", "test"):
        return None
    if record.get(f"{split}/num_samples") == 0:
        return "no rows"
    if record.get(f"{split}/logloss") is not None:
        return "the rows are of one class"
    return None


def save_figure(fig: Any, path: Path, dpi: int = 100, *, replace: bool = True) -> None:
    """Write a matplotlib figure as PNG through a temporary file and a rename
    (:func:`dmt.results.write_atomic`; ``replace=False``: never over an existing file)."""
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi), replace=replace)


def _write_atomically(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), replace=True)


def _finite(values: dict[str, Any]) -> dict[str, Any]:
    """Non-finite floats as ``None`` (JSON ``null``; strict JSON has no NaN)."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, list):
            out[k] = [None if isinstance(x, float) and not math.isfinite(x) else x for x in v]
        elif isinstance(v, float) and not math.isfinite(v):
            out[k] = None
        else:
            out[k] = v
    return out
