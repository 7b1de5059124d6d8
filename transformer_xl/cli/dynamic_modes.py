"""Dynamic evaluation on the command line (``--mode=eval`` and ``--mode=score``).

``cli/modes.py`` and ``cli/eval_modes.py`` call these; the method itself is
``inference/dynamic_eval.py``.  Here: the checks of ``--dynamic_stats``
against the mode and ``config.eval.dynamic`` (before anything is loaded),
reading it, the statistics pass with its report (the same for both modes),
and the scoring of a split or of token streams.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ml_collections
import numpy as np

from transformer_xl import data, default_config
from transformer_xl.cli import user_errors
from transformer_xl.inference import dynamic_eval, evaluate, text_scores
from transformer_xl.util import report


def check_request(mode: str, dynamic_stats: str | None, config: ml_collections.ConfigDict) -> None:
  """Checks ``--dynamic_stats`` against the mode and ``config.eval.dynamic``
  before anything is loaded, and notes where dynamic evaluation is not used.

  Raises:
    default_config.ConfigError: ``--dynamic_stats`` outside ``--mode=score``,
      without dynamic evaluation, or with the "sgd" rule (no statistics).
  """
  dynamic = dynamic_eval.DynamicSettings.from_config(config)
  if dynamic_stats and mode != "score":
    raise default_config.ConfigError(
        f"--dynamic_stats is read by --mode=score only (--mode={mode}"
        + (
            ": its statistics come from the training split, eval.dynamic.stats_tokens of it)."
            if mode == "eval"
            else ")."
        )
    )
  if dynamic_stats and not dynamic.enabled:
    raise default_config.ConfigError(
        f"--dynamic_stats={dynamic_stats} is for dynamic evaluation, which is off "
        "(eval.dynamic.lr=0): set --config.eval.dynamic.lr (e.g. 2e-6) or leave out "
        "--dynamic_stats."
    )
  if dynamic_stats and not dynamic.needs_statistics:
    raise default_config.ConfigError(
        f"--dynamic_stats={dynamic_stats}: eval.dynamic.rule={dynamic.rule!r} uses no "
        "statistics; leave it out, or set --config.eval.dynamic.rule=rms."
    )
  if dynamic.enabled and mode in ("train", "generate"):
    report.log(
        f"Note: eval.dynamic.lr={dynamic.lr}: dynamic evaluation is used by --mode=eval and "
        f"--mode=score, not by --mode={mode}."
    )


def stats_tokens(corpus: data.Corpus, path: str) -> np.ndarray:
  """``--dynamic_stats=FILE`` as token rows: a .npy array [B, T+1] as
  ``--tokens``, or a text file as ``--text`` ([1, N+1]: the boundary symbol,
  then the text's N tokens).

  Raises:
    evaluate.ScoreInputError: missing, not a token array or UTF-8 text, or
      no token.
    data.DataError: a symbol the corpus cannot encode.
  """
  if path.endswith(".npy"):
    return user_errors.load_tokens(path, flag="--dynamic_stats")
  text = user_errors.read_text(path, flag="--dynamic_stats")
  tokens = text_scores.text_tokens(corpus, text)
  if tokens.shape[1] < 2:
    raise evaluate.ScoreInputError(
        f"--dynamic_stats={path} has no token: give some text of the kind the model scores."
    )
  report.log(f"--dynamic_stats={path}: {tokens.shape[1] - 1:,} tokens of statistics text.")
  return tokens


def split_scorer(
    config: ml_collections.ConfigDict,
    evaluator: evaluate.Evaluator,
    params: Any,
) -> tuple[Callable[[str], dict], dict | None]:
  """How ``--mode=eval`` scores a split: ``evaluator.evaluate`` (for a
  synthetic task with ``evaluator.greedy_answers``' accuracies), or with
  ``eval.dynamic.lr > 0`` dynamic evaluation from the loaded parameters for
  each split, its "rms" statistics from the start of the training split
  (computed once, here).

  Returns:
    (split -> results, the dynamic settings and statistics' size recorded in
    eval_results.json, or None).

  Raises:
    data.DataError: the corpus has no training split for the statistics.
  """
  settings = dynamic_eval.DynamicSettings.from_config(config)
  if not settings.enabled:
    if evaluator.whole:  # eval.documents="whole": per-document results too
      return (lambda split: evaluator.evaluate_documents(params, split)), None
    if evaluator.answers:  # a synthetic task: the answers decoded greedily too
      return (
          lambda split: {
              **evaluator.evaluate(params, split),
              **evaluator.greedy_answers(params, split),
          }
      ), None
    return (lambda split: evaluator.evaluate(params, split)), None
  dyn = dynamic_eval.DynamicEvaluator(evaluator, settings)
  ss, record = statistics(dyn, params)

  def score_split(split: str) -> dict:
    start = time.perf_counter()
    r = dyn.evaluate(params, split, ss)
    seconds = time.perf_counter() - start
    report.log(
        f"{split}: dynamic evaluation of {r['tokens']:,} tokens in {seconds:.1f} s "
        f"({r['tokens'] / max(seconds, 1e-9):,.0f} tokens/s)."
    )
    return r

  return score_split, record


def statistics(
    dyn: dynamic_eval.DynamicEvaluator, params: Any, tokens_BxT1: np.ndarray | None = None
) -> tuple[Any, dict]:
  """The "rms" statistics, from ``tokens_BxT1`` (``--dynamic_stats``) or the
  start of the evaluator's corpus's training split, with the report: the
  settings, the tokens read and the time, and the pull-back warning
  (``dynamic_eval.check_pull_back``).

  Returns:
    (ss, or None for the "sgd" rule; the settings as recorded in results,
    with ``stats_tokens_read``).

  Raises:
    data.DataError: statistics from a training split the corpus lacks.
  """
  settings, record = dyn.settings, dyn.settings.to_json()
  if not settings.needs_statistics:
    dynamic_eval.log_settings(settings, "none")
    return None, record
  if tokens_BxT1 is not None:
    dynamic_eval.log_settings(settings, f"--dynamic_stats ({tokens_BxT1.shape[0]} row(s))")
    what = "tokens of --dynamic_stats"
  else:
    corpus, tgt_len = dyn.evaluator.corpus, dyn.evaluator.cfg.tgt_len
    if corpus is None or "train" not in corpus.splits:
      raise data.DataError(
          "dynamic evaluation's statistics come from the training split, which the corpus "
          "does not have here; give --dynamic_stats=FILE (--mode=score)."
      )
    train_tokens = corpus.splits["train"].num_tokens
    steps = settings.stats_steps(train_tokens, tgt_len)
    if settings.stats_tokens > train_tokens:
      report.log(
          f"Note: eval.dynamic.stats_tokens={settings.stats_tokens:,} is more than the "
          f"training split's {train_tokens:,} tokens: the statistics are of all of it."
      )
    dynamic_eval.log_settings(
        settings,
        f"{steps:,} segment(s) x {settings.global_batch} row(s) x {tgt_len} tokens of the "
        "training split",
    )
    what = "training tokens"
  start = time.perf_counter()
  if tokens_BxT1 is not None:
    ss, n = dyn.statistics_of_tokens(params, tokens_BxT1)
  else:
    ss, n = dyn.statistics_of_split(params, "train")
  record["stats_tokens_read"] = n
  report.log(f"Statistics pass: {n:,} {what} in {time.perf_counter() - start:.1f} s.")
  dynamic_eval.check_pull_back(settings, ss)
  return ss, record


def score(
    config: ml_collections.ConfigDict,
    evaluator: evaluate.Evaluator,
    params: Any,
    tokens_BxT1: np.ndarray,
    stats_BxT1: np.ndarray | None,
) -> tuple[np.ndarray, dict | None]:
  """``--mode=score``'s NLL: ``evaluator.score``, or with ``eval.dynamic.lr >
  0`` dynamic evaluation (the rows share one update per segment).

  Returns:
    (float32 [B, T] nats, the dynamic settings as recorded, or None).
  """
  settings = dynamic_eval.DynamicSettings.from_config(config)
  if not settings.enabled:
    return evaluator.score(params, tokens_BxT1), None
  dyn = dynamic_eval.DynamicEvaluator(evaluator, settings)
  ss, record = statistics(dyn, params, stats_BxT1)
  return dyn.score(params, tokens_BxT1, ss), record
