"""The checks of the run config's train section (``default_config.validate``),
and curriculum stages as configs of their own.

The learning-rate schedule, Adam and the batch, backpropagation through
segments, early stopping (``train.stop_*``, training/early_stop.py) and the
curriculum's stages (``train.curriculum``, training/curriculum.py).  Each
``*_problems`` returns one message per problem, naming the key and the fix.
In ``run/``, not ``training/``: validating a config (which
evaluation and generation do) loads no training code.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Collection, Mapping
from typing import Any

import ml_collections

from transformer_xl.data import synthetic

NONFINITE_POLICIES = ("stop", "skip")  # train.nonfinite


STOP_LOWER_IS_BETTER = ("loss_nats", "ppl", "bpc")
STOP_ANSWER_METRICS = ("answer_accuracy", "answer_token_accuracy")
# Validation metrics a run can stop on: every corpus's, and the example corpora's answers.
STOP_METRICS = (*STOP_LOWER_IS_BETTER, *STOP_ANSWER_METRICS)


def stop_problems(
    train_cfg: Mapping[str, Any], example_corpus: bool, nonfinite: Collection[str] = ()
) -> list[str]:
  """What is wrong with ``train.stop_*`` (early stopping, training/early_stop.py); ``example_corpus``: the data is
  whole examples with answers (a synthetic task, BABILong); ``nonfinite``:
  the keys already refused as NaN or infinite (not checked again)."""
  metric = train_cfg.get("stop_metric", "")
  target, patience = train_cfg.get("stop_target", 0.0), train_cfg.get("stop_patience", 0)
  if "train.stop_target" in nonfinite:
    target = 0.0
  if not metric:
    if target or patience:
      return [
          f"train.stop_target={target} and train.stop_patience={patience} need "
          f"train.stop_metric: set it to one of {', '.join(STOP_METRICS)}."
      ]
    return []
  if metric not in STOP_METRICS:
    return [f"train.stop_metric={metric!r}: use one of {', '.join(STOP_METRICS)} (or '' for none)."]
  problems = []
  if metric in STOP_ANSWER_METRICS and not example_corpus:
    problems.append(
        f"train.stop_metric={metric!r} is measured on tasks with answers (data.dataset "
        "'synthetic:TASK' or 'babilong:qaN'): use loss_nats, ppl or bpc."
    )
  if not isinstance(patience, int) or patience < 0:
    problems.append(f"train.stop_patience={patience!r} must be an integer >= 0 (0 = off).")
  if not isinstance(target, (int, float)) or not math.isfinite(target) or target < 0:
    problems.append(f"train.stop_target={target!r} must be a finite number >= 0.")
  elif metric not in STOP_LOWER_IS_BETTER and target > 1:
    problems.append(f"train.stop_target={target} is an accuracy: use a value in [0, 1].")
  if not problems and not patience and not target:
    problems.append(f"train.stop_metric={metric!r} needs train.stop_target or train.stop_patience.")
  if train_cfg.get("eval_every", 1) == 0:
    problems.append(
        "train.stop_metric needs validations: set train.eval_every > 0 (steps between them)."
    )
  return problems


CURRICULUM_FIXED = ("train.curriculum", "train.init_from")  # set by the curriculum itself


def stage_overrides(text: str) -> dict[str, Any]:
  """A curriculum stage's ``"KEY=VALUE KEY=VALUE"``: {dotted key: value}
  (values read as Python literals, e.g. ``2``, ``0.5``, ``(1, 2)``, ``True``;
  anything else as a string).

  Raises:
    ValueError: an entry is not KEY=VALUE, or a key repeats.
  """
  out: dict[str, Any] = {}
  for item in str(text).split():
    key, eq, raw = item.partition("=")
    if not eq or not key:
      raise ValueError(f"{item!r} is not KEY=VALUE (e.g. data.synthetic_num_pairs=2)")
    if key in out:
      raise ValueError(f"{key} is set twice")
    try:
      out[key] = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
      out[key] = raw
  return out


def stage_config(config: ml_collections.ConfigDict, i: int) -> ml_collections.ConfigDict:
  """``config`` with curriculum stage ``i``'s overrides (``train.curriculum[i]``)
  and no curriculum of its own.

  Raises:
    ValueError: a malformed stage, an unknown key, a key the curriculum
      sets itself (``CURRICULUM_FIXED``), or a value of another type.
  """
  out = ml_collections.ConfigDict(config.to_dict())
  out.train.curriculum = ()
  for key, value in stage_overrides(config.train.curriculum[i]).items():
    if key in CURRICULUM_FIXED:
      raise ValueError(f"{key} is set by the curriculum itself; remove it from the stage")
    *path, name = key.split(".")
    section = out
    try:
      for part in path:
        section = section[part]
      if not isinstance(section, ml_collections.ConfigDict) or name not in section:
        raise KeyError(key)
      section[name] = value
    except KeyError:
      raise ValueError(f"{key} is not a config key (e.g. data.synthetic_num_pairs)") from None
    except TypeError as err:
      raise ValueError(f"{key}={value!r}: {err}") from None
  return out


def schedule_problems(t: ml_collections.ConfigDict, nonfinite: set[str]) -> list[str]:
  """The learning-rate schedule's ranges beyond the signs checked in ``default_config.validate``
  (``nonfinite``: the keys ``nonfinite_problems`` refused, not checked again)."""
  problems = []
  if (
      {"train.learning_rate", "train.min_lr"}.isdisjoint(nonfinite)
      and 0 <= t.min_lr
      and 0 < t.learning_rate < t.min_lr
  ):
    problems.append(
        f"train.min_lr={t.min_lr} must be <= train.learning_rate="
        f"{t.learning_rate} (the cosine decays from learning_rate to min_lr)."
    )
  schedule, span = t.get("schedule", "cosine"), t.get("schedule_steps", 0)
  if schedule not in ("cosine", "linear"):
    problems.append(f"train.schedule={schedule!r}: use 'cosine' or 'linear'.")
  if not isinstance(span, int) or isinstance(span, bool) or span < 0:
    problems.append(f"train.schedule_steps={span!r} must be an integer >= 0 (0 = num_steps).")
  elif span and span < t.warmup_steps:
    problems.append(
        f"train.schedule_steps={span} must be >= train.warmup_steps={t.warmup_steps} (the "
        "decay follows the warmup), or 0 (num_steps)."
    )
  if t.num_steps >= 1 and t.warmup_steps > t.num_steps:
    problems.append(
        f"train.warmup_steps={t.warmup_steps} must be <= train.num_steps="
        f"{t.num_steps}; lower --config.train.warmup_steps."
    )
  return problems


def bptt_problems(config: ml_collections.ConfigDict) -> list[str]:
  """``train.mem_backprop_depth`` and ``train.bptt_bp``: an integer depth >= 0
  (> 0 only with a memory that carries the gradient between segments:
  ``memory.run_problems``), bptt_bp only with a depth; ``train.vary_n_segments``
  only on ``synthetic:armt_retrieval`` trained on whole examples."""
  t = config.train
  depth = t.get("mem_backprop_depth", 0)
  if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
    return [f"train.mem_backprop_depth={depth!r} must be an integer >= 0 (0 = none)."]
  if t.get("bptt_bp", False) and depth == 0:
    return ["train.bptt_bp=True needs train.mem_backprop_depth > 0 (no earlier segment)."]
  if t.get("vary_n_segments", False):
    if config.data.dataset != synthetic.PREFIX + synthetic.ARMT:
      return [
          f"train.vary_n_segments=True varies the pairs of data.dataset="
          f"'synthetic:armt_retrieval', not {config.data.dataset!r}: set it False."
      ]
    pairs = config.data.get("synthetic_num_pairs", 0)
    if depth != pairs or not t.get("bptt_bp", False):
      return [
          "train.vary_n_segments=True trains on whole examples of up to "
          f"data.synthetic_num_pairs={pairs} pairs: set train.mem_backprop_depth={pairs} "
          "and train.bptt_bp=True."
      ]
  return []


def optimizer_problems(t: ml_collections.ConfigDict, nonfinite: set[str]) -> list[str]:
  """Adam's hyperparameters, the batch and the non-finite policy (``nonfinite``:
  the keys ``nonfinite_problems`` refused, not checked again)."""
  problems = []
  for key in ("adam_b1", "adam_b2"):
    if f"train.{key}" not in nonfinite and not 0.0 <= t[key] < 1.0:
      problems.append(f"train.{key}={t[key]} must be in [0, 1) (Adam's decay rate).")
  if "train.adam_eps" not in nonfinite and not 0.0 < t.adam_eps:
    problems.append(f"train.adam_eps={t.adam_eps} must be > 0.")
  if t.global_batch < 1:
    problems.append(f"train.global_batch={t.global_batch} must be >= 1.")
  if t.nonfinite not in NONFINITE_POLICIES:
    problems.append(f"train.nonfinite={t.nonfinite!r}: use one of {NONFINITE_POLICIES}.")
  if t.prefetch < 0:
    problems.append(f"train.prefetch={t.prefetch} must be >= 0 (0 = no background thread).")
  if t.max_skipped_steps < 1:
    problems.append(f"train.max_skipped_steps={t.max_skipped_steps} must be >= 1.")
  if "train.aux_loss_weight" not in nonfinite and not t.aux_loss_weight >= 0:
    problems.append(
        f"train.aux_loss_weight={t.aux_loss_weight} must be >= 0 (the weight of "
        "the auxiliary losses)."
    )
  return problems
