"""Passkey retrieval (Mohtashami & Jaggi 2023, Landmark Attention), in word tokens.

The text of an example is the authors' prompt (their ``llama/run_test.py``,
``generate_prompt``; the same prompt as LongLoRA's Fig. 3 and most
long-context papers since), five lines joined by newlines::

    There is an important info hidden inside a lot of irrelevant text. Find it and
    memorize them. I will quiz you about the important information there.
    <filler, the first P tokens of the cycle>
    The pass key is 71432. Remember it. 71432 is the pass key.
    <filler, the first F - P tokens of the cycle>
    What is the pass key? The pass key is 71432

where the filler cycles "The grass is green. The sky is blue. The sun is
yellow. Here we go. There and back again." and the answer (the key after
the question) is what the model must write.  ``data.dataset="synthetic:passkey"``
(``synthetic.py``: splits, iterators, accuracy, as the other tasks).

**Tokens.**  Words and punctuation are tokens (``\\w+`` or one other
character); a line end is ``<eos>`` (as in the word-level corpora); the
key's digits are one token each, ids 0..9, so that a key of any value is in
the vocabulary and nothing but the key has a digit.  The vocabulary is 10
digits, ``<eos>``, then the prompt's words in order of first appearance.

**Lengths.**  An example is ``E + 1`` tokens (E = ``passkey_len``, the
positions the model reads), of which the last ``digits`` are the answer;
the filler takes what the fixed text leaves: F = E + 1 - ``fixed_len`` -
``digits`` tokens, P of them before the pass-key line (``passkey_depth``,
or drawn uniformly from 0..F per example when -1: the authors'
``random.randint(0, n_garbage)``).  Both filler parts start at the
cycle's beginning, as the authors cut ``garbage_inf[:n]`` twice.

**Differences from the authors' prompt**, all from counting in word tokens
rather than characters of a subword tokenizer: the filler is cut at a
token, not at a character (their cut may split a word); the key has
exactly ``digits`` digits (first digit 1..9), theirs is
``random.randint(1, 50000)`` (1 to 5 digits); P is in tokens.
"""

from __future__ import annotations

import re

import numpy as np

DESCRIPTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and "
    "memorize them. I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
INFO = ("The pass key is", ". Remember it.", "is the pass key.")  # around the key, twice
QUESTION = "What is the pass key? The pass key is"
EOS = "<eos>"
DIGITS = 10  # ids 0..9 are the digits


def words(text: str) -> list[str]:
  """The tokens of ``text``: words (``\\w+``) and single other characters."""
  return re.findall(r"\w+|[^\w\s]", text)


def vocabulary() -> list[str]:
  """Symbol of each id: the digits 0..9, ``<eos>``, then the prompt's words
  in order of first appearance (54 symbols in all)."""
  vocab = [str(d) for d in range(DIGITS)] + [EOS]
  for w in words(" ".join([DESCRIPTION, FILLER, *INFO, QUESTION])):
    if w not in vocab:
      vocab.append(w)
  return vocab


_ID = {w: i for i, w in enumerate(vocabulary())}


def _ids(text: str) -> np.ndarray:
  return np.array([_ID[w] for w in words(text)], np.int32)


_DESCRIPTION, _FILLER, _QUESTION = _ids(DESCRIPTION), _ids(FILLER), _ids(QUESTION)
_INFO = [_ids(part) for part in INFO]


def fixed_len(digits: int) -> int:
  """Tokens of an example that are not filler: the description, the
  pass-key line (the key twice), the question, the four line ends and the
  answer's ``digits``."""
  info = sum(len(p) for p in _INFO) + 2 * digits
  return len(_DESCRIPTION) + info + len(_QUESTION) + 4 + digits


def filler_len(passkey_len: int, digits: int) -> int:
  """F: filler tokens of an example of ``passkey_len`` positions (the
  sequence is one token longer); negative if the fixed text does not fit."""
  return passkey_len + 1 - fixed_len(digits)


def key_distance(passkey_len: int, digits: int, depth: int) -> int:
  """Positions from the last digit of the pass key's second mention to the
  position that predicts the answer's first digit (the last token of the
  question): how far back the model must reach, with ``depth`` filler
  tokens before the pass-key line."""
  info_end = len(_DESCRIPTION) + 2 + depth + len(_INFO[0]) + digits + len(_INFO[1]) + digits
  return (passkey_len - digits) - (info_end - 1)


def examples(
    passkey_len: int, digits: int, depth: int, rng: np.random.Generator, n: int
) -> np.ndarray:
  """``n`` examples drawn from ``rng``: int32 [n, passkey_len + 1], each the
  prompt, its answer last.

  Args:
    passkey_len: E, positions the model reads (>= ``fixed_len - 1``).
    digits: digits of the key.
    depth: filler tokens before the pass-key line, 0..F; -1: drawn per
      example uniformly from 0..F.
    rng: the generator (keys first, then depths).
    n: examples.
  """
  f = filler_len(passkey_len, digits)
  key_n = rng.integers(10 ** (digits - 1), 10**digits, size=n)
  depth_n = rng.integers(0, f + 1, size=n) if depth < 0 else np.full(n, depth)
  powers = 10 ** np.arange(digits - 1, -1, -1)
  digits_nxD = ((key_n[:, None] // powers[None, :]) % 10).astype(np.int32)
  filler = np.resize(_FILLER, f)  # the cycle, cut at f tokens
  eos = np.array([_ID[EOS]], np.int32)
  out = np.empty((n, passkey_len + 1), np.int32)
  for i in range(n):
    p, key = int(depth_n[i]), digits_nxD[i]
    out[i] = np.concatenate(
        [
            _DESCRIPTION,
            eos,
            filler[:p],
            eos,
            _INFO[0],
            key,
            _INFO[1],
            key,
            _INFO[2],
            eos,
            filler[: f - p],
            eos,
            _QUESTION,
            key,
        ]
    )
  return out


def answers(x_NxL: np.ndarray, digits: int) -> np.ndarray:
  """The answer of prompts ``x_NxL`` (examples without their last
  ``digits`` tokens): the first ``digits`` digit tokens, the key's first
  mention.  int32 [N, digits]."""
  first = np.argmax(x_NxL < DIGITS, axis=1)
  return np.take_along_axis(x_NxL, first[:, None] + np.arange(digits)[None, :], axis=1).astype(
      np.int32
  )
