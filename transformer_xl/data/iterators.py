"""Ordered segments of a token stream: training and evaluation iterators.

Both reproduce the reference implementation's ``LMOrderedIterator`` (Dai et
al. 2019 code, ``pytorch/data_utils.py``): the split's stream is cut into
``B = global_batch`` contiguous rows read ``T = tgt_len`` tokens at a time,
so that each row's memory is the text right before its segment.  Each class
docstring states its layout and its one deliberate difference from the
reference, both made to keep every batch the same shape under ``jax.jit``.
Batches follow the batch contract of ``transformer_xl.data``.

``make_train_iterator`` picks ``TrainIterator`` or, for corpora
with sentence boundaries, ``shuffled.ShuffledSentenceIterator``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from transformer_xl import errors
from transformer_xl.data import example_corpus
from transformer_xl.data.checks import (
    Batch,
    check_boundary_id,
    check_positive,
    check_row_ids,
    check_source,
    check_state,
    read_checked,
    side_by_side,
)
from transformer_xl.data.corpus import Corpus, SentenceIndex, TokenSource
from transformer_xl.data.shuffled import ShuffledSentenceIterator

_TRAIN_STATE_KEYS = ("epoch", "step", "global_batch", "tgt_len", "num_tokens")
_EVAL_STATE_KEYS = ("step", "global_batch", "tgt_len", "num_tokens")


def document_offsets(documents: SentenceIndex | None, num_tokens: int) -> np.ndarray | None:
  """int64 [n + 1] start of each document in the stream (and the stream's end),
  read once; None without documents.

  Raises:
    ValueError: the documents do not cover the stream exactly.
  """
  if documents is None:
    return None
  offsets = documents.read_offsets(0, documents.num_sentences + 1)
  if offsets[0] != 0 or offsets[-1] != num_tokens:
    raise ValueError(
        f"the documents cover tokens [{offsets[0]}, {offsets[-1]}) but the stream "
        f"has {num_tokens}; the prepared dataset is inconsistent."
    )
  return offsets


def doc_pos(offsets: np.ndarray, targets_BxT: np.ndarray) -> np.ndarray:
  """int32 [B, T]: each position's offset from the start of its document.

  A position belongs to the document of its target: ``targets_BxT`` holds
  stream indices of the targets (>= 0), and document ``k`` holds targets
  ``[offsets[k], offsets[k + 1])``, so the input that predicts a document's
  first token (the end symbol of the document before it) is its position 0:
  with ``data.documents="reset"`` a document is scored exactly as if alone,
  after the boundary symbol (``models.TransformerXL.hidden``'s ``doc_pos_BxT``).
  """
  k = np.searchsorted(offsets, targets_BxT, side="right") - 1
  return (targets_BxT - offsets[k]).astype(np.int32)


class TrainIterator(Iterator[Batch]):
  """Endless ordered iterator over training segments (reference LMOrderedIterator).

  The stream of ``N = source.num_tokens`` tokens is cut into ``B`` rows of
  ``row_len = n_step = N // B`` contiguous tokens: row ``r`` is
  ``tokens[r * n_step : (r + 1) * n_step]``; the trailing ``N % B`` tokens
  are dropped, as in the reference.  Step ``t`` (0-based within an epoch)
  yields, for every row, ``inputs = row[t*T : t*T + T]`` and ``targets =
  row[t*T + 1 : t*T + T + 1]``; an epoch has ``steps_per_epoch = (n_step -
  1) // T`` steps.  *Difference from the reference:* it also emits a shorter
  last batch of ``(n_step - 1) % T`` positions; that batch is dropped here
  (those tokens are never trained on as targets within an epoch).  Epochs
  repeat forever, each starting again at ``t = 0`` with ``reset`` True on
  its first step (the reference: "Memory is reset each epoch"); ``weights``
  are all ones.

  Per step it reads ``T + 1`` tokens per local row from ``source``, and only
  from its own rows' ranges (the last target of an epoch is still inside
  the row).

  With ``documents`` (``data.documents="reset"``) each batch also has
  ``doc_pos`` int32 [b, T] (``doc_pos``), so that no query attends
  across a document boundary.

  Attributes:
    global_batch: B, number of rows of the global batch.
    tgt_len: T, segment length in tokens.
    row_ids: the global rows this iterator materialises (sorted tuple).
    row_len: n_step, tokens per row.
    steps_per_epoch: steps per epoch.
  """

  def __init__(
      self,
      source: TokenSource,
      global_batch: int,
      tgt_len: int,
      row_ids: Sequence[int] | None = None,
      documents: SentenceIndex | None = None,
  ):
    """Builds the iterator at epoch 0, step 0.

    Args:
      source: the split's TokenSource (e.g. ``corpus.splits["train"]``).
      global_batch: B, rows of the global batch (over all processes), >= 1.
      tgt_len: T, tokens per segment, >= 1.
      row_ids: sorted, duplicate-free global row indices in [0, B) that this
        process materialises (``process_row_ids``); None for all rows.
      documents: the split's documents (``corpus.documents[split]``) to emit
        ``doc_pos``; None for none.

    Raises:
      ValueError: global_batch or tgt_len < 1; source is not a TokenSource;
        row_ids empty, out of range, unsorted or duplicated.
      errors.ConfigError (a ValueError and a UserError: the command line's
        one error line): the split has fewer than ``global_batch * (tgt_len
        + 1)`` tokens (no full training step).
    """
    self.global_batch = check_positive("global_batch", global_batch)
    self.tgt_len = check_positive("tgt_len", tgt_len)
    self._source = source
    self.num_tokens = check_source(source)
    self.row_len = self.num_tokens // self.global_batch
    self.steps_per_epoch = (self.row_len - 1) // self.tgt_len
    self._doc_offsets = document_offsets(documents, self.num_tokens)
    if self.steps_per_epoch < 1:
      needed = self.global_batch * (self.tgt_len + 1)
      raise errors.ConfigError(  # a UserError (one error line), and still a ValueError
          f"the training split has {self.num_tokens} tokens, too few for one "
          f"training step with global_batch={self.global_batch} and "
          f"tgt_len={self.tgt_len}: each of the {self.global_batch} rows needs "
          f"tgt_len + 1 = {self.tgt_len + 1} tokens, i.e. at least {needed} "
          f"tokens. Lower train.global_batch or model.tgt_len, or use a larger split."
      )
    self.row_ids = check_row_ids(row_ids, self.global_batch)
    self._epoch = 0
    self._step = 0

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> Batch:
    """Returns the next batch and advances one step."""
    b, T = len(self.row_ids), self.tgt_len
    inputs_BxT = np.empty((b, T), dtype=np.int32)
    targets_BxT = np.empty((b, T), dtype=np.int32)
    offset = self._step * T
    for i, r in enumerate(self.row_ids):
      start = r * self.row_len + offset
      # T + 1 tokens; stays inside the row since steps_per_epoch*T + 1 <= row_len.
      tokens = read_checked(self._source, start, start + T + 1)
      inputs_BxT[i] = tokens[:-1]
      targets_BxT[i] = tokens[1:]
    batch = {
        "inputs": inputs_BxT,
        "targets": targets_BxT,
        "weights": np.ones((b, T), dtype=np.float32),
        "reset": np.full((b,), self._step == 0, dtype=bool),
    }
    if self._doc_offsets is not None:
      targets_BxT = (
          np.asarray(self.row_ids)[:, None] * self.row_len + offset + 1 + np.arange(T)[None, :]
      )
      batch["doc_pos"] = doc_pos(self._doc_offsets, targets_BxT)
    self._step += 1
    if self._step == self.steps_per_epoch:
      self._step = 0
      self._epoch += 1
    return batch

  def get_state(self) -> dict[str, int]:
    """Position of the next batch.

    Returns:
      {"epoch": completed epochs, "step": step within the epoch of the next
      batch, in [0, steps_per_epoch), "global_batch", "tgt_len",
      "num_tokens"}.
    """
    return {
        "epoch": self._epoch,
        "step": self._step,
        "global_batch": self.global_batch,
        "tgt_len": self.tgt_len,
        "num_tokens": self.num_tokens,
    }

  def set_state(self, state: Mapping[str, int]) -> None:
    """Moves to a position returned by ``get_state``.

    Raises:
      ValueError: state is not a dict with exactly the keys of get_state();
        a value is not an integer; epoch < 0; step outside
        [0, steps_per_epoch); global_batch, tgt_len or num_tokens differ from
        this iterator's.
    """
    s = check_state(
        state,
        _TRAIN_STATE_KEYS,
        {"global_batch": self.global_batch, "tgt_len": self.tgt_len, "num_tokens": self.num_tokens},
        "TrainIterator",
    )
    if s["epoch"] < 0:
      raise ValueError(f"TrainIterator state epoch must be >= 0, got {s['epoch']}.")
    if not 0 <= s["step"] < self.steps_per_epoch:
      raise ValueError(
          f"TrainIterator state step must be in [0, "
          f"{self.steps_per_epoch}) (steps per epoch), got "
          f"{s['step']}."
      )
    self._epoch, self._step = s["epoch"], s["step"]


class SegmentWindows(Iterator[Batch]):
  """Windows of ``depth + 1`` consecutive training segments, sliding by one.

  For backpropagation through segments (``train.mem_backprop_depth`` =
  ``depth``; Bulatov et al. 2022, the authors' ``train.py``): step s gets
  the segments s - depth .. s of every row (``base``'s batches s - depth ..
  s) laid side by side: ``inputs``, ``targets``, ``weights`` (and
  ``doc_pos``) [B, (depth + 1) T], segment j at columns j T .. (j + 1) T;
  ``reset`` [B, depth + 1], segment j's flags.  Each step moves on by one
  segment, so every segment is the newest of one window.  Before the
  stream's first segment the window is padded with empty segments (inputs
  and targets 0, weight 0, no reset); the first real segment has ``reset``
  (the base's epoch start), so nothing of the padding reaches it.

  ``get_state`` is the base's position of the next newest segment (the same
  checkpoint state as without windows); ``set_state`` rewinds the base
  ``depth`` steps and reads the window's older segments again, so a resumed
  run gets the same windows.

  Args:
    base: a ``TrainIterator`` (ordered rows; the shuffled-sentence iterator
      has no rewind and is refused).
    depth: segments before the newest one, >= 1.

  Raises:
    ValueError: depth < 1, or ``base`` is not a ``TrainIterator``.
  """

  def __init__(self, base: TrainIterator, depth: int):
    if not isinstance(base, TrainIterator):
      raise ValueError(
          f"train.mem_backprop_depth={depth} needs an ordered training stream; "
          f"{type(base).__name__} (shuffled sentences, One Billion Word) has none."
      )
    self.depth = check_positive("depth", depth)
    self.base = base
    self._window: list[Batch] = []

  def __iter__(self) -> SegmentWindows:
    return self

  def _padding(self, like: Batch) -> Batch:
    pad = {k: np.zeros_like(v) for k, v in like.items()}
    pad["reset"] = np.zeros_like(like["reset"])
    return pad

  def __next__(self) -> Batch:
    batch = next(self.base)
    self._window = (self._window + [batch])[-(self.depth + 1) :]
    return side_by_side(
        [self._padding(batch)] * (self.depth + 1 - len(self._window)) + self._window
    )

  def get_state(self) -> dict[str, int]:
    return self.base.get_state()

  def set_state(self, state: Mapping[str, int]) -> None:
    """Moves to ``state`` (a ``get_state`` of the same run) with the window
    of the segments before it read again.

    Raises:
      ValueError: as ``TrainIterator.set_state``.
    """
    self.base.set_state(state)
    spe = self.base.steps_per_epoch
    position = state["epoch"] * spe + state["step"]
    start = max(0, position - self.depth)
    self.base.set_state({**state, "epoch": start // spe, "step": start % spe})
    self._window = [next(self.base) for _ in range(position - start)]


class EvalIterator(Iterator[Batch]):
  """One ordered pass over a split that scores every token exactly once.

  ``boundary_id`` (the corpus's ``<eos>``/boundary symbol) is the context of
  the split's first token: with ``N = source.num_tokens`` and ``s =
  [boundary_id] + tokens``, pair ``j`` (``0 <= j < N``) is input ``s[j]``,
  target ``tokens[j]``.  Row ``r`` of the global batch holds pairs ``[r *
  L, (r + 1) * L)`` with ``L = ceil(N / B)`` (with ``documents``: each row
  boundary moved forward to the next document start, so that no document
  is cut between two rows), emitted in ``num_steps = ceil(row_len / T)``
  segments of ``T`` positions, ``row_len`` the longest row; positions
  past the end of the row or of the stream are padding: weight 0, input and
  target ``boundary_id``.  Padding always follows every real position of its
  row, so with causal attention it cannot change any real score.  Over a
  full pass the weights sum to ``N`` and each target token index appears
  exactly once with weight 1.  ``reset`` is True on step 0 only; after
  ``num_steps`` batches the iterator raises ``StopIteration``.

  *Difference from the reference:* it scores ``tokens[1:]`` only, drops the
  remainder of ``N // B`` and uses a shorter last batch; here the weights
  make every batch the same shape while scoring all ``N`` tokens, the tail
  included.  (For the absolute encodings, attn_type 2 and 3, whose positions
  count from the end of the window, the padding of a row's last segment
  also moves the positions of its real tokens.)

  Per step it reads at most ``T + 1`` tokens per local row, only from its
  own rows' ranges (one token before a row's first pair, for that pair's
  input).  With ``documents`` each batch also has ``doc_pos`` (as
  ``TrainIterator``; 0 at padding).

  *Aligned documents* (``align_documents``, with ``documents``): every
  document also starts a segment.  Document ``k`` of ``n_k`` pairs takes
  ``ceil(n_k / T)`` segments of its row, its pairs in order from position 0
  of the first, then padding to the end of its last segment; rows hold the
  documents in stream order, row ``r`` from the first document with at
  least ``r * ceil(S / B)`` segments before it (``S`` segments in all).  A
  document is then laid out exactly as when it is scored alone
  (``Evaluator.score``), which makes its scores equal to those even where
  a query's keys depend on its place in the segment (``same_length=False``:
  query ``i`` sees ``mem_len + i`` keys; the absolute positions of
  ``attn_type`` 2 and 3).  The weights still sum to ``N``.

  Attributes:
    global_batch: B, number of rows of the global batch.
    tgt_len: T, segment length in tokens.
    boundary_id: token id used as the first token's context and as padding.
    row_ids: the global rows this iterator materialises (sorted tuple).
    align_documents: whether every document starts a segment.
    row_len: pairs of the longest row (ceil(N / B) without documents);
      aligned: positions of the longest row, the padding after its
      documents included (``num_steps * T``).
    num_steps: ceil(row_len / T), batches in the pass.
  """

  def __init__(
      self,
      source: TokenSource,
      global_batch: int,
      tgt_len: int,
      boundary_id: int,
      row_ids: Sequence[int] | None = None,
      documents: SentenceIndex | None = None,
      align_documents: bool = False,
  ):
    """Builds the iterator at step 0.

    Args:
      source: the split's TokenSource (e.g. ``corpus.splits["valid"]``).
      global_batch: B, rows of the global batch (over all processes), >= 1.
      tgt_len: T, tokens per segment, >= 1.
      boundary_id: the corpus's boundary symbol id (``corpus.boundary_id``),
        >= 0.
      row_ids: sorted, duplicate-free global row indices in [0, B) that this
        process materialises (``process_row_ids``); None for all rows.
      documents: the split's documents, to emit ``doc_pos``; None for none.
      align_documents: start every document at a segment (see the class
        docstring); needs ``documents``.

    Raises:
      ValueError: global_batch or tgt_len < 1; boundary_id not an integer
        >= 0; source is not a TokenSource or has no tokens; row_ids empty, out
        of range, unsorted or duplicated; align_documents without documents.
    """
    self.global_batch = check_positive("global_batch", global_batch)
    self.tgt_len = check_positive("tgt_len", tgt_len)
    self.boundary_id = check_boundary_id(boundary_id)
    self._source = source
    self.num_tokens = check_source(source)
    if self.num_tokens < 1:
      raise ValueError(
          "the evaluation split has 0 tokens; there is nothing to "
          "score. Check that the split was built correctly."
      )
    self.row_ids = check_row_ids(row_ids, self.global_batch)
    self._doc_offsets = document_offsets(documents, self.num_tokens)
    self.align_documents = bool(align_documents)
    if self.align_documents:
      if self._doc_offsets is None:
        raise ValueError("align_documents=True needs the split's documents (documents=...).")
      self._init_aligned(self._doc_offsets)
      self._step = 0
      return
    even = -(-self.num_tokens // self.global_batch)
    starts = np.minimum(np.arange(self.global_batch + 1) * even, self.num_tokens)
    if self._doc_offsets is not None:  # rows start at documents: none is cut between rows
      starts = self._doc_offsets[np.searchsorted(self._doc_offsets, starts)]
    self._row_start, self._row_end = starts[:-1], starts[1:]
    self.row_len = int(np.max(self._row_end - self._row_start))
    self.num_steps = -(-self.row_len // self.tgt_len)
    self._step = 0

  def _init_aligned(self, offsets: np.ndarray) -> None:
    """The aligned layout: every segment of every row, in row order.

    Segment ``g`` (``0 <= g < S``) holds pairs ``[seg_a[g], seg_a[g] +
    seg_n[g])`` (``1 <= seg_n[g] <= T``) of one document at its positions 0
    to ``seg_n[g] - 1``; row ``r`` holds segments ``[row_seg[r], row_seg[r +
    1])``, one per step.
    """
    T = self.tgt_len
    lengths = np.diff(offsets)  # pairs of each document (0 for an empty one)
    segs = -(-lengths // T)
    first_seg = np.concatenate([[0], np.cumsum(segs)])  # segments before each document
    total = int(first_seg[-1])
    doc = np.repeat(np.arange(len(lengths)), segs)  # the document of each segment
    within = np.arange(total) - first_seg[doc]  # the segment's index in its document
    self._seg_a = offsets[doc] + within * T
    self._seg_n = np.minimum(T, lengths[doc] - within * T)
    share = -(-total // self.global_batch)
    targets = np.minimum(np.arange(self.global_batch + 1) * share, total)
    # Rows start at documents: the first document with at least r * share segments before it.
    self._row_seg = first_seg[np.searchsorted(first_seg, targets)]
    self.num_steps = int(np.max(np.diff(self._row_seg)))
    self.row_len = self.num_steps * T

  def _segments(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(first pair, number of pairs) of every global row's segment at
    ``step``: int64 [B] each; 0 pairs where the segment is all padding."""
    if self.align_documents:
      g = self._row_seg[:-1] + step
      real = g < self._row_seg[1:]
      g = np.minimum(g, len(self._seg_a) - 1)
      return np.where(real, self._seg_a[g], 0), np.where(real, self._seg_n[g], 0)
    a = self._row_start + step * self.tgt_len
    return a, np.clip(self._row_end - a, 0, self.tgt_len)

  def __len__(self) -> int:
    """Total number of batches in a pass (``num_steps``), wherever the iterator is."""
    return self.num_steps

  def __iter__(self) -> EvalIterator:
    return self

  def __next__(self) -> Batch:
    """Returns the next batch and advances one step.

    Raises:
      StopIteration: after ``num_steps`` batches.
    """
    if self._step >= self.num_steps:
      raise StopIteration
    b, T = len(self.row_ids), self.tgt_len
    inputs_BxT = np.full((b, T), self.boundary_id, dtype=np.int32)
    targets_BxT = np.full((b, T), self.boundary_id, dtype=np.int32)
    weights_BxT = np.zeros((b, T), dtype=np.float32)
    a_B, n_B = self._segments(self._step)
    for i, r in enumerate(self.row_ids):
      # Real pairs [a, z) of the stream; n = 0 means the segment is all padding.
      a, n = int(a_B[r]), int(n_B[r])
      z = a + n
      if n <= 0:
        continue
      if a == 0:
        tokens = read_checked(self._source, 0, z)
        inputs_BxT[i, 0] = self.boundary_id
        inputs_BxT[i, 1:n] = tokens[:-1]
        targets_BxT[i, :n] = tokens
      else:
        tokens = read_checked(self._source, a - 1, z)
        inputs_BxT[i, :n] = tokens[:-1]
        targets_BxT[i, :n] = tokens[1:]
      weights_BxT[i, :n] = 1.0
    batch = {
        "inputs": inputs_BxT,
        "targets": targets_BxT,
        "weights": weights_BxT,
        "reset": np.full((b,), self._step == 0, dtype=bool),
    }
    if self._doc_offsets is not None:
      pairs_BxT = self.pairs(self._step)[np.asarray(self.row_ids)]
      batch["doc_pos"] = np.where(
          pairs_BxT >= 0, doc_pos(self._doc_offsets, np.maximum(pairs_BxT, 0)), 0
      )
    self._step += 1
    return batch

  def pairs(self, step: int) -> np.ndarray:
    """Stream index j of every position of batch ``step``, for all B global
    rows: int64 [B, T], -1 where the position is padding."""
    a_B, n_B = self._segments(step)
    t_T = np.arange(self.tgt_len)
    return np.where(t_T[None, :] < n_B[:, None], a_B[:, None] + t_T[None, :], -1).astype(np.int64)

  def get_state(self) -> dict[str, int]:
    """Position of the next batch.

    Returns:
      {"step": index of the next batch in [0, num_steps] (num_steps: pass
      finished), "global_batch", "tgt_len", "num_tokens"}.
    """
    return {
        "step": self._step,
        "global_batch": self.global_batch,
        "tgt_len": self.tgt_len,
        "num_tokens": self.num_tokens,
    }

  def set_state(self, state: Mapping[str, int]) -> None:
    """Moves to a position returned by ``get_state``.

    Raises:
      ValueError: state is not a dict with exactly the keys of get_state();
        a value is not an integer; step outside [0, num_steps];
        global_batch, tgt_len or num_tokens differ from this iterator's.
    """
    s = check_state(
        state,
        _EVAL_STATE_KEYS,
        {"global_batch": self.global_batch, "tgt_len": self.tgt_len, "num_tokens": self.num_tokens},
        "EvalIterator",
    )
    if not 0 <= s["step"] <= self.num_steps:
      raise ValueError(
          f"EvalIterator state step must be in [0, "
          f"{self.num_steps}] (num_steps), got {s['step']}."
      )
    self._step = s["step"]


class SlidingWindowIterator(Iterator[Batch]):
  """The vanilla Transformer's evaluation: every token scored by a fresh
  forward pass over a window of its previous tokens (Al-Rfou et al. 2018).

  Pairs ``j`` are as in ``EvalIterator`` (input ``s[j]``, target
  ``tokens[j]``, ``s = [boundary_id] + tokens``).  Window ``k`` (``0 <= k <
  num_windows = ceil(N / stride)``) scores pairs ``[k * stride, end_k)``,
  ``end_k = min((k + 1) * stride, N)``, and holds as context the ``L -
  stride`` pairs before them (``L = window``): pairs ``[max(0, k * stride -
  (L - stride)), end_k)``, as the reference does with ``tgt_len = stride,
  mem_len = 0`` and an extended context of ``L - stride`` unscored
  positions (its batches at the start and the end of a split are
  shorter).  With stride 1 every pair is scored with exactly
  ``min(j, L - 1)`` earlier pairs as context: the evaluation that Table 9 of
  Dai et al. 2019 times.  No memory is carried.

  Static shapes: each window's pairs are right-aligned in a row of ``L``
  positions and the row is padded at the FRONT (``front_pad`` positions);
  the model masks those as keys (``front_pad`` goes to the model as a
  negative valid-slot count, ``Memory.with_front_padding``), so the real tokens get exactly
  the context and the positions (counted from the window's end, for the
  absolute encodings) of the reference's shorter window.

  Batches follow the batch contract (``T = L``; ``reset`` all True) plus
  ``front_pad`` int32 [b].  Batch ``t`` holds windows ``t * B ... t * B + B
  - 1`` (row r = window t * B + r); windows past the last are all padding.

  Attributes:
    global_batch, window, stride, boundary_id, row_ids, num_tokens: as given
      (num_tokens: N, the source's).
    num_windows: ceil(N / stride).
    num_steps: ceil(num_windows / B), batches in the pass.
  """

  def __init__(
      self,
      source: TokenSource,
      global_batch: int,
      window: int,
      stride: int,
      boundary_id: int,
      row_ids: Sequence[int] | None = None,
  ):
    """Builds the iterator at step 0.

    Raises:
      ValueError: global_batch, window or stride < 1; stride > window;
        boundary_id not an integer >= 0; an empty split; bad row_ids.
    """
    self.global_batch = check_positive("global_batch", global_batch)
    self.window = check_positive("window", window)
    self.stride = check_positive("stride", stride)
    if self.stride > self.window:
      raise ValueError(
          f"stride={stride} must be <= window={window} (each window scores its "
          "last stride positions)."
      )
    self.boundary_id = check_boundary_id(boundary_id)
    self._source = source
    self.num_tokens = check_source(source)
    if self.num_tokens < 1:
      raise ValueError("the evaluation split has 0 tokens; there is nothing to score.")
    self.row_ids = check_row_ids(row_ids, self.global_batch)
    self.num_windows = -(-self.num_tokens // self.stride)
    self.num_steps = -(-self.num_windows // self.global_batch)
    self._step = 0

  def __len__(self) -> int:
    """Total number of batches in a pass (``num_steps``)."""
    return self.num_steps

  def __iter__(self) -> SlidingWindowIterator:
    return self

  def _bounds(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first scored pair, end, first context pair) of every global row's
    window at ``step``, int64 [B] each (end = start: a padding row)."""
    k_B = step * self.global_batch + np.arange(self.global_batch, dtype=np.int64)
    first_B = k_B * self.stride
    start_B = np.maximum(first_B - (self.window - self.stride), 0)
    end_B = np.where(
        k_B < self.num_windows, np.minimum(first_B + self.stride, self.num_tokens), start_B
    )
    return first_B, end_B, start_B

  def pairs(self, step: int) -> np.ndarray:
    """Stream index j of every position of batch ``step`` for all B global
    rows, int64 [B, L]: -1 where the position is padding or context."""
    first_B, end_B, _ = self._bounds(step)
    j_BxL = end_B[:, None] - self.window + np.arange(self.window)[None, :]
    return np.where((j_BxL >= first_B[:, None]) & (j_BxL < end_B[:, None]), j_BxL, -1)

  def __next__(self) -> Batch:
    """Returns the next batch and advances one step.

    Raises:
      StopIteration: after ``num_steps`` batches.
    """
    if self._step >= self.num_steps:
      raise StopIteration
    b, L = len(self.row_ids), self.window
    inputs_BxL = np.full((b, L), self.boundary_id, dtype=np.int32)
    targets_BxL = np.full((b, L), self.boundary_id, dtype=np.int32)
    front_pad_B = np.full((b,), L, dtype=np.int32)
    _, end_B, start_B = self._bounds(self._step)
    for i, r in enumerate(self.row_ids):
      a, z = int(start_B[r]), int(end_B[r])  # real pairs [a, z), right-aligned
      if z <= a:
        continue
      off = L - (z - a)
      front_pad_B[i] = off
      if a == 0:
        tokens = read_checked(self._source, 0, z)
        inputs_BxL[i, off] = self.boundary_id
        inputs_BxL[i, off + 1 :] = tokens[:-1]
      else:
        tokens = read_checked(self._source, a - 1, z)
        inputs_BxL[i, off:] = tokens[:-1]
        tokens = tokens[1:]
      targets_BxL[i, off:] = tokens
    batch = {
        "inputs": inputs_BxL,
        "targets": targets_BxL,
        "weights": (self.pairs(self._step)[list(self.row_ids)] >= 0).astype(np.float32),
        "reset": np.ones((b,), dtype=bool),
        "front_pad": front_pad_B,
    }
    self._step += 1
    return batch


def make_train_iterator(
    corpus: Corpus,
    split: str,
    global_batch: int,
    tgt_len: int,
    seed: int,
    row_ids: Sequence[int] | None = None,
    documents: str = "stream",
) -> TrainIterator | ShuffledSentenceIterator:
  """The training iterator that fits ``corpus``.

  Corpora with sentence boundaries (``corpus.sentence_offsets`` holding
  ``split``: One Billion Word) get a ``ShuffledSentenceIterator``
  (reference ``LMMultiFileIterator``/``LMShuffledIterator``) with
  ``boundary_id = corpus.boundary_id``; all others an ordered
  ``TrainIterator`` (reference ``LMOrderedIterator``), which ignores
  ``seed``; a synthetic task (``example_corpus.ExampleCorpus``) its
  ``example_corpus.ExampleIterator`` (whole examples, each from an empty
  memory, ``documents`` and ``seed`` ignored).  All follow the batch
  contract and have ``get_state``/``set_state``.

  Args:
    corpus: a ``Corpus``.
    split: the split to train on, usually "train".
    global_batch: B, rows of the global batch, >= 1.
    tgt_len: T, tokens per segment, >= 1.
    seed: integer >= 0, the sentence-order seed (shuffled iterator only).
    row_ids: this process's rows (``process_row_ids``); None for all.
    documents: "stream" (memory flows across documents) or "reset"
      (``doc_pos`` from ``corpus.documents``; ``data.documents``).

  Raises:
    ValueError: ``split`` is not in ``corpus.splits``, "reset" for a corpus
      without documents, or the iterator's own errors.
  """
  if split not in corpus.splits:
    raise ValueError(
        f"split {split!r} is not in the corpus {corpus.name!r}; "
        f"its splits are {sorted(corpus.splits)}."
    )
  if isinstance(corpus, example_corpus.ExampleCorpus):
    return example_corpus.ExampleIterator(corpus, split, global_batch, tgt_len, row_ids=row_ids)
  index = (corpus.sentence_offsets or {}).get(split)
  if index is not None:
    return ShuffledSentenceIterator(
        corpus.splits[split],
        index,
        global_batch,
        tgt_len,
        seed,
        corpus.boundary_id,
        row_ids=row_ids,
    )
  return TrainIterator(
      corpus.splits[split],
      global_batch,
      tgt_len,
      row_ids=row_ids,
      documents=split_documents(corpus, split, documents),
  )


def split_documents(corpus: Corpus, split: str, documents: str) -> SentenceIndex | None:
  """The documents of ``split`` for ``data.documents="reset"``, None for "stream".

  Raises:
    ValueError: "reset" for a corpus without documents (the built-in ones),
      or another value.
  """
  if documents == "stream":
    return None
  if documents != "reset":
    raise ValueError(f"data.documents={documents!r}: use 'stream' or 'reset'.")
  if corpus.documents is None:
    raise ValueError(
        f"data.documents='reset' needs a corpus with documents (data.dataset="
        f"'text'); {corpus.name!r} has none: use 'stream'."
    )
  return corpus.documents[split]
