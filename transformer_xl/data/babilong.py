"""BABILong: bAbI questions hidden in long text (Kuratov et al. 2024).

``data.dataset="babilong:qa1"`` ... ``"babilong:qa20"``: the tasks of
BABILong (Kuratov, Bulatov, Anokhin, Rodkin, Sorokin, Sorokin, Burtsev,
NeurIPS 2024 Datasets and Benchmarks, arXiv 2406.10149; ``booydar/babilong``):
the facts of a bAbI task (Weston et al. 2015, ``tasks_1-20_v1-2/en-10k``)
scattered between the sentences of unrelated text (PG-19 books in the
paper), the question after them, and the answer to write.

**Construction** (exact to the authors' ``babilong/babilong_utils.py`` for
a given seed and tokenizer; ``tests/test_babilong.py`` compares with
samples their code made, ``scripts/make_babilong_fixtures.py``):

* ``read_task_file`` is their ``get_dataset_df`` and ``TaskDataset``: a
  story with several questions becomes one sample per question, its facts
  every statement of the story before the question (earlier questions
  dropped); ``max_n_facts`` drops samples with more lines; as their
  ``TaskDataset.__len__`` the last sample of a file is never used.
* ``SentenceSampler`` is theirs: background text split into sentences by
  NLTK's Punkt (untrained, as theirs), each sentence tokenised with a space
  in front, sentences shorter than ``min_sentence_len`` tokens (or longer
  than ``max_sentence_len``) skipped, sentences taken in order until the
  sample is long enough, the last one cut; ``shuffle``: each new text is a
  random document from a random character on, cut to ``10 x`` the length,
  its first and last (partial) sentences dropped.
* ``NoiseInjectionDataset`` is theirs: the facts (each tokenised with a
  space in front) go between background sentences at positions drawn with
  replacement (anywhere, or where the text so far is between
  ``task_start_pct`` and ``task_end_pct`` of the sample) and sorted; the
  sample's length is the context's ``sample_size - qa_margin`` tokens
  (their run script's ``qa_margin = 20`` left for the question and
  answer); the curriculum's mixed lengths (``train_sample_sizes`` and
  ``mixed_length_ratio``) as their ``get_sample_size``.

**An example** (their ``run_finetuning_babilong_rmt.py``'s ``collate_fn``)
is the context, the question, a ``GEN`` token (the first token of
``"GEN"``), the answer and the end token (eos).  Here every example of a
corpus has the same length ``S = sample_size + 1`` tokens, so that it is
``E = S - 1 = sample_size`` positions, whole segments (the authors'
``sample_size`` is segments x segment size): the answer and eos fill the
last ``A`` tokens (``A`` = the longest answer of the corpus + 1; shorter
answers are followed by more eos tokens), the context, question and GEN
end just before them, and eos tokens pad the front.  The loss weighs the
answer's tokens and the first eos after it (their ``labels_mask`` shifted
as their loss shifts it); ``answer_accuracy`` counts an example right when
all of those are the argmax.  *Differences from the authors' code:* the
front padding (theirs pads at the end of a batch's shorter rows);
training samples are drawn once per corpus load, in a seeded order, with
seeded samplers (theirs draw new background text every epoch from an
unseeded sampler); valid is the train file's last ``valid_size`` samples
with the noise corpus's validation split (theirs validate on test).

**Scoring** (``compare_answers``, theirs): greedy decoding of ``A`` tokens
after GEN, cut at the first eos, decoded to text; right when the answer
(lower-cased) is in the output's first sentence (lower-cased, up to the
first ".").  ``--mode=eval`` reports it as ``babilong_accuracy``.

**Sources.**  The bAbI files are read from ``data.manual_dir``
(``qa1_single-supporting-fact_train.txt`` etc., or the archive
``tasks_1-20_v1-2.tar.gz``), downloaded from the bAbI page when absent
and ``data.download`` is on.  The background text is ``data.babilong_noise``:
``"tfds:pg19"`` (the authors'; ``data.text_key=book_text``, the splits of
``data.tfds_splits``) or ``"text"`` (one's own files: ``data.train_files``,
``valid_files``, ``test_files``, each file one document).  The tokenizer is
``data.tokenizer="pretrained:PATH"``: a Hugging Face ``tokenizer.json``
(GPT-2's, as the authors) or a SentencePiece model.
"""

from __future__ import annotations

import dataclasses
import glob
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from transformer_xl import errors
from transformer_xl.data import sources
from transformer_xl.data.synthetic import SyntheticCorpus

PREFIX = "babilong:"  # data.dataset="babilong:qaN"
TASK_NAMES = {  # the bAbI file names (tasks_1-20_v1-2/en-10k/qaN_NAME_{train,test}.txt)
    "qa1": "single-supporting-fact",
    "qa2": "two-supporting-facts",
    "qa3": "three-supporting-facts",
    "qa4": "two-arg-relations",
    "qa5": "three-arg-relations",
    "qa6": "yes-no-questions",
    "qa7": "counting",
    "qa8": "lists-sets",
    "qa9": "simple-negation",
    "qa10": "indefinite-knowledge",
    "qa11": "basic-coreference",
    "qa12": "conjunction",
    "qa13": "compound-coreference",
    "qa14": "time-reasoning",
    "qa15": "basic-deduction",
    "qa16": "basic-induction",
    "qa17": "positional-reasoning",
    "qa18": "size-reasoning",
    "qa19": "path-finding",
    "qa20": "agents-motivations",
}
ARCHIVE = "tasks_1-20_v1-2.tar.gz"
URL = "http://www.thespermwhale.com/jaseweston/babi/tasks_1-20_v1-2.tar.gz"
MEMBER_DIR = "tasks_1-20_v1-2/en-10k"
NOISE_SOURCES = ("tfds:pg19", "text")  # data.babilong_noise; any "tfds:NAME" is read alike
GEN = "GEN"  # their gen_token: tokenizer.encode('GEN')[0]
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")  # tokenizer.json eos
# data config key -> BabilongSettings field.
FIELDS = {
    "babilong_sample_size": "sample_size",
    "babilong_qa_margin": "qa_margin",
    "babilong_task_start_pct": "task_start_pct",
    "babilong_task_end_pct": "task_end_pct",
    "babilong_max_n_facts": "max_n_facts",
    "babilong_min_sentence_len": "min_sentence_len",
    "babilong_train_sample_sizes": "train_sample_sizes",
    "babilong_mixed_length_ratio": "mixed_length_ratio",
    "babilong_train_size": "train_size",
    "babilong_valid_size": "valid_size",
    "babilong_test_size": "test_size",
    "babilong_seed": "seed",
    "babilong_noise": "noise",
}
# The data fields of one's own text that BABILong reads too (the noise and the tokenizer).
TEXT_FIELDS_READ = (
    "train_files",
    "valid_files",
    "test_files",
    "tokenizer",
    "text_key",
    "tfds_splits",
)


def is_babilong(dataset: str) -> bool:
  """Whether ``data.dataset`` names a BABILong task (``"babilong:qaN"``)."""
  return dataset.startswith(PREFIX)


@dataclasses.dataclass(frozen=True)
class BabilongSettings:
  """A BABILong corpus's settings (``data.babilong_*``; the authors' names).

  Attributes:
    task: "qa1" .. "qa20".
    sample_size: E, positions of an example (the authors' ``--sample_size``:
      context, question and answer; segments x segment size).
    qa_margin: tokens of ``sample_size`` left for the question and the
      answer (their script's 20): the context is ``sample_size - qa_margin``.
    task_start_pct, task_end_pct: where the facts go, as fractions of the
      sample (their ``--task_start_pct``/``--task_end_pct``); both -1:
      anywhere (their None).
    max_n_facts: drop samples of more lines (facts + question); 0: keep all.
    min_sentence_len: background sentences of fewer tokens are skipped.
    train_sample_sizes: the curriculum's lengths (their ``vary_n_segments``
      list, each before ``qa_margin`` is taken off), comma-separated; "":
      ``sample_size`` only.  Shorter samples are padded at the front.
    mixed_length_ratio: with ``train_sample_sizes``, the probability of a
      sample of the longest length (their ``--mixed_length_ratio``).
    train_size, valid_size, test_size: samples per split (0 for train: every
      sample of the train file but valid's; 0 for test: all of the test
      file's).
    seed: seed of the test split's sampler and noise injection (their 42);
      valid uses seed + 1, train seed + 2.
    noise: "tfds:NAME" (PG-19: "tfds:pg19") or "text".
    tokenizer: ``data.tokenizer``: "pretrained:PATH".
    text_key, tfds_splits: the tfds noise's text feature and splits.
    train_files, valid_files, test_files: the text noise's files.
  """

  task: str
  sample_size: int = 1024
  qa_margin: int = 20
  task_start_pct: float = -1.0
  task_end_pct: float = -1.0
  max_n_facts: int = 0
  min_sentence_len: int = 10
  train_sample_sizes: str = ""
  mixed_length_ratio: float = 0.0
  train_size: int = 0
  valid_size: int = 100
  test_size: int = 0
  seed: int = 42
  noise: str = "tfds:pg19"
  tokenizer: str = ""
  text_key: str = "text"
  tfds_splits: str = "train,validation,test"
  train_files: str = ""
  valid_files: str = ""
  test_files: str = ""

  @classmethod
  def from_data_config(cls, data_cfg: Mapping[str, Any]) -> BabilongSettings:
    """The settings of a config's ``data`` section."""
    fields = {f: data_cfg[k] for k, f in FIELDS.items() if k in data_cfg}
    fields.update({k: data_cfg[k] for k in TEXT_FIELDS_READ if k in data_cfg})
    return cls(task=data_cfg["dataset"][len(PREFIX) :], **fields)

  @property
  def placed(self) -> bool:
    """Whether the facts' place is set (``task_start_pct``/``task_end_pct``)."""
    return self.task_start_pct >= 0 or self.task_end_pct >= 0

  @property
  def max_sentence_len(self) -> int | None:
    """Their run script's cap on background sentences: half the facts' range."""
    if not self.placed:
      return None
    return int((self.task_end_pct - self.task_start_pct) * 0.5 * self.sample_size)

  def curriculum(self) -> list[int]:
    """The training lengths (``train_sample_sizes``), [] when unset."""
    return [int(x) for x in self.train_sample_sizes.split(",") if x.strip()]


def settings_problems(s: BabilongSettings) -> list[str]:
  """What is wrong with the settings, without reading a file: one message
  per problem naming the ``data.*`` key and the fix."""
  if s.task not in TASK_NAMES:
    return [f"data.dataset={PREFIX + s.task!r}: use babilong:qa1 ... babilong:qa20."]
  problems = []
  for key in ("babilong_sample_size", "babilong_qa_margin", "babilong_min_sentence_len"):
    value = getattr(s, FIELDS[key])
    if not isinstance(value, int) or value < 1:
      problems.append(f"data.{key}={value!r} must be an integer >= 1.")
  if problems:
    return problems
  if s.qa_margin >= s.sample_size:
    problems.append(
        f"data.babilong_qa_margin={s.qa_margin} leaves no context in "
        f"data.babilong_sample_size={s.sample_size}: lower it or raise the sample size."
    )
  for key in ("babilong_train_size", "babilong_valid_size", "babilong_test_size"):
    if getattr(s, FIELDS[key]) < 0:
      problems.append(f"data.{key} must be >= 0.")
  if s.valid_size < 1:
    problems.append("data.babilong_valid_size must be >= 1 (the samples validation scores).")
  if (s.task_start_pct < 0) != (s.task_end_pct < 0):
    problems.append(
        "data.babilong_task_start_pct and data.babilong_task_end_pct are set together (both "
        "-1: the facts go anywhere)."
    )
  elif s.placed and not 0 <= s.task_start_pct < s.task_end_pct <= 1:
    problems.append(
        f"data.babilong_task_start_pct={s.task_start_pct} and task_end_pct={s.task_end_pct} "
        "must satisfy 0 <= start < end <= 1."
    )
  try:
    sizes = s.curriculum()
  except ValueError:
    sizes = []
    problems.append(
        f"data.babilong_train_sample_sizes={s.train_sample_sizes!r}: give comma-separated "
        "integers, e.g. '512,1024'."
    )
  bad = [n for n in sizes if not s.qa_margin < n <= s.sample_size]
  if bad:
    problems.append(
        f"data.babilong_train_sample_sizes: {bad} must be above data.babilong_qa_margin="
        f"{s.qa_margin} and at most data.babilong_sample_size={s.sample_size}."
    )
  if not 0.0 <= s.mixed_length_ratio <= 1.0:
    problems.append(f"data.babilong_mixed_length_ratio={s.mixed_length_ratio} must be in [0, 1].")
  if s.seed < 1:
    problems.append(f"data.babilong_seed={s.seed} must be >= 1 (their code draws with 42).")
  if not (s.noise == "text" or s.noise.startswith("tfds:")):
    problems.append(
        f"data.babilong_noise={s.noise!r}: use 'tfds:pg19' (the authors' PG-19) or 'text' "
        "(your files: data.train_files, valid_files, test_files)."
    )
  elif s.noise == "text":
    missing = [
        f"data.{k}" for k in ("train_files", "valid_files", "test_files") if not getattr(s, k)
    ]
    if missing:
      problems.append(
          f"data.babilong_noise='text' reads the background text from your files: set "
          f"{', '.join(missing)} (comma-separated globs)."
      )
  if not s.tokenizer.startswith("pretrained:"):
    problems.append(
        f"data.tokenizer={s.tokenizer!r}: BABILong needs a pretrained tokenizer, "
        "--config.data.tokenizer=pretrained:PATH (a Hugging Face tokenizer.json, e.g. GPT-2's "
        "as the authors: `huggingface-cli download gpt2 tokenizer.json`, or a SentencePiece "
        ".model)."
    )
  return problems


# ---------------------------------------------------------------------------------------------
# bAbI files: get_dataset_df and TaskDataset


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
    min_sentence_len, max_sentence_len: token bounds of a sentence (None: no
      bound).
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
    task_start_pct, task_end_pct: the facts' range, or None (anywhere).
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
  """Their scoring: ``target`` (lower-cased) in the first sentence of
  ``output`` (lower-cased, up to the first "."), examples it imitates
  (after ``<context>`` or ``<example>``) cut off."""
  target, output = target.lower(), output.lower()
  output = output.split(".")[0].split("<context>")[0].split("<example>")[0]
  return target in output


# ---------------------------------------------------------------------------------------------
# The corpus


@dataclasses.dataclass(frozen=True)
class Layout:
  """A BABILong corpus's example layout (what the synthetic tasks' iterators,
  evaluation and greedy decoding read from ``SyntheticCorpus.settings``).

  Attributes:
    task: "qa1" .. "qa20".
    sequence_len: S, tokens of an example.
    answer_len: A, the answer region at its end (answer, eos, eos padding).
  """

  task: str
  sequence_len: int
  answer_len: int

  @property
  def name(self) -> str:
    return PREFIX + self.task

  @property
  def example_len(self) -> int:
    """E = S - 1."""
    return self.sequence_len - 1


@dataclasses.dataclass(frozen=True)
class BabilongCorpus(SyntheticCorpus):
  """A BABILong task's corpus: a ``SyntheticCorpus`` of whole examples whose
  answers differ in length (``answer_counts``) and are scored as text.

  Attributes (beyond ``SyntheticCorpus``'s):
    answers: split -> the answers' texts, one per example.
    babilong: the ``BabilongSettings``.
  """

  answers: Mapping[str, tuple[str, ...]] | None = None
  babilong: BabilongSettings | None = None

  def greedy_scores(self, split: str, examples_NxS: np.ndarray, preds_NxA: np.ndarray) -> dict:
    """{"babilong_accuracy": the share of examples ``compare_answers`` finds
    right (the benchmark's), "greedy_accuracy": the share whose answer and
    eos are decoded exactly, "greedy_examples", "babilong_sample_size": the
    examples' length E}."""
    n, a_len = preds_NxA.shape
    eos = self.boundary_id
    counts = self.counts(split)[:n]
    truth_NxA = examples_NxS[:, -a_len:]
    exact = [
        bool(np.array_equal(preds_NxA[i, : counts[i]], truth_NxA[i, : counts[i]])) for i in range(n)
    ]
    right = []
    for i in range(n):
      ids = preds_NxA[i].tolist()
      ids = ids[: ids.index(eos)] if eos in ids else ids
      right.append(compare_answers(self.answers[split][i], self.decode(ids)))
    return {
        "babilong_accuracy": float(np.mean(right)) if n else float("nan"),
        "greedy_accuracy": float(np.mean(exact)) if n else float("nan"),
        "greedy_examples": n,
        "babilong_sample_size": self.settings.example_len,
    }


def _babi_spec(task: str) -> sources.SourceSpec:
  name = f"{task}_{TASK_NAMES[task]}"
  return sources.SourceSpec(
      corpus=PREFIX + task,
      archive=ARCHIVE,
      url=URL,
      files=tuple(
          sources.SourceFile(name=f"{name}_{split}.txt", member=f"{MEMBER_DIR}/{name}_{split}.txt")
          for split in ("train", "test")
      ),
      note="BABILong reads the en-10k files of bAbI (Weston et al. 2015).",
  )


def read_babi(
    task: str,
    manual_dir: str | None,
    data_dir: str | None = None,
    download: bool = True,
    timeout_s: float | None = None,
) -> dict[str, str]:
  """The task's bAbI files' texts: {"train": ..., "test": ...}.

  Looked for in ``manual_dir`` (the files, or the archive; default
  ``<data_dir>/downloads/manual``), then downloaded (``sources.locate``).

  Raises:
    errors.DataError: missing (the message names the files, where they go
      and the archive's URL), or unreadable.
  """
  base = Path(data_dir or Path.home() / "tensorflow_datasets").expanduser()
  manual = Path(manual_dir).expanduser() if manual_dir else base / "downloads" / "manual"
  found = sources.locate(
      _babi_spec(task),
      manual_dir=manual,
      download_dir=base / "downloads",
      download=download,
      timeout_s=timeout_s,
  )
  return {
      split: found[f.name].read_bytes().decode("utf-8")
      for split, f in zip(("train", "test"), _babi_spec(task).files)
  }


class _TextDocuments:
  """One's own files as documents (each file one text), read when indexed."""

  def __init__(self, patterns: str, key: str):
    files: list[str] = []
    for pattern in (p.strip() for p in patterns.split(",") if p.strip()):
      files += sorted(f for f in glob.glob(str(Path(pattern).expanduser()), recursive=True))
    files = [f for f in files if Path(f).is_file()]
    if not files:
      raise errors.DataError(
          f"data.{key}={patterns!r} (BABILong's background text) matches no file: give "
          "comma-separated globs of text files."
      )
    self.files = files

  def __len__(self) -> int:
    return len(self.files)

  def __getitem__(self, i: int) -> str:
    return Path(self.files[i]).read_text(encoding="utf-8", errors="replace")


class _TfdsDocuments:
  """A tfds split's texts (``data_source``), decoded when indexed."""

  def __init__(self, name: str, split: str, key: str, data_dir: str | None):
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    try:
      builder = tfds.builder(name, data_dir=data_dir)
      if key not in builder.info.features:
        raise errors.DataError(
            f"data.text_key={key!r}: tfds:{name} has no such feature (its features: "
            f"{sorted(builder.info.features)}; PG-19's text is --config.data.text_key=book_text)."
        )
      try:
        self.source = builder.as_data_source(split=split)
      except Exception:  # pylint: disable=broad-except  (not prepared yet)
        builder.download_and_prepare(file_format="array_record")
        self.source = builder.as_data_source(split=split)
    except errors.DataError:
      raise
    except Exception as err:  # pylint: disable=broad-except
      raise errors.DataError(
          f"data.babilong_noise='tfds:{name}' (split {split!r}) does not load: "
          f"{str(err).splitlines()[0][:200]}"
      ) from None
    self.key = key

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i: int) -> str:
    text = self.source[i][self.key]
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def noise_documents(s: BabilongSettings, data_dir: str | None = None) -> dict[str, Any]:
  """split -> the background documents (``len``, ``[i]`` -> str)."""
  if s.noise == "text":
    return {
        split: _TextDocuments(getattr(s, f"{split}_files"), f"{split}_files")
        for split in ("train", "valid", "test")
    }
  splits = [x.strip() for x in s.tfds_splits.split(",")]
  return {
      split: _TfdsDocuments(s.noise[len("tfds:") :], tfds_split, s.text_key, data_dir)
      for split, tfds_split in zip(("train", "valid", "test"), splits)
  }


def special_ids(tok: Any) -> tuple[int, int]:
  """(GEN, eos) of a pretrained tokenizer: GEN the first token of "GEN"
  (their ``tokenizer.encode('GEN')[0]``), eos the SentencePiece model's
  ``</s>`` or the first of ``EOS_CANDIDATES`` a tokenizer.json has.

  Raises:
    errors.DataError: no end token.
  """
  gen = tok.line_ids(GEN)[0]
  if hasattr(tok, "processor"):
    return int(gen), int(tok.end_id)
  for token in EOS_CANDIDATES:
    eos = tok.tokenizer.token_to_id(token)
    if eos is not None:
      return int(gen), int(eos)
  raise errors.DataError(
      f"the tokenizer has none of the end tokens {list(EOS_CANDIDATES)} that BABILong's "
      "examples end with: use a tokenizer with one (GPT-2's <|endoftext|>)."
  )


def generate_split(
    samples: Sequence[Sample],
    documents: Any,
    encode: Callable[[str], list[int]],
    s: BabilongSettings,
    seed: int,
    order: Sequence[int],
    sample_sizes: int | list[int],
) -> list[Tokens]:
  """The samples ``order`` of a split, generated in that order (the
  authors' loader indexes their dataset alike)."""
  sampler = SentenceSampler(
      documents,
      encode,
      min_sentence_len=s.min_sentence_len,
      max_sentence_len=s.max_sentence_len,
      shuffle=True,
      seed=seed,
  )
  injection = NoiseInjection(
      samples,
      sampler,
      encode,
      sample_sizes,
      s.task_start_pct if s.placed else None,
      s.task_end_pct if s.placed else None,
      s.mixed_length_ratio,
      seed,
  )
  return [injection.sample(int(i)) for i in order]


def layout_examples(
    generated: Sequence[Tokens], gen_id: int, eos_id: int, sequence_len: int, answer_len: int
) -> tuple[np.ndarray, np.ndarray]:
  """Examples of one length: (int32 [N, S], int32 [N] weighted positions).

  Row: eos padding, context, question, GEN, then the answer region of
  ``answer_len`` tokens (answer, eos, more eos); weighted: the answer and
  its eos.

  Raises:
    errors.DataError: a sample longer than ``sequence_len`` allows.
  """
  out = np.full((len(generated), sequence_len), eos_id, np.int32)
  counts = np.zeros(len(generated), np.int32)
  for i, g in enumerate(generated):
    prompt = g.input_tokens + g.question_tokens + [gen_id]
    answer = g.target_tokens + [eos_id]
    start = sequence_len - answer_len - len(prompt)
    if start < 0:
      raise errors.DataError(
          f"a BABILong sample is {len(g.input_tokens)} context + {len(g.question_tokens)} "
          f"question + 1 + {len(answer)} answer tokens, more than data.babilong_sample_size + 1 "
          f"= {sequence_len}: raise data.babilong_qa_margin (question and answer) or set "
          "data.babilong_max_n_facts (fewer facts)."
      )
    out[i, start : start + len(prompt)] = prompt
    out[i, sequence_len - answer_len : sequence_len - answer_len + len(answer)] = answer
    counts[i] = len(answer)
  return out, counts


class _LazySplits(Mapping):
  """split -> a value made on first access (``make(split)``), then kept: a
  split is generated only when something reads it (``--mode=eval`` never
  generates the training split)."""

  def __init__(self, splits: Sequence[str], make: Callable[[str], Any]):
    self._splits, self._make, self._made = tuple(splits), make, {}

  def __getitem__(self, split: str) -> Any:
    if split not in self._splits:
      raise KeyError(split)
    if split not in self._made:
      self._made[split] = self._make(split)
    return self._made[split]

  def __iter__(self):
    return iter(self._splits)

  def __len__(self) -> int:
    return len(self._splits)

  def made(self, split: str) -> bool:
    """Whether ``split`` has been generated."""
    return split in self._made


@dataclasses.dataclass(frozen=True)
class _LazySource:
  """A split's token stream (``TokenSource``): its length known from the
  plan, its tokens generated when first read."""

  examples: Mapping[str, np.ndarray]
  split: str
  num_tokens: int

  def read(self, start: int, stop: int) -> np.ndarray:
    """int32 tokens [start, stop); IndexError outside [0, num_tokens]."""
    if not 0 <= start <= stop <= self.num_tokens:
      raise IndexError(f"range [{start}, {stop}) outside [0, {self.num_tokens}]")
    return self.examples[self.split].reshape(-1)[start:stop]


def load(
    s: BabilongSettings, manual_dir=None, data_dir=None, download: bool = True
) -> BabilongCorpus:
  """The task's corpus (``data.dataset="babilong:qaN"``), each split
  generated when first read.

  Returns:
    A ``BabilongCorpus``: name "babilong:qaN", unit "word", the tokenizer's
    vocabulary, ``boundary_id`` eos.

  Raises:
    errors.ConfigError: bad settings (``settings_problems``).
    errors.DataError: bAbI files or background text missing or unusable
      (the files: now; the text: when a split is generated), a sample that
      does not fit.
  """
  problems = settings_problems(s)
  if problems:
    raise errors.ConfigError(" ".join(problems))
  from transformer_xl.data import text_vocab  # pylint: disable=import-outside-toplevel

  tok = text_vocab.load_pretrained(s.tokenizer[len("pretrained:") :], PREFIX + s.task)
  gen_id, eos_id = special_ids(tok)
  encode = tok.line_ids
  texts = read_babi(s.task, manual_dir, data_dir, download)
  train_all = parse_task(texts["train"], s.max_n_facts)
  test_all = parse_task(texts["test"], s.max_n_facts)
  if len(train_all) <= s.valid_size:
    raise errors.DataError(
        f"{PREFIX}{s.task}: the train file has {len(train_all)} samples, not more than "
        f"data.babilong_valid_size={s.valid_size}: lower it."
    )
  n_train = len(train_all) - s.valid_size
  n_train = min(n_train, s.train_size) if s.train_size else n_train
  n_test = min(len(test_all), s.test_size) if s.test_size else len(test_all)
  docs = noise_documents(s, data_dir)
  context = s.sample_size - s.qa_margin
  curriculum = [n - s.qa_margin for n in s.curriculum()]
  rng = np.random.default_rng(s.seed + 2)
  plan = {  # split -> (samples, seed, order, lengths)
      "train": (train_all, s.seed + 2, rng.permutation(n_train), curriculum or context),
      "valid": (
          train_all,
          s.seed + 1,
          np.arange(len(train_all) - s.valid_size, len(train_all)),
          context,
      ),
      "test": (test_all, s.seed, np.arange(n_test), context),
  }
  # The answer region fits the longest answer of every split (known without the noise).
  answers = {
      split: tuple(samples[int(i)].answer for i in order)
      for split, (samples, _, order, _) in plan.items()
  }
  answer_len = 1 + max(len(encode(a)) for a in set(sum(answers.values(), ())))
  layout = Layout(task=s.task, sequence_len=s.sample_size + 1, answer_len=answer_len)

  def make(split: str) -> tuple[np.ndarray, np.ndarray]:
    samples, seed, order, sizes = plan[split]
    generated = generate_split(samples, docs[split], encode, s, seed, order, sizes)
    return layout_examples(generated, gen_id, eos_id, layout.sequence_len, answer_len)

  made = _LazySplits(tuple(plan), make)
  examples = _LazySplits(tuple(plan), lambda split: made[split][0])
  return BabilongCorpus(
      name=PREFIX + s.task,
      unit="word",
      vocab=list(tok.vocab),
      boundary_id=eos_id,
      splits={k: _LazySource(examples, k, len(plan[k][2]) * layout.sequence_len) for k in plan},
      tokenizer=tok,
      settings=layout,  # type: ignore[arg-type]
      examples=examples,
      answer_counts=_LazySplits(tuple(plan), lambda split: made[split][1]),
      answers=answers,
      babilong=s,
  )
