"""Ordered iterators that emit contiguous segments of a token stream.

Transformer-XL (Dai et al., 2019, Sec. 3.2) carries a memory of hidden states
from one segment to the next, so the data must arrive in order: row ``r`` of
the batch at step ``t + 1`` must continue exactly where row ``r`` stopped at
step ``t``.  This module reproduces the reference implementation's
``LMOrderedIterator`` (Dai et al. 2019 code, ``pytorch/data_utils.py``), with
two deliberate differences, both to keep shapes static under ``jax.jit``:

Training (:class:`TrainIterator`)
  The split's stream of ``N`` tokens is cut into ``B = global_batch`` rows:
  ``n_step = N // B`` and row ``r`` is the contiguous stream
  ``tokens[r * n_step : (r + 1) * n_step]``; the trailing ``N - B * n_step``
  tokens are dropped, as in the reference.  Step ``t`` (0-based within an
  epoch) yields, for every row, ``inputs = row[t*T : t*T + T]`` and
  ``targets = row[t*T + 1 : t*T + T + 1]`` with ``T = tgt_len``.  An epoch has
  ``(n_step - 1) // T`` steps.  *Difference 1:* the reference also emits a
  shorter last batch of ``(n_step - 1) % T`` positions; it is dropped here
  (those tokens are never trained on as targets within an epoch).  After the
  last step of an epoch the next epoch starts again at ``t = 0``; ``reset`` is
  True on that first step, telling the model to clear every row's memory
  (the reference: "Memory is reset each epoch").  The iterator never ends.

Evaluation (:class:`EvalIterator`)
  Every token of the split is scored exactly once, the tail included.
  ``boundary_id`` (the corpus's ``<eos>``/boundary symbol) is prepended as the
  context of the split's first token, so the stream
  ``s = [boundary_id] + tokens`` has ``N + 1`` tokens and gives ``N``
  (input, target) pairs ``(s[j], s[j + 1])``, ``j = 0 .. N - 1``.  The pairs
  are cut into ``B`` rows of ``row_len = ceil(N / B)`` pairs (row ``r`` holds
  pairs ``[r * row_len, (r + 1) * row_len)``, the last rows padded with weight
  0), and each row is emitted in ``num_steps = ceil(row_len / T)`` segments of
  ``T``, the last one padded with weight 0.  *Difference 2:* the reference
  scores ``tokens[1:]`` only, drops the remainder of ``N // B`` and uses a
  shorter last batch; here the weights make every batch the same shape while
  scoring all ``N`` tokens.  Padding always comes after every real position
  of its row, so with causal attention it cannot change any real score.
  ``reset`` is True on step 0 only.  One pass, then ``StopIteration``.

Batches
  Each batch is a dict of numpy arrays holding only this process's rows
  (``b = len(row_ids)``, in the order of ``row_ids``):

  * ``inputs``  int32   [b, T]  token ids fed to the model;
  * ``targets`` int32   [b, T]  the next token of each input position;
  * ``weights`` float32 [b, T]  1 for a real position, 0 for padding
    (all ones in training);
  * ``reset``   bool    [b]     True where the row's memory must be cleared
    before this segment.

Processes and devices
  Each process materialises only the global rows its devices hold
  (:func:`process_row_ids`), reading only those rows' token ranges from the
  :class:`~transformer_xl.datasets.TokenSource` (one token beyond a training
  row's segment for the last target; one token before an eval row's first
  pair for its first input), and :func:`to_global_batch` assembles the global
  ``jax.Array`` batch from every process's local rows.

Shuffled sentences (:class:`ShuffledSentenceIterator`, One Billion Word)
  The reference trains lm1b with ``LMMultiFileIterator``/``LMShuffledIterator``
  (``pytorch/data_utils.py``): sentences in random order, each row of the
  batch a stream of whole sentences that takes the next sentence of the
  shared order whenever it runs out, memory carried from step to step.  See
  the class docstring for the exact dealing rule, the epoch handling and the
  differences from the reference.  :func:`make_train_iterator` picks this
  iterator for corpora with ``sentence_offsets`` and :class:`TrainIterator`
  otherwise.

Position state
  ``get_state()`` returns a JSON-serialisable dict and ``set_state()``
  restores it, so that a restored iterator yields exactly what the original
  would have yielded next (used by the checkpoints).  The state also records
  ``global_batch``, ``tgt_len`` and ``num_tokens`` so that restoring into an
  iterator with a different layout fails loudly instead of silently resuming
  at a different place of the stream.  The state is global: it does not
  depend on ``row_ids``, so every process saves and restores the same dict.
"""
from __future__ import annotations

import numbers
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from transformer_xl.datasets import Corpus, SentenceIndex, TokenSource

Batch = dict[str, np.ndarray]

_TRAIN_STATE_KEYS = ("epoch", "step", "global_batch", "tgt_len", "num_tokens")
_EVAL_STATE_KEYS = ("step", "global_batch", "tgt_len", "num_tokens")


# ---------------------------------------------------------------------------
# Validation helpers.


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_positive(name: str, value: Any) -> int:
  if not _is_int(value) or value < 1:
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}; "
                     f"set {name} to a positive integer.")
  return int(value)


def _check_source(source: Any) -> int:
  if not (hasattr(source, "num_tokens") and callable(getattr(source, "read", None))):
    raise ValueError(
        f"source must be a TokenSource (with .num_tokens and .read(start, "
        f"stop)), got {type(source).__name__}; pass e.g. corpus.splits['train'] "
        f"or datasets.ArraySource(tokens).")
  num_tokens = source.num_tokens
  if not _is_int(num_tokens) or num_tokens < 0:
    raise ValueError(f"source.num_tokens must be a non-negative integer, got "
                     f"{num_tokens!r}.")
  return int(num_tokens)


def _check_row_ids(row_ids: Sequence[int] | None, global_batch: int) -> tuple[int, ...]:
  """Validates ``row_ids`` (sorted, unique, in [0, global_batch)); None -> all rows."""
  if row_ids is None:
    return tuple(range(global_batch))
  rows = list(row_ids)
  if not rows:
    raise ValueError("row_ids is empty; pass the global rows this process holds "
                     "(process_row_ids(sharding, global_batch)) or None for all "
                     "rows.")
  for r in rows:
    if not _is_int(r) or not 0 <= r < global_batch:
      raise ValueError(f"row_ids contains {r!r}, outside the global batch rows "
                       f"[0, {global_batch}); every row id must be an integer in "
                       f"[0, global_batch).")
  for a, b in zip(rows, rows[1:]):
    if b <= a:
      raise ValueError(f"row_ids must be sorted and without duplicates, got "
                       f"{a} followed by {b}; pass sorted(set(row_ids)).")
  return tuple(int(r) for r in rows)


def _read(source: TokenSource, start: int, stop: int) -> np.ndarray:
  """``source.read(start, stop)`` as int32, checking the returned length."""
  tokens = np.asarray(source.read(start, stop), dtype=np.int32)
  if tokens.shape != (stop - start,):
    raise ValueError(f"source.read({start}, {stop}) returned shape "
                     f"{tokens.shape}, expected ({stop - start},); the "
                     f"TokenSource is inconsistent with its num_tokens.")
  return tokens


def _check_state(state: Any, keys: tuple[str, ...], expected: Mapping[str, int],
                 kind: str) -> dict[str, int]:
  """Checks a state dict's keys, integer types and layout fields."""
  if not isinstance(state, Mapping):
    raise ValueError(f"{kind} state must be a dict with keys {list(keys)}, got "
                     f"{type(state).__name__}.")
  if set(state) != set(keys):
    missing = sorted(set(keys) - set(state))
    extra = sorted(set(state) - set(keys), key=str)
    raise ValueError(f"{kind} state must have exactly the keys {list(keys)}; "
                     f"missing {missing}, unexpected {extra}. Pass a dict "
                     f"returned by {kind}.get_state().")
  for key in keys:
    if not _is_int(state[key]):
      raise ValueError(f"{kind} state[{key!r}] must be an integer, got "
                       f"{state[key]!r}.")
  for key, value in expected.items():
    if state[key] != value:
      raise ValueError(
          f"{kind} state was saved with {key}={state[key]} but this iterator "
          f"has {key}={value}; the saved position refers to a different "
          f"layout of the stream. Restore with the same global_batch, tgt_len "
          f"and split, or start a fresh iterator.")
  return {key: int(state[key]) for key in keys}


# ---------------------------------------------------------------------------
# Training.


class TrainIterator(Iterator[Batch]):
  """Endless ordered iterator over training segments (reference LMOrderedIterator).

  The stream of ``N = source.num_tokens`` tokens is cut into ``global_batch``
  rows of ``n_step = N // global_batch`` contiguous tokens (the trailing
  ``N % global_batch`` tokens are dropped).  Step ``t`` of an epoch yields
  ``row[t*T : t*T+T]`` as inputs and ``row[t*T+1 : t*T+T+1]`` as targets for
  each row; an epoch has ``steps_per_epoch = (n_step - 1) // T`` steps (the
  reference's shorter last batch is dropped so that every batch has shape
  [b, T]).  Epochs repeat forever; ``reset`` is True on the first step of
  every epoch.

  Each ``next()`` returns a dict of numpy arrays for the local rows
  (``b = len(row_ids)``, in ``row_ids`` order): ``inputs`` int32 [b, T],
  ``targets`` int32 [b, T], ``weights`` float32 [b, T] (all ones), ``reset``
  bool [b].  Per step it reads ``T + 1`` tokens per local row from
  ``source``, and only from its own rows' ranges.

  Attributes:
    global_batch: B, number of rows of the global batch.
    tgt_len: T, segment length in tokens.
    row_ids: the global rows this iterator materialises (sorted tuple).
    row_len: n_step, tokens per row.
    steps_per_epoch: steps per epoch.
  """

  def __init__(self, source: TokenSource, global_batch: int, tgt_len: int,
               row_ids: Sequence[int] | None = None):
    """Builds the iterator at epoch 0, step 0.

    Args:
      source: the split's TokenSource (e.g. ``corpus.splits["train"]``).
      global_batch: B, rows of the global batch (over all processes), >= 1.
      tgt_len: T, tokens per segment, >= 1.
      row_ids: sorted, duplicate-free global row indices in [0, B) that this
        process materialises (see :func:`process_row_ids`); None for all rows.

    Raises:
      ValueError: global_batch or tgt_len < 1; source is not a TokenSource;
        the split has fewer than ``global_batch * (tgt_len + 1)`` tokens (no
        full training step); row_ids empty, out of range, unsorted or
        duplicated.
    """
    self.global_batch = _check_positive("global_batch", global_batch)
    self.tgt_len = _check_positive("tgt_len", tgt_len)
    self._source = source
    self.num_tokens = _check_source(source)
    self.row_len = self.num_tokens // self.global_batch
    self.steps_per_epoch = (self.row_len - 1) // self.tgt_len
    if self.steps_per_epoch < 1:
      needed = self.global_batch * (self.tgt_len + 1)
      raise ValueError(
          f"the training split has {self.num_tokens} tokens, too few for one "
          f"training step with global_batch={self.global_batch} and "
          f"tgt_len={self.tgt_len}: each of the {self.global_batch} rows needs "
          f"tgt_len + 1 = {self.tgt_len + 1} tokens, i.e. at least {needed} "
          f"tokens. Lower global_batch or tgt_len, or use a larger split.")
    self.row_ids = _check_row_ids(row_ids, self.global_batch)
    self._epoch = 0
    self._step = 0

  def __iter__(self) -> "TrainIterator":
    return self

  def __next__(self) -> Batch:
    """Returns the next batch (see the class docstring) and advances one step."""
    b, T = len(self.row_ids), self.tgt_len
    inputs_BxT = np.empty((b, T), dtype=np.int32)
    targets_BxT = np.empty((b, T), dtype=np.int32)
    offset = self._step * T
    for i, r in enumerate(self.row_ids):
      start = r * self.row_len + offset
      # T + 1 tokens; stays inside the row since steps_per_epoch*T + 1 <= row_len.
      tokens = _read(self._source, start, start + T + 1)
      inputs_BxT[i] = tokens[:-1]
      targets_BxT[i] = tokens[1:]
    batch = {
        "inputs": inputs_BxT,
        "targets": targets_BxT,
        "weights": np.ones((b, T), dtype=np.float32),
        "reset": np.full((b,), self._step == 0, dtype=bool),
    }
    self._step += 1
    if self._step == self.steps_per_epoch:
      self._step = 0
      self._epoch += 1
    return batch

  def get_state(self) -> dict[str, int]:
    """Position of the next batch, as a JSON-serialisable dict.

    Returns:
      {"epoch": completed epochs, "step": step within the epoch of the next
      batch, in [0, steps_per_epoch), "global_batch", "tgt_len",
      "num_tokens"}.  The same on every process.
    """
    return {"epoch": self._epoch, "step": self._step,
            "global_batch": self.global_batch, "tgt_len": self.tgt_len,
            "num_tokens": self.num_tokens}

  def set_state(self, state: Mapping[str, int]) -> None:
    """Moves to a position returned by :meth:`get_state`.

    Raises:
      ValueError: state is not a dict with exactly the keys of get_state();
        a value is not an integer; epoch < 0; step outside
        [0, steps_per_epoch); global_batch, tgt_len or num_tokens differ from
        this iterator's.
    """
    s = _check_state(state, _TRAIN_STATE_KEYS,
                     {"global_batch": self.global_batch, "tgt_len": self.tgt_len,
                      "num_tokens": self.num_tokens}, "TrainIterator")
    if s["epoch"] < 0:
      raise ValueError(f"TrainIterator state epoch must be >= 0, got {s['epoch']}.")
    if not 0 <= s["step"] < self.steps_per_epoch:
      raise ValueError(f"TrainIterator state step must be in [0, "
                       f"{self.steps_per_epoch}) (steps per epoch), got "
                       f"{s['step']}.")
    self._epoch, self._step = s["epoch"], s["step"]


# ---------------------------------------------------------------------------
# Evaluation.


class EvalIterator(Iterator[Batch]):
  """One ordered pass over a split that scores every token exactly once.

  With ``N = source.num_tokens`` and ``s = [boundary_id] + tokens``, pair
  ``j`` (``0 <= j < N``) is input ``s[j]``, target ``tokens[j]``.  Row ``r``
  of the global batch holds pairs ``[r * row_len, (r + 1) * row_len)`` with
  ``row_len = ceil(N / B)`` (pairs >= N are padding), emitted in
  ``num_steps = ceil(row_len / T)`` segments of ``T`` positions; positions
  past the end of the row or of the stream are padding with weight 0 and
  input/target ``boundary_id``.  Padding always follows every real position
  of its row.  Over a full pass the weights sum to ``N`` and each target
  token index appears exactly once with weight 1.  After ``num_steps``
  batches the iterator raises ``StopIteration``.

  Each ``next()`` returns a dict of numpy arrays for the local rows
  (``b = len(row_ids)``, in ``row_ids`` order): ``inputs`` int32 [b, T],
  ``targets`` int32 [b, T], ``weights`` float32 [b, T] (1 real, 0 padding),
  ``reset`` bool [b] (True on step 0 only).  Per step it reads at most
  ``T + 1`` tokens per local row, only from its own rows' ranges (one token
  before a row's first pair, for that pair's input).

  Attributes:
    global_batch: B, number of rows of the global batch.
    tgt_len: T, segment length in tokens.
    boundary_id: token id used as the first token's context and as padding.
    row_ids: the global rows this iterator materialises (sorted tuple).
    row_len: ceil(N / B), pairs per row (padding included).
    num_steps: ceil(row_len / T), batches in the pass.
  """

  def __init__(self, source: TokenSource, global_batch: int, tgt_len: int,
               boundary_id: int, row_ids: Sequence[int] | None = None):
    """Builds the iterator at step 0.

    Args:
      source: the split's TokenSource (e.g. ``corpus.splits["valid"]``).
      global_batch: B, rows of the global batch (over all processes), >= 1.
      tgt_len: T, tokens per segment, >= 1.
      boundary_id: the corpus's boundary symbol id (``corpus.boundary_id``),
        >= 0.
      row_ids: sorted, duplicate-free global row indices in [0, B) that this
        process materialises (see :func:`process_row_ids`); None for all rows.

    Raises:
      ValueError: global_batch or tgt_len < 1; boundary_id not an integer
        >= 0; source is not a TokenSource or has no tokens; row_ids empty, out
        of range, unsorted or duplicated.
    """
    self.global_batch = _check_positive("global_batch", global_batch)
    self.tgt_len = _check_positive("tgt_len", tgt_len)
    if not _is_int(boundary_id) or boundary_id < 0:
      raise ValueError(f"boundary_id must be an integer token id >= 0, got "
                       f"{boundary_id!r}; pass corpus.boundary_id.")
    self.boundary_id = int(boundary_id)
    self._source = source
    self.num_tokens = _check_source(source)
    if self.num_tokens < 1:
      raise ValueError("the evaluation split has 0 tokens; there is nothing to "
                       "score. Check that the split was built correctly.")
    self.row_ids = _check_row_ids(row_ids, self.global_batch)
    self.row_len = -(-self.num_tokens // self.global_batch)
    self.num_steps = -(-self.row_len // self.tgt_len)
    self._step = 0

  def __len__(self) -> int:
    """Total number of batches in a pass (``num_steps``), wherever the iterator is."""
    return self.num_steps

  def __iter__(self) -> "EvalIterator":
    return self

  def __next__(self) -> Batch:
    """Returns the next batch (see the class docstring) and advances one step.

    Raises:
      StopIteration: after ``num_steps`` batches.
    """
    if self._step >= self.num_steps:
      raise StopIteration
    b, T = len(self.row_ids), self.tgt_len
    inputs_BxT = np.full((b, T), self.boundary_id, dtype=np.int32)
    targets_BxT = np.full((b, T), self.boundary_id, dtype=np.int32)
    weights_BxT = np.zeros((b, T), dtype=np.float32)
    seg_start = self._step * T  # Offset of this segment within each row.
    seg_stop = min(seg_start + T, self.row_len)
    for i, r in enumerate(self.row_ids):
      # Real pairs [a, z) of the stream; a >= z means the segment is all padding.
      a = r * self.row_len + seg_start
      z = min(r * self.row_len + seg_stop, self.num_tokens)
      n = z - a
      if n <= 0:
        continue
      if a == 0:
        tokens = _read(self._source, 0, z)
        inputs_BxT[i, 0] = self.boundary_id
        inputs_BxT[i, 1:n] = tokens[:-1]
        targets_BxT[i, :n] = tokens
      else:
        tokens = _read(self._source, a - 1, z)
        inputs_BxT[i, :n] = tokens[:-1]
        targets_BxT[i, :n] = tokens[1:]
      weights_BxT[i, :n] = 1.0
    batch = {
        "inputs": inputs_BxT,
        "targets": targets_BxT,
        "weights": weights_BxT,
        "reset": np.full((b,), self._step == 0, dtype=bool),
    }
    self._step += 1
    return batch

  def get_state(self) -> dict[str, int]:
    """Position of the next batch, as a JSON-serialisable dict.

    Returns:
      {"step": index of the next batch in [0, num_steps] (num_steps: pass
      finished), "global_batch", "tgt_len", "num_tokens"}.  The same on every
      process.
    """
    return {"step": self._step, "global_batch": self.global_batch,
            "tgt_len": self.tgt_len, "num_tokens": self.num_tokens}

  def set_state(self, state: Mapping[str, int]) -> None:
    """Moves to a position returned by :meth:`get_state`.

    Raises:
      ValueError: state is not a dict with exactly the keys of get_state();
        a value is not an integer; step outside [0, num_steps];
        global_batch, tgt_len or num_tokens differ from this iterator's.
    """
    s = _check_state(state, _EVAL_STATE_KEYS,
                     {"global_batch": self.global_batch, "tgt_len": self.tgt_len,
                      "num_tokens": self.num_tokens}, "EvalIterator")
    if not 0 <= s["step"] <= self.num_steps:
      raise ValueError(f"EvalIterator state step must be in [0, "
                       f"{self.num_steps}] (num_steps), got {s['step']}.")
    self._step = s["step"]


# ---------------------------------------------------------------------------
# Shuffled sentences (One Billion Word).

_SHUFFLED_STATE_KEYS = ("epoch", "position", "step", "row_sentence",
                        "row_used", "seed", "global_batch", "tgt_len",
                        "num_tokens", "num_sentences")


class ShuffledSentenceIterator(Iterator[Batch]):
  """Endless iterator over shuffled whole sentences (reference LMShuffledIterator).

  The split's stream is a sequence of ``n = sentence_index.num_sentences``
  sentences; sentence ``i`` is ``stream[offsets[i]:offsets[i + 1]]`` and
  ends with the boundary token (lm1b: ``w1 ... wk <S>``).  It contributes
  ``L_i = offsets[i + 1] - offsets[i]`` (input, target) pairs: inputs
  ``<S> w1 ... wk`` (the boundary before the sentence is its first input)
  and targets ``w1 ... wk <S>``; this is the reference's ``add_double_eos``
  sentence ``<S> w1 ... wk <S>`` read as pairs.

  Sentence order: epoch ``e`` deals the sentences in the order
  :meth:`epoch_order` ``(e)``, a permutation of ``range(n)`` drawn from
  ``np.random.default_rng([seed, e])`` (numpy's PCG64 seeded by
  ``SeedSequence([seed, e])``; same seed and numpy version, same order).
  The orders of epochs 0, 1, 2, ... are concatenated into one endless
  sentence sequence: when epoch ``e``'s permutation runs out, the next
  sentence comes from epoch ``e + 1``'s, in the middle of a step if need be
  (no padding, no dropped partial batch).

  Dealing (the reference's ``stream_iterator``, exactly): each of the
  ``B = global_batch`` rows holds a current sentence and how many of its
  pairs it has emitted.  Step ``t`` fills rows ``0, 1, ..., B - 1`` in that
  order; row ``r`` emits ``T = tgt_len`` pairs: the rest of its current
  sentence, and whenever that is used up (and only then, i.e. lazily, when
  another position of the row must be filled) it takes the NEXT sentence
  of the shared sequence.  So a sentence is taken at step ``t`` by row
  ``r`` before any sentence taken by a row ``r' > r`` at step ``t`` or by
  any row at step ``t + 1``; a sentence longer than what is left of a row's
  segment continues in the same row at the next step.  Every row is thus
  one continuous stream ``<S> s_a <S> s_b <S> ...``: inputs are the targets
  shifted by one within the row, also across sentences and steps.  Each
  sentence appears exactly once per epoch, in exactly one row.

  Memory: ``reset`` is True on the very first step of the run (step 0)
  only.  A row's stream never restarts, so its memory is always the
  preceding text of the same row, across sentence and epoch boundaries.

  Differences from the reference (``LMMultiFileIterator``): the reference
  shuffles the order of the 99 training shards, then the sentences within
  each shard, and runs a fresh ``stream_iterator`` per shard, dropping the
  unfinished sentences and the last incomplete batch of every shard; and
  its training loop resets the memory each epoch.  Here one permutation of
  all training sentences is drawn per epoch, the rows continue across
  epochs (so nothing is dropped and there is no stale memory to clear), and
  every step is a full [b, T] batch with weights 1.  An epoch lasts
  ``num_tokens / (B * T)`` steps on average (every stream token is one
  pair).

  Each ``next()`` returns a dict of numpy arrays for the local rows
  (``b = len(row_ids)``, in ``row_ids`` order): ``inputs`` int32 [b, T],
  ``targets`` int32 [b, T], ``weights`` float32 [b, T] (all ones),
  ``reset`` bool [b].  Every process keeps the bookkeeping of all ``B``
  rows (sentence lengths only, from the offsets array it holds in memory:
  ``8 * (n + 1)`` bytes, 240 MB for lm1b's 30M sentences, plus one epoch
  permutation of ``4 * n`` bytes), but reads tokens only for its own rows:
  per local row and step, one ``source.read`` per sentence piece, of the
  piece's tokens and, for a piece that continues a sentence, the one token
  before it.

  Position state: :meth:`get_state` is ``{"epoch", "position"}`` (the
  permutation and the index in it of the next sentence to deal), ``"step"``,
  ``"row_sentence"``/``"row_used"`` (per row: current sentence id, -1
  before the first step, and pairs of it already emitted: ``2 * B`` ints,
  no tokens) and the layout fields ``"seed"``, ``"global_batch"``,
  ``"tgt_len"``, ``"num_tokens"``, ``"num_sentences"``.  Restoring
  recomputes only the permutation of the current epoch, so it is as fast
  at step 10^6 as at step 1 (replaying the dealing from step 0 would cost
  ``B`` operations per step ever taken).  The state is the same on every
  process.

  Attributes:
    global_batch: B, number of rows of the global batch.
    tgt_len: T, segment length in tokens.
    seed: the seed of the sentence orders.
    boundary_id: the boundary token id (input before each sentence).
    row_ids: the global rows this iterator materialises (sorted tuple).
    num_tokens: tokens of the split (= pairs per epoch).
    num_sentences: sentences of the split (n).
  """

  def __init__(self, source: TokenSource, sentence_index: SentenceIndex,
               global_batch: int, tgt_len: int, seed: int, boundary_id: int,
               row_ids: Sequence[int] | None = None):
    """Builds the iterator at epoch 0, step 0 (no row holds a sentence yet).

    Reads the whole offsets array from ``sentence_index`` (no token).

    Args:
      source: the split's TokenSource (e.g. ``corpus.splits["train"]``).
      sentence_index: the split's SentenceIndex
        (``corpus.sentence_offsets["train"]``).
      global_batch: B, rows of the global batch (over all processes), >= 1.
      tgt_len: T, tokens per segment, >= 1.
      seed: integer >= 0; with the epoch it determines every sentence order.
      boundary_id: id of the sentence boundary (``corpus.boundary_id``,
        ``<S>`` for lm1b), >= 0: each sentence's first input.
      row_ids: sorted, duplicate-free global row indices in [0, B) that this
        process materialises (see :func:`process_row_ids`); None for all rows.

    Raises:
      ValueError: global_batch or tgt_len < 1; seed or boundary_id not an
        integer >= 0; source is not a TokenSource; sentence_index has no
        ``num_sentences``/``read_offsets``, no sentence, or offsets that do
        not start at 0, increase strictly and end at ``source.num_tokens``;
        row_ids empty, out of range, unsorted or duplicated.
    """
    self.global_batch = _check_positive("global_batch", global_batch)
    self.tgt_len = _check_positive("tgt_len", tgt_len)
    if not _is_int(seed) or seed < 0:
      raise ValueError(f"seed must be an integer >= 0, got {seed!r}.")
    self.seed = int(seed)
    if not _is_int(boundary_id) or boundary_id < 0:
      raise ValueError(f"boundary_id must be an integer token id >= 0, got "
                       f"{boundary_id!r}; pass corpus.boundary_id.")
    self.boundary_id = int(boundary_id)
    self._source = source
    self.num_tokens = _check_source(source)
    if not (hasattr(sentence_index, "num_sentences")
            and callable(getattr(sentence_index, "read_offsets", None))):
      raise ValueError(
          f"sentence_index must be a SentenceIndex (with .num_sentences and "
          f".read_offsets(start, stop)), got {type(sentence_index).__name__}; "
          f"pass corpus.sentence_offsets['train'].")
    n = sentence_index.num_sentences
    if not _is_int(n) or n < 1:
      raise ValueError(f"the split must hold at least one sentence, got "
                       f"num_sentences={n!r}.")
    self.num_sentences = int(n)
    offsets = np.asarray(sentence_index.read_offsets(0, self.num_sentences + 1))
    if (offsets.shape != (self.num_sentences + 1,)
        or not np.issubdtype(offsets.dtype, np.integer)):
      raise ValueError(f"sentence_index.read_offsets(0, {n + 1}) returned "
                       f"dtype {offsets.dtype}, shape {offsets.shape}; "
                       f"expected {n + 1} integer offsets.")
    offsets = offsets.astype(np.int64)
    if (offsets[0] != 0 or offsets[-1] != self.num_tokens
        or np.any(np.diff(offsets) < 1)):
      raise ValueError(
          f"sentence offsets must start at 0, increase strictly and end at "
          f"the split's {self.num_tokens} tokens; got first {offsets[0]}, "
          f"last {offsets[-1]}. The sentence index does not belong to this "
          f"token stream.")
    offsets.flags.writeable = False
    self._offsets = offsets
    self.row_ids = _check_row_ids(row_ids, self.global_batch)
    self._local = {r: i for i, r in enumerate(self.row_ids)}
    self._order: np.ndarray | None = None
    self._order_epoch = -1
    self._reset_position()

  def _reset_position(self) -> None:
    self._epoch, self._position, self._step = 0, 0, 0
    self._row_sentence = [-1] * self.global_batch
    self._row_used = [0] * self.global_batch
    self._row_length = [0] * self.global_batch

  def epoch_order(self, epoch: int) -> np.ndarray:
    """The sentence order of epoch ``epoch``: a permutation of range(n).

    Returns:
      [num_sentences] sentence ids in the order they are dealt (int32 when
      num_sentences < 2**31, else int64): the values of
      ``np.random.default_rng([seed, epoch]).permutation(num_sentences)``
      (computed by shuffling an int32 ``arange``, which draws the same
      random numbers, in half the memory).

    Raises:
      ValueError: epoch is not an integer >= 0.
    """
    if not _is_int(epoch) or epoch < 0:
      raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}.")
    dtype = np.int32 if self.num_sentences < 2**31 else np.int64
    order = np.arange(self.num_sentences, dtype=dtype)
    np.random.default_rng([self.seed, int(epoch)]).shuffle(order)
    return order

  @property
  def epoch(self) -> int:
    """The epoch whose permutation deals the next sentence."""
    return self._epoch + (self._position == self.num_sentences)

  def _next_sentence(self) -> int:
    """Deals the next sentence of the endless sequence; returns its id."""
    if self._position == self.num_sentences:
      self._epoch += 1
      self._position = 0
    if self._order_epoch != self._epoch:
      self._order = self.epoch_order(self._epoch)
      self._order_epoch = self._epoch
    sid = int(self._order[self._position])
    self._position += 1
    return sid

  def __iter__(self) -> "ShuffledSentenceIterator":
    return self

  def _deal(self) -> list[list[tuple[int, int, int, int]]]:
    """Advances every row by T pairs; returns the local rows' pieces.

    A piece ``(sentence, a, z, pos)`` means pairs ``[a, z)`` of the sentence
    fill positions ``[pos, pos + z - a)`` of the row's segment.
    """
    T, off = self.tgt_len, self._offsets
    sentence, used, length = (self._row_sentence, self._row_used,
                              self._row_length)
    pieces: list[list[tuple[int, int, int, int]]] = [[] for _ in self.row_ids]
    for r in range(self.global_batch):
      sid, u, n = sentence[r], used[r], length[r]
      local = self._local.get(r)
      filled = 0
      while filled < T:
        if u == n:  # The current sentence is used up (or none yet): take one.
          sid = self._next_sentence()
          u, n = 0, int(off[sid + 1] - off[sid])
        k = min(n - u, T - filled)
        if local is not None:
          pieces[local].append((sid, u, u + k, filled))
        u += k
        filled += k
      sentence[r], used[r], length[r] = sid, u, n
    return pieces

  def __next__(self) -> Batch:
    """Returns the next batch (see the class docstring) and advances one step."""
    saved = self.get_state()
    try:
      pieces = self._deal()
      b, T = len(self.row_ids), self.tgt_len
      inputs_BxT = np.empty((b, T), dtype=np.int32)
      targets_BxT = np.empty((b, T), dtype=np.int32)
      for i, row_pieces in enumerate(pieces):
        for sid, a, z, pos in row_pieces:
          start = int(self._offsets[sid])
          k = z - a
          if a == 0:  # Sentence start: the boundary is the first input.
            tokens = _read(self._source, start, start + z)
            inputs_BxT[i, pos] = self.boundary_id
            inputs_BxT[i, pos + 1:pos + k] = tokens[:-1]
            targets_BxT[i, pos:pos + k] = tokens
          else:
            tokens = _read(self._source, start + a - 1, start + z)
            inputs_BxT[i, pos:pos + k] = tokens[:-1]
            targets_BxT[i, pos:pos + k] = tokens[1:]
    except BaseException:
      self.set_state(saved)  # A failed read leaves the position unchanged.
      raise
    batch = {
        "inputs": inputs_BxT,
        "targets": targets_BxT,
        "weights": np.ones((b, T), dtype=np.float32),
        "reset": np.full((b,), self._step == 0, dtype=bool),
    }
    self._step += 1
    return batch

  def get_state(self) -> dict[str, Any]:
    """Position of the next batch, as a JSON-serialisable dict.

    Returns:
      {"epoch": permutation of the next sentence to deal, "position": its
      index in that permutation (in [0, num_sentences]; num_sentences means
      "start of the next epoch"), "step": batches emitted so far,
      "row_sentence": list of B current sentence ids (-1: none yet),
      "row_used": list of B pairs of that sentence already emitted, "seed",
      "global_batch", "tgt_len", "num_tokens", "num_sentences"}.  Ints and
      lists of ints only; the same on every process.
    """
    return {"epoch": self._epoch, "position": self._position,
            "step": self._step, "row_sentence": list(self._row_sentence),
            "row_used": list(self._row_used), "seed": self.seed,
            "global_batch": self.global_batch, "tgt_len": self.tgt_len,
            "num_tokens": self.num_tokens,
            "num_sentences": self.num_sentences}

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Moves to a position returned by :meth:`get_state` (of any process).

    Raises:
      ValueError: state is not a dict with exactly the keys of get_state();
        a value has the wrong type; seed, global_batch, tgt_len, num_tokens
        or num_sentences differ from this iterator's; epoch or step < 0;
        position outside [0, num_sentences]; a row list not of length B, a
        sentence id outside [-1, num_sentences), or a used count outside
        [0, that sentence's length] (0 for -1).
    """
    kind = "ShuffledSentenceIterator"
    if not isinstance(state, Mapping):
      raise ValueError(f"{kind} state must be a dict with keys "
                       f"{list(_SHUFFLED_STATE_KEYS)}, got "
                       f"{type(state).__name__}.")
    rows = ("row_sentence", "row_used")
    scalars = tuple(k for k in _SHUFFLED_STATE_KEYS if k not in rows)
    if set(state) != set(_SHUFFLED_STATE_KEYS):
      missing = sorted(set(_SHUFFLED_STATE_KEYS) - set(state))
      extra = sorted(set(state) - set(_SHUFFLED_STATE_KEYS), key=str)
      raise ValueError(f"{kind} state must have exactly the keys "
                       f"{list(_SHUFFLED_STATE_KEYS)}; missing {missing}, "
                       f"unexpected {extra}. Pass a dict returned by "
                       f"{kind}.get_state().")
    s = _check_state({k: state[k] for k in scalars}, scalars, {
        "seed": self.seed, "global_batch": self.global_batch,
        "tgt_len": self.tgt_len, "num_tokens": self.num_tokens,
        "num_sentences": self.num_sentences}, kind)
    if s["epoch"] < 0 or s["step"] < 0:
      raise ValueError(f"{kind} state epoch and step must be >= 0, got "
                       f"{s['epoch']} and {s['step']}.")
    if not 0 <= s["position"] <= self.num_sentences:
      raise ValueError(f"{kind} state position must be in [0, "
                       f"{self.num_sentences}], got {s['position']}.")
    lists = {}
    for key in rows:
      value = state[key]
      if (not isinstance(value, Sequence) or isinstance(value, (str, bytes))
          or len(value) != self.global_batch
          or not all(_is_int(v) for v in value)):
        raise ValueError(f"{kind} state[{key!r}] must be a list of "
                         f"{self.global_batch} integers (one per row).")
      lists[key] = [int(v) for v in value]
    lengths = []
    for r, (sid, u) in enumerate(zip(lists["row_sentence"], lists["row_used"])):
      if not -1 <= sid < self.num_sentences:
        raise ValueError(f"{kind} state row_sentence[{r}] = {sid} is outside "
                         f"[-1, {self.num_sentences}).")
      n = 0 if sid < 0 else int(self._offsets[sid + 1] - self._offsets[sid])
      if not 0 <= u <= n:
        raise ValueError(f"{kind} state row_used[{r}] = {u} is outside [0, "
                         f"{n}] (the length of sentence {sid}).")
      lengths.append(n)
    self._epoch, self._position, self._step = (s["epoch"], s["position"],
                                               s["step"])
    self._row_sentence = lists["row_sentence"]
    self._row_used = lists["row_used"]
    self._row_length = lengths


def make_train_iterator(corpus: Corpus, split: str, global_batch: int,
                        tgt_len: int, seed: int,
                        row_ids: Sequence[int] | None = None
                        ) -> TrainIterator | ShuffledSentenceIterator:
  """The training iterator that fits ``corpus``.

  Corpora with sentence boundaries (``corpus.sentence_offsets`` holding
  ``split``: One Billion Word) get a :class:`ShuffledSentenceIterator`
  (reference ``LMMultiFileIterator``/``LMShuffledIterator``) with
  ``boundary_id = corpus.boundary_id``; all others an ordered
  :class:`TrainIterator` (reference ``LMOrderedIterator``), which ignores
  ``seed``.  Both yield batches ``inputs``/``targets`` int32 [b, T],
  ``weights`` float32 [b, T] (ones), ``reset`` bool [b], and have
  ``get_state``/``set_state``.

  Args:
    corpus: a :class:`~transformer_xl.datasets.Corpus`.
    split: the split to train on, usually "train".
    global_batch: B, rows of the global batch, >= 1.
    tgt_len: T, tokens per segment, >= 1.
    seed: integer >= 0, the sentence-order seed (shuffled iterator only).
    row_ids: this process's rows (:func:`process_row_ids`); None for all.

  Raises:
    ValueError: ``split`` is not in ``corpus.splits``, or the iterator's own
      errors.
  """
  if split not in corpus.splits:
    raise ValueError(f"split {split!r} is not in the corpus {corpus.name!r}; "
                     f"its splits are {sorted(corpus.splits)}.")
  index = (corpus.sentence_offsets or {}).get(split)
  if index is not None:
    return ShuffledSentenceIterator(
        corpus.splits[split], index, global_batch, tgt_len, seed,
        corpus.boundary_id, row_ids=row_ids)
  return TrainIterator(corpus.splits[split], global_batch, tgt_len,
                       row_ids=row_ids)


# ---------------------------------------------------------------------------
# Processes and devices.


def process_row_ids(sharding: jax.sharding.Sharding, global_batch: int,
                    tgt_len: int | None = None) -> list[int]:
  """Global batch rows held by this process's addressable devices.

  Args:
    sharding: the sharding of the global [global_batch, tgt_len] batch arrays
      (e.g. ``NamedSharding(mesh, P("data", None))``).
    global_batch: B, rows of the global batch, >= 1.
    tgt_len: T, only needed when ``sharding`` splits the time axis unevenly;
      by default the number of devices of the sharding is used as the time
      length, which any even split of the time axis divides.

  Returns:
    Sorted, duplicate-free list of row indices in [0, B): the union of the
    rows of every addressable device's shard (rows replicated on several
    local devices appear once).  Pass it as ``row_ids`` to the iterators.

  Raises:
    ValueError: global_batch or tgt_len < 1, or the sharding cannot shard a
      [global_batch, tgt_len] array (e.g. B not divisible by the data axis).
  """
  global_batch = _check_positive("global_batch", global_batch)
  if tgt_len is None:
    tgt_len = len(sharding.device_set)
  tgt_len = _check_positive("tgt_len", tgt_len)
  try:
    index_map = sharding.addressable_devices_indices_map((global_batch, tgt_len))
  except Exception as e:  # jax raises several types for an incompatible shape.
    raise ValueError(f"the sharding {sharding} cannot shard a batch of shape "
                     f"({global_batch}, {tgt_len}): {e}. Make global_batch "
                     f"divisible by the size of the mesh axes that shard the "
                     f"batch axis.") from e
  rows: set[int] = set()
  for index in index_map.values():
    row_slice = index[0] if index else slice(None)
    rows.update(range(*row_slice.indices(global_batch)))
  return sorted(rows)


def _batch_axis_sharding(sharding: jax.sharding.Sharding) -> NamedSharding:
  """The sharding of a [B] array that follows the batch axis of ``sharding``."""
  if not isinstance(sharding, NamedSharding):
    raise TypeError(f"to_global_batch needs a jax.sharding.NamedSharding (to "
                    f"derive the sharding of the [B] reset array), got "
                    f"{type(sharding).__name__}; build the batch sharding as "
                    f"NamedSharding(mesh, PartitionSpec('data', None)).")
  batch_spec = sharding.spec[0] if len(sharding.spec) else None
  return NamedSharding(sharding.mesh, PartitionSpec(batch_spec))


def to_global_batch(local_batch: Mapping[str, np.ndarray],
                    sharding: jax.sharding.Sharding,
                    global_batch: int) -> dict[str, jax.Array]:
  """Assembles global ``jax.Array`` batches from each process's local rows.

  Every process calls this with its own local batch (rows ``row_ids`` from
  :func:`process_row_ids` of the same sharding, in that order).  Arrays with
  2 or more dimensions (``inputs``, ``targets``, ``weights``: [b, T]) become
  [global_batch, T] arrays with ``sharding``; 1-D arrays (``reset``: [b])
  become [global_batch] arrays sharded like the batch axis of ``sharding``
  (``NamedSharding(mesh, PartitionSpec(spec[0]))``).  Dtypes are kept.

  Args:
    local_batch: dict of numpy arrays whose leading axis is this process's
      rows, e.g. a batch from :class:`TrainIterator` or :class:`EvalIterator`.
    sharding: the NamedSharding of the global [global_batch, T] batch.
    global_batch: B, rows of the global batch, >= 1.

  Returns:
    Dict with the same keys of global jax.Arrays.

  Raises:
    ValueError: global_batch < 1, or an array is 0-dimensional.
    TypeError: sharding is not a NamedSharding.
    Errors from ``jax.make_array_from_process_local_data`` when the local
    rows do not match the rows that ``sharding`` puts on this process.
  """
  global_batch = _check_positive("global_batch", global_batch)
  row_sharding = _batch_axis_sharding(sharding)
  out = {}
  for key, local in local_batch.items():
    local = np.asarray(local)
    if local.ndim == 0:
      raise ValueError(f"local_batch[{key!r}] is a scalar; every batch array "
                       f"needs a leading row axis.")
    global_shape = (global_batch,) + local.shape[1:]
    target = sharding if local.ndim >= 2 else row_sharding
    out[key] = jax.make_array_from_process_local_data(target, local, global_shape)
  return out
