"""The training loop's guards: the clean stop of a preempted run
(``PreemptionGuard``), the non-finite policy (``NonFiniteGuard``,
``train.nonfinite``) and the checkpoints set aside after a divergence
(``set_aside_diverged``).  Used by ``train.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np

from transformer_xl.run import distributed, metrics, run_dir


class PreemptionGuard:
  """Agrees across processes on a request to stop (SIGTERM on a preempted
  Cloud TPU VM), so that every process writes its checkpoint after the same
  step.

  ``stop_requested`` is this process's flag (the command line passes
  ``process_settings.StopSignals.received``: SIGTERM or Ctrl-C).  With several processes the
  flag is agreed on by an all-gather every ``sync_every`` steps (not every
  step: the all-gather waits for the devices and would stall the pipelined
  dispatch of steps), as a SIGTERM reaches the workers of a slice at
  slightly different times.
  """

  def __init__(self, stop_requested: Callable[[], bool], sync_every: int = 10):
    self._stop_requested = stop_requested
    self._sync_every = sync_every

  def should_stop(self, step: int) -> bool:
    """True on every process once any process's flag is set (checked at
    every step with one process, every ``sync_every`` with several)."""
    if jax.process_count() > 1 and step % self._sync_every:
      return False
    return distributed.any_process(bool(self._stop_requested()))


class NonFiniteGuard:
  """The host side of the non-finite policy (``train.nonfinite``).

  The train step never applies a step whose loss, gradient norm or updated
  parameters are not finite (``make_train_step``); the host learns of it
  when it reads the metrics anyway: at log steps, and before every
  checkpoint (so that a checkpoint is only written once every step since
  the last check is known).  Every process reads the same replicated flags
  and so takes the same decision.

  Policies: "stop" raises at the first non-finite step; "skip" reports it,
  counts it (``skipped``), and raises once ``max_skipped`` steps in a row
  were skipped.

  Args:
    policy: "stop" or "skip".
    max_skipped: the run stops when this many steps in a row were skipped.
    train_cfg: ``config.train`` (quoted in the advice of the message).
    last_checkpoint: returns a description of the newest good checkpoint
      (``retention.Verification.describe``).
    say: where "skip" reports each skipped step.
  """

  def __init__(
      self,
      policy: str,
      max_skipped: int,
      train_cfg: ml_collections.ConfigDict,
      last_checkpoint: Callable[[], str],
      say: Callable[[str], None],
  ):
    self.policy, self.max_skipped = policy, max_skipped
    self.skipped = 0
    self._in_a_row = []
    self._cfg = train_cfg
    self._last_checkpoint = last_checkpoint
    self._say = say

  @staticmethod
  def _what(row: Mapping[str, float]) -> str:
    bad = [
        f"the {name} is {row[key]}"
        for key, name in (("loss", "loss"), ("grad_norm", "gradient norm"))
        if not np.isfinite(row[key])
    ]
    return " and ".join(bad) or "the update made parameters non-finite"

  def _advice(self) -> str:
    t = self._cfg
    return (
        f"The last good checkpoint is {self._last_checkpoint()}; nothing non-finite was "
        f"saved. Try a lower --config.train.learning_rate (now {t.learning_rate}), a "
        f"smaller --config.train.clip (now {t.clip}) or a longer "
        f"--config.train.warmup_steps (now {t.warmup_steps}): the same command with such "
        "a change resumes from that checkpoint."
    )

  def check(self, rows: list[Mapping[str, Any]]) -> int:
    """Applies the policy to the metrics of consecutive steps, in order.

    Args:
      rows: host metrics of steps, each with ``step``, ``loss``,
        ``grad_norm`` and ``finite``.

    Returns:
      How many of ``rows`` were skipped.

    Raises:
      metrics.NonFiniteError: "stop" and a non-finite step, or "skip" and
        ``max_skipped`` skipped steps in a row.
    """
    skipped = 0
    for row in rows:
      if row["finite"]:
        self._in_a_row = []
        continue
      if self.policy == "stop":
        raise metrics.NonFiniteError(
            f"step {row['step']}: {self._what(row)} (train.nonfinite=stop): the run stopped "
            f"before applying that step. {self._advice()} "
            "(--config.train.nonfinite=skip skips such steps instead.)"
        )
      skipped += 1
      self.skipped += 1
      self._in_a_row.append(row["step"])
      self._say(
          f"step {row['step']}: {self._what(row)}; the update was skipped "
          f"({len(self._in_a_row)} in a row, at most {self.max_skipped})."
      )
      if len(self._in_a_row) >= self.max_skipped:
        raise metrics.NonFiniteError(
            f"steps {self._in_a_row[0]} to {self._in_a_row[-1]}: {len(self._in_a_row)} steps in "
            f"a row had a non-finite loss or gradient (train.max_skipped_steps="
            f"{self.max_skipped}); the run stopped. {self._advice()}"
        )
    return skipped


def set_aside_diverged(
    rundir: run_dir.RunDir, err: metrics.NonFiniteError
) -> metrics.NonFiniteError | None:
  """Sets aside the checkpoints saved after the newest good one (a step
  computed from them was not finite); returns ``err`` extended with where
  they went, or None when there were none."""
  went = rundir.set_aside_unverified(
      "set aside when the run diverged: a step computed from it was not finite"
  )
  if not went:
    return None
  where = (
      "deleted (this file system cannot move them)"
      if "deleted" in went
      else f"moved to {rundir.rejected_dir}"
  )
  return metrics.NonFiniteError(
      f"{err} The {len(went)} checkpoint(s) saved after it were {where} (a step computed "
      "from them was not finite)."
  )
