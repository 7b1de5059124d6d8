"""Early stopping on a validation metric (``train.stop_metric``, ``stop_target``, ``stop_patience``).

The ARMT and RMT authors' trainer (``lm_experiments_tools/trainer.py``, the
``Trainer`` of RodkinIvan/associative-recurrent-memory-transformer and
booydar/LM-RMT) stops a run when the validation metric reaches a target
(their ``stop_metric_condition``, ``--desired_metric``) or has not improved
for ``--early_stopping_patience`` validations in a row; their curricula
move on to the next stage then.  Here:

* ``train.stop_metric``: a validation metric (``train_checks.STOP_METRICS``,
  checked by ``train_checks.stop_problems``; "" = never stop early); accuracies count as better when higher, ``loss_nats``, ``ppl``
  and ``bpc`` when lower;
* ``train.stop_target``: stop once the metric is at least as good (0 with a
  higher-is-better metric, or with ``stop_patience`` alone: no target);
* ``train.stop_patience``: stop after this many validations in a row
  without a new best (0 = never).

The decision is taken after a validation; the run then writes
``early_stop.json`` in its workdir and then the step's checkpoint, so that
the same command run again finds both and does nothing (a marker without
its checkpoint, from a run killed between the two, is stale: the run
resumes from its last checkpoint, reaches the same validation and stops
there again).  The patience counter is rebuilt on resume from the
validations in ``metrics.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import jax
from etils import epath

from transformer_xl.run import metrics, train_checks
from transformer_xl.util import files

MARKER = "early_stop.json"
LOWER_IS_BETTER = train_checks.STOP_LOWER_IS_BETTER  # the settings' checks: config_checks


def corpus_problem(metric: str, unit: str, has_answers: bool) -> str | None:
  """Why ``train.stop_metric`` is not measured on a corpus of ``unit``
  (``bpc`` on a word-level corpus, ``ppl`` on a byte-level one) or without
  answers; None: it is (or it is off)."""
  if not metric:
    return None
  reported = metrics.metric_name(unit)
  if metric in ("bpc", "ppl") and metric != reported:
    return (
        f"train.stop_metric={metric!r}: this corpus's validation reports {reported} "
        f"({unit}-level): use {reported!r} or 'loss_nats'."
    )
  if metric in train_checks.STOP_ANSWER_METRICS and not has_answers:
    return f"train.stop_metric={metric!r} needs a task with answers: use loss_nats or {reported}."
  return None


@dataclasses.dataclass
class EarlyStop:
  """The decision, validation by validation (``train.stop_*``)."""

  metric: str = ""
  target: float = 0.0
  patience: int = 0
  best: float | None = None
  since_best: int = 0

  @classmethod
  def from_config(cls, train_cfg: Mapping[str, Any]) -> EarlyStop:
    return cls(
        train_cfg.get("stop_metric", ""),
        float(train_cfg.get("stop_target", 0.0)),
        int(train_cfg.get("stop_patience", 0)),
    )

  @property
  def enabled(self) -> bool:
    return bool(self.metric)

  def _better(self, a: float, b: float) -> bool:
    return a < b if self.metric in LOWER_IS_BETTER else a > b

  def update(self, value: float | None) -> str | None:
    """Records one validation's value of the metric (None or NaN: no
    value); returns why the run stops now, or None."""
    if not self.enabled or value is None or not math.isfinite(value):
      if self.enabled:
        self.since_best += 1
      return self._patience_reason()
    lower = self.metric in LOWER_IS_BETTER
    if self.best is None or self._better(value, self.best):
      self.best, self.since_best = value, 0
    else:
      self.since_best += 1
    if self.target and (value <= self.target if lower else value >= self.target):
      return f"valid {self.metric}={value:.4g} reached train.stop_target={self.target:g}"
    return self._patience_reason()

  def _patience_reason(self) -> str | None:
    if self.patience and self.since_best >= self.patience:
      return (
          f"valid {self.metric} has not improved on {self.best} for {self.since_best} "
          f"validations (train.stop_patience={self.patience})"
      )
    return None

  def replay(self, rows: list[Mapping[str, Any]], up_to_step: int) -> None:
    """Rebuilds the best value and the patience counter from the
    validation rows of metrics.jsonl up to ``up_to_step`` (a resumed run)."""
    if not self.enabled:
      return
    key = f"valid/{self.metric}"
    for row in sorted(rows, key=lambda r: r["step"]):
      if row["step"] <= up_to_step and key in row:
        self.update(row[key])


def write_marker(workdir: str, step: int, reason: str) -> None:
  """``early_stop.json``: the run stopped early at ``step`` (process 0 writes)."""
  if jax.process_index() == 0:
    text = json.dumps({"step": step, "reason": reason}, indent=2) + "\n"
    files.write_text_atomic(epath.Path(workdir) / MARKER, text)


def stopped_at(workdir: str) -> tuple[int, str] | None:
  """(step, reason) of a run that stopped early, from its marker; None: none."""
  path = epath.Path(workdir) / MARKER
  if not path.exists():
    return None
  try:
    record = json.loads(path.read_text())
    return int(record["step"]), str(record["reason"])
  except (ValueError, KeyError, TypeError):
    return None
