"""A model for EleutherAI's lm-evaluation-harness: any workdir or released model.

    python -m transformer_xl.harness run --model transformer_xl \\
        --model_args workdir=workdirs/quickstart --batch_size 8 --tasks wikitext
    # or in Python:
    import lm_eval
    from transformer_xl.harness import HarnessLM
    lm_eval.simple_evaluate(model=HarnessLM(workdir="workdirs/quickstart"), tasks=[...])

``HarnessLM`` subclasses ``lm_eval.api.model.LM`` (registered as
``transformer_xl``) over ``inference.language_model.LanguageModel``; every
request goes through the recurrent memory segment by segment with the
workdir's evaluation settings (``eval.tgt_len``, ``eval.mem_len``, the
memory variant's own state), so a context of any length is read whole:
there is no context window to truncate to.

* ``loglikelihood``: the boundary symbol, the context, then the
  continuation, scored as one stream (``Evaluator.score_greedy``); the
  continuation's log-probability (nats) and whether every one of its tokens
  is the argmax.  Requests are batched, longest first, ``batch_size`` rows
  at a time.
* ``loglikelihood_rolling``: a document tokenised as ``--mode=score
  --text`` tokenises a file (``text_scores.text_tokens``: the boundary
  symbol first, every line ended), every token scored once with the memory
  of everything before it (the paper's evaluation, Sec. 3.2): the sum of
  ``--mode=score``'s per-token NLLs, negated.
* ``generate_until``: ``LanguageModel.generate`` with the harness's
  ``until`` strings and ``max_gen_toks``; greedy (``do_sample`` false, or
  ``temperature`` 0: top-1) or sampled (``temperature``, ``top_k``,
  ``top_p``, ``seed``); the text is cut before the first stop string, as
  the harness's own models cut it.  Requests with the same ``gen_kwargs``
  run as batches (of prompts of one length for a memory that runs on whole
  segments: the memory tokens, ARMT).

Tokenisation is the workdir's vocabulary (``Corpus.encode`` with the
line left open): word-level vocabularies split on whitespace, so the
harness's convention of a continuation that starts with a space holds;
SentencePiece and byte vocabularies encode the context and the
continuation together and split where the context's tokens end (trailing
whitespace of a context moves to the continuation first, as the harness's
HuggingFace model does).  A word-level vocabulary maps unknown words to
``<unk>`` and has no capitals where its corpus had none (PTB): scores on
text of another style measure that too.

One process (``rank`` 0 of 1); the devices are JAX's (``device`` is not
used).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from transformer_xl import errors
from transformer_xl.inference import language_model, text_scores

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_GEN_TOKS = 256  # the harness's HuggingFace model's default
# gen_kwargs that generate_until understands (the rest are refused, naming them).
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p", "seed")


class HarnessError(errors.UsageError):
  """A model argument or a request this model cannot serve (one line)."""


def _batch_size(value: Any) -> int:
  if value in (None, "auto"):
    return DEFAULT_BATCH_SIZE
  try:
    size = int(value)
  except (TypeError, ValueError):
    size = 0
  if size < 1 or str(value).strip() != str(size):
    raise HarnessError(
        f"batch_size={value!r}: give an integer >= 1 (rows scored or generated together; "
        f"'auto' means {DEFAULT_BATCH_SIZE})."
    )
  return size


@register_model("transformer_xl")
class HarnessLM(LM):
  """A trained workdir (or released model) as an lm-evaluation-harness model.

  Args:
    workdir: a training or converted run's directory (``--workdir``).
    pretrained: a released model's name instead (``LanguageModel.from_pretrained``:
      enwik8, text8, wt103, lm1b).
    batch_size: rows scored or generated together (an int, or "auto": 8).
    max_batch_size: accepted for the harness's command line; not used.
    device: accepted for the harness's command line; JAX places the
      computation (``JAX_PLATFORMS`` chooses).
    max_gen_toks: default ``max_gen_toks`` of ``generate_until``.
    seed: default sampling seed of ``generate_until``.
    lm: an already loaded ``LanguageModel`` (Python use; instead of the two
      above).

  Raises:
    HarnessError: no or two models named, a bad ``batch_size``.
    FileNotFoundError, data.DataError, default_config.ConfigError: the
      workdir cannot be loaded (``LanguageModel.from_workdir``).
  """

  def __init__(
      self,
      workdir: str | None = None,
      pretrained: str | None = None,
      batch_size: int | str | None = DEFAULT_BATCH_SIZE,
      max_batch_size: int | None = None,
      device: str | None = None,
      max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
      seed: int = 0,
      lm: language_model.LanguageModel | None = None,
  ):
    super().__init__()
    del max_batch_size, device
    if sum(x is not None for x in (workdir, pretrained, lm)) != 1:
      raise HarnessError(
          "name one model: --model_args workdir=DIR (a trained or converted run) or "
          "pretrained=NAME (enwik8, text8, wt103, lm1b)."
      )
    self.batch_size = _batch_size(batch_size)
    if not isinstance(max_gen_toks, int) or max_gen_toks < 1:
      raise HarnessError(f"max_gen_toks={max_gen_toks!r}: give an integer >= 1.")
    self.max_gen_toks, self.seed = max_gen_toks, int(seed)
    if lm is None:
      if workdir is not None:
        lm = language_model.LanguageModel.from_workdir(str(workdir))
      else:
        lm = language_model.LanguageModel.from_pretrained(str(pretrained))
    self.lm = lm
    self.corpus = lm.corpus

  # -- tokens ------------------------------------------------------------------------------

  def tok_encode(self, text: str) -> list[int]:
    """The ids of ``text`` with its last line left open (``Corpus.encode``)."""
    if not text:
      return []
    return [int(i) for i in self.corpus.encode(text, end_last_line=False)]

  def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as the harness's models split them:
    trailing whitespace of the context moves to the continuation, the two are
    encoded together and split where the context's ids end; where that split
    does not hold (a word-level vocabulary and a continuation inside a
    word), each is encoded alone."""
    n = len(context) - len(context.rstrip())
    if n:
      context, continuation = context[:-n], context[-n:] + continuation
    ctx = self.tok_encode(context)
    whole = self.tok_encode(context + continuation)
    if whole[: len(ctx)] == ctx:
      return ctx, whole[len(ctx) :]
    return ctx, self.tok_encode(continuation)

  def _rows(self, streams: Sequence[Sequence[int]]) -> np.ndarray:
    """int32 [batch_size, T + 1]: the streams, padded after their ends (and with
    dummy rows to ``batch_size``, one compiled shape per batch)."""
    width = max(len(s) for s in streams)
    out = np.zeros((max(self.batch_size, len(streams)), width), np.int32)
    out[:, 0] = self.corpus.boundary_id
    for r, s in enumerate(streams):
      out[r, : len(s)] = s
    return out

  # -- the harness's three requests ----------------------------------------------------------

  def loglikelihood(
      self, requests: list[Instance], disable_tqdm: bool = False
  ) -> list[tuple[float, bool]]:
    """(log p(continuation | context) in nats, greedy) per request."""
    del disable_tqdm
    pairs = [self.encode_pair(*req.args) for req in requests]
    # boundary + context + continuation, and how many of the last ids are the continuation
    items = [([self.corpus.boundary_id, *ctx, *cont], len(cont)) for ctx, cont in pairs]
    results: list[tuple[float, bool] | None] = [None] * len(items)
    order = sorted(range(len(items)), key=lambda i: -len(items[i][0]))
    for first in range(0, len(order), self.batch_size):
      batch = order[first : first + self.batch_size]
      nll, hit = self.lm.evaluator.score_greedy(
          self.lm.params, self._rows([items[i][0] for i in batch])
      )
      for r, i in enumerate(batch):
        stream, n = items[i]
        end = len(stream) - 1  # scores of positions 1..len-1 are nll[:, 0..len-2]
        logp = -float(np.sum(nll[r, end - n : end], dtype=np.float64))
        results[i] = (logp, bool(np.all(hit[r, end - n : end])))
    for req, res in zip(requests, results):
      self.cache_hook.add_partial("loglikelihood", req.args, res)
    return [r for r in results if r is not None]

  def loglikelihood_rolling(
      self, requests: list[Instance], disable_tqdm: bool = False
  ) -> list[float]:
    """log p(document) in nats per request, every token scored once with the
    memory of all before it (``--mode=score``'s tokens and scores)."""
    del disable_tqdm
    streams = [text_scores.text_tokens(self.corpus, req.args[0])[0] for req in requests]
    results: list[float] = [0.0] * len(streams)
    order = sorted(range(len(streams)), key=lambda i: -len(streams[i]))
    for first in range(0, len(order), self.batch_size):
      batch = order[first : first + self.batch_size]
      nll = self.lm.evaluator.score(self.lm.params, self._rows([streams[i] for i in batch]))
      for r, i in enumerate(batch):
        results[i] = -float(np.sum(nll[r, : len(streams[i]) - 1], dtype=np.float64))
    for req, res in zip(requests, results):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, res)
    return results

  def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
    """The continuation of each context, cut before the first of its
    ``until`` strings; requests with the same ``gen_kwargs`` run as batches."""
    del disable_tqdm
    results: list[str] = [""] * len(requests)
    # A memory that runs on whole segments (memory tokens, ARMT) generates prompts of one
    # length together (``generate.Generator``); the others any prompts.
    by_length = self.lm.generator.memory_plan.whole_segments
    groups: dict[tuple[str, int], list[int]] = {}
    for i, req in enumerate(requests):
      n = len(self.lm.encode_prompt(req.args[0])) if by_length else 0
      groups.setdefault((json.dumps(req.args[1], sort_keys=True, default=str), n), []).append(i)
    for (key, _), idx in groups.items():
      settings = self._generation_settings(json.loads(key))
      until = settings.pop("stop")
      outs = self.lm.generate(
          [requests[i].args[0] for i in idx],
          stop=until,
          batch_size=self.batch_size,
          **settings,
      )
      for i, out in zip(idx, outs):
        text = out.texts[0]
        for term in until:
          text = text.split(term)[0]
        results[i] = text
        self.cache_hook.add_partial("generate_until", requests[i].args, text)
    return results

  def _generation_settings(self, gen_kwargs: dict) -> dict:
    """``LanguageModel.generate``'s keywords from the harness's ``gen_kwargs``.

    Raises:
      HarnessError: a key this model does not know, or a bad value.
    """
    unknown = sorted(set(gen_kwargs) - set(GEN_KWARGS))
    if unknown:
      raise HarnessError(
          f"gen_kwargs {unknown}: not understood by the transformer_xl model (it takes "
          f"{', '.join(GEN_KWARGS)})."
      )
    until = gen_kwargs.get("until", [])
    until = [until] if isinstance(until, str) else list(until or [])
    until = [u for u in until if u]
    temperature = float(gen_kwargs.get("temperature", 0.0) or 0.0)
    greedy = not gen_kwargs.get("do_sample", False) or temperature == 0.0
    max_gen_toks = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
    if max_gen_toks < 1:
      raise HarnessError(f"max_gen_toks={max_gen_toks}: give an integer >= 1.")
    return {
        "num_tokens": max_gen_toks,
        "stop": until,
        "top_k": 1 if greedy else int(gen_kwargs.get("top_k", 0) or 0),
        "top_p": 1.0 if greedy else float(gen_kwargs.get("top_p", 1.0)),
        "temperature": 1.0 if greedy else temperature,
        "seed": int(gen_kwargs.get("seed", self.seed)),
    }
