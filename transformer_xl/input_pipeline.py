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

from transformer_xl.datasets import TokenSource

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
