"""The checks of the run config's dynamic-evaluation settings (``eval.dynamic``;
``default_config.validate``, ``dynamic_eval.DynamicSettings``).  One message
per problem, naming the key and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

DYNAMIC_RULES = ("rms", "sgd")  # eval.dynamic.rule (inference/dynamic_eval.py)


def eval_problems(
    config: ml_collections.ConfigDict, nonfinite: set[str], default: Callable[[str], Any]
) -> list[str]:
  """``eval.dynamic``'s settings (``dynamic_problems``; the
  non-finite floats already refused are not checked again), and the eval
  method dynamic evaluation needs when it is on."""
  d = config.eval.get("dynamic")
  if d is None:
    return []
  values = {k: v for k, v in d.items() if f"eval.dynamic.{k}" not in nonfinite}
  problems = dynamic_problems(values, default_decay=default("eval.dynamic.decay"))
  lr = values.get("lr", 0.0)
  if not problems and lr > 0 and config.eval.method != "segments":
    problems.append(
        f"eval.dynamic.lr={lr} (dynamic evaluation) needs eval.method='segments', not "
        f"{config.eval.method!r}: set --config.eval.method=segments or leave eval.dynamic.lr 0."
    )
  return problems


def dynamic_problems(
    values: Mapping[str, Any], section: str = "eval.dynamic.", default_decay: float = 0.0
) -> list[str]:
  """What is wrong with dynamic-evaluation settings (``eval.dynamic``;
  ``inference.dynamic_eval.DynamicSettings``); empty: nothing.

  Args:
    values: the settings by name (``DynamicSettings``' fields).
    section: the prefix the messages give the names (``--config.`` keys).
    default_decay: the config's default ``eval.dynamic.decay`` (a decay the
      'sgd' rule leaves alone).

  Returns:
    One message per problem, naming the key, its value and the fix.
  """
  p, problems = section, []
  rule = values.get("rule", "rms")
  if rule not in DYNAMIC_RULES:
    problems.append(f"{p}rule={rule!r}: use 'rms' (the authors' rule) or 'sgd'.")
  for key, bound in (("lr", ">= 0"), ("decay", ">= 0"), ("eps", "> 0")):
    v = values.get(key, 0.0 if key != "eps" else 1.0)
    ok = isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 if key == "eps" else v >= 0)
    if not ok:
      problems.append(f"{p}{key}={v} must be finite and {bound}.")
  if rule == "sgd" and values.get("decay", 0.0) not in (
      0,
      0.0,
      default_decay,
  ):
    problems.append(
        f"{p}decay={values['decay']} applies to rule='rms' only (the 'sgd' rule is plain SGD, "
        f"as the authors' --rms=False): remove it or set {p}rule=rms."
    )
  stats = values.get("stats_tokens", -1)
  if not isinstance(stats, int) or stats < -1 or stats == 0:
    problems.append(
        f"{p}stats_tokens={stats} must be -1 (the reference's 1/5000 of the training split) "
        "or a number of tokens >= 1."
    )
  batch = values.get("global_batch", 1)
  if not isinstance(batch, int) or batch < 1:
    problems.append(f"{p}global_batch={batch} must be >= 1 (the authors': 1).")
  return problems
