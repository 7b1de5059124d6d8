"""Corpora of whole examples and their batches: the synthetic tasks' and BABILong's.

An ``ExampleCorpus`` holds each split as examples of one length, ``S``
tokens, laid out so that the model reads ``inputs = seq[:-1]`` and predicts
``targets = seq[1:]``: ``E = S - 1`` positions per example, whole segments
of ``tgt_len``, the last ``answer_len`` the answer region
(``data/synthetic.py``: copy, reverse, associative retrieval, passkey;
``data/babilong.py``: BABILong).  Every example is scored from an empty
memory (``reset`` at its first segment), and only its answer positions are
weighed: the first ``counts(split)[n]`` of its answer region (all of it for
the synthetic tasks; BABILong's answers differ in length).

Layout of a split: ``ExampleCorpus.examples[split]``, int32 [N, S]; the
split's ``TokenSource`` is the same examples back to back (N * S tokens),
for the tools that read a stream.  Batches: ``ExampleIterator`` (training,
endless), ``ExampleWindows`` (whole examples per step, for backpropagation
through their segments) and ``ExampleEvalIterator`` (one pass), which
follow the batch contract of ``transformer_xl.data``.  Evaluation
(``inference/evaluate.py``) adds the answers' accuracies, and greedy
decoding (``inference/greedy_answers.py``) the corpus's ``greedy_scores``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from transformer_xl import errors
from transformer_xl.data.checks import (
    Batch,
    check_positive,
    check_row_ids,
    check_state,
    side_by_side,
)
from transformer_xl.data.corpus import Corpus


class Layout(Protocol):
  """What the iterators read of an example layout (``TaskSettings``,
  ``babilong.Layout``)."""

  @property
  def name(self) -> str:
    """``data.dataset``, for messages."""

  @property
  def sequence_len(self) -> int:
    """S: tokens of an example."""

  @property
  def example_len(self) -> int:
    """E = S - 1: the model's positions per example."""

  @property
  def answer_len(self) -> int:
    """The answer region at the end of an example."""


def segment_problems(s: Layout, lengths: Mapping[str, int]) -> list[str]:
  """Segment lengths that do not divide the example length.

  Args:
    s: the example layout.
    lengths: config key -> segment length, e.g. {"model.tgt_len": 12}.

  Returns:
    One message per length that is not a divisor of ``s.example_len``.
  """
  e = s.example_len
  divisors = [d for d in range(1, e + 1) if e % d == 0]
  return [
      f"{key}={t} does not divide the {s.name} example length {e} (an example "
      f"must be whole segments): set --config.{key} to one of {divisors}."
      for key, t in lengths.items()
      if t < 1 or e % t
  ]


@dataclasses.dataclass(frozen=True)
class ExampleCorpus(Corpus):
  """A corpus whose splits are whole examples (the synthetic tasks, BABILong).

  Attributes (beyond ``Corpus``'s):
    settings: the example layout (``Layout``): a synthetic task's
      ``TaskSettings``, BABILong's ``babilong.Layout``.
    examples: "train", "valid", "test" -> int32 [N, S] examples.
    answer_counts: "train", "valid", "test" -> int [N], each example's
      weighed positions (None: the whole answer region of every example).
  """

  settings: Layout | None = None
  examples: Mapping[str, np.ndarray] | None = None
  answer_counts: Mapping[str, np.ndarray] | None = None

  def example_of(self, stream_index: np.ndarray) -> np.ndarray:
    """The example of stream positions of a split (int64, same shape)."""
    return np.asarray(stream_index) // self.settings.sequence_len

  def counts(self, split: str) -> np.ndarray:
    """int [N]: each example's weighed positions, the first of its answer
    region of ``answer_len`` (``answer_counts``; all of it by default)."""
    if self.answer_counts is not None:
      return np.asarray(self.answer_counts[split])
    return np.full(self.examples[split].shape[0], self.settings.answer_len, np.int32)

  def greedy_scores(self, split: str, examples_NxS: np.ndarray, preds_NxA: np.ndarray) -> dict:
    """The accuracies of greedily decoded answers ``preds_NxA`` (int [N,
    answer_len]) of the first N examples of ``split`` (``examples_NxS``),
    over each example's weighed answer tokens (the first ``counts`` of
    its answer region): {"greedy_token_accuracy": the share of those tokens
    decoded right (the authors' "No teacher forcing: acc", ``num_correct /
    num_total``), "greedy_accuracy": the share of examples whose whole
    answer is decoded right (equal to the teacher-forced
    ``answer_accuracy``: an answer is decoded right exactly when every
    token of it is predicted right from the true earlier ones),
    "greedy_examples": N}; NaN accuracies for none."""
    n, a_len = preds_NxA.shape
    counts_N = self.counts(split)[:n]
    scored_NxA = np.arange(a_len)[None, :] < counts_N[:, None]
    right_NxA = (preds_NxA == examples_NxS[:, examples_NxS.shape[1] - a_len :]) & scored_NxA
    right_N = right_NxA.sum(axis=1)
    return {
        "greedy_token_accuracy": float(right_N.sum() / counts_N.sum()) if n else math.nan,
        "greedy_accuracy": float(np.count_nonzero(right_N == counts_N) / n) if n else math.nan,
        "greedy_examples": n,
    }


def weighed(settings: Layout, counts_b: np.ndarray, pos_T: np.ndarray) -> np.ndarray:
  """bool [b, T]: which of positions ``pos_T`` (int [T], of an example) are
  weighed for examples with ``counts_b`` (int [b]) weighed answer positions:
  the first ``count`` of the answer region."""
  start = settings.example_len - settings.answer_len
  return (pos_T[None, :] >= start) & (pos_T[None, :] < start + np.asarray(counts_b)[:, None])


class _Examples:
  """What both iterators share: the examples, the segments, the rows."""

  def __init__(
      self,
      corpus: ExampleCorpus,
      split: str,
      global_batch: int,
      tgt_len: int,
      row_ids: Sequence[int] | None,
  ):
    self.global_batch = check_positive("global_batch", global_batch)
    self.tgt_len = check_positive("tgt_len", tgt_len)
    s = corpus.settings
    problems = segment_problems(s, {"tgt_len": self.tgt_len})
    if problems:
      raise errors.ConfigError(problems[0])
    self._examples_NxS = corpus.examples[split]
    self._settings = s
    self._counts_N = corpus.counts(split)
    self._seq_len = s.sequence_len
    self.num_examples = int(self._examples_NxS.shape[0])
    self.segments = s.example_len // self.tgt_len  # the authors' n_chunks
    self.row_ids = check_row_ids(row_ids, self.global_batch)
    self._step = 0

  def _batch(self, k_b: np.ndarray, real_b: np.ndarray, segment: int) -> Batch:
    """Segment ``segment`` of examples ``k_b`` (rows with ``real_b`` False: padding)."""
    T = self.tgt_len
    a = segment * T
    k_b = np.where(real_b, k_b, 0)
    tokens_bxT1 = self._examples_NxS[k_b, a : a + T + 1]
    answer_bxT = weighed(self._settings, self._counts_N[k_b], np.arange(a, a + T))
    weights_bxT = np.where(real_b[:, None] & answer_bxT, 1.0, 0.0)
    return {
        "inputs": np.ascontiguousarray(tokens_bxT1[:, :-1], dtype=np.int32),
        "targets": np.ascontiguousarray(tokens_bxT1[:, 1:], dtype=np.int32),
        "weights": weights_bxT.astype(np.float32),
        "reset": np.full((len(k_b),), segment == 0),
    }

  def __iter__(self):
    return self


class ExampleIterator(_Examples):
  """Endless training batches of whole examples, in split order.

  Step ``t`` is segment ``s = t % segments`` of the examples of batch ``e =
  t // segments``: row ``r`` holds example ``(e * B + r) % N`` (the authors'
  ``data_loader`` reads batches of consecutive examples and wraps around
  the split).  ``reset`` is True at each example's first segment; the
  ``weights`` are 1 at the answer positions only (the authors' loss).

  Args:
    corpus: the ``ExampleCorpus``.
    split: usually "train".
    global_batch: B, rows over all processes.
    tgt_len: T, a divisor of the example length.
    row_ids: this process's rows (``process_row_ids``); None: all.

  Raises:
    ValueError: global_batch or tgt_len < 1; bad row_ids.
    errors.ConfigError: tgt_len does not divide the example length.
  """

  def __init__(self, corpus, split, global_batch, tgt_len, row_ids=None):
    super().__init__(corpus, split, global_batch, tgt_len, row_ids)

  def __next__(self) -> Batch:
    e, s = divmod(self._step, self.segments)
    k_b = (e * self.global_batch + np.asarray(self.row_ids, np.int64)) % self.num_examples
    self._step += 1
    return self._batch(k_b, np.ones(len(k_b), bool), s)

  def next_examples(self) -> tuple[int, np.ndarray]:
    """(its index, the examples: int32 [b, S], this process's rows) of the
    next batch of whole examples, skipping to its start (the steps of one
    example's segments at once: ``armt_retrieval.VaryPairsWindows``)."""
    e = -(-self._step // self.segments)  # the next batch of examples that has not begun
    k_b = (e * self.global_batch + np.asarray(self.row_ids, np.int64)) % self.num_examples
    self._step = (e + 1) * self.segments
    return e, self._examples_NxS[k_b]

  def get_state(self) -> dict[str, int]:
    """{"step": batches yielded, "global_batch", "tgt_len", "num_examples"}."""
    return {
        "step": self._step,
        "global_batch": self.global_batch,
        "tgt_len": self.tgt_len,
        "num_examples": self.num_examples,
    }

  def set_state(self, state: Mapping[str, int]) -> None:
    """Moves to a position of ``get_state``.

    Raises:
      ValueError: not such a dict, a negative step, or another layout.
    """
    s = check_state(
        state,
        ("step", "global_batch", "tgt_len", "num_examples"),
        {
            "global_batch": self.global_batch,
            "tgt_len": self.tgt_len,
            "num_examples": self.num_examples,
        },
        "ExampleIterator",
    )
    if s["step"] < 0:
      raise ValueError(f"ExampleIterator state step must be >= 0, got {s['step']}.")
    self._step = s["step"]


class ExampleWindows:
  """Whole examples per step: the ``segments`` batches of each example of an
  ``ExampleIterator`` side by side (``checks.side_by_side``: arrays [B,
  segments T], ``reset`` [B, segments]), for backpropagation through all
  its segments (``train.mem_backprop_depth = segments - 1``), as the
  authors' ``train_synthetic.py`` trains: one update per batch of examples,
  the memory tokens carried with their gradient from the first segment to
  the last.  The state is the base's (always at an example's start).

  Raises:
    ValueError: ``base`` is not an ``ExampleIterator``.
  """

  def __init__(self, base: ExampleIterator):
    if not isinstance(base, ExampleIterator):
      raise ValueError(f"ExampleWindows reads an ExampleIterator, not {type(base).__name__}.")
    self.base = base

  def __iter__(self):
    return self

  def __next__(self) -> Batch:
    return side_by_side([next(self.base) for _ in range(self.base.segments)])

  def get_state(self) -> dict[str, int]:
    return self.base.get_state()

  def set_state(self, state: Mapping[str, int]) -> None:
    self.base.set_state(state)


class ExampleEvalIterator(_Examples):
  """One pass over a split's examples, each scored once from an empty memory.

  Batch ``e`` of examples holds examples ``e * B .. e * B + B - 1`` (row
  ``r``: example ``e * B + r``; rows past the last example are padding,
  weight 0), in ``segments`` steps; ``num_steps = ceil(N / B) * segments``.
  ``weights`` are 1 at the answer positions of real rows only; ``reset``
  is True at each example's first segment.  ``boundary_id`` is accepted for
  the interface of ``EvalIterator`` and not used.
  """

  def __init__(self, corpus, split, global_batch, tgt_len, boundary_id=0, row_ids=None):
    super().__init__(corpus, split, global_batch, tgt_len, row_ids)
    self.num_steps = -(-self.num_examples // self.global_batch) * self.segments

  def __len__(self) -> int:
    return self.num_steps

  def _examples(self, step: int) -> tuple[np.ndarray, int]:
    """(example of every global row: int64 [B], -1 for padding; the segment)."""
    e, s = divmod(step, self.segments)
    k_B = e * self.global_batch + np.arange(self.global_batch, dtype=np.int64)
    return np.where(k_B < self.num_examples, k_B, -1), s

  def pairs(self, step: int) -> np.ndarray:
    """int64 [B, T]: the split stream's index of every scored position's
    target (the answer positions of real rows), -1 elsewhere."""
    k_B, s = self._examples(step)
    T = self.tgt_len
    pos_T = s * T + np.arange(T)
    j_BxT = k_B[:, None] * self._seq_len + pos_T[None, :] + 1
    real_B = k_B >= 0
    scored = real_B[:, None] & weighed(
        self._settings, self._counts_N[np.where(real_B, k_B, 0)], pos_T
    )
    return np.where(scored, j_BxT, -1)

  def __next__(self) -> Batch:
    if self._step >= self.num_steps:
      raise StopIteration
    k_B, s = self._examples(self._step)
    k_b = k_B[list(self.row_ids)]
    self._step += 1
    return self._batch(k_b, k_b >= 0, s)


def answer_scores(example_BxT: np.ndarray, correct_BxT: np.ndarray, counts_N: np.ndarray) -> dict:
  """The accuracies of a synthetic task's answers (Bulatov et al. 2022, Sec. 4).

  Args:
    example_BxT: int [B, T'] the example of every scored answer position,
      -1 where a position is not scored (any T': segments side by side).
    correct_BxT: bool [B, T'], whether the argmax prediction at the position
      (given the true earlier tokens) is its target.
    counts_N: int [N], the weighed answer positions of each example of the
      split (``ExampleCorpus.counts``: the task's ``answer_len`` for all
      but BABILong's, whose answers differ in length).

  Returns:
    {"answer_token_accuracy": the share of scored answer positions predicted
    right (the authors' teacher-forced accuracy, ``num_correct_tf /
    num_total`` of ``train_synthetic.py``), "answer_accuracy": the share of
    examples whose answer positions are all scored and all
    right (exact match; an example cut off by ``max_steps`` does not count),
    "examples": those examples}; accuracies are NaN where nothing was scored.
  """
  scored = example_BxT >= 0
  k, ok = example_BxT[scored], correct_BxT[scored]
  ids, inverse = np.unique(k, return_inverse=True)
  seen = np.bincount(inverse, minlength=len(ids))
  right = np.bincount(inverse, weights=ok.astype(np.float64), minlength=len(ids))
  expected = np.asarray(counts_N)[ids] if len(ids) else np.zeros(0, np.int64)
  whole = seen == expected
  n = int(np.count_nonzero(whole))
  return {
      "answer_accuracy": float(np.count_nonzero(right[whole] == expected[whole]) / n)
      if n
      else math.nan,
      "answer_token_accuracy": float(ok.mean()) if ok.size else math.nan,
      "examples": n,
  }
