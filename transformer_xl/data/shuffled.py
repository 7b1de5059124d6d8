"""Shuffled whole sentences: the training iterator of One Billion Word.

The reference trains lm1b with ``LMMultiFileIterator``/``LMShuffledIterator``
(Dai et al. 2019 code, ``pytorch/data_utils.py``): sentences in random order,
each row of the batch a stream of whole sentences that takes the next
sentence of the shared order whenever it runs out, memory carried from step
to step.  ``ShuffledSentenceIterator`` states the exact dealing rule,
the epoch handling and the differences from the reference.  Batches follow
the batch contract of ``transformer_xl.data``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from transformer_xl.data.checks import (
    Batch,
    check_boundary_id,
    check_positive,
    check_row_ids,
    check_source,
    check_state,
    is_int,
    read_checked,
)
from transformer_xl.data.corpus import SentenceIndex, TokenSource

_SHUFFLED_STATE_KEYS = (
    "epoch",
    "position",
    "step",
    "row_sentence",
    "row_used",
    "seed",
    "global_batch",
    "tgt_len",
    "num_tokens",
    "num_sentences",
)


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
  ``epoch_order`` ``(e)``, a permutation of ``range(n)`` drawn from
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

  Reads: every process keeps the bookkeeping of all ``B`` rows (sentence
  lengths only, from the offsets array it holds in memory: ``8 * (n + 1)``
  bytes, 240 MB for lm1b's 30M sentences, plus one epoch permutation of
  ``4 * n`` bytes), but reads tokens only for its own rows: per local row
  and step, one ``source.read`` per sentence piece, of the piece's tokens
  and, for a piece that continues a sentence, the one token before it.

  Position state: ``get_state`` is ``{"epoch", "position"}`` (the
  permutation and the index in it of the next sentence to deal), ``"step"``,
  ``"row_sentence"``/``"row_used"`` (per row: current sentence id, -1
  before the first step, and pairs of it already emitted: ``2 * B`` ints,
  no tokens) and the layout fields ``"seed"``, ``"global_batch"``,
  ``"tgt_len"``, ``"num_tokens"``, ``"num_sentences"``.  Restoring
  recomputes only the permutation of the current epoch, so it is as fast
  at step 10^6 as at step 1 (replaying the dealing from step 0 would cost
  ``B`` operations per step ever taken).

  Attributes:
    global_batch: B, number of rows of the global batch.
    tgt_len: T, segment length in tokens.
    seed: the seed of the sentence orders.
    boundary_id: the boundary token id (input before each sentence).
    row_ids: the global rows this iterator materialises (sorted tuple).
    num_tokens: tokens of the split (= pairs per epoch).
    num_sentences: sentences of the split (n).
  """

  def __init__(
      self,
      source: TokenSource,
      sentence_index: SentenceIndex,
      global_batch: int,
      tgt_len: int,
      seed: int,
      boundary_id: int,
      row_ids: Sequence[int] | None = None,
  ):
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
        process materialises (``process_row_ids``); None for all rows.

    Raises:
      ValueError: global_batch or tgt_len < 1; seed or boundary_id not an
        integer >= 0; source is not a TokenSource; sentence_index has no
        ``num_sentences``/``read_offsets``, no sentence, or offsets that do
        not start at 0, increase strictly and end at ``source.num_tokens``;
        row_ids empty, out of range, unsorted or duplicated.
    """
    self.global_batch = check_positive("global_batch", global_batch)
    self.tgt_len = check_positive("tgt_len", tgt_len)
    if not is_int(seed) or seed < 0:
      raise ValueError(f"seed must be an integer >= 0, got {seed!r}.")
    self.seed = int(seed)
    self.boundary_id = check_boundary_id(boundary_id)
    self._source = source
    self.num_tokens = check_source(source)
    if not (
        hasattr(sentence_index, "num_sentences")
        and callable(getattr(sentence_index, "read_offsets", None))
    ):
      raise ValueError(
          f"sentence_index must be a SentenceIndex (with .num_sentences and "
          f".read_offsets(start, stop)), got {type(sentence_index).__name__}; "
          f"pass corpus.sentence_offsets['train']."
      )
    n = sentence_index.num_sentences
    if not is_int(n) or n < 1:
      raise ValueError(f"the split must hold at least one sentence, got num_sentences={n!r}.")
    self.num_sentences = int(n)
    offsets = np.asarray(sentence_index.read_offsets(0, self.num_sentences + 1))
    if offsets.shape != (self.num_sentences + 1,) or not np.issubdtype(offsets.dtype, np.integer):
      raise ValueError(
          f"sentence_index.read_offsets(0, {n + 1}) returned "
          f"dtype {offsets.dtype}, shape {offsets.shape}; "
          f"expected {n + 1} integer offsets."
      )
    offsets = offsets.astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != self.num_tokens or np.any(np.diff(offsets) < 1):
      raise ValueError(
          f"sentence offsets must start at 0, increase strictly and end at "
          f"the split's {self.num_tokens} tokens; got first {offsets[0]}, "
          f"last {offsets[-1]}. The sentence index does not belong to this "
          f"token stream."
      )
    offsets.flags.writeable = False
    self._offsets = offsets
    self.row_ids = check_row_ids(row_ids, self.global_batch)
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
    if not is_int(epoch) or epoch < 0:
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

  def __iter__(self) -> ShuffledSentenceIterator:
    return self

  def _deal(self) -> list[list[tuple[int, int, int, int]]]:
    """Advances every row by T pairs; returns the local rows' pieces.

    A piece ``(sentence, a, z, pos)`` means pairs ``[a, z)`` of the sentence
    fill positions ``[pos, pos + z - a)`` of the row's segment.
    """
    T, off = self.tgt_len, self._offsets
    sentence, used, length = (self._row_sentence, self._row_used, self._row_length)
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
    """Returns the next batch and advances one step."""
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
            tokens = read_checked(self._source, start, start + z)
            inputs_BxT[i, pos] = self.boundary_id
            inputs_BxT[i, pos + 1 : pos + k] = tokens[:-1]
            targets_BxT[i, pos : pos + k] = tokens
          else:
            tokens = read_checked(self._source, start + a - 1, start + z)
            inputs_BxT[i, pos : pos + k] = tokens[:-1]
            targets_BxT[i, pos : pos + k] = tokens[1:]
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
    """Position of the next batch.

    Returns:
      {"epoch": permutation of the next sentence to deal, "position": its
      index in that permutation (in [0, num_sentences]; num_sentences means
      "start of the next epoch"), "step": batches emitted so far,
      "row_sentence": list of B current sentence ids (-1: none yet),
      "row_used": list of B pairs of that sentence already emitted, "seed",
      "global_batch", "tgt_len", "num_tokens", "num_sentences"}.  Ints and
      lists of ints only.
    """
    return {
        "epoch": self._epoch,
        "position": self._position,
        "step": self._step,
        "row_sentence": list(self._row_sentence),
        "row_used": list(self._row_used),
        "seed": self.seed,
        "global_batch": self.global_batch,
        "tgt_len": self.tgt_len,
        "num_tokens": self.num_tokens,
        "num_sentences": self.num_sentences,
    }

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Moves to a position returned by ``get_state`` (of any process).

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
      raise ValueError(
          f"{kind} state must be a dict with keys "
          f"{list(_SHUFFLED_STATE_KEYS)}, got "
          f"{type(state).__name__}."
      )
    rows = ("row_sentence", "row_used")
    scalars = tuple(k for k in _SHUFFLED_STATE_KEYS if k not in rows)
    if set(state) != set(_SHUFFLED_STATE_KEYS):
      missing = sorted(set(_SHUFFLED_STATE_KEYS) - set(state))
      extra = sorted(set(state) - set(_SHUFFLED_STATE_KEYS), key=str)
      raise ValueError(
          f"{kind} state must have exactly the keys "
          f"{list(_SHUFFLED_STATE_KEYS)}; missing {missing}, "
          f"unexpected {extra}. Pass a dict returned by "
          f"{kind}.get_state()."
      )
    s = check_state(
        {k: state[k] for k in scalars},
        scalars,
        {
            "seed": self.seed,
            "global_batch": self.global_batch,
            "tgt_len": self.tgt_len,
            "num_tokens": self.num_tokens,
            "num_sentences": self.num_sentences,
        },
        kind,
    )
    if s["epoch"] < 0 or s["step"] < 0:
      raise ValueError(
          f"{kind} state epoch and step must be >= 0, got {s['epoch']} and {s['step']}."
      )
    if not 0 <= s["position"] <= self.num_sentences:
      raise ValueError(
          f"{kind} state position must be in [0, {self.num_sentences}], got {s['position']}."
      )
    lists = {}
    for key in rows:
      value = state[key]
      if (
          not isinstance(value, Sequence)
          or isinstance(value, (str, bytes))
          or len(value) != self.global_batch
          or not all(is_int(v) for v in value)
      ):
        raise ValueError(
            f"{kind} state[{key!r}] must be a list of "
            f"{self.global_batch} integers (one per row)."
        )
      lists[key] = [int(v) for v in value]
    lengths = []
    for r, (sid, u) in enumerate(zip(lists["row_sentence"], lists["row_used"])):
      if not -1 <= sid < self.num_sentences:
        raise ValueError(
            f"{kind} state row_sentence[{r}] = {sid} is outside [-1, {self.num_sentences})."
        )
      n = 0 if sid < 0 else int(self._offsets[sid + 1] - self._offsets[sid])
      if not 0 <= u <= n:
        raise ValueError(
            f"{kind} state row_used[{r}] = {u} is outside [0, "
            f"{n}] (the length of sentence {sid})."
        )
      lengths.append(n)
    self._epoch, self._position, self._step = (s["epoch"], s["position"], s["step"])
    self._row_sentence = lists["row_sentence"]
    self._row_used = lists["row_used"]
    self._row_length = lengths
