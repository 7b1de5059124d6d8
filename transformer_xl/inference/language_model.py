"""A trained model with its vocabulary as one Python object: generate and score text.

    from transformer_xl.inference.language_model import LanguageModel
    lm = LanguageModel.from_workdir("workdirs/quickstart")
    out = lm.generate("the company said", num_tokens=50, top_k=40, seed=0)
    print(out.texts[0])
    print(lm.score_text("the company said it would sell the unit\\n").ppl)

``LanguageModel`` holds the config, the corpus (vocabulary and
tokenisation), the restored parameters and the mesh; generation is
``generate.Generator``'s (the memory; the sampling rule is
``sampling.py``'s), scoring is ``evaluate.Evaluator.score``'s, and what
it returns is a ``Generation`` or a ``text_scores.TextScore``.  The
trained model's settings and corpus are loaded as every mode loads them
(``trained_model.py``).  ``--mode=generate`` of the command line
(``cli/generate_mode.py``) is this class's ``LanguageModel.generate``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from transformer_xl import data, default_config, sharding
from transformer_xl.inference import (
    dynamic_eval,
    eval_steps,
    evaluate,
    generate,
    sampling,
    text_scores,
    trained_model,
)
from transformer_xl.model import models
from transformer_xl.run import run_dir
from transformer_xl.run import workdir as wd

# Rows (prompts x samples) that ``LanguageModel.generate`` and --mode=generate run as one
# batch at most: bounds the memory of a long prompt list (docs/guide/generation.md).
DEFAULT_BATCH_SIZE = 64


@dataclasses.dataclass(frozen=True)
class Generation:
  """What ``LanguageModel.generate`` produced.

  Attributes:
    prompt: the prompt text as given.
    prompt_tokens: int32 [N + 1], what the model read before generating:
      the corpus's boundary symbol, then the prompt's ids.
    tokens: int32 [B, n], the generated ids of each sample; n is
      num_tokens, or fewer when every sample stopped early (a stop
      condition), and a sample that stopped before n is padded with -1.
    texts: B strings, each sample's generated text as it continues the
      decoded prompt: ``corpus.decode(prompt_tokens + tokens[b]) ==
      corpus.decode(prompt_tokens) + texts[b]`` (the -1 padding left out).
      A sample ended by a stop string ends with the token that completed
      it, so its text holds the stop string (and the rest of that token).
    settings: seed, top_k, top_p, temperature, num_tokens, num_samples,
      stop, stop_at_eos, step (of the checkpoint), dataset, and
      ``context``: the prompt's segment length tgt_len, mem_len,
      same_length and clamp_len.
    finish_reasons: B strings, why each sample ended: "length" (num_tokens
      reached), "eos" (it drew the corpus's boundary symbol, with
      ``stop_at_eos``) or "stop" (its text reached a stop string).
  """

  prompt: str
  prompt_tokens: np.ndarray
  tokens: np.ndarray
  texts: tuple[str, ...]
  settings: Mapping[str, Any]
  finish_reasons: tuple[str, ...] = ()

  def to_json(self) -> dict:
    """The ``--out`` file's object: ``prompt``, ``prompt_tokens``, ``tokens``
    and ``text`` (sample 0), ``samples`` (every sample's
    ``{"tokens", "text", "finish_reason"}``, sample 0 first, without the -1
    padding), and the settings' keys."""
    reasons = self.finish_reasons or ("length",) * len(self.texts)
    samples = [
        {"tokens": [int(t) for t in row if t >= 0], "text": text, "finish_reason": why}
        for row, text, why in zip(self.tokens, self.texts, reasons)
    ]
    return {
        "prompt": self.prompt,
        "prompt_tokens": [int(t) for t in self.prompt_tokens],
        "tokens": samples[0]["tokens"],
        "text": samples[0]["text"],
        "samples": samples,
        **self.settings,
    }


class LanguageModel:
  """A trained Transformer-XL with its corpus: text in, text or scores out
  (generation as in Dai et al. 2019, Appendix E; scoring as Sec. 4's
  evaluation).

  Generation and scoring use the evaluation settings of the config
  (``eval.tgt_len``, ``mem_len``, ``clamp_len``, ``same_length``; the
  context each generated token has is described in ``generate.py``).

  Args:
    config: the full config (``eval`` section used).
    model_cfg: the training ModelConfig (parameters are shared).
    corpus: the corpus whose vocabulary the model was trained on (its
      tokenizer encodes and decodes).
    params: the parameters, on ``mesh``.
    step: the checkpoint's training step.
    mesh: the device mesh.
  """

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      model_cfg: models.ModelConfig,
      corpus: data.Corpus,
      params: Any,
      step: int,
      mesh: Mesh,
  ):
    self.config, self.model_cfg, self.corpus = config, model_cfg, corpus
    self.params, self.step, self.mesh = params, int(step), mesh
    self.eval_cfg = eval_steps.eval_model_config(config, model_cfg)
    self._generator: generate.Generator | None = None
    self._evaluator: evaluate.Evaluator | None = None

  @classmethod
  def from_workdir(
      cls,
      workdir: str,
      config: ml_collections.ConfigDict | None = None,
      mesh: Mesh | None = None,
      corpus: data.Corpus | None = None,
      *,
      source: str | None = None,
  ) -> LanguageModel:
    """Loads a training (or converted) run's directory: its config (or
    ``config``), architecture, corpus and latest checkpoint.

    The architecture is the trained one (``model_config.json``), with the
    config's free model settings (``trained_model.FREE_KEYS``: ``dtype``,
    ``attention_impl``, ``remat``, ``attn_block``, ``scan_unroll``;
    ``trained_model.apply_free_settings``), e.g. a model trained in bfloat16 used in
    float32.  For one's own text the workdir's saved tokenizer is the
    vocabulary (``trained_model.load_corpus``).

    Args:
      workdir: the run's ``--workdir``.
      config: overrides the saved ``config.json`` (e.g. other eval settings,
        ``model.dtype``); its architecture must be the trained one.
      mesh: defaults to the config's mesh over all devices.
      corpus: the corpus if already loaded (``trained_model.load_corpus``).
      source: what ``config`` came from, for the message that refuses
        another architecture (default "config", or the saved config.json).

    Raises:
      FileNotFoundError: no config.json, model_config.json or checkpoint.
      data.DataError: the corpus cannot be loaded, or its vocabulary is not
        the model's.
      default_config.ConfigError: the config does not fit the devices, or
        changes the architecture (naming the key).
    """
    if source is None:
      source = "config" if config is not None else f"{workdir}/config.json"
    config = wd.load_config(workdir) if config is None else config
    trained, model_cfg, _ = trained_model.model_configs(config, workdir, source)
    if mesh is None:
      default_config.validate(
          config, jax.device_count(), training=False, device_kind=jax.devices()[0].device_kind
      )
      mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
    corpus = trained_model.load_corpus(config, trained, workdir) if corpus is None else corpus
    step, params = run_dir.restore_params(workdir, trained, mesh)
    return cls(config, model_cfg, corpus, params, step, mesh)

  @classmethod
  def from_pretrained(
      cls,
      name: str,
      cache_dir: str | None = None,
      *,
      manual_dir: str | None = None,
      download: bool = True,
      data_dir: str | None = None,
      dataset_manual_dir: str | None = None,
      verify_checksums: bool = True,
      mesh: Mesh | None = None,
      dynamic_eval: bool = False,
  ) -> LanguageModel:
    """A released model of the reference implementation (``enwik8``, ``text8``,
    ``wt103``, ``lm1b``): downloaded, verified, converted once into
    ``<cache>/workdirs/<name>`` and loaded from there, with the release's
    evaluation settings (``transformer_xl.convert.pretrained``).

        lm = LanguageModel.from_pretrained("wt103")
        print(lm.generate("The game", num_tokens=50).texts[0])
        print(lm.score_text("The game is carried over .\\n").ppl)

    With ``dynamic_eval=True``, ``score_text`` adapts the parameters as it
    scores (``dynamic_eval.py``) with the settings Krause et al. (2019)
    published for this model (``releases.dynamic_settings``: wt103 16.4
    ppl, enwik8 0.940 bpc, text8 1.038 bpc on the test sets), its
    statistics from the start of the corpus's training split.

    Args:
      name: a key of ``transformer_xl.convert.releases.RELEASES``.
      cache_dir: the cache (default ``$TRANSFORMER_XL_CACHE``, else
        ``~/.cache/transformer_xl``).
      manual_dir: the release's files already on disk (offline).
      download: may download the release's files and the dataset's sources.
      data_dir: tfds data dir of the release's corpus (its vocabulary and
        tokenizer; prepared on first use); overrides the converted config's.
      dataset_manual_dir: the corpus's source files (``data.manual_dir``).
      verify_checksums: check the corpus's source files.
      mesh: defaults to the config's mesh over all devices.
      dynamic_eval: set ``config.eval.dynamic`` to the published settings.

    Raises:
      transformer_xl.convert.ConvertError: the release's files cannot be
        had or fail their checks (one line naming each file, its URL and
        checksum); ``dynamic_eval`` for a release without published
        settings (lm1b).
      data.DataError: the corpus cannot be prepared.
    """
    from transformer_xl.convert import pretrained, releases  # the converter stays off other paths

    dynamic = releases.dynamic_settings(name) if dynamic_eval else None  # before downloading
    workdir = str(
        pretrained.pretrained_workdir(
            name,
            cache_dir,
            manual_dir=manual_dir,
            download=download,
            data_dir=data_dir,
            dataset_manual_dir=dataset_manual_dir,
            verify_checksums=verify_checksums,
        )
    )
    config = wd.load_config(workdir)
    with config.unlocked():
      config.data.download, config.data.verify_checksums = download, verify_checksums
      if data_dir is not None:
        config.data.data_dir = data_dir
      if dataset_manual_dir is not None:
        config.data.manual_dir = dataset_manual_dir
      if dynamic is not None:
        config.eval.dynamic.update(dynamic)
    return cls.from_workdir(workdir, config=config, mesh=mesh)

  @property
  def generator(self) -> generate.Generator:
    """The sampler (``generate.Generator``) of the eval model, made on first use."""
    if self._generator is None:
      self._generator = generate.Generator(self.eval_cfg, self.mesh)
    return self._generator

  @property
  def evaluator(self) -> evaluate.Evaluator:
    """The scorer (``evaluate.Evaluator``), made on first use."""
    if self._evaluator is None:
      self._evaluator = evaluate.Evaluator(self.config, self.model_cfg, self.corpus, self.mesh)
    return self._evaluator

  def encode_prompt(self, prompt: str) -> np.ndarray:
    """int32 [N + 1]: the boundary symbol, then the prompt's ids
    (``trained_model.encode_prompt``)."""
    return trained_model.encode_prompt(self.corpus, prompt)

  def generate(
      self,
      prompt: str | Sequence[str],
      num_tokens: int,
      *,
      top_k: int = 40,
      top_p: float = 1.0,
      temperature: float = 1.0,
      seed: int | Sequence[int] = 0,
      num_samples: int = 1,
      stop: str | Sequence[str] = (),
      stop_at_eos: bool = False,
      on_text: Callable[[list[str]], None] | None = None,
      batch_size: int = DEFAULT_BATCH_SIZE,
      on_batch: Callable[[int, list[Generation]], None] | None = None,
  ) -> Generation | list[Generation]:
    """Continues ``prompt`` (or each of several prompts) with up to
    ``num_tokens`` tokens, ``num_samples`` times, in batches of at most
    ``batch_size`` rows (prompts x samples, in order).

    Each prompt (after the boundary symbol, ``encode_prompt``) fills the
    memory in segments of the eval tgt_len; prompts of different lengths
    are padded in front and masked (``generate.py``); every new token is
    one pass of length 1 against the cached memory.  The defaults are
    Appendix E's: top-40 sampling at temperature 1.

        outs = lm.generate(["the company said", "stocks fell"], 30, seed=[1, 2])
        outs[1].texts[0] == lm.generate("stocks fell", 30, seed=2).texts[0]  # True

    A sample ends at ``num_tokens``, or earlier at a stop condition: the
    corpus's boundary symbol drawn (``stop_at_eos``: ``<eos>``, the end of
    a line or sentence, or a newline for character corpora), or a stop
    string in its text; the others go on, and the batch ends when all have
    ended.  A sample's tokens before its stop are those it gets without
    stops (same seed).  Rows are independent: every sample gets the
    tokens it gets in one batch, whatever ``batch_size``; the batch size
    bounds the memory (a batch's rows, their memories and logits).

    Args:
      prompt: text in the corpus's format (e.g. PTB: lower-case words), or a
        sequence of such texts.
      num_tokens: tokens per sample at most, >= 1.
      top_k: ``sampling.SamplingSettings`` (top_k=1 is greedy).
      top_p: ``sampling.SamplingSettings``.
      temperature: ``sampling.SamplingSettings`` (finite, > 0).
      seed: PRNG seed; the same seed gives the same samples.  With several
        prompts (and num_samples 1), one seed per prompt gives each prompt
        the tokens it gets alone with that seed.
      num_samples: samples per prompt, >= 1.
      stop: a string or strings, each non-empty: a sample whose generated
        text comes to hold one ends with the token that completed it.
      stop_at_eos: a sample ends with the corpus's boundary symbol.
      on_text: called after every step with the new pieces of text of the
        rows of the current batch (one per row: prompt by prompt, sample by
        sample; detokenised incrementally: a UTF-8 sequence split over
        tokens comes out whole; "" for a sample that has ended), and once
        more at the end of a batch if a held-back piece is flushed.
      batch_size: rows (prompts x samples) generated together at most, >= 1.
      on_batch: called after each batch with (the index of the first prompt
        completed, the ``Generation`` of each prompt whose samples are all
        done by then, in order): results stream out batch by batch.

    Returns:
      A ``Generation``, or one per prompt for a sequence of prompts.  A
      Generation's ``tokens`` has as many columns as its batch took steps
      (num_tokens unless every row of the batch stopped early).

    Raises:
      default_config.ConfigError: a setting out of range (before anything
        is compiled), no prompt, seeds that do not fit the prompts, an
        empty stop string, or a bad prompt (``encode_prompt``).
      data.DataError: a prompt has a character the corpus lacks.
    """
    settings = sampling.SamplingSettings(top_k=top_k, top_p=top_p, temperature=temperature)
    if num_tokens < 1 or num_samples < 1:
      raise default_config.ConfigError(
          f"num_tokens={num_tokens} and num_samples={num_samples} must be >= 1."
      )
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
      raise default_config.ConfigError(
          f"batch_size={batch_size} must be an integer >= 1 (rows generated together; "
          f"default {DEFAULT_BATCH_SIZE})."
      )
    stops = [stop] if isinstance(stop, str) else list(stop)
    if not all(isinstance(x, str) and x for x in stops):
      raise default_config.ConfigError(f"stop={stop!r}: stop strings must be non-empty strings.")
    texts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not texts:
      raise default_config.ConfigError("no prompt: give a text or a non-empty list of texts.")
    per_row_seed = np.ndim(seed) > 0
    if per_row_seed and (num_samples != 1 or np.shape(seed) != (len(texts),)):
      raise default_config.ConfigError(
          f"seed={list(seed)}: give one int, or one seed per prompt ({len(texts)}) with "
          "num_samples=1."
      )
    ids = [self.encode_prompt(t) for t in texts]
    n_rows = len(ids) * num_samples
    row_tokens: list[np.ndarray | None] = [None] * n_rows
    row_texts, row_reasons = [""] * n_rows, ["length"] * n_rows
    out, c = [], self.eval_cfg
    for first in range(0, n_rows, batch_size):
      last = min(first + batch_size, n_rows)
      row_seed = [int(seed[r // num_samples]) for r in range(first, last)] if per_row_seed else seed
      tokens_BxN, batch_texts, reasons = self._generate_rows(
          [ids[r // num_samples] for r in range(first, last)],
          num_tokens,
          settings,
          row_seed,
          first,
          stops,
          stop_at_eos,
          on_text,
      )
      row_tokens[first:last] = list(tokens_BxN)
      row_texts[first:last], row_reasons[first:last] = batch_texts, reasons
      done_prompts = last // num_samples if last < n_rows else len(ids)
      new = []
      for j in range(len(out), done_prompts):
        rows = slice(j * num_samples, (j + 1) * num_samples)
        width = max(len(t) for t in row_tokens[rows])
        tokens = np.stack(
            [np.pad(t, (0, width - len(t)), constant_values=-1) for t in row_tokens[rows]]
        ).astype(np.int32)
        new.append(
            Generation(
                prompt=texts[j],
                prompt_tokens=ids[j],
                tokens=tokens,
                texts=tuple(row_texts[rows]),
                settings={
                    "seed": int(seed[j]) if per_row_seed else int(seed),
                    "top_k": int(top_k),
                    "top_p": float(top_p),
                    "temperature": float(temperature),
                    "num_tokens": int(num_tokens),
                    "num_samples": int(num_samples),
                    "stop": stops,
                    "stop_at_eos": bool(stop_at_eos),
                    "step": self.step,
                    "dataset": self.corpus.name,
                    "context": {
                        "tgt_len": c.tgt_len,
                        "mem_len": c.mem_len,
                        "same_length": c.same_length,
                        "clamp_len": c.clamp_len,
                    },
                },
                finish_reasons=tuple(row_reasons[rows]),
            )
        )
        for r in range(rows.start, rows.stop):  # its rows are no longer needed
          row_tokens[r] = None
      if new and on_batch is not None:
        on_batch(len(out), new)
      out.extend(new)
    return out[0] if isinstance(prompt, str) else out

  def _generate_rows(
      self,
      row_ids: list[np.ndarray],
      num_tokens: int,
      settings: sampling.SamplingSettings,
      seed: Any,
      first_row: int,
      stops: list[str],
      stop_at_eos: bool,
      on_text: Callable[[list[str]], None] | None,
  ) -> tuple[np.ndarray, list[str], list[str]]:
    """One batch of ``generate``: rows ``first_row ..`` of the whole call.

    Returns:
      (int32 [B, n] tokens, -1 after a row's end; B texts; B finish reasons).
    """
    decoders = [self.corpus.decoder() for _ in row_ids]
    for d, i in zip(decoders, row_ids):  # so that the text continues the prompt
      d.decode(i)  # (spaces, UTF-8 state)
    b = len(row_ids)
    steps, pieces, done_B = [], [[] for _ in row_ids], np.zeros(b, bool)
    reasons = ["length"] * b
    lookback = max((len(x) for x in stops), default=0) - 1
    tails = [""] * b  # each row's last lookback characters (a stop string may straddle pieces)
    stream = self.generator.stream(
        self.params,
        row_ids,
        num_tokens,
        settings,
        seed,
        stop_tokens=[self.corpus.boundary_id] if stop_at_eos else (),
        done_B=done_B,
        first_row=first_row,
    )
    for token_B in stream:
      steps.append(token_B)
      new = [
          d.decode(token_B[r : r + 1]) if token_B[r] >= 0 else "" for r, d in enumerate(decoders)
      ]
      for r, piece in enumerate(new):
        if token_B[r] < 0:
          continue
        pieces[r].append(piece)
        if stop_at_eos and token_B[r] == self.corpus.boundary_id:
          reasons[r] = "eos"
        elif stops and piece:  # a stop string that ends in this piece
          window = tails[r] + piece
          if any(x in window[max(0, len(window) - len(piece) - len(x) + 1) :] for x in stops):
            reasons[r], done_B[r] = "stop", True
          tails[r] = window[max(0, len(window) - lookback) :] if lookback else ""
      if on_text is not None:
        on_text(new)
    tail = [d.decode([], final=True) for d in decoders]
    if any(tail):
      for r, piece in enumerate(tail):
        pieces[r].append(piece)
      if on_text is not None:
        on_text(tail)
    return np.stack(steps, axis=1), ["".join(p) for p in pieces], reasons

  def score_text(
      self,
      text: str,
      *,
      dynamic: dynamic_eval.DynamicSettings | None = None,
      dynamic_stats: str | np.ndarray | None = None,
  ) -> text_scores.TextScore:
    """Per-token NLL of ``text`` with the evaluation settings
    (``evaluate.Evaluator.score``; the first token in the context of the
    boundary symbol, as ``--mode=score --text``), statically or with
    dynamic evaluation (``dynamic_eval.py``).

    The result holds the text's UTF-8 bytes and whitespace-separated words
    too (``TextScore.bits_per_byte``, ``TextScore.word_ppl``).

        lm = LanguageModel.from_pretrained("wt103", dynamic_eval=True)
        lm.score_text(article).ppl          # with the authors' settings
        lm.score_text(article, dynamic=DynamicSettings(lr=0.0)).ppl  # static

    Args:
      text: the text, in the corpus's format.
      dynamic: dynamic-evaluation settings (None: the config's
        ``eval.dynamic``; static evaluation where its lr is 0).
      dynamic_stats: the "rms" rule's statistics text: a string (tokenised
        like ``text``), or int token rows [B, T+1]; None: the start of the
        corpus's training split (``eval.dynamic.stats_tokens``).

    Raises:
      data.DataError: a symbol the corpus cannot encode; statistics from a
        training split that this corpus (a saved tokenizer only) lacks.
      ValueError: the text has no token; statistics tokens out of the
        vocabulary (``evaluate.ScoreInputError``).
    """
    tokens_1xT1 = text_scores.text_tokens(self.corpus, text)
    settings = (
        dynamic if dynamic is not None else dynamic_eval.DynamicSettings.from_config(self.config)
    )
    if not settings.enabled:
      nll_1xT = self.evaluator.score(self.params, tokens_1xT1)
    else:
      dyn = dynamic_eval.DynamicEvaluator(self.evaluator, settings)
      ss = None
      if settings.needs_statistics and dynamic_stats is None:
        if "train" not in self.corpus.splits:
          raise data.DataError(
              f"dynamic evaluation's statistics: corpus {self.corpus.name} was loaded without "
              "its training split (the tokenizer saved in the workdir); pass dynamic_stats="
              "some training text."
          )
        ss, _ = dyn.statistics_of_split(self.params, "train")
      elif settings.needs_statistics:
        stats = (
            text_scores.text_tokens(self.corpus, dynamic_stats)
            if isinstance(dynamic_stats, str)
            else evaluate.check_tokens(dynamic_stats, self.model_cfg.n_token)
        )
        ss, _ = dyn.statistics_of_tokens(self.params, stats)
      nll_1xT = dyn.score(self.params, tokens_1xT1, ss)
    num_bytes, num_words = text_scores.text_size(text)
    return text_scores.TextScore(
        tokens=tokens_1xT1[0, 1:],
        nll=nll_1xT[0],
        unit=self.corpus.unit,
        num_bytes=num_bytes,
        num_words=num_words,
    )
