"""The command-line modes: what ``python -m transformer_xl.main`` does with its flags.

``main.py`` reads the flags into a ``Request`` and calls ``run``;
everything here calls the library (``train``, ``evaluate``,
``language_model``) and is the only place that prints results for a user,
reads ``--tokens``/``--text``/``--prompt_file`` or writes ``--out``:

* ``--mode=train``: ``run_train``, which calls ``train.train_and_evaluate``;
  SIGTERM or Ctrl-C is a clean stop.
* ``--mode=eval``: ``run_eval``, valid and test of the latest checkpoint.
* ``--mode=score``: ``run_score``, the per-token NLL of ``--tokens`` or
  ``--text``.
* ``--mode=generate``: ``run_generate``, which continues ``--prompt`` or
  ``--prompt_file``.

Everything that can be checked before compiling is checked first, in this
order: the output path, the workdir, the config (``default_config.validate``:
keys, values, the mesh against the devices and batch), for eval, score and
generate the config's model against the trained one (its architecture
fixed, its free settings applied: ``language_model.apply_free_settings``),
then the data files, then the checkpoint's model; so bad input fails in
seconds.  Errors a user can cause end as one ``error: ...`` line with exit
status 1 (``user_errors.report``; ``--debug`` shows their traceback).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
import sys

import jax
import ml_collections
import numpy as np
from etils import epath
from jax.sharding import Mesh

from transformer_xl import data, default_config, sharding
from transformer_xl.cli import dynamic_modes, process_settings, user_errors
from transformer_xl.data import text_vocab
from transformer_xl.inference import dynamic_eval, evaluate, generate, language_model
from transformer_xl.run import distributed, lock, metrics, run_dir
from transformer_xl.run import workdir as wd
from transformer_xl.training import train
from transformer_xl.util import files, report

MODES = ("train", "eval", "score", "generate")


@dataclasses.dataclass(frozen=True)
class Request:
  """What the command line asked for (``main.py``'s flags, same names).

  Attributes:
    mode: one of ``MODES``.
    workdir: the run's directory.
    config: the ``--config`` file's config (None: the workdir's config.json).
    config_source: what ``config`` came from, for the message that refuses
      another architecture (None: "--config", or the workdir's config.json
      when ``config`` is None).
    tokens, text, out: ``--mode=score`` (and ``out`` of ``--mode=generate``).
    dynamic_stats: ``--mode=score`` with dynamic evaluation: the statistics' text
      (.npy token rows or a text file; None: the training split).
    prompt, prompt_file, num_tokens, num_samples, stop, stop_at_eos: ``--mode=generate``.
    batch_size: ``--mode=generate``'s rows generated together at most.
    top_k, top_p, temperature, seed: ``--mode=generate``'s sampling.
    coordinator_address, num_processes, process_id: a multi-process run.
  """

  mode: str
  workdir: str
  config: ml_collections.ConfigDict | None = None
  config_source: str | None = None
  tokens: str | None = None
  text: str | None = None
  out: str | None = None
  prompt: str | None = None
  prompt_file: str | None = None
  num_tokens: int = 100
  stop: tuple[str, ...] = ()
  stop_at_eos: bool = False
  top_k: int = 40
  top_p: float = 1.0
  temperature: float = 1.0
  seed: int = 0
  num_samples: int = 1
  batch_size: int = language_model.DEFAULT_BATCH_SIZE
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  dynamic_stats: str | None = None


def run(request: Request, debug: bool = False) -> None:
  """Runs one command-line mode; a user's mistake exits with one ``error:``
  line and status 1 (with ``debug``: its traceback).

  Raises:
    SystemExit: a user error (``user_errors.USER_ERRORS``, an OSError of the
      environment).
  """
  with user_errors.report(debug):
    _run(request)


def _run(r: Request) -> None:
  """``run``'s work, in the order of its checks (paths, config, workdir,
  data, then the mode)."""
  process_settings.initialize_distributed(r.coordinator_address, r.num_processes, r.process_id)
  if r.mode == "score":
    check_output_path(r.out)
  elif r.mode == "generate" and r.out:
    check_output_path(r.out, example="samples.json", error=wd.WorkdirError)
  wd.require_dir(r.workdir)
  config = r.config if r.config is not None else wd.load_config(r.workdir)
  tokens = user_errors.load_tokens(r.tokens) if r.mode == "score" and r.tokens else None
  default_config.validate(config, jax.device_count(), training=r.mode == "train")
  dynamic_modes.check_request(r.mode, r.dynamic_stats, config)
  if r.mode != "train":
    _run_mode(r, config, tokens)
    return
  wd.check_writable(r.workdir)
  with lock.training_lock(r.workdir):  # before the data: a second run stops now
    _run_mode(r, config, tokens)


def _run_mode(r: Request, config: ml_collections.ConfigDict, tokens: np.ndarray | None) -> None:
  """The mesh, the corpus where the mode needs one, then the mode."""
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  source = r.config_source or (
      "--config" if r.config is not None else str(epath.Path(r.workdir) / "config.json")
  )
  if r.mode != "train" and (epath.Path(r.workdir) / "model_config.json").exists():
    language_model.model_configs(config, r.workdir, source)  # an architecture change: now
  corpus = None
  dynamic = dynamic_eval.DynamicSettings.from_config(config)
  stats_from_split = (
      r.mode == "score" and dynamic.enabled and dynamic.needs_statistics and not r.dynamic_stats
  )
  stats_text = bool(r.dynamic_stats) and not r.dynamic_stats.endswith(".npy")
  if r.mode == "score" and (r.text or stats_text) and not stats_from_split:
    # the workdir's saved tokenizer may stand in for the files
    corpus = language_model.load_corpus(config, wd.load_model_config(r.workdir)[0], r.workdir)
  elif r.mode in ("train", "eval") or stats_from_split:
    data_cfg = config.data.to_dict()
    corpus = distributed.process_0_first(lambda: data.load_configured(data_cfg), (data.DataError,))
    if corpus.name == data.TEXT:  # a resumed or evaluated run: the ids it was trained with
      text_vocab.check_saved_tokenizer(corpus, r.workdir)
  if corpus is not None:
    splits = ", ".join(f"{k} {v.num_tokens:,} tokens" for k, v in corpus.splits.items())
    report.log(
        f"Corpus {corpus.name}: vocab {corpus.vocab_size:,}, "
        + (splits or f"the tokenizer saved in {r.workdir} (no corpus file read)")
        + f"; mesh {dict(mesh.shape)}; {jax.process_count()} process(es)."
    )
  if r.mode == "train":
    run_train(config, r.workdir, corpus, mesh)
  elif r.mode == "eval":
    run_eval(config, r.workdir, corpus, mesh, source=source)
  elif r.mode == "generate":
    run_generate(
        config,
        r.workdir,
        mesh,
        prompt=r.prompt,
        prompt_file=r.prompt_file,
        num_tokens=r.num_tokens,
        stop=r.stop,
        stop_at_eos=r.stop_at_eos,
        top_k=r.top_k,
        top_p=r.top_p,
        temperature=r.temperature,
        seed=r.seed,
        num_samples=r.num_samples,
        out=r.out,
        batch_size=r.batch_size,
        source=source,
    )
  else:
    sizes: tuple[int | None, int | None] = (None, None)
    if tokens is None:
      tokens, text = text_file_tokens(corpus, r.text)
      sizes = language_model.text_size(text)
    stats = dynamic_modes.stats_tokens(corpus, r.dynamic_stats) if r.dynamic_stats else None
    run_score(
        config,
        r.workdir,
        mesh,
        tokens,
        r.out,
        *sizes,
        source=source,
        dynamic_stats=stats,
        corpus=corpus,
    )


def run_train(
    config: ml_collections.ConfigDict, workdir: str, corpus: data.Corpus, mesh: Mesh
) -> dict:
  """``--mode=train``: ``train.train_and_evaluate``, with SIGTERM (a
  preempted VM, ``launch/stop.sh``) turned into a checkpoint and a clean
  exit (``process_settings.StopSignals``).

  Returns:
    The last logged training metrics.
  """
  with process_settings.StopSignals() as signals:
    return train.train_and_evaluate(config, workdir, corpus, mesh, stop_requested=signals.received)


def text_file_tokens(corpus: data.Corpus, path: str) -> tuple[np.ndarray, str]:
  """``--text=FILE`` as a token stream for scoring: int32 [1, N + 1], the
  boundary symbol then the file's N tokens (``evaluate.text_tokens``), and
  the file's text; says how many words the vocabulary lacks.

  Raises:
    evaluate.ScoreInputError: the file is missing or not UTF-8.
    data.DataError: a symbol the corpus cannot encode.
  """
  text = user_errors.read_text(path)
  tokens = evaluate.text_tokens(corpus, text)
  unknown = evaluate.unknown_words(corpus, text)
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
  free settings of ``config.model`` (``language_model.apply_free_settings``:
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
  bits per byte and word-level perplexity) and ``documents_scored``.  With dynamic evaluation (``eval.dynamic.lr > 0``,
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
    trained, model_cfg, _ = language_model.model_configs(config, workdir, source)
  else:  # no record (a checkpoint's own is compared when it is restored)
    trained = model_cfg = default_config.model_config(config, corpus.vocab_size)
  language_model.check_vocabulary(corpus, trained)
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
  results["step"] = int(step)
  results["eval"] = {**evaluator.lengths, **({"dynamic": dynamic} if dynamic else {})}
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
  bad = [s for s in ("valid", "test") if not np.isfinite(results[s]["loss_nats"])]
  if bad and dynamic:
    where = f"printed as null, not saved to {path}" if unwritable else f"written as null in {path}"
    raise metrics.NonFiniteError(
        f"the {' and '.join(bad)} loss of dynamic evaluation is not finite ({where}): the "
        "adapted parameters diverged; lower eval.dynamic.lr (or eval.dynamic.decay, see the "
        "warning above if there is one); tune them on the valid split."
    )
  if bad:
    where = f"printed as null, not saved to {path}" if unwritable else f"written as null in {path}"
    raise metrics.NonFiniteError(
        f"the {' and '.join(bad)} loss of checkpoint step {step} is not finite ({where}), "
        "although its parameters are finite: the computation overflowed; with "
        "--config.model.dtype=bfloat16 try float32."
    )
  return results


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


def check_output_path(
    out_path: str, example: str = "nll.npy", error: type[Exception] = evaluate.ScoreInputError
) -> None:
  """Checks, before any scoring or generation, that ``out_path`` can be written.

  Args:
    out_path: the --out path.
    example: a file name the message suggests.
    error: the kind raised (``evaluate.ScoreInputError`` for --mode=score).

  Raises:
    error: it is a directory, its directory does not exist, or it cannot
      be written there.
  """
  path = epath.Path(out_path)
  if path.is_dir():
    raise error(f"--out={out_path} is a directory; give a file name (e.g. {example}).")
  if not path.parent.is_dir():
    raise error(f"--out={out_path}: the directory {path.parent} does not exist; create it first.")
  probe = path.parent / f".{path.name}.probe.{jax.process_index()}"
  try:
    probe.write_bytes(b"")
    probe.unlink()
  except OSError as err:
    raise error(
        f"--out={out_path} cannot be written "
        f"({err.strerror or err}); choose a writable location."
    ) from None


def _save_npy(out_path: str, array: np.ndarray) -> None:
  """``array`` as .npy at exactly ``out_path``, through a temporary file and a rename."""
  buf = io.BytesIO()
  np.save(buf, array)
  files.write_bytes_atomic(out_path, buf.getvalue())


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
  (``language_model.apply_free_settings``: ``dtype``, ``attention_impl``,
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
  check_output_path(out_path)
  trained, model_cfg, unit = language_model.model_configs(config, workdir, source)
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
      "bits_per_byte": language_model.bits_per_byte(total, num_bytes),
      "word_ppl": language_model.word_perplexity(total, num_words),
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


def read_prompts(prompt: str | None, prompt_file: str | None) -> str | list[str]:
  """The prompt of ``--prompt`` (a str), or the prompts of ``--prompt_file``
  (a list: one per line of the UTF-8 file, without the line break; blank
  lines skipped).  Exactly one of the two.

  Raises:
    default_config.ConfigError: both or neither given, a file that is not
      UTF-8 text, or one with no prompt.
    FileNotFoundError: ``prompt_file`` does not exist.
  """
  if (prompt is None) == (prompt_file is None):
    raise default_config.ConfigError(
        "--mode=generate needs exactly one of --prompt=TEXT and --prompt_file=FILE (got "
        f"{'both' if prompt is not None else 'neither'})."
    )
  if prompt_file is None:
    return prompt
  path = epath.Path(prompt_file)
  if not path.exists():
    raise FileNotFoundError(f"--prompt_file={prompt_file} does not exist.")
  try:
    text = path.read_bytes().decode("utf-8")
  except UnicodeDecodeError as err:
    raise default_config.ConfigError(
        f"--prompt_file={prompt_file} is not UTF-8 text: {err}."
    ) from None
  prompts = [line for line in text.splitlines() if line.strip()]
  if not prompts:
    raise default_config.ConfigError(
        f"--prompt_file={prompt_file} has no prompt: write one prompt per line."
    )
  return prompts


def run_generate(
    config: ml_collections.ConfigDict,
    workdir: str,
    mesh: Mesh,
    *,
    prompt: str | None,
    prompt_file: str | None,
    num_tokens: int,
    top_k: int,
    top_p: float,
    temperature: float,
    seed: int,
    num_samples: int,
    out: str | None,
    stop: tuple[str, ...] = (),
    stop_at_eos: bool = False,
    batch_size: int = language_model.DEFAULT_BATCH_SIZE,
    source: str = "--config",
) -> language_model.Generation | list[language_model.Generation]:
  """``--mode=generate``: continues a prompt, or every line of a prompt
  file, with the workdir's latest checkpoint (Dai et al. 2019, Appendix E),
  the rows (prompts x samples) in batches of at most ``batch_size``
  (``LanguageModel.generate``; the samples are those of one batch).

  The model is the trained one with the free settings of ``config.model``
  (``language_model.apply_free_settings``: ``dtype``, ``attention_impl``,
  ...; ``source`` names the config in the message that refuses another
  architecture); the corpus of one's own text is the workdir's saved
  tokenizer (``language_model.load_corpus``).  The settings, the prompt
  source, the output path and the model are checked first, then the
  corpus loaded and the prompts encoded, then the checkpoint restored: bad
  input stops before anything is compiled.  The
  generated text of row 0 streams to stdout as it is produced; with
  several rows, each is headed by ``=== sample s ===`` (one prompt) or
  ``=== prompt p ===`` / ``=== prompt p, sample s ===`` (a prompt file),
  and the other rows of a batch follow when it is done.  What the model
  read and the settings go to stderr.  ``out`` (a .json path) receives
  ``language_model.Generation.to_json`` (a prompt file: a list of them,
  in the file's order, written batch by batch to a temporary file renamed
  to ``out`` at the end; an existing ``out`` is replaced, and the last
  line on stderr says so).

  Raises:
    default_config.ConfigError: a bad flag or prompt.
    FileNotFoundError: no prompt file, config, model_config.json or
      checkpoint.
    wd.WorkdirError: ``out`` cannot be written (``check_output_path``).
    default_config.ConfigError: ``config`` changes the architecture.
    data.DataError: the corpus cannot be loaded or cannot encode a prompt.
  """
  if out:
    check_output_path(out, example="samples.json", error=wd.WorkdirError)
  texts = read_prompts(prompt, prompt_file)
  try:
    generate.SamplingSettings(top_k=top_k, top_p=top_p, temperature=temperature)
  except default_config.ConfigError as err:  # named as the flags
    raise default_config.ConfigError(
        re.sub(r"\b(top_k|top_p|temperature)=", r"--\1=", str(err))
    ) from None
  if num_tokens < 1 or num_samples < 1:
    raise default_config.ConfigError(
        f"--num_tokens={num_tokens} and --num_samples={num_samples} must be >= 1."
    )
  if batch_size < 1:
    raise default_config.ConfigError(
        f"--batch_size={batch_size} must be >= 1 (rows generated together; default "
        f"{language_model.DEFAULT_BATCH_SIZE})."
    )
  if not all(stop):
    raise default_config.ConfigError("--stop= is empty: give the text that ends a sample.")
  trained, _, _ = language_model.model_configs(config, workdir, source)
  corpus = language_model.load_corpus(config, trained, workdir)
  many = not isinstance(texts, str)
  prompt_ids = [
      language_model.encode_prompt(corpus, t)  # before the checkpoint is read
      for t in (texts if many else [texts])
  ]
  lm = language_model.LanguageModel.from_workdir(workdir, config, mesh, corpus, source=source)
  c, main = lm.eval_cfg, jax.process_index() == 0
  n_rows = len(prompt_ids) * num_samples

  def header(p: int, s: int) -> str:
    if not many:
      return f"=== sample {s} ===\n"
    return f"=== prompt {p} ===\n" if num_samples == 1 else f"=== prompt {p}, sample {s} ===\n"

  if main:
    read = (
        f"the prompt as read ({len(prompt_ids[0])} tokens): {lm.corpus.decode(prompt_ids[0])!r}"
        if not many
        else f"{len(prompt_ids)} prompts of {prompt_file} ({min(map(len, prompt_ids))} to "
        f"{max(map(len, prompt_ids))} tokens as read)"
    )
    vocab = "" if lm.corpus.splits else f" using the tokenizer saved in {workdir}"
    print(
        f"Step {lm.step} of {workdir} ({lm.corpus.name}{vocab}); {read}; {n_rows} rows x up to "
        f"{num_tokens} tokens in batches of up to {batch_size} rows, top_k={top_k} "
        f"top_p={top_p} temperature={temperature} seed={seed}, stop={list(stop)} "
        f"stop_at_eos={stop_at_eos}; prompt segments of {c.tgt_len}, memory {c.mem_len}, "
        f"same_length={c.same_length}, clamp_len={c.clamp_len}.",
        file=sys.stderr,
        flush=True,
    )
    if n_rows > 1:
      sys.stdout.write(header(0, 0))

  # Row 0 streams token by token (it is in the first batch); every other row is printed,
  # and every prompt's Generation written to out, when its batch is done.
  first_batch = [True]
  replaced = bool(out) and epath.Path(out).exists()
  tmp = files.temporary_name(out) if out else None
  sink = tmp.open("w", encoding="utf-8") if out and main else None

  def on_text(pieces: list[str]) -> None:
    if main and first_batch[0]:
      sys.stdout.write(pieces[0])
      sys.stdout.flush()

  def on_batch(first: int, generations: list[language_model.Generation]) -> None:
    first_batch[0] = False
    if not main:
      return
    for p, g in enumerate(generations, start=first):
      for s, text in enumerate(g.texts):
        if (p, s) != (0, 0):
          sys.stdout.write(f"\n{header(p, s)}{text}")
    sys.stdout.flush()
    if sink is not None and many:
      sink.write(
          ("[" if first == 0 else ", ")
          + ", ".join(json.dumps(g.to_json(), ensure_ascii=False) for g in generations)
      )
      sink.flush()

  try:
    result = lm.generate(
        texts,
        num_tokens,
        top_k=top_k,
        top_p=top_p,
        temperature=temperature,
        seed=seed,
        num_samples=num_samples,
        stop=stop,
        stop_at_eos=stop_at_eos,
        on_text=on_text,
        batch_size=batch_size,
        on_batch=on_batch,
    )
    if sink is not None:
      sink.write(("]" if many else json.dumps(result.to_json(), ensure_ascii=False)) + "\n")
      sink.close()
      tmp.replace(epath.Path(out))
  finally:  # a failed or interrupted run leaves no temporary file
    if sink is not None:
      sink.close()
      if tmp.exists():
        tmp.unlink()
  if main:
    sys.stdout.write("\n")
    sys.stdout.flush()
  if out and main:
    note = " (replacing the existing file)" if replaced else ""
    print(f"Wrote {out}{note}", file=sys.stderr, flush=True)
  return result
