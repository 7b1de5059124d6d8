"""Associative retrieval as the ARMT authors train it: one key-value pair per segment.

Rodkin et al. 2024 (ARMT, arXiv 2407.04841, Sec. 4.1) and their
``run_finetuning_associative_retrieval.py`` (RodkinIvan/associative-
recurrent-memory-transformer; the ``scripts/associative_retrieval/*_cur.sh``
recipes).  ``data.dataset="synthetic:armt_retrieval"`` (``synthetic.py``
holds the settings, splits and corpus; this module the draws and layout).

**Tokens** (their ids, kept so that a sample here is theirs token for
token): symbols 0..15 (``NUM_SYMBOLS``), ``SEP`` = 100 between a key and
its value, ``GEN`` = 101 after the queried key, ``EOS`` = 102 after
every value; ids 16..99 are unused (the vocabulary has 103 entries).

**A sample** of P pairs, keys of K symbols, values of V symbols, is P + 1
segments of K + V + 2 tokens (their ``segment_size``)::

    k_1 SEP v_1 EOS | k_2 SEP v_2 EOS | ... | k_P SEP v_P EOS | k_q GEN v_q EOS

``generate_pairs``: the P keys of a sample are distinct, drawn as P of the
``16**K`` integers without replacement (``torch.randperm``) and written
least significant symbol first; values are uniform symbols; the queried
pair q is uniform over the P (``ARDataset.target_key_inds``).

**Loss positions** (their ``labels_mask``: the last V + 2 tokens, shifted
with the logits): the predictions made at ``GEN`` and at the value's
tokens, i.e. of the value and its ``EOS``: V + 1 positions.  Their
``exact_match`` asks the greedy continuation after ``GEN`` to be the value
and ``EOS``, the same V + 1 tokens.

**Layout here**: the corpus's examples are ``seq = [sample, EOS]`` of S =
(P + 1)(K + V + 2) + 1 tokens, so that the model reads ``seq[:-1]``, their
``input_ids`` exactly, in the same segments, and predicts ``seq[1:]``; the
appended ``EOS`` is a target of weight 0.  The answer region is the last
V + 2 positions (value, ``EOS``, the appended one), of which the first V + 1
are weighed (``answer_counts``).

**Their ``--vary_n_segments``** (``collate_fn``): per batch, n is drawn
uniformly from 1..P, every sample keeps its last n pairs, and the queried
pair is drawn again uniformly among them (``last_pairs``); training with
``train.vary_n_segments`` reads such batches (``VaryPairsWindows``).

*Differences from the authors' code*: draws come from a numpy Generator,
not torch's, so samples are theirs in distribution and layout, not in
value (the test feeds their drawn keys and values through ``layout``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from transformer_xl.data.checks import Batch
from transformer_xl.data.example_corpus import ExampleIterator

NUM_SYMBOLS = 16  # their NUM_SYMBOLS: symbols 0..15
SEP, GEN, EOS = 100, 101, 102  # their sep_token, gen_token, eos_token
VOCAB_SIZE = EOS + 1
_CHUNK = 1 << 22  # distinct keys: at most this many candidates held at once


def segment_len(key_size: int, value_size: int) -> int:
  """Tokens of one pair's segment (their ``segment_size``): K + V + 2."""
  return key_size + value_size + 2


def vocabulary() -> list[str]:
  """Symbol of each id: hexadecimal digits 0..f, ``<unused16>`` ..
  ``<unused99>``, ``<sep>``, ``<gen>``, ``<eos>``."""
  return (
      [f"{i:x}" for i in range(NUM_SYMBOLS)]
      + [f"<unused{i}>" for i in range(NUM_SYMBOLS, SEP)]
      + ["<sep>", "<gen>", "<eos>"]
  )


def draw(
    rng: np.random.Generator, key_size: int, value_size: int, num_pairs: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``n`` samples' keys, values and queried pairs (their ``ARDataset``).

  Args:
    rng: the Generator drawn from.
    key_size: K, symbols of a key.
    value_size: V, symbols of a value.
    num_pairs: P, at most ``16**K`` (the keys of a sample are distinct).
    n: samples.

  Returns:
    keys_NxPxK (symbols, least significant first), values_NxPxV, target_N
    (the queried pair, 0..P-1), all int32.
  """
  space = NUM_SYMBOLS**key_size
  if not 1 <= num_pairs <= space:
    raise ValueError(f"num_pairs={num_pairs} must be in [1, {space}] for keys of {key_size}")
  ints = np.empty((n, num_pairs), np.int64)
  rows = max(1, _CHUNK // space)
  for start in range(0, n, rows):  # the first P of a partial Fisher-Yates shuffle per row
    stop = min(n, start + rows)
    at = np.arange(stop - start)
    perm = np.broadcast_to(np.arange(space), (stop - start, space)).copy()
    for i in range(num_pairs):
      j = rng.integers(i, space, size=stop - start)
      perm[at, i], perm[at, j] = perm[at, j], perm[at, i]
    ints[start:stop] = perm[:, :num_pairs]
  powers = NUM_SYMBOLS ** np.arange(key_size)
  keys = (ints[:, :, None] // powers) % NUM_SYMBOLS
  values = rng.integers(0, NUM_SYMBOLS, size=(n, num_pairs, value_size))
  target = rng.integers(0, num_pairs, size=n)
  return keys.astype(np.int32), values.astype(np.int32), target.astype(np.int32)


def layout(keys_NxPxK: np.ndarray, values_NxPxV: np.ndarray, target_N: np.ndarray) -> np.ndarray:
  """The examples ``[sample, EOS]`` of drawn pairs (their ``collate_fn``'s
  ``input_ids``, then the appended ``EOS``).

  Returns:
    int32 [N, (P + 1)(K + V + 2) + 1].
  """
  n, p, _ = keys_NxPxK.shape
  rows = np.arange(n)

  def segment(key, mark, value):
    return np.concatenate([key, np.full((n, 1), mark), value, np.full((n, 1), EOS)], axis=1)

  parts = [segment(keys_NxPxK[:, i], SEP, values_NxPxV[:, i]) for i in range(p)]
  parts.append(segment(keys_NxPxK[rows, target_N], GEN, values_NxPxV[rows, target_N]))
  parts.append(np.full((n, 1), EOS))
  return np.concatenate(parts, axis=1).astype(np.int32)


def answer_len(value_size: int) -> int:
  """The answer region: the last V + 2 positions (value, ``EOS``, the appended one)."""
  return value_size + 2


def weighed_len(value_size: int) -> int:
  """The weighed positions of the answer region, its first V + 1: the value and ``EOS``."""
  return value_size + 1


def last_pairs(
    rng: np.random.Generator,
    keys_NxPxK: np.ndarray,
    values_NxPxV: np.ndarray,
    n_pairs: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A batch as their ``--vary_n_segments`` makes it: the last n pairs of
  each sample, the queried pair drawn again among them.

  Args:
    rng: the Generator drawn from.
    keys_NxPxK: the batch's keys.
    values_NxPxV: the batch's values.
    n_pairs: n; None draws it uniformly from 1..P, as theirs, per batch.

  Returns:
    keys_Nxnxk, values_NxnxV, target_N (0..n-1).
  """
  p = keys_NxPxK.shape[1]
  n = int(rng.integers(1, p + 1)) if n_pairs is None else n_pairs
  if not 1 <= n <= p:
    raise ValueError(f"n_pairs={n} must be in [1, {p}]")
  target = rng.integers(0, n, size=keys_NxPxK.shape[0]).astype(np.int32)
  return keys_NxPxK[:, p - n :], values_NxPxV[:, p - n :], target


def split_pairs(
    examples_NxS: np.ndarray, key_size: int, value_size: int
) -> tuple[np.ndarray, np.ndarray]:
  """The keys and values of laid-out examples (``layout``'s inverse for
  the P pairs; the query segment and the appended ``EOS`` dropped).

  Returns:
    keys_NxPxK, values_NxPxV.
  """
  seg = segment_len(key_size, value_size)
  n, s = examples_NxS.shape
  p = (s - 1) // seg - 1
  pairs = examples_NxS[:, : p * seg].reshape(n, p, seg)
  return pairs[:, :, :key_size], pairs[:, :, key_size + 1 : key_size + 1 + value_size]


class VaryPairsWindows:
  """Training batches as their ``--vary_n_segments`` makes them: per batch
  of whole examples, n drawn uniformly from 1..P, every example cut to its
  last n pairs with the queried pair drawn again among them
  (``last_pairs``), laid out and given as one window of n + 1 segments
  (arrays [b, (n + 1) T], ``reset`` [b, n + 1]: the batch contract of
  ``example_corpus.ExampleWindows``).  n and the queries are drawn from
  (``seed``, the batch's index), so a resumed run reads the same batches;
  the state is the base iterator's.  The examples are read in the base's
  order (rows of consecutive examples, as their unshuffled DataLoader).

  Args:
    base: the ``ExampleIterator`` of a ``synthetic:armt_retrieval`` corpus
      whose ``tgt_len`` is the segment (K + V + 2).
    key_size: the corpus's K.
    value_size: the corpus's V.
    seed: ``train.seed``.
  """

  def __init__(self, base: ExampleIterator, key_size: int, value_size: int, seed: int):
    seg = segment_len(key_size, value_size)
    if base.tgt_len != seg:
      raise ValueError(
          f"train.vary_n_segments reads segments of one pair: tgt_len must be {seg}, "
          f"not {base.tgt_len}."
      )
    self.base, self.key_size, self.value_size, self.seed = base, key_size, value_size, seed

  def __iter__(self):
    return self

  def __next__(self) -> Batch:
    batch_index, examples = self.base.next_examples()
    rng = np.random.default_rng([self.seed, batch_index])
    keys, values = split_pairs(examples, self.key_size, self.value_size)
    seq = layout(*last_pairs(rng, keys, values))
    b, e = seq.shape[0], seq.shape[1] - 1
    start = e - answer_len(self.value_size)
    pos = np.arange(e)
    weights = (pos >= start) & (pos < start + weighed_len(self.value_size))
    n_seg = e // self.base.tgt_len
    return {
        "inputs": np.ascontiguousarray(seq[:, :-1]),
        "targets": np.ascontiguousarray(seq[:, 1:]),
        "weights": np.broadcast_to(weights, (b, e)).astype(np.float32),
        "reset": np.broadcast_to(np.arange(n_seg) == 0, (b, n_seg)).copy(),
    }

  def get_state(self) -> dict[str, int]:
    return self.base.get_state()

  def set_state(self, state: Mapping[str, int]) -> None:
    self.base.set_state(state)
