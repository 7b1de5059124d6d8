"""``--mode=eval`` and ``--mode=score``: a checkpoint's scores, written for a user.

``run_eval`` scores the valid and test splits of the latest checkpoint and
writes ``eval_results.json``; ``run_score`` scores ``--tokens`` or
``--text`` (``text_file_tokens``) and writes the per-token NLL to
``--out``.  Both take the trained model with the config's free settings
(``trained_model.model_configs``) and, with ``eval.dynamic.lr > 0``, run
dynamic evaluation (``dynamic_modes.py``).  ``modes.run`` calls them after
its checks.
"""

from __future__ import annotations

import io
import math
import os

import jax
import ml_collections
import numpy as np
from etils import epath
from jax.sharding import Mesh

from transformer_xl import data, default_config
from transformer_xl.cli import dynamic_modes, user_errors
from transformer_xl.inference import dynamic_eval, evaluate, text_scores, trained_model
from transformer_xl.model import memory as memory_lib
from transformer_xl.run import metrics, run_dir
from transformer_xl.run import workdir as wd
from transformer_xl.util import files, report


def text_file_tokens(corpus: data.Corpus, path: str) -> tuple[np.ndarray, str]:
  """``--text=FILE`` as a token stream for scoring: int32 [1, N + 1], the
  boundary symbol then the file's N tokens (``text_scores.text_tokens``), and
  the file's text; says how many words the vocabulary lacks.

  Raises:
    evaluate.ScoreInputError: the file is missing or not UTF-8.
    data.DataError: a symbol the corpus cannot encode.
  """
  text = user_errors.read_text(path)
  tokens = text_scores.text_tokens(corpus, text)
  unknown = text_scores.unknown_words(corpus, text)
  report.log(
      f"--text={path}: {tokens.shape[1] - 1:,} tokens; {unknown:,} unknown word(s) "
      f"({100 * unknown / max(tokens.shape[1] - 1, 1):.2f}%) are scored as the "
      "vocabulary's unknown-word symbol."
  )
  return tokens, text


def run_eval(
    config: ml_collections.ConfigDict,
    workdir: str,
    corpus: data.Corpus,
    mesh: Mesh,
    source: str = "--config",
) -> dict:
  """``--mode=eval``: scores valid and test from the latest checkpoint.

  The model is the trained one (``<workdir>/model_config.json``) with the
  free settings of ``config.model`` (``trained_model.apply_free_settings``:
  ``dtype``, ``attention_impl``, ...); ``source`` names the config in the
  message that refuses another architecture.

  Writes ``<workdir>/eval_results.json``: {"valid": {...}, "test": {...},
  "step": int, "eval": the settings}, each split's dict as
  ``evaluate.Evaluator.evaluate`` returns it, plus ``metrics.corpus_level``
  (bits per byte and the number of documents, for corpora of one's own
  text; the word-level perplexity ``word_ppl`` over the split's ``words``
  where they can be counted).  With ``eval.documents="whole"`` each split
  is scored document by document (``Evaluator.evaluate_documents``) and
  its dict also holds ``per_document`` (each document's tokens, loss,
  bits per byte and word-level perplexity) and ``documents_scored``.  A
  memory that can be evaluated without its own part (the kNN store:
  ``MemoryVariant.EVAL_WITHOUT``) is scored both ways: each split's dict
  also holds ``without_<name>`` (loss, metric, tokens, answer accuracies,
  and the overrides used), so that the gain of the memory is one file.  With dynamic evaluation (``eval.dynamic.lr > 0``,
  ``dynamic_eval.py``: each split from the loaded parameters, the
  statistics once from the training split) the same goes to
  ``<workdir>/eval_results_dynamic.json`` instead, its settings under
  "eval" / "dynamic", so the static results stay.  A workdir that cannot be written (a
  read-only copy of someone's run) is still evaluated: a note says so
  before the evaluation, and the results, which cannot be saved, are
  printed whole (one JSON line, ``eval results (not saved): {...}``);
  the exit status is 0.

  Raises:
    FileNotFoundError: no checkpoint in ``workdir``.
    default_config.ConfigError: ``config`` changes the architecture.
    data.DataError: the corpus's vocabulary is not the model's.
  """
  if (epath.Path(workdir) / "model_config.json").exists():
    trained, model_cfg, _ = trained_model.model_configs(config, workdir, source)
  else:  # no record (a checkpoint's own is compared when it is restored)
    trained = model_cfg = default_config.model_config(config, corpus.vocab_size)
  trained_model.check_vocabulary(corpus, trained)
  step, params = run_dir.restore_params(workdir, trained, mesh)
  dynamic_on = dynamic_eval.DynamicSettings.from_config(config).enabled
  name = wd.DYNAMIC_EVAL_RESULTS if dynamic_on else wd.EVAL_RESULTS
  path = str(epath.Path(workdir) / name)
  unwritable = _cannot_write(workdir)
  if unwritable:
    report.log(
        f"Note: --workdir={workdir} cannot be written ({unwritable}): evaluating anyway; the "
        f"results will be printed here, not saved to {path}."
    )
  evaluator = evaluate.Evaluator(config, model_cfg, corpus, mesh)
  score_split, dynamic = dynamic_modes.split_scorer(config, evaluator, params)
  metric = metrics.metric_name(corpus.unit)
  results = {}
  for split in ("valid", "test"):
    r = results[split] = score_split(split)
    r.update(metrics.corpus_level(r["loss_nats"], r["tokens"], corpus, split))
    extra = "".join(
        f", {k} {r[k]:.4f}"
        for k in (  # then the synthetic tasks' accuracies
            "bits_per_byte",
            "answer_accuracy",
            "answer_token_accuracy",
            "greedy_accuracy",
            "greedy_token_accuracy",
            "babilong_accuracy",
        )
        if k in r
    )
    if "word_ppl" in r:
      extra += f", word perplexity {r['word_ppl']:.6g} over {r['words']:,} words"
    if "documents" in r:
      extra += f", {r['documents']:,} documents"
    report.log(
        f"step {step} {split}: loss {r['loss_nats']:.4f} nats, {metric} "
        f"{r[metric]:.4f} over {r['tokens']:,} tokens{extra}"
    )
  if not dynamic:
    _score_without(config, model_cfg, corpus, mesh, params, step, results)
  results["step"] = int(step)
  results["eval"] = {**evaluator.lengths, **({"dynamic": dynamic} if dynamic else {})}
  bad = [s for s in ("valid", "test") if not np.isfinite(results[s]["loss_nats"])]
  if bad:  # a failed evaluation never replaces the results of a good one
    kept = "; the file there is kept" if epath.Path(path).exists() else ""
    report.log(
        f"Not saving {path} (a loss is not finite{kept}); eval results: "
        + metrics.dumps(results, sort_keys=True)
    )
  else:
    if not unwritable:
      try:
        wd.write_eval_results(workdir, results, name)
      except OSError as err:  # e.g. the disk filled up during the evaluation
        unwritable = err.strerror or str(err)
    if unwritable:
      report.log(
          f"Could not save {path} ({unwritable}); eval results (not saved): "
          + metrics.dumps(results, sort_keys=True)
      )
    else:
      report.log(f"Wrote {path}")
  where = f"printed as null, not saved to {path}"
  if bad and dynamic:
    raise metrics.NonFiniteError(
        f"the {' and '.join(bad)} loss of dynamic evaluation is not finite ({where}): the "
        "adapted parameters diverged; lower eval.dynamic.lr (or eval.dynamic.decay, see the "
        "warning above if there is one); tune them on the valid split."
    )
  if bad:
    raise metrics.NonFiniteError(
        f"the {' and '.join(bad)} loss of checkpoint step {step} is not finite ({where}), "
        "although its parameters are finite: the computation overflowed; with "
        "--config.model.dtype=bfloat16 try float32."
    )
  return results


# What an evaluation without a variant's memory records of each split (those it has).
_WITHOUT_KEYS = ("loss_nats", "tokens", "answer_accuracy", "answer_token_accuracy")


def _score_without(config, model_cfg, corpus, mesh, params, step, results) -> None:
  """Scores valid and test again without each variant's own memory that has
  such an evaluation (``memory.eval_without``: the kNN store), into
  ``results[split]["without_<name>"]`` (loss, the unit's metric, tokens,
  the answer accuracies of a synthetic task); logs each."""
  metric = metrics.metric_name(corpus.unit)
  for name, overrides in memory_lib.eval_without(model_cfg, config.eval.to_dict()).items():
    cfg = config.copy_and_resolve_references()
    cfg.eval[name].update(overrides)
    evaluator = evaluate.Evaluator(cfg, model_cfg, corpus, mesh)
    score = evaluator.evaluate_documents if evaluator.whole else evaluator.evaluate
    for split in ("valid", "test"):
      r = score(params, split)
      kept = {k: r[k] for k in (*_WITHOUT_KEYS, metric) if k in r}
      results[split][f"without_{name}"] = {**kept, "eval": overrides}
      shown = ", ".join(
          f"{k} {r[k]:.4f}" for k in ("loss_nats", metric, *_WITHOUT_KEYS[2:]) if k in r
      )
      report.log(
          f"step {step} {split} without the {name} memory ({_flags(name, overrides)}): {shown}"
      )


def _flags(name: str, overrides: dict) -> str:
  return " ".join(f"eval.{name}.{k}={v}" for k, v in overrides.items())


def _cannot_write(workdir: str) -> str | None:
  """Why a file cannot be written in the existing directory ``workdir`` (a
  probe file written and removed by process 0), or None when it can."""
  if jax.process_index() != 0:
    return None
  probe = epath.Path(workdir) / f".txl_eval_probe.{os.getpid()}"
  try:
    probe.write_bytes(b"")
    probe.unlink()
  except OSError as err:
    return err.strerror or str(err)
  return None


def _save_npy(out_path: str, array: np.ndarray) -> None:
  """``array`` as .npy at exactly ``out_path``, through a temporary file and a rename."""
  buf = io.BytesIO()
  np.save(buf, array)
  try:
    files.write_bytes_atomic(out_path, buf.getvalue())
  except OSError as err:
    raise user_errors.output_error(err, out_path) from None


def run_score(
    config: ml_collections.ConfigDict,
    workdir: str,
    mesh: Mesh,
    tokens_BxT1: np.ndarray,
    out_path: str,
    num_bytes: int | None = None,
    num_words: int | None = None,
    *,
    source: str = "--config",
    dynamic_stats: np.ndarray | None = None,
    corpus: data.Corpus | None = None,
) -> dict:
  """``--mode=score``: per-token NLL of token streams with the workdir's model.

  The model is the trained one with the free settings of ``config.model``
  (``trained_model.apply_free_settings``: ``dtype``, ``attention_impl``,
  ...).  Writes float32 [B, T] nats to ``out_path`` (.npy, exactly that
  path; an existing file is replaced, and the report says so) and returns
  (and prints) over all B*T tokens:

  * ``loss_nats``: mean NLL per token, nats; ``bits_per_token`` (= it / ln
    2) and ``ppl`` (per token, exp of it); ``bpc`` only for byte- and
    character-level corpora, where a token is a character;
  * ``bits_per_byte``: total NLL / (num_bytes x ln 2), and ``word_ppl``:
    exp(total NLL / num_words), for text of known size (``--text``: its
    UTF-8 bytes and whitespace-separated words); None for ``--tokens``,
    whose text is not known (the report says so);
  * ``tokens``, ``bytes``, ``words``, ``step``;
  * ``dynamic``: with ``eval.dynamic.lr > 0``, the settings of dynamic
    evaluation (``dynamic_eval.py``: the B rows share one update per
    segment) and ``stats_tokens_read``.

  The token ids and ``out_path`` are checked before the model is loaded.

  Args:
    config: the config (its ``eval`` section and free model settings).
    workdir: the trained run's directory.
    mesh: the device mesh.
    tokens_BxT1: integer [B, T + 1] token ids, each row one stream.
    out_path: the .npy file written.
    num_bytes: UTF-8 bytes of the text the tokens encode (None: unknown).
    num_words: whitespace-separated words of that text (None: unknown).
    source: what ``config`` came from, for the message that refuses
      another architecture.
    dynamic_stats: dynamic evaluation ("rms"): the statistics' token rows
      [B', T'+1] (None: the first ``eval.dynamic.stats_tokens`` of
      ``corpus``'s training split).
    corpus: the corpus (needed for statistics from its training split).

  Raises:
    evaluate.ScoreInputError: a bad token array (or statistics array) or ``out_path``;
    FileNotFoundError: no model_config.json or checkpoint;
    default_config.ConfigError: ``config`` changes the architecture;
    metrics.NonFiniteError: a score is not finite (nothing is written).
  """
  user_errors.check_output_path(out_path)
  trained, model_cfg, unit = trained_model.model_configs(config, workdir, source)
  evaluate.check_tokens(tokens_BxT1, model_cfg.n_token)
  if dynamic_stats is not None:
    try:
      evaluate.check_tokens(dynamic_stats, model_cfg.n_token)
    except evaluate.ScoreInputError as err:
      raise evaluate.ScoreInputError(f"--dynamic_stats: {err}") from None
  step, params = run_dir.restore_params(workdir, trained, mesh)
  evaluator = evaluate.Evaluator(config, model_cfg, corpus, mesh)
  nll_BxT, dynamic = dynamic_modes.score(config, evaluator, params, tokens_BxT1, dynamic_stats)
  if not np.all(np.isfinite(nll_BxT)):
    b, t = np.argwhere(~np.isfinite(nll_BxT))[0]
    raise metrics.NonFiniteError(
        f"{int(np.sum(~np.isfinite(nll_BxT))):,} of the scores are not finite (the first at row "
        f"{b}, position {t}) although the parameters of checkpoint step {step} are finite: "
        + (
            "dynamic evaluation's adapted parameters diverged; lower eval.dynamic.lr (or "
            "eval.dynamic.decay)"
            if dynamic
            else "the computation overflowed"
        )
        + f"; nothing was written to {out_path}."
    )
  replaced = epath.Path(out_path).exists()
  if jax.process_index() == 0:
    _save_npy(out_path, nll_BxT)
  total = float(np.sum(nll_BxT, dtype=np.float64))
  loss = total / nll_BxT.size
  result = {
      "loss_nats": loss,
      "bits_per_token": loss / math.log(2.0),
      "ppl": float(np.exp(loss)),
      "bits_per_byte": text_scores.bits_per_byte(total, num_bytes),
      "word_ppl": text_scores.word_perplexity(total, num_words),
      "tokens": int(nll_BxT.size),
      "bytes": num_bytes,
      "words": num_words,
      "step": int(step),
  }
  if dynamic is not None:
    result["dynamic"] = dynamic
  if unit not in metrics.PER_TOKEN_UNITS:  # a token is a byte or a character
    result["bpc"] = result["bits_per_token"]
  if result["bits_per_byte"] is None:
    per_text = (
        "bits per byte: unknown for --tokens (the text's bytes are not known; score "
        "--text=FILE for bits per byte and word perplexity)"
    )
  else:
    per_text = f"bits per byte {result['bits_per_byte']:.4f} (over {num_bytes:,} bytes)"
    if result["word_ppl"] is not None:
      per_text += f", word perplexity {result['word_ppl']:.3f} (over {num_words:,} words)"
  report.log(
      f"step {step}: scored {nll_BxT.size:,} tokens ({unit} level"
      f"{', dynamic evaluation' if dynamic else ''}): loss {loss:.4f} nats "
      f"per token, bits per token {result['bits_per_token']:.4f}, ppl {result['ppl']:.3f} "
      f"per token; {per_text}; wrote {out_path}"
      + (" (replacing the existing file)" if replaced else "")
  )
  return result
