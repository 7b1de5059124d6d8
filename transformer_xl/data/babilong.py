"""BABILong: bAbI questions hidden in long text (Kuratov et al. 2024).

``data.dataset="babilong:qa1"`` ... ``"babilong:qa20"``: the tasks of
BABILong (Kuratov, Bulatov, Anokhin, Rodkin, Sorokin, Sorokin, Burtsev,
NeurIPS 2024 Datasets and Benchmarks, arXiv 2406.10149; ``booydar/babilong``):
the facts of a bAbI task (Weston et al. 2015, ``tasks_1-20_v1-2/en-10k``)
scattered between the sentences of unrelated text (PG-19 books in the
paper), the question after them, and the answer to write.

**Construction**: ``babilong_samples.py``, exact to the authors'
``babilong/babilong_utils.py`` for a given seed and tokenizer (the task
file's samples, the background sentences, the facts placed among them;
the curriculum's mixed lengths); the files and documents:
``babilong_sources.py``.  The test split is their test set (the test
file in order, the test background, seed ``babilong_seed``); valid and
train are drawn alike with seeds ``babilong_seed + 1`` and ``+ 2``.

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
training samples are drawn once per run (when first read), in a seeded order, with
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from transformer_xl import errors
from transformer_xl.data.babilong_samples import (
    NoiseInjection,
    Sample,
    SentenceSampler,
    Tokens,
    compare_answers,
    parse_task,
)
from transformer_xl.data.babilong_sources import (
    TASK_NAMES,
    TextDocuments,
    TfdsDocuments,
    babi_spec,
    read_babi,
)
from transformer_xl.data.example_corpus import ExampleCorpus

PREFIX = "babilong:"  # data.dataset="babilong:qaN"
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
  if not isinstance(s.max_n_facts, int) or s.max_n_facts < 0:
    problems.append(
        f"data.babilong_max_n_facts={s.max_n_facts!r} must be an integer >= 0 (0: keep every "
        "sample)."
    )
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
# The corpus


@dataclasses.dataclass(frozen=True)
class Layout:
  """A BABILong corpus's example layout (what the synthetic tasks' iterators,
  evaluation and greedy decoding read from ``ExampleCorpus.settings``).

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
class BabilongCorpus(ExampleCorpus):
  """A BABILong task's corpus: an ``ExampleCorpus`` of whole examples whose
  answers differ in length (``answer_counts``) and are scored as text.

  Attributes (beyond ``ExampleCorpus``'s):
    answers: split -> the answers' texts, one per example.
    questions: split -> the questions' texts (as in the bAbI file), one per
      example.
    babilong: the ``BabilongSettings``.
  """

  answers: Mapping[str, tuple[str, ...]] | None = None
  questions: Mapping[str, tuple[str, ...]] | None = None
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


def noise_documents(s: BabilongSettings, data_dir: str | None = None) -> dict[str, Any]:
  """split -> the background documents (``len``, ``[i]`` -> str)."""
  if s.noise == "text":
    return {
        split: TextDocuments(getattr(s, f"{split}_files"), f"{split}_files")
        for split in ("train", "valid", "test")
    }
  splits = [x.strip() for x in s.tfds_splits.split(",")]
  return {
      split: TfdsDocuments(s.noise[len("tfds:") :], tfds_split, s.text_key, data_dir)
      for split, tfds_split in zip(("train", "valid", "test"), splits)
  }


def special_ids(tok: Any) -> tuple[int, int]:
  """(GEN, eos) of a pretrained tokenizer: GEN the first token of "GEN"
  (their ``tokenizer.encode('GEN')[0]``; encoded without special tokens, so
  a tokenizer that adds a BOS token gives GEN's own token, not the BOS
  theirs would take), eos the SentencePiece model's ``</s>`` or the first of
  ``EOS_CANDIDATES`` a tokenizer.json has.

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


def _samples_of(s: BabilongSettings, split: str, text: str) -> list[Sample]:
  """The samples of the task's ``split`` file (``parse_task``).

  Raises:
    errors.DataError: naming the file and split: an empty file, one that does
      not parse, or one without a sample (no question, or every sample longer
      than ``data.babilong_max_n_facts``).
  """
  name = dict(zip(("train", "test"), (f.name for f in babi_spec(s.task).files)))[split]
  where = f"{PREFIX}{s.task}: the {split} file {name}"
  if not text.strip():
    raise errors.DataError(f"{where} is empty; put the en-10k archive's {name} there.")
  if not text.endswith("\n"):  # bAbI's lines each end with a line break
    raise errors.DataError(
        f"{where} ends in the middle of a line (a truncated copy?); put the en-10k archive's "
        f"{name} there again."
    )
  try:
    samples = parse_task(text, s.max_n_facts)
  except errors.DataError as err:
    raise errors.DataError(f"{where}: {err} Is it a bAbI task file?") from None
  if not samples:
    why = (
        f"data.babilong_max_n_facts={s.max_n_facts} drops every one (raise it, or 0: all)"
        if s.max_n_facts and "\t" in text
        else "it has no question line ('N question<TAB>answer<TAB>facts')"
    )
    raise errors.DataError(f"{where} gives no sample: {why}.")
  return samples


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
  train_all, test_all = (_samples_of(s, split, texts[split]) for split in ("train", "test"))
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
  questions = {
      split: tuple(samples[int(i)].question for i in order)
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
      settings=layout,
      examples=examples,
      answer_counts=_LazySplits(tuple(plan), lambda split: made[split][1]),
      answers=answers,
      questions=questions,
      babilong=s,
  )
