"""Long-range synthetic tasks: copy, reverse, associative retrieval, passkey.

The algorithmic tasks of the Recurrent Memory Transformer (Bulatov,
Kuratov, Burtsev 2022, arXiv 2207.06881, Sec. 4), generated as the authors'
``pytorch/experiment_utils/generate_data.py`` and ``retrieval.py``
(``booydar/LM-RMT``) generate them and laid out as their
``pytorch/train_synthetic.py`` feeds them to the model:
``data.dataset="synthetic:copy"``, ``"synthetic:reverse"`` or
``"synthetic:associative_retrieval"``.  Nothing is downloaded: the splits
are drawn from ``data.synthetic_seed`` (a numpy ``Generator``) when the
corpus is loaded.

**An example** is one sequence ``[X, y]`` of ``S`` token ids (the authors'
``np.hstack((X, y))``), ``y[0]`` a marker that says the answer comes next:

* copy (``generate_data.copy_generator``): ``X`` = ``seq_len`` symbols
  drawn uniformly from ``2 .. num_tokens - 1``, ``y = [1, X, X]``: the
  input twice; ``S = 3 * seq_len + 1``;
* reverse (``reverse_generator``): ``y = [1, reversed(X)]``;
  ``S = 2 * seq_len + 1``;
* associative retrieval (``retrieval_generator``, ``retrieval.create_sequence``):
  ``X = [k_1, v_1, ..., k_K, v_K, q]``, ``K = num_pairs`` keys (letters,
  ids 11..36, distinct), values (digits, ids 0..9, distinct for K <= 10),
  the query ``q`` one of the keys; ``y = [10, v]``, ``v`` the query's value;
  ``S = 2 * K + 3``.  The vocabulary is always 37 ids.

``data.dataset="synthetic:armt_retrieval"`` is associative retrieval as
the ARMT authors train it (Rodkin et al. 2024; ``armt_retrieval.py``): one
key-value pair per segment, keys of ``key_size`` and values of
``value_size`` symbols of 16, their token ids and layout; its splits are
independent draws as theirs (not deduplicated), and of its answer region
(the value, ``EOS`` and an appended ``EOS`` the model reads nothing after)
the value and ``EOS`` are weighed.

``data.dataset="synthetic:passkey"`` is the passkey retrieval of Landmark
Attention (Mohtashami & Jaggi 2023; ``passkey.py``): filler text with a
pass-key line at a depth, the question, and the key's ``passkey_digits``
digits as the answer (no marker: the question ends "The pass key is");
``S = passkey_len + 1``.  It is laid out, scored and decoded as the others.

The model reads ``inputs = seq[:-1]`` and predicts ``targets = seq[1:]``:
``E = S - 1`` positions per example (the *example length*; 72 for copy
with seq_len 24), of which the last ``answer_len`` (copy ``2 * seq_len``,
reverse ``seq_len``, retrieval 1) are the answer.  ``E`` must be a multiple
of the segment length ``tgt_len``: an example is ``E / tgt_len`` whole
segments (the authors' ``n_chunks``), and the memory is emptied at its
first segment (``reset``; the memory tokens of the authors' code restart
from their learned values at every example).  *Difference from the
authors' code:* their Transformer-XL cache (``mems``) is not reset between
examples, so an example's first segment attends to the previous example's
last ``mem_len`` states, which hold nothing about it; here it is reset.

**Splits** (``generate_data.generate_data``): ``3 * (train + valid +
test)`` examples are drawn (the authors: as many, rounded down to whole
batches of 32), the duplicates removed over all of them at once
(``np.unique`` over the inputs ``X``), the rest shuffled and cut into
train, valid and test, so no input is in two splits.  Defaults (their
``generate_data`` and run scripts): 10,000 / 1,000 / 2,000 examples, copy
and reverse with ``seq_len`` 24 over 10 symbols (``num_tokens`` 12),
retrieval with 4 pairs.  Where fewer distinct inputs exist than the
splits need, loading refuses (the authors' code would make smaller splits).

**Loss and accuracy.**  The authors train and validate on the answer
positions only (``loss[-args.answer_size:]``): the corpus's batches weigh
those positions 1 and the others 0, in training and in evaluation (so
``loss_nats`` and ``ppl`` of an evaluation are over answer tokens).
Evaluation also reports ``answer_token_accuracy`` (the share of answer
tokens whose argmax prediction, given the true earlier tokens, is right:
the authors' teacher-forced accuracy ``num_correct_tf / num_total``, which
is what they report where the answer is shorter than a segment) and
``answer_accuracy`` (the share of examples whose whole answer is right;
equal to the share that greedy decoding gets exactly right).  Where the
answer spans a segment or more (their copy and reverse runs) the authors
report the per-token accuracy of greedy decoding instead: ``--mode=eval``
adds it as ``greedy_token_accuracy`` (``inference/greedy_answers.py``).

The examples' corpus, batches and weights: ``example_corpus.py`` (an
``ExampleCorpus``, ``ExampleIterator``, ``ExampleEvalIterator``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_xl import errors
from transformer_xl.data import armt_retrieval, passkey
from transformer_xl.data.corpus import ArraySource
from transformer_xl.data.example_corpus import ExampleCorpus

PREFIX = "synthetic:"  # data.dataset="synthetic:TASK"
RMT_TASKS = ("copy", "reverse", "associative_retrieval")  # Bulatov et al. 2022's
ARMT = "armt_retrieval"  # Rodkin et al. 2024's associative retrieval (armt_retrieval.py)
TASKS = (*RMT_TASKS, ARMT, "passkey")  # passkey: Mohtashami & Jaggi 2023 (passkey.py)
# data config key -> TaskSettings field (the authors' names in the comments of default_config).
FIELDS = {
    "synthetic_seq_len": "seq_len",
    "synthetic_num_tokens": "num_tokens",
    "synthetic_num_pairs": "num_pairs",
    "synthetic_key_size": "key_size",
    "synthetic_value_size": "value_size",
    "synthetic_train_size": "train_size",
    "synthetic_valid_size": "valid_size",
    "synthetic_test_size": "test_size",
    "synthetic_seed": "seed",
    "synthetic_passkey_len": "passkey_len",
    "synthetic_passkey_depth": "passkey_depth",
    "synthetic_passkey_digits": "passkey_digits",
}
# The fields that apply to some tasks only.
_TASK_FIELDS = {
    "synthetic_seq_len": ("copy", "reverse"),
    "synthetic_num_tokens": ("copy", "reverse"),
    "synthetic_num_pairs": ("associative_retrieval", ARMT),
    "synthetic_key_size": (ARMT,),
    "synthetic_value_size": (ARMT,),
    "synthetic_passkey_len": ("passkey",),
    "synthetic_passkey_depth": ("passkey",),
    "synthetic_passkey_digits": ("passkey",),
}
ANSWER_MARKER = 1  # copy and reverse: y[0] (generate_data.py: ``y[:, 0] = 1``)
QUERY_MARKER = 10  # retrieval: y[0] (``y[:, 0] = 10``)
_LETTERS = 26  # retrieval keys: ids 11..36 (retrieval.get_three_letters)
_DIGITS = 10  # retrieval values: ids 0..9 (retrieval.get_three_numbers)
RETRIEVAL_VOCAB = 37
# The corpus's boundary_id (what generation may stop at): the marker, passkey's line end.
_BOUNDARY = {
    "associative_retrieval": QUERY_MARKER,
    "passkey": passkey.vocabulary().index(passkey.EOS),
    ARMT: armt_retrieval.EOS,
}
ARMT_MAX_KEY_SIZE = 4  # keys of up to 16**4 values
OVERSAMPLE = 3  # generate_data: ``num_batches = total_size // batch_size * 3``


def is_synthetic(dataset: str) -> bool:
  """Whether ``data.dataset`` names a synthetic task (``"synthetic:..."``)."""
  return dataset.startswith(PREFIX)


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  """One synthetic task's settings (``data.synthetic_*``; defaults: the authors').

  Attributes:
    task: one of ``TASKS``.
    seq_len: copy/reverse: symbols of the input X (authors: 24; 120 in
      their long runs).
    num_tokens: copy/reverse: the vocabulary, ids 0 (unused padding), 1 (the
      answer marker) and the symbols 2 .. num_tokens - 1 (authors' 12).
    num_pairs: retrieval: key-value pairs K (authors' 4), 1 to 26;
      armt_retrieval: pairs P, one per segment, 1 to ``16**key_size``.
    key_size, value_size: armt_retrieval: symbols of a key and a value
      (their ar-value recipe: 1 and 1, keys of 2 and 3 from 20 pairs).
    passkey_len: passkey: E, the positions of an example (the prompt and
      its answer are E + 1 tokens); a multiple of the segment length.
    passkey_depth: passkey: filler tokens before the pass-key line; -1:
      drawn uniformly per example (the authors').
    passkey_digits: passkey: digits of the key (the answer's tokens).
    train_size, valid_size, test_size: examples per split.
    seed: seed of the numpy Generator that draws every split.
  """

  task: str
  seq_len: int = 24
  num_tokens: int = 12
  num_pairs: int = 4
  key_size: int = 1
  value_size: int = 1
  passkey_len: int = 512
  passkey_depth: int = -1
  passkey_digits: int = 5
  train_size: int = 10_000
  valid_size: int = 1_000
  test_size: int = 2_000
  seed: int = 0

  @classmethod
  def from_data_config(cls, data_cfg: Mapping[str, Any]) -> TaskSettings:
    """The settings of a config's ``data`` section (``dataset`` and the
    ``synthetic_*`` keys it has)."""
    fields = {f: data_cfg[k] for k, f in FIELDS.items() if k in data_cfg}
    return cls(task=data_cfg["dataset"][len(PREFIX) :], **fields)

  @property
  def name(self) -> str:
    """``data.dataset``: "synthetic:TASK"."""
    return PREFIX + self.task

  @property
  def sequence_len(self) -> int:
    """S: tokens of one example ``[X, y]``."""
    if self.task == "copy":
      return 3 * self.seq_len + 1
    if self.task == "reverse":
      return 2 * self.seq_len + 1
    if self.task == "passkey":
      return self.passkey_len + 1
    if self.task == ARMT:  # P + 1 segments, then the appended EOS
      return (self.num_pairs + 1) * armt_retrieval.segment_len(self.key_size, self.value_size) + 1
    return 2 * self.num_pairs + 3

  @property
  def example_len(self) -> int:
    """E = S - 1: the model's positions per example (the authors' src length)."""
    return self.sequence_len - 1

  @property
  def answer_len(self) -> int:
    """Answer positions at the end of an example (the authors' answer_size)."""
    answer = {
        "copy": 2 * self.seq_len,
        "reverse": self.seq_len,
        "passkey": self.passkey_digits,
        ARMT: armt_retrieval.answer_len(self.value_size),
    }
    return answer.get(self.task, 1)

  @property
  def weighed_len(self) -> int:
    """Weighed positions of the answer region, its first (all of it but
    armt_retrieval's appended EOS)."""
    return armt_retrieval.weighed_len(self.value_size) if self.task == ARMT else self.answer_len

  @property
  def n_token(self) -> int:
    """The vocabulary size (the authors' ``ntokens``)."""
    if self.task == "passkey":
      return len(passkey.vocabulary())
    if self.task == ARMT:
      return armt_retrieval.VOCAB_SIZE
    return RETRIEVAL_VOCAB if self.task == "associative_retrieval" else self.num_tokens

  @property
  def sizes(self) -> dict[str, int]:
    """Split -> examples."""
    return {"train": self.train_size, "valid": self.valid_size, "test": self.test_size}

  def distinct_inputs(self, at_most: int = 2**64) -> int:
    """How many different inputs X the task has (an upper bound on the
    examples), counted up to ``at_most``: a larger count is returned as
    ``at_most`` (``(num_tokens - 2) ** seq_len`` exactly takes seconds to
    hours for a seq_len of millions; its logarithm decides)."""
    if self.task == ARMT:  # distinct keys in order, any values, any query
      m, p = armt_retrieval.NUM_SYMBOLS**self.key_size, self.num_pairs
      bits = (math.lgamma(m + 1) - math.lgamma(m - p + 1)) / math.log(2)
      bits += 4 * self.value_size * p + math.log2(p)
      return (
          at_most
          if bits > math.log2(at_most) + 1
          else min(math.perm(m, p) * 16 ** (self.value_size * p) * p, at_most)
      )
    if self.task == "associative_retrieval":
      k = self.num_pairs  # <= 26 (settings_problems)
      values = math.perm(_DIGITS, k) if k <= _DIGITS else _DIGITS**k
      return min(math.perm(_LETTERS, k) * values * k, at_most)
    if self.task == "passkey":
      depths = passkey.filler_len(self.passkey_len, self.passkey_digits) + 1
      keys = 9 * 10 ** (self.passkey_digits - 1)
      return min(keys * (depths if self.passkey_depth < 0 else 1), at_most)
    base = self.num_tokens - 2
    if base > 1 and self.seq_len * math.log2(base) > math.log2(at_most) + 1:
      return at_most
    return min(base**self.seq_len, at_most)


def settings_problems(s: TaskSettings, defaults: TaskSettings | None = None) -> list[str]:
  """What is wrong with synthetic-task settings; empty: nothing.

  Args:
    s: the settings.
    defaults: the config's defaults; a field of another task that differs
      from them is refused (e.g. ``synthetic_num_pairs`` with copy); None:
      such fields are ignored.

  Returns:
    One message per problem, naming the ``data.*`` key and the fix.
  """
  if s.task not in TASKS:
    return [
        f"data.dataset={PREFIX + s.task!r}: use one of "
        f"{', '.join(repr(PREFIX + t) for t in TASKS)}."
    ]
  problems = []
  for key, tasks in _TASK_FIELDS.items():
    field = FIELDS[key]
    if (
        defaults is not None
        and s.task not in tasks
        and getattr(s, field) != getattr(defaults, field)
    ):
      problems.append(
          f"data.{key} applies only to {' and '.join(PREFIX + t for t in tasks)}, not to "
          f"{PREFIX + s.task}: remove it."
      )
  ints = {k: getattr(s, f) for k, f in FIELDS.items()}
  bad = [k for k, v in ints.items() if not isinstance(v, int) or isinstance(v, bool)]
  if bad:
    return problems + [f"data.{k}={ints[k]!r} must be an integer." for k in bad]
  for key in ("synthetic_seq_len", *(f"synthetic_{k}_size" for k in s.sizes)):
    if ints[key] < 1:
      problems.append(f"data.{key}={ints[key]} must be >= 1.")
  if s.num_tokens < 3:
    problems.append(
        f"data.synthetic_num_tokens={s.num_tokens} must be >= 3 (ids 0 and 1 are the "
        "padding and the answer marker; the symbols are 2 .. num_tokens - 1)."
    )
  if s.task == ARMT:
    problems += _armt_problems(s)
  elif not 1 <= s.num_pairs <= _LETTERS:
    problems.append(
        f"data.synthetic_num_pairs={s.num_pairs} must be in [1, {_LETTERS}] (the keys are "
        "distinct letters)."
    )
  if s.seed < 0:
    problems.append(f"data.synthetic_seed={s.seed} must be >= 0.")
  if s.task == "passkey":
    problems += _passkey_problems(s)
  if problems:
    return problems
  total = sum(s.sizes.values())
  gib = total * s.example_len * 4 / 2**30  # the examples, int32
  if gib > _memory_gib() / 2:
    return problems + [
        f"{PREFIX}{s.task} with these settings is {total:,} examples of {s.example_len:,} "
        f"tokens: {gib:,.1f} GiB, more than half this machine's memory "
        f"({_memory_gib():,.1f} GiB): lower data.synthetic_seq_len (or "
        "data.synthetic_num_pairs) or data.synthetic_train_size + valid_size + test_size."
    ]
  if s.task != ARMT and s.distinct_inputs() < total:  # ARMT's splits: independent draws
    problems.append(
        f"{PREFIX}{s.task} has only {s.distinct_inputs():,} distinct inputs with these "
        f"settings, fewer than the {total:,} examples of data.synthetic_train_size + "
        "valid_size + test_size: lower the sizes, or raise data.synthetic_seq_len or "
        "data.synthetic_num_tokens (data.synthetic_num_pairs for retrieval)."
    )
  return problems


def _armt_problems(s: TaskSettings) -> list[str]:
  """armt_retrieval's key and value sizes and pairs."""
  if not 1 <= s.key_size <= ARMT_MAX_KEY_SIZE:
    return [
        f"data.synthetic_key_size={s.key_size} must be in [1, {ARMT_MAX_KEY_SIZE}] (symbols "
        "of a key; the authors' recipes use 1 to 3)."
    ]
  if s.value_size < 1:
    return [f"data.synthetic_value_size={s.value_size} must be >= 1."]
  space = armt_retrieval.NUM_SYMBOLS**s.key_size
  if not 1 <= s.num_pairs <= space:
    return [
        f"data.synthetic_num_pairs={s.num_pairs} must be in [1, {space}] with "
        f"data.synthetic_key_size={s.key_size} (the keys of an example are distinct): "
        "lower it or raise data.synthetic_key_size."
    ]
  return []


def _passkey_problems(s: TaskSettings) -> list[str]:
  """The passkey settings' problems: the digits, the length, the depth."""
  if not 1 <= s.passkey_digits <= 9:
    return [f"data.synthetic_passkey_digits={s.passkey_digits} must be in [1, 9]."]
  shortest = passkey.fixed_len(s.passkey_digits) - 1
  if s.passkey_len < shortest:
    return [
        f"data.synthetic_passkey_len={s.passkey_len} is shorter than the prompt without "
        f"filler ({shortest} positions with {s.passkey_digits} digits): raise it."
    ]
  f = passkey.filler_len(s.passkey_len, s.passkey_digits)
  if not -1 <= s.passkey_depth <= f:
    return [
        f"data.synthetic_passkey_depth={s.passkey_depth} must be -1 (drawn per example) or "
        f"in [0, {f}] (the filler tokens of data.synthetic_passkey_len={s.passkey_len})."
    ]
  return []


def _memory_gib() -> float:
  """This machine's physical memory, GiB (64 where the OS does not say)."""
  try:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
  except (AttributeError, ValueError, OSError):
    return 64.0


def marked_answer(s: TaskSettings, x_NxL: np.ndarray) -> np.ndarray:
  """``y`` of inputs ``X``: the marker, then the answer (copy: ``X`` twice;
  reverse: ``X`` reversed; retrieval: the value of the query key).

  Args:
    s: the task's settings.
    x_NxL: int inputs [N, len(X)].

  Returns:
    int32 [N, 1 + answer_len].
  """
  n = x_NxL.shape[0]
  if s.task == "passkey":  # no marker: the question ends "The pass key is"
    return passkey.answers(x_NxL, s.passkey_digits)
  if s.task in ("copy", "reverse"):
    answer = np.concatenate([x_NxL, x_NxL], axis=1) if s.task == "copy" else x_NxL[:, ::-1]
    return np.concatenate([np.full((n, 1), ANSWER_MARKER), answer], axis=1).astype(np.int32)
  k = s.num_pairs
  keys, values, query = x_NxL[:, 0 : 2 * k : 2], x_NxL[:, 1 : 2 * k : 2], x_NxL[:, 2 * k]
  found = np.argmax(keys == query[:, None], axis=1)  # the keys are distinct
  value = values[np.arange(n), found]
  return np.stack([np.full(n, QUERY_MARKER), value], axis=1).astype(np.int32)


def _inputs(s: TaskSettings, rng: np.random.Generator, n: int) -> np.ndarray:
  """``n`` drawn inputs X: int32 [n, len(X)]."""
  if s.task == "passkey":
    return passkey.examples(s.passkey_len, s.passkey_digits, s.passkey_depth, rng, n)[
        :, : -s.passkey_digits
    ]
  if s.task in ("copy", "reverse"):
    return rng.integers(2, s.num_tokens, size=(n, s.seq_len), dtype=np.int32)
  k = s.num_pairs
  # Distinct keys (k <= 26) and values (k <= 10), as np.random.choice(replace=False).
  keys = np.argsort(rng.random((n, _LETTERS)), axis=1)[:, :k] + 11
  if k <= _DIGITS:
    values = np.argsort(rng.random((n, _DIGITS)), axis=1)[:, :k]
  else:
    values = rng.integers(0, _DIGITS, size=(n, k))
  query = keys[np.arange(n), rng.integers(0, k, size=n)]
  x = np.empty((n, 2 * k + 1), np.int32)
  x[:, 0 : 2 * k : 2], x[:, 1 : 2 * k : 2], x[:, 2 * k] = keys, values, query
  return x


def generate(s: TaskSettings) -> dict[str, np.ndarray]:
  """Every split's examples, drawn from ``s.seed``.

  Returns:
    "train", "valid", "test" -> int32 [n, S] examples ``[X, y]``
    (armt_retrieval: ``armt_retrieval.layout``); no input X is in two
    splits or twice in one (armt_retrieval's splits are independent draws,
    as the authors').

  Raises:
    errors.DataError: fewer distinct inputs were drawn than the splits need.
  """
  rng = np.random.default_rng(s.seed)
  if s.task == ARMT:  # independent draws per split, in order, as their three ARDatasets
    return {
        split: armt_retrieval.layout(
            *armt_retrieval.draw(rng, s.key_size, s.value_size, s.num_pairs, size)
        )
        for split, size in s.sizes.items()
    }
  total = sum(s.sizes.values())
  x = _inputs(s, rng, OVERSAMPLE * total)
  _, first = np.unique(x, axis=0, return_index=True)
  if first.shape[0] < total:
    raise errors.DataError(
        f"{PREFIX}{s.task}: {OVERSAMPLE * total:,} draws gave {first.shape[0]:,} distinct "
        f"inputs, fewer than the {total:,} examples the splits need: lower "
        "data.synthetic_train_size, valid_size or test_size, or make the task larger."
    )
  order = rng.permutation(first)[:total]
  seqs = np.concatenate([x[order], marked_answer(s, x[order])], axis=1)
  bounds = np.cumsum([0, s.train_size, s.valid_size, s.test_size])
  return {name: seqs[bounds[i] : bounds[i + 1]] for i, name in enumerate(s.sizes)}


def vocabulary(s: TaskSettings) -> list[str]:
  """Symbol of each id: copy/reverse ``<pad>``, ``<answer>``, then the ids
  as numbers; retrieval the digits, ``?`` (the query marker), a..z;
  armt_retrieval ``armt_retrieval.vocabulary``."""
  if s.task == "passkey":
    return passkey.vocabulary()
  if s.task == ARMT:
    return armt_retrieval.vocabulary()
  if s.task == "associative_retrieval":
    return [str(d) for d in range(_DIGITS)] + ["?"] + [chr(ord("a") + i) for i in range(_LETTERS)]
  return ["<pad>", "<answer>"] + [str(i) for i in range(2, s.num_tokens)]


def load(s: TaskSettings) -> ExampleCorpus:
  """The task's corpus (``data.dataset="synthetic:TASK"``), drawn now.

  Returns:
    An ``ExampleCorpus``, name ``"synthetic:TASK"``, unit "word" (results
    as perplexity), no tokenizer (``encode`` refuses).

  Raises:
    errors.ConfigError: bad settings (``settings_problems``).
    errors.DataError: too few distinct inputs drawn (``generate``).
  """
  problems = settings_problems(s)
  if problems:
    raise errors.ConfigError(" ".join(problems))
  examples = generate(s)
  return ExampleCorpus(
      name=PREFIX + s.task,
      unit="word",
      vocab=vocabulary(s),
      boundary_id=_BOUNDARY.get(s.task, ANSWER_MARKER),
      splits={k: ArraySource(v.reshape(-1)) for k, v in examples.items()},
      settings=s,
      examples=examples,
      answer_counts=(
          {k: np.full(v.shape[0], s.weighed_len, np.int32) for k, v in examples.items()}
          if s.weighed_len != s.answer_len
          else None
      ),
  )
