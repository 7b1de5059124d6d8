"""Argument and state checks shared by the iterators and the row placement.

Each check raises ValueError with a message that names the argument, the
value received and what to pass instead.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from transformer_xl.data.corpus import TokenSource

# A batch of the iterators: see "Batch contract" in ``transformer_xl.data``.
Batch = dict[str, np.ndarray]


def is_int(value: Any) -> bool:
  """Whether ``value`` is an integer (numpy integers included, bool not)."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_positive(name: str, value: Any) -> int:
  """``value`` as an int; ValueError unless it is an integer >= 1."""
  if not is_int(value) or value < 1:
    raise ValueError(
        f"{name} must be an integer >= 1, got {value!r}; set {name} to a positive integer."
    )
  return int(value)


def check_boundary_id(boundary_id: Any) -> int:
  """``boundary_id`` as an int; ValueError unless it is an integer >= 0."""
  if not is_int(boundary_id) or boundary_id < 0:
    raise ValueError(
        f"boundary_id must be an integer token id >= 0, got "
        f"{boundary_id!r}; pass corpus.boundary_id."
    )
  return int(boundary_id)


def check_source(source: Any) -> int:
  """``source.num_tokens``; ValueError unless ``source`` is a TokenSource."""
  if not (hasattr(source, "num_tokens") and callable(getattr(source, "read", None))):
    raise ValueError(
        f"source must be a TokenSource (with .num_tokens and .read(start, "
        f"stop)), got {type(source).__name__}; pass e.g. corpus.splits['train'] "
        f"or data.ArraySource(tokens)."
    )
  num_tokens = source.num_tokens
  if not is_int(num_tokens) or num_tokens < 0:
    raise ValueError(f"source.num_tokens must be a non-negative integer, got {num_tokens!r}.")
  return int(num_tokens)


def check_row_ids(row_ids: Sequence[int] | None, global_batch: int) -> tuple[int, ...]:
  """Validates ``row_ids`` (sorted, unique, in [0, global_batch)); None -> all rows."""
  if row_ids is None:
    return tuple(range(global_batch))
  rows = list(row_ids)
  if not rows:
    raise ValueError(
        "row_ids is empty; pass the global rows this process holds "
        "(process_row_ids(sharding, global_batch)) or None for all "
        "rows."
    )
  for r in rows:
    if not is_int(r) or not 0 <= r < global_batch:
      raise ValueError(
          f"row_ids contains {r!r}, outside the global batch rows "
          f"[0, {global_batch}); every row id must be an integer in "
          f"[0, global_batch)."
      )
  for a, b in zip(rows, rows[1:]):
    if b <= a:
      raise ValueError(
          f"row_ids must be sorted and without duplicates, got "
          f"{a} followed by {b}; pass sorted(set(row_ids))."
      )
  return tuple(int(r) for r in rows)


def read_checked(source: TokenSource, start: int, stop: int) -> np.ndarray:
  """``source.read(start, stop)`` as int32, checking the returned length."""
  tokens = np.asarray(source.read(start, stop), dtype=np.int32)
  if tokens.shape != (stop - start,):
    raise ValueError(
        f"source.read({start}, {stop}) returned shape "
        f"{tokens.shape}, expected ({stop - start},); the "
        f"TokenSource is inconsistent with its num_tokens."
    )
  return tokens


def check_state(
    state: Any, keys: tuple[str, ...], expected: Mapping[str, int], kind: str
) -> dict[str, int]:
  """Checks a state dict's keys, integer types and layout fields.

  Args:
    state: the dict given to ``set_state``.
    keys: exactly the keys it must have, each an integer.
    expected: key -> the value this iterator has (the layout fields).
    kind: the iterator's class name, for messages.

  Returns:
    The state with int values.
  """
  if not isinstance(state, Mapping):
    raise ValueError(
        f"{kind} state must be a dict with keys {list(keys)}, got {type(state).__name__}."
    )
  if set(state) != set(keys):
    missing = sorted(set(keys) - set(state))
    extra = sorted(set(state) - set(keys), key=str)
    raise ValueError(
        f"{kind} state must have exactly the keys {list(keys)}; "
        f"missing {missing}, unexpected {extra}. Pass a dict "
        f"returned by {kind}.get_state()."
    )
  for key in keys:
    if not is_int(state[key]):
      raise ValueError(f"{kind} state[{key!r}] must be an integer, got {state[key]!r}.")
  for key, value in expected.items():
    if state[key] != value:
      raise ValueError(
          f"{kind} state was saved with {key}={state[key]} but this iterator "
          f"has {key}={value}; the saved position refers to a different "
          f"layout of the stream. Restore with the same global_batch, tgt_len "
          f"and split, or start a fresh iterator."
      )
  return {key: int(state[key]) for key in keys}


def side_by_side(segments: Sequence[Batch]) -> Batch:
  """Consecutive segments' batches as one window: every [B, T] array
  concatenated along T in order, ``reset`` [B] stacked to [B, n]."""
  out = {
      k: np.concatenate([seg[k] for seg in segments], axis=1) for k in segments[0] if k != "reset"
  }
  out["reset"] = np.stack([seg["reset"] for seg in segments], axis=1)
  return out
