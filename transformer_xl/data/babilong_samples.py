"""BABILong's samples, exact to the authors' ``babilong/babilong_utils.py``.

(Kuratov et al. 2024, ``booydar/babilong``; the corpus that lays them out
as examples: ``babilong.py``.)  For a given seed and tokenizer every
function here gives what theirs gives (``tests/test_babilong.py``, against
samples their code made: ``scripts/make_babilong_fixtures.py``):

* ``parse_task``: their ``get_dataset_df`` and ``TaskDataset``;
* ``SentenceSampler``: theirs (NLTK's Punkt, untrained, splits the text);
* ``NoiseInjection``: their ``NoiseInjectionDataset``;
* ``compare_answers``: their answer check.

The one departure: where theirs would loop forever (text without a usable
sentence) or make a sample longer than asked (facts longer than the
context), these raise ``errors.DataError`` naming the setting to change.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from transformer_xl import errors


@dataclasses.dataclass(frozen=True)
class Sample:
  """One question of a bAbI story (their ``TaskDataset.__getitem__``).

  Attributes:
    facts: the story's statements before the question, in order.
    question: the question line's text (as in the file, trailing space kept).
    answer: the answer text.
    references: the supporting facts' texts.
  """

  facts: tuple[str, ...]
  question: str
  answer: str
  references: tuple[str, ...]


def parse_task(text: str, max_n_facts: int = 0) -> list[Sample]:
  """The samples of a bAbI task file's text, as their ``TaskDataset`` indexes
  them (``len`` = their ``__len__``: the last sample is left out).

  Args:
    text: the file's contents.
    max_n_facts: drop samples of more lines (facts and question); 0: none.

  Raises:
    errors.DataError: a line without its number, or a file not starting a
      story at line 1.
  """
  rows = []  # (phrase_num, text, answer or None, reference_num or None)
  for i, line in enumerate(text.strip().split("\n")):
    try:
      num = int(line.split(" ")[0])
      body = line[line.index(" ") + 1 :]
      answer = body[body.index("\t") + 1 :] if "\t" in body else None
      refs = None if answer is None else [int(n) for n in re.split("\t| ", answer)[1:]]
    except ValueError:
      raise errors.DataError(
          f"bAbI line {i + 1} ({line[:60]!r}) is not 'N text' or 'N question\\tanswer\\tfacts'."
      ) from None
    if answer is not None:
      answer = answer.split("\t")[0]
    rows.append((num, body.split("\t")[0] if "\t" in body else body, answer, refs))
  if not rows or rows[0][0] != 1:
    raise errors.DataError("a bAbI file starts with a story's line 1.")
  stories = _split_at_ones(rows)
  flat = []
  for story in stories:  # one sample per question: the story's statements up to it
    for q, row in enumerate(story):
      if row[2] is None:
        continue
      kept = [r for r in story[: q + 1] if r[2] is None] + [row]
      if max_n_facts and len(kept) > max_n_facts:
        continue
      flat.extend(kept)
  samples = []
  for sample in _split_at_ones(flat)[:-1]:  # their __len__ = sample_num.max()
    last = sample[-1]
    samples.append(
        Sample(
            facts=tuple(r[1] for r in sample[:-1]),
            question=last[1],
            answer=last[2],
            references=tuple(r[1] for r in sample if r[0] in last[3]),
        )
    )
  return samples


def _split_at_ones(rows: list) -> list[list]:
  """Runs of rows, each starting where the line number is 1 (their marking)."""
  starts = [i for i, r in enumerate(rows) if r[0] == 1] + [len(rows)]
  return [rows[a:b] for a, b in zip(starts, starts[1:])]


# ---------------------------------------------------------------------------------------------
# SentenceSampler and NoiseInjectionDataset


class SentenceSampler:
  """Background sentences (their ``SentenceSampler``).

  Args:
    documents: random-access texts (``len`` and ``[i]`` -> str).
    encode: text -> token ids (no special tokens).
    min_sentence_len: the fewest tokens of a sentence taken (None: no bound).
    max_sentence_len: the most tokens of a sentence taken (None: no bound).
    shuffle: a random document from a random place each time (theirs).
    seed: the numpy ``Generator``'s seed.

  Raises (``get_sample``):
    errors.DataError: the documents give no usable sentence.
  """

  _MAX_EMPTY_REFILLS = 1000  # theirs would loop forever on text without usable sentences

  def __init__(
      self,
      documents: Any,
      encode: Callable[[str], list[int]],
      min_sentence_len: int | None = 10,
      max_sentence_len: int | None = None,
      shuffle: bool = False,
      seed: int | None = 42,
  ):
    from nltk.tokenize.punkt import PunktSentenceTokenizer  # pylint: disable=import-outside-toplevel

    self.documents, self.encode = documents, encode
    self.min_sentence_len, self.max_sentence_len = min_sentence_len, max_sentence_len
    self.shuffle = shuffle
    self.gen = np.random.default_rng(seed=seed)
    self.sentences: list[str] = []
    self.sample_ind = 0
    self.splitter = PunktSentenceTokenizer()

  def get_sample(self, sample_size: int) -> list[list[int]]:
    """Tokenised sentences of ``sample_size`` tokens in all, the last one cut."""
    sample: list[list[int]] = []
    total_len = 0
    for _ in range(self._MAX_EMPTY_REFILLS):
      for i, sent in enumerate(list(self.sentences)):
        tokenized = self.encode(" " + sent)
        if not self._length_is_ok(tokenized):
          continue
        total_len += len(tokenized)
        sample.append(tokenized)
        if total_len >= sample_size:
          self.sentences = self.sentences[i + 1 :]
          cutoff = total_len - sample_size
          if cutoff > 0:
            sample[-1] = sample[-1][:-cutoff]
          return sample
      self.sentences = []
      self._sample_sentences(sample_size)
    raise errors.DataError(
        f"BABILong's background text gave no sentence of at least {self.min_sentence_len} "
        f"tokens in {self._MAX_EMPTY_REFILLS} tries: use longer texts or lower "
        "data.babilong_min_sentence_len."
    )

  def _sample_sentences(self, sample_size: int) -> None:
    sentences: list[str] = []
    for _ in range(self._MAX_EMPTY_REFILLS):
      if sentences:
        break
      text = self._next_document()
      if self.shuffle:
        if len(text) == 0:
          continue
        text = text[self.gen.choice(len(text)) :]
        text = text[: sample_size * 10]
      sentences += self.splitter.tokenize(text)
      if self.shuffle:
        sentences = sentences[1:-1]
    self.sentences += sentences

  def _next_document(self) -> str:
    if self.shuffle:
      return self.documents[int(self.gen.choice(len(self.documents)))]
    text = self.documents[int(self.sample_ind)]
    self.sample_ind = (self.sample_ind + 1) % len(self.documents)
    return text

  def _length_is_ok(self, tokenized: list[int]) -> bool:
    if self.max_sentence_len is not None and len(tokenized) > self.max_sentence_len:
      return False
    if self.min_sentence_len is not None and len(tokenized) < self.min_sentence_len:
      return False
    return True


@dataclasses.dataclass(frozen=True)
class Tokens:
  """One generated sample's tokens (their ``input_tokens``, ``question_tokens``,
  ``target_tokens``) and where its facts went (``fact_positions``)."""

  input_tokens: list[int]
  question_tokens: list[int]
  target_tokens: list[int]
  fact_positions: list[int]


class NoiseInjection:
  """Samples with their facts among background sentences (their
  ``NoiseInjectionDataset``; call ``sample(i)`` in the order their loader
  would index the dataset: the sampler and generator carry state).

  Args:
    samples: the task's ``Sample`` list.
    sampler: the background's ``SentenceSampler``.
    encode: text -> token ids.
    sample_size: tokens of the context (an int, or the curriculum's list).
    task_start_pct: where the facts' range starts (a fraction of the
      sample), or None (anywhere).
    task_end_pct: where it ends, or None.
    mixed_length_ratio: see ``BabilongSettings``.
    seed: the numpy ``Generator``'s seed.

  Raises (``sample``):
    errors.DataError: no place for the facts in the range (their IndexError).
  """

  def __init__(
      self,
      samples: Sequence[Sample],
      sampler: SentenceSampler,
      encode: Callable[[str], list[int]],
      sample_size: int | list[int],
      task_start_pct: float | None = None,
      task_end_pct: float | None = None,
      mixed_length_ratio: float = 0.0,
      seed: int = 42,
  ):
    self.samples, self.sampler, self.encode = samples, sampler, encode
    self.sample_size = sample_size
    self.task_start_pct, self.task_end_pct = task_start_pct, task_end_pct
    self.mixed_length_ratio = mixed_length_ratio
    self.gen = np.random.default_rng(seed=seed)

  def sample(self, ind: int) -> Tokens:
    """The tokens of sample ``ind`` (their ``__getitem__``)."""
    s = self.samples[ind]
    facts_tok = [self.encode(" " + f) for f in s.facts]
    question_tok = self.encode(s.question)
    answer_tok = self.encode(s.answer)
    sample_size = self._sample_size()
    task_len = sum(len(f) for f in facts_tok)
    if task_len > sample_size:  # theirs would go on and make a sample longer than asked
      raise errors.DataError(
          f"a BABILong sample's {len(facts_tok)} facts are {task_len} tokens, more than its "
          f"context of {sample_size} (data.babilong_sample_size less qa_margin): raise "
          "data.babilong_sample_size or set data.babilong_max_n_facts (the authors' scripts: "
          "sample_size / 5)."
      )
    background = self.sampler.get_sample(sample_size - task_len)
    if self.task_start_pct is None and self.task_end_pct is None:
      possible_positions: Any = range(len(background) + 1)
    else:
      start = int(sample_size * self.task_start_pct)
      end = int(sample_size * self.task_end_pct)
      possible_positions, current = [], 0
      for i, text in enumerate(background):
        if current >= start and current < end - task_len:
          possible_positions.append(i)
        current += len(text)
      if not possible_positions:
        raise errors.DataError(
            f"BABILong: no place for the facts ({task_len} tokens) between "
            f"data.babilong_task_start_pct={self.task_start_pct} and task_end_pct="
            f"{self.task_end_pct} of a {sample_size}-token sample: widen the range or raise "
            "data.babilong_sample_size."
        )
    positions = self.gen.choice(possible_positions, len(facts_tok))
    positions.sort()
    slots: list[list[list[int]]] = [[] for _ in range(len(background) + 1)]
    for fact, pos in zip(facts_tok, positions):
      slots[pos].append(fact)
    for i, sentence in enumerate(background):
      slots[i].append(sentence)
    tokens = [t for slot in slots for piece in slot for t in piece]
    return Tokens(tokens, question_tok, answer_tok, [int(p) for p in positions])

  def _sample_size(self) -> int:
    if isinstance(self.sample_size, list):
      if self.gen.random() > self.mixed_length_ratio:
        return int(self.gen.choice(self.sample_size))
      return max(self.sample_size)
    return self.sample_size


def compare_answers(target: str, output: str) -> bool:
  """Their training scripts' scoring (``babilong_utils.compare_answers``):
  ``target`` (lower-cased) in the first sentence of ``output`` (lower-cased,
  up to the first "."), examples it imitates (after ``<context>`` or
  ``<example>``) cut off."""
  target, output = target.lower(), output.lower()
  output = output.split(".")[0].split("<context>")[0].split("<example>")[0]
  return target in output


# The answers each task can have (their ``babilong/metrics.py`` ``TASK_LABELS``): what the
# leaderboard's rule looks for in an output.
_ROOMS = "bathroom bedroom garden hallway kitchen office"
TASK_LABELS: dict[str, tuple[str, ...]] = {
    task: tuple(labels.split())
    for task, labels in {
        **{f"qa{i}": _ROOMS for i in (1, 2, 3, 4, 11, 12, 13)},
        "qa5": "Bill Fred Jeff Mary apple football milk",
        **{f"qa{i}": "no yes" for i in (6, 9, 17, 18)},
        "qa7": "none one three two",
        "qa8": "apple football milk nothing",
        "qa10": "maybe no yes",
        "qa14": "bedroom cinema kitchen office park school",
        "qa15": "cat mouse sheep wolf",
        "qa16": "gray green white yellow",
        "qa19": "e,e e,n e,s n,e n,n n,w s,e s,s s,w w,n w,s w,w",
        "qa20": "bedroom bored garden hungry kitchen thirsty tired",
    }.items()
}


def leaderboard_answers(target: str, output: str, question: str, task: str) -> bool:
  """The leaderboard's scoring (their ``babilong/metrics.py``
  ``compare_answers``, which ``collect_results.py`` applies), stricter than
  ``compare_answers``: of the task's ``TASK_LABELS`` found in ``output``'s
  first sentence (lower-cased, cut as ``compare_answers`` cuts it; their cut
  at "Question" comes after lower-casing and so never applies), those not in
  the question must be exactly the target (qa8's "a,b": exactly its parts).

  Raises:
    KeyError: ``task`` is not qa1..qa20.
  """
  labels = {label.lower() for label in TASK_LABELS[task]}
  output = output.lower().split(".")[0].split("<context>")[0].split("<example>")[0]
  target = target.lower()
  found = {l for l in labels if l in output} - {l for l in labels if l in question.lower()}
  if "," in target and len(target) > 3:  # several objects (qa8)
    parts = target.split(",")
    return len(found) == len(parts) and all(p in found for p in parts)
  return found == {target}
