"""Scoring with the evaluation settings (Dai et al. 2019, Sec. 3.2, 4).

Evaluation uses its own segment length, memory length, clamp_len and
same_length (``config.eval``; longer memory than in training, as in the
paper), the training parameters, and no dropout; the evaluation model and
its jitted steps are in ``eval_steps.py``.  Rows carry their memory from
segment to segment, starting empty.  The ``Evaluator``'s entry points:

* ``Evaluator.evaluate``: a corpus split, every token scored exactly once,
  the tail included (``--mode=eval`` and validation during training);
* ``Evaluator.score``: the per-token NLL of given token streams
  (``--mode=score``);
* ``Evaluator.token_nll``: every token's NLL of a split (RECL);
* ``Evaluator.greedy_answers``: a synthetic task's answers decoded
  greedily, without teacher forcing (``greedy_answers.py``).

The command-line modes around them (``--mode=eval``, ``--mode=score``) are
in ``cli/eval_modes.py``.  Dynamic evaluation (``dynamic_eval.py``) runs the
same segments, rows and memory with its own step (``Step``), which updates
the parameters after scoring each segment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from transformer_xl import data, errors, sharding
from transformer_xl.data import example_corpus
from transformer_xl.inference import eval_steps, greedy_answers
from transformer_xl.model import attention, models
from transformer_xl.model import memory as memory_lib
from transformer_xl.run import metrics
from transformer_xl.util import report

ScoreInputError = errors.ScoreInputError  # re-exported (transformer_xl.errors)

# A replacement of the eval step ("segments"): (memory, batch, weights_BxT) ->
# (nll_BxT, memory), with the batch and memory of ``eval_steps.make_eval_step`` and the
# weights (1: a token scored, 0: padding) as a global array; dynamic
# evaluation's (``dynamic_eval.py``) updates parameters it holds itself.
Step = Callable[[Any, dict, jax.Array], tuple[jax.Array, Any]]


def check_tokens(tokens: np.ndarray, n_token: int | None = None) -> np.ndarray:
  """Checks a token array for ``Evaluator.score``.

  Args:
    tokens: the array, expected integer [B, T+1] with B >= 1, T >= 1.
    n_token: the vocabulary size, or None to skip the range check.

  Returns:
    ``tokens`` as a numpy array.

  Raises:
    ScoreInputError: not an integer array, not 2-D, empty, T < 1, or ids
      outside [0, n_token).
  """
  tokens = np.asarray(tokens)
  if (
      tokens.ndim != 2
      or tokens.shape[0] < 1
      or tokens.shape[1] < 2
      or not np.issubdtype(tokens.dtype, np.integer)
  ):
    raise ScoreInputError(
        f"tokens must be an integer array [B, T+1] with B >= 1 and T >= 1; "
        f"got {tokens.dtype} {tokens.shape}."
    )
  if n_token is not None and (tokens.min() < 0 or tokens.max() >= n_token):
    raise ScoreInputError(
        f"token ids must be in [0, {n_token}) (the model's vocabulary); got "
        f"[{tokens.min()}, {tokens.max()}]."
    )
  return tokens


class Evaluator:
  """Scores a corpus split or token streams; one compiled step per method, reused.

  ``config.eval.method`` chooses how a split is scored:

  * "segments" (Transformer-XL, Sec. 3.2): ``eval.global_batch`` rows, each
    a contiguous part of the split, read ``eval.tgt_len`` tokens at a time
    with a memory of ``eval.mem_len`` (``data.EvalIterator``);
  * "sliding" (the vanilla Transformer of Al-Rfou et al. 2018; Table 9):
    every token scored by a fresh forward pass over a window of
    ``eval.window`` tokens, ``eval.stride`` tokens per window
    (``data.SlidingWindowIterator``), ``eval.global_batch`` windows a step.

  With ``data.documents="reset"`` ("segments" only) the batches carry
  ``doc_pos``, so that no query attends across a document boundary, and
  every row starts at a document, so that none is cut between two rows:
  each document is scored as if alone (``Evaluator.score`` of the boundary
  symbol and the document), to float32 rounding (``data.iterators.doc_pos``).
  Where a query's keys depend on its place in the segment
  (``eval.same_length=False``, or the absolute positions of ``attn_type`` 2
  and 3), every document also starts a segment (``align_documents``), as it
  does alone; with ``same_length`` and relative positions (every config's
  setting) documents follow each other without padding.

  With ``eval.documents="whole"`` (PG-19's whole-book evaluation;
  ``evaluate_documents``) the split is laid out the same way whatever
  ``data.documents`` says: every row holds whole documents, each document
  (book) scored from an empty memory to its end, as if alone; results come
  per document as well.

  A corpus of whole examples (``data.example_corpus.ExampleCorpus``: the
  synthetic tasks, BABILong) is scored example by example
  (``example_corpus.ExampleEvalIterator``: each example from an empty memory,
  only its answer positions weighed, whatever ``data.documents`` says), and
  ``evaluate`` adds the accuracy of the argmax predictions at the answer
  positions (``eval_steps.segment_nll_correct``; computed for these corpora
  only); ``greedy_answers`` adds those of the answers the model writes
  itself.

  Either way every token of the split is scored exactly once.  Any number
  of rows works on any mesh: rows are padded to a multiple of the
  data-parallel size with dummy rows of weight 0 (so the reference's eval
  batch of 10 runs on any slice); each process reads only its own real rows.

  Args:
    config: full config (``eval`` section used).
    train_model_cfg: the training ModelConfig (parameters are shared).
    corpus: the corpus (for ``evaluate``; None when only scoring arrays).
    mesh: the device mesh; rows go over the data-parallel axes.
  """

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      train_model_cfg: models.ModelConfig,
      corpus: data.Corpus | None,
      mesh: Mesh,
  ):
    self.method = config.eval.method
    self.cfg = eval_steps.eval_model_config(config, train_model_cfg)
    self.window_cfg = eval_steps.window_model_config(config, train_model_cfg)
    self.stride = config.eval.stride
    self.global_batch = config.eval.global_batch
    self.corpus = corpus
    self.documents = config.data.get("documents", "stream")  # "reset": batches carry doc_pos
    # A synthetic task: whole examples, each from an empty memory (``reset``), and accuracy.
    self.answers = isinstance(corpus, example_corpus.ExampleCorpus)
    if self.answers:
      self.documents = "stream"
      if self.method != "segments":
        raise ValueError(f"{corpus.name!r} is scored with eval.method='segments' only.")
    # "whole": every document scored from an empty memory (as "reset"), results per document
    self.whole = config.eval.get("documents", "split") == "whole"
    if self.whole and corpus is not None and corpus.documents is None:
      raise data.DataError(
          f"eval.documents='whole' needs a corpus with documents (data.dataset='text' or "
          f"'tfds:NAME', e.g. tfds:pg19); {corpus.name!r} has none: use eval.documents='split'."
      )
    # With "reset": each document starts a segment where the keys a query sees depend on
    # its place in the segment (as they do for a document scored alone): without
    # same_length, query i sees mem_len + i keys; absolute positions count from the window.
    self.align_documents = not self.cfg.same_length or issubclass(
        attention.variant(self.cfg), attention.AbsoluteAttention
    )
    self.mesh = mesh
    self.model = models.TransformerXL(self.cfg)
    self.batch_sharding = sharding.batch_sharding(mesh)
    self._mem_sharding = memory_lib.shardings(self.cfg, mesh)
    self._init_memory = {}  # batch size -> jitted constructor
    self._eval_step = eval_steps.make_eval_step(self.model, mesh)
    self._eval_correct_step = eval_steps.make_eval_step(
        self.model, mesh, correct=True
    )  # compiled if used
    self._window_step = eval_steps.make_window_step(
        models.TransformerXL(self.window_cfg), mesh, self.stride
    )
    self._greedy_step: Callable | None = None  # greedy_answers.make_greedy_segment, if used

  @property
  def lengths(self) -> dict:
    """The evaluation method and its lengths (recorded in eval_results.json), and
    ``documents: "whole"`` with ``eval.documents="whole"``."""
    if self.method == "sliding":
      return {
          "method": "sliding",
          "window": self.window_cfg.tgt_len,
          "stride": self.stride,
          "clamp_len": self.window_cfg.clamp_len,
      }
    return {
        "method": "segments",
        "tgt_len": self.cfg.tgt_len,
        "mem_len": self.cfg.mem_len,
        "clamp_len": self.cfg.clamp_len,
        "same_length": self.cfg.same_length,
        **memory_lib.describe_eval(self.cfg),  # e.g. the compressed slots
        **({"documents": "whole"} if self.whole else {}),
    }

  def rows(self, b: int) -> tuple[int, list[int]]:
    """(b padded to the data-parallel size, the padded rows this process holds)."""
    n_data = sharding.data_parallel_size(self.mesh)
    b_pad = -(-b // n_data) * n_data
    return b_pad, data.process_row_ids(self.batch_sharding, b_pad, self.cfg.tgt_len)

  def empty_memory(self, batch_size: int) -> memory_lib.Memory:
    """Empty eval memory for ``batch_size`` rows, made on the devices (one
    compilation per batch size)."""
    if batch_size not in self._init_memory:
      self._init_memory[batch_size] = jax.jit(
          lambda: memory_lib.init_memory(self.cfg, batch_size), out_shardings=self._mem_sharding
      )
    return self._init_memory[batch_size]()

  def greedy_answers(
      self, params: Any, split: str, max_examples: int = 0, num_rows: int = 0
  ) -> dict:
    """Greedy-decoding accuracies of a synthetic task's ``split``: the
    answers the model writes itself, each token the argmax given the
    question and its own earlier answer tokens (``greedy_answers.py``;
    Bulatov et al. 2022, Sec. 4).

    Args:
      params: model parameters.
      split: "train", "valid" or "test".
      max_examples: examples decoded at most, from the split's start (0: all).
      num_rows: examples decoded side by side (0: ``eval.global_batch``).

    Returns:
      {"greedy_token_accuracy", "greedy_accuracy", "greedy_examples"}
      (``greedy_answers.greedy_answers``).

    Raises:
      ValueError: the corpus is not a synthetic task.
    """
    return greedy_answers.greedy_answers(
        self, self._greedy_segment(), params, split, max_examples, num_rows
    )

  def decode_answers(self, params: Any, examples_NxS: np.ndarray, num_rows: int = 0) -> np.ndarray:
    """The answers of ``examples_NxS`` (int [N, S] examples of the corpus's
    synthetic task; only their questions are read) decoded greedily: int32
    [N, answer_len] (``greedy_answers.decode``).

    Raises:
      ValueError: the corpus is not a synthetic task.
    """
    return greedy_answers.decode(self, self._greedy_segment(), params, examples_NxS, num_rows)

  def _greedy_segment(self) -> Callable:
    """The jitted greedy segment of this evaluator's model, made on first use
    (compiled once per evaluator, not per split)."""
    if self._greedy_step is None:
      self._greedy_step = greedy_answers.make_greedy_segment(self.model, self.mesh)
    return self._greedy_step

  def _scored_batches(
      self,
      params: Any,
      split: str,
      max_steps: int = 0,
      step: Step | None = None,
      num_rows: int = 0,
      correct: bool = False,
  ) -> Iterator[tuple]:
    """Runs the eval method over ``split``; yields per step (nll_BxT on device,
    weights_BxT on device, pairs() -> int64 [B, T] stream index of every
    position, -1 where it is not scored), over the padded rows; with
    ``correct`` (the eval step, "segments") a fourth item, correct_BxT bool
    on device (``eval_steps.segment_nll_correct``).  ``step`` replaces the eval step
    ("segments"; see ``Step``); ``num_rows`` the number of rows (0:
    ``eval.global_batch``)."""
    source, boundary = self.corpus.splits[split], self.corpus.boundary_id
    b = num_rows or self.global_batch
    b_pad, rows = self.rows(b)
    real = [r for r in rows if r < b]
    sliding = self.method == "sliding"
    if sliding:
      make_it = lambda row_ids: data.SlidingWindowIterator(
          source, b, self.window_cfg.tgt_len, self.stride, boundary, row_ids=row_ids
      )
    elif self.answers:
      make_it = lambda row_ids: example_corpus.ExampleEvalIterator(
          self.corpus, split, b, self.cfg.tgt_len, boundary, row_ids=row_ids
      )
    else:
      documents = data.split_documents(
          self.corpus, split, "reset" if self.whole else self.documents
      )
      align = documents is not None and self.align_documents
      make_it = lambda row_ids: data.EvalIterator(
          source,
          b,
          self.cfg.tgt_len,
          boundary,
          row_ids=row_ids,
          documents=documents,
          align_documents=align,
      )
    layout = make_it([0])  # every process: the global layout (pairs of all rows)
    num_steps = min(len(layout), max_steps) if max_steps else len(layout)
    it = make_it(real) if real else None
    n_dummy, seg = len(rows) - len(real), (self.window_cfg if sliding else self.cfg).tgt_len
    memory = None if sliding else self.empty_memory(b_pad)
    for i in range(num_steps):
      local = next(it) if it is not None else None
      if n_dummy:
        dummy = {
            "inputs": np.zeros((n_dummy, seg), np.int32),
            "targets": np.zeros((n_dummy, seg), np.int32),
            "weights": np.zeros((n_dummy, seg), np.float32),
            "reset": np.full((n_dummy,), i == 0),
        }
        if sliding:
          dummy["front_pad"] = np.zeros((n_dummy,), np.int32)
        elif self.whole or self.documents == "reset":
          dummy["doc_pos"] = np.zeros((n_dummy, seg), np.int32)
        local = dummy if local is None else {k: np.concatenate([local[k], dummy[k]]) for k in dummy}
      batch = data.to_global_batch(local, self.batch_sharding, b_pad)
      weights = batch.pop("weights")
      if sliding:
        batch.pop("reset")
        nll_BxT = self._window_step(params, batch)
      elif step is not None:
        nll_BxT, memory = step(memory, batch, weights)
      elif correct:
        nll_BxT, correct_BxT, memory = self._eval_correct_step(params, memory, batch)
      else:
        nll_BxT, memory = self._eval_step(params, memory, batch)

      def pairs(i=i):
        p = np.full((b_pad, seg), -1, np.int64)
        p[:b] = layout.pairs(i)
        return p

      yield (nll_BxT, weights, pairs, correct_BxT) if correct else (nll_BxT, weights, pairs)

  def evaluate(
      self, params: Any, split: str, max_steps: int = 0, step: Step | None = None, num_rows: int = 0
  ) -> dict:
    """Scores ``split`` of the corpus (all of it unless ``max_steps`` > 0).

    Args:
      params: model parameters.
      split: "train", "valid" or "test".
      max_steps: segments scored at most (0: all).
      step: replaces the eval step (``Step``; dynamic evaluation).
      num_rows: rows of the batch (0: ``eval.global_batch``).

    Returns:
      {"loss_nats": mean NLL per token (nats), "bpc" or "ppl": ...,
        "tokens": number of scored tokens}, the loss and its metric None
      when no token was scored (e.g. ``max_steps`` segments of a synthetic
      task that reach no answer token); for a synthetic task (its
      answer tokens only) also ``answers``' "answer_accuracy" and
      "answer_token_accuracy" and "examples", unless ``step`` is given.
    """
    correct = self.answers and step is None and self.method == "segments"
    pending = list(self._scored_batches(params, split, max_steps, step, num_rows, correct))
    nll_sum, n_tok = 0.0, 0.0
    for nll_BxT, w_BxT, *_ in pending:  # float64 sums over every scored token
      w = np.asarray(jax.device_get(_fully_replicated(w_BxT)), np.float64)
      nll_sum += float(np.sum(np.asarray(jax.device_get(nll_BxT), np.float64) * w))
      n_tok += float(w.sum())
    metric = metrics.metric_name(self.corpus.unit)
    if n_tok:
      loss = nll_sum / n_tok
      result = {"loss_nats": loss, metric: metrics.metric_value(loss, self.corpus.unit)}
    else:  # nothing measured: no score (a loss of 0 would read as a perfect model)
      result = {"loss_nats": None, metric: None}
    result["tokens"] = int(round(n_tok))
    if correct:
      example_BxT, correct_BxT = [], []
      for _, _, pairs, c_BxT in pending:
        p = pairs()
        example_BxT.append(np.where(p >= 0, self.corpus.example_of(np.maximum(p, 0)), -1))
        correct_BxT.append(np.asarray(jax.device_get(c_BxT), bool))
      result.update(
          example_corpus.answer_scores(
              np.concatenate(example_BxT, axis=1) if example_BxT else np.zeros((0, 0), np.int64),
              np.concatenate(correct_BxT, axis=1) if correct_BxT else np.zeros((0, 0), bool),
              self.corpus.counts(split),
          )
      )
    return result

  def evaluate_documents(
      self, params: Any, split: str, step: Step | None = None, num_rows: int = 0
  ) -> dict:
    """Scores ``split`` document by document (``eval.documents="whole"``).

    Every document (a book of PG-19) is scored from an empty memory to its
    end, as ``score`` scores it alone (the boundary symbol, then the
    document): the rows hold whole documents, and a query sees no earlier
    document (``doc_pos``; each document also starts a segment where a
    query's keys depend on its place in it: ``align_documents``).  Progress
    is reported by documents (``report.log``, at every tenth of them, and a
    progress bar on a terminal).

    Args:
      params: model parameters.
      split: "train", "valid" or "test".
      step: replaces the eval step (``Step``).
      num_rows: rows of the batch (0: ``eval.global_batch``).

    Returns:
      ``evaluate``'s {"loss_nats", "ppl" or "bpc", "tokens"} over the whole
      split (token-weighted: the documents' total NLL over their tokens),
      plus "documents_scored" and "per_document": one dict per document in
      split order: {"document": index, "tokens", "loss_nats" (mean, nats),
      "ppl" or "bpc", "bytes" and "bits_per_byte", "words" and "word_ppl"
      (exp(NLL / words); None for a document without words)}, the last four
      where the corpus records each document's bytes and words.

    Raises:
      DataError: the corpus has no documents.
    """
    if self.corpus.documents is None:
      raise data.DataError(
          f"scoring whole documents needs a corpus with documents; {self.corpus.name!r} has none."
      )
    if not self.whole:
      raise ValueError("evaluate_documents needs eval.documents='whole'.")
    index = self.corpus.documents[split]
    n_docs = index.num_sentences
    offsets = index.read_offsets(0, n_docs + 1)
    lengths = np.diff(offsets)
    nll_D, seen_D = np.zeros(n_docs, np.float64), np.zeros(n_docs, np.int64)
    done, reported = 0, 0
    bar = metrics.progress_bar(n_docs, desc=f"eval {split}", unit="document")
    for nll_BxT, _, pairs, *_ in self._scored_batches(params, split, step=step, num_rows=num_rows):
      p = pairs()
      scored = p >= 0
      j = p[scored]  # stream indices scored in this step
      doc = np.searchsorted(offsets, j, side="right") - 1
      np.add.at(nll_D, doc, np.asarray(jax.device_get(nll_BxT), np.float64)[scored])
      np.add.at(seen_D, doc, 1)
      # A document is done when its last token is scored (a row reads its tokens in order).
      ended = int(np.count_nonzero(j == offsets[doc + 1] - 1))
      bar.update(ended)
      done += ended
      if done * 10 // n_docs > reported:  # each tenth of the documents, and the last one
        reported = done * 10 // n_docs
        report.log(f"eval {split}: {done}/{n_docs} documents scored")
    bar.close()
    unit = self.corpus.unit
    metric = metrics.metric_name(unit)
    sizes = {}
    for key, counts in (
        ("bytes", self.corpus.document_bytes),
        ("words", self.corpus.document_words),
    ):
      if counts is not None:
        sizes[key] = counts[split].read(0, n_docs)
    per_document = []
    for k in range(n_docs):
      n = int(lengths[k])
      d = {"document": k, "tokens": n, "loss_nats": nll_D[k] / max(n, 1)}
      d[metric] = metrics.metric_value(d["loss_nats"], unit)
      if "bytes" in sizes and sizes["bytes"][k] >= 0:
        d["bytes"] = int(sizes["bytes"][k])
        d["bits_per_byte"] = nll_D[k] / np.log(2.0) / d["bytes"] if d["bytes"] else None
      if "words" in sizes and sizes["words"][k] >= 0:
        d["words"] = int(sizes["words"][k])
        with np.errstate(over="ignore"):  # inf where it overflows (null in the JSON)
          d["word_ppl"] = float(np.exp(nll_D[k] / d["words"])) if d["words"] else None
      per_document.append(d)
    tokens = int(seen_D.sum())
    loss = float(nll_D.sum()) / max(tokens, 1)
    return {
        "loss_nats": loss,
        metric: metrics.metric_value(loss, unit),
        "tokens": tokens,
        "documents_scored": done,
        "per_document": per_document,
    }

  def token_nll(self, params: Any, split: str) -> np.ndarray:
    """The NLL of every token of ``split`` in stream order: float32 [N], nats.

    Entry j is -log p(token j | its context): the boundary symbol and the
    tokens before j that the eval method shows the model (for RECL and
    per-token analyses; ``evaluate`` is its mean).
    """
    out = np.full((self.corpus.splits[split].num_tokens,), np.nan, np.float32)
    for nll_BxT, _, pairs in list(self._scored_batches(params, split)):
      p = pairs()
      scored = p >= 0
      out[p[scored]] = np.asarray(jax.device_get(nll_BxT))[scored]
    return out

  def score(self, params: Any, tokens_BxT1: np.ndarray, step: Step | None = None) -> np.ndarray:
    """Per-token NLL of contiguous streams, segment by segment with memory.

    Row b of ``tokens_BxT1`` is one stream; segments of the eval tgt_len go
    left to right, carrying a memory of the eval mem_len that starts empty.
    Padding (rows, and the last segment to tgt_len) comes after the real
    tokens of a row, so it cannot change their scores (causality), and is
    cut off.

    Args:
      params: model parameters.
      tokens_BxT1: integer array [B, T + 1] of token ids (all processes pass
        the same array).
      step: replaces the eval step (``Step``; dynamic evaluation), with
        weight 0 on the padding.

    Returns:
      float32 [B, T]: entry (b, t) is -log p(token t+1 | tokens <= t), nats.

    Raises:
      ScoreInputError (a ValueError): not a 2-D integer array with B, T >= 1,
        or ids outside [0, n_token) (``check_tokens``).
    """
    return self._score(params, tokens_BxT1, step, correct=False)[0]

  def score_greedy(self, params: Any, tokens_BxT1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``score``, and whether each token is the model's argmax prediction.

    Returns:
      (float32 [B, T] NLL in nats as ``score``'s, bool [B, T]: entry (b, t)
      says token t+1 is the argmax of p(. | tokens <= t)
      (``eval_steps.segment_nll_correct``)).

    Raises:
      ScoreInputError (a ValueError): as ``score``.
    """
    nll, hit = self._score(params, tokens_BxT1, None, correct=True)
    assert hit is not None
    return nll, hit

  def _score(
      self, params: Any, tokens_BxT1: np.ndarray, step: Step | None, correct: bool
  ) -> tuple[np.ndarray, np.ndarray | None]:
    """``score`` (``correct``: with the argmax hits of ``score_greedy``)."""
    tokens = check_tokens(tokens_BxT1, self.cfg.n_token)
    b, t1 = tokens.shape
    t, seg = t1 - 1, self.cfg.tgt_len
    b_pad, rows = self.rows(b)
    n_seg = -(-t // seg)
    padded = np.zeros((b_pad, n_seg * seg + 1), np.int32)
    padded[:b, :t1] = tokens
    weights = np.zeros((b_pad, n_seg * seg), np.float32)  # 1 on the real tokens (``step``)
    weights[:b, :t] = 1.0
    memory = self.empty_memory(b_pad)
    out, hits = [], []
    for s in range(n_seg):
      local = {
          "inputs": padded[rows, s * seg : (s + 1) * seg],
          "targets": padded[rows, s * seg + 1 : (s + 1) * seg + 1],
          "reset": np.full((len(rows),), s == 0),
      }
      if correct:
        batch = data.to_global_batch(local, self.batch_sharding, b_pad)
        nll_BxT, correct_BxT, memory = self._eval_correct_step(params, memory, batch)
        hits.append(correct_BxT)
      elif step is None:
        batch = data.to_global_batch(local, self.batch_sharding, b_pad)
        nll_BxT, memory = self._eval_step(params, memory, batch)
      else:
        local["weights"] = weights[rows, s * seg : (s + 1) * seg]
        batch = data.to_global_batch(local, self.batch_sharding, b_pad)
        nll_BxT, memory = step(memory, batch, batch.pop("weights"))
      out.append(nll_BxT)
    nll = np.concatenate([np.asarray(jax.device_get(x)) for x in out], axis=1)[:b, :t]
    if not correct:
      return nll.astype(np.float32), None
    hit = np.concatenate([np.asarray(jax.device_get(x)) for x in hits], axis=1)[:b, :t]
    return nll.astype(np.float32), hit.astype(bool)


def _fully_replicated(x: jax.Array) -> jax.Array:
  """``x`` gathered onto every device, so that any process can read it."""
  if x.is_fully_replicated:
    return x
  return jax.jit(
      lambda a: a,
      out_shardings=jax.sharding.NamedSharding(x.sharding.mesh, jax.sharding.PartitionSpec()),
  )(x)
