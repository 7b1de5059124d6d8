"""Vocabularies and tokenizers of one's own text (``data.dataset="text"``, ``"tfds:NAME"``).

What ``text_builder.py`` builds a corpus's vocabulary with: counted word and
character vocabularies, SentencePiece trained on a random sample of lines,
pretrained tokenizer files, the vectorised line encoders; and the record of
a tokenizer kept with a prepared corpus and in a run's workdir
(``tokenizer.json``: generation and scoring without the files; a changed
tokenisation refused).  No tfds import.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import heapq
import io
import itertools
import json
import os
import random
import reprlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from transformer_xl.data import tokenizers
from transformer_xl.data.corpus import Corpus, DataError
from transformer_xl.data.text_settings import SPM_MAX_SENTENCE_LENGTH, TextSettings
from transformer_xl.util import files, report


def count_vocab(
    symbols: collections.Counter, end: str, unk: str, vocab_size: int, min_count: int, what: str
) -> list[str]:
  """The end symbol, the symbols by descending count (ties: first occurrence),
  then ``unk`` unless already chosen; ``vocab_size`` (0 = no cap) counts all.

  Raises:
    DataError: ``vocab_size`` exceeds what the counted symbols allow.
  """
  symbols.pop(end, None)
  kept = [
      s for s in sorted(symbols, key=symbols.__getitem__, reverse=True) if symbols[s] >= min_count
  ]
  most = 1 + len(kept) + (unk not in kept)
  if vocab_size > most:
    raise DataError(
        f"data.vocab_size={vocab_size} is larger than the vocabulary the training "
        f"files allow: {most:,} (their {len(kept):,} distinct {what} seen at least "
        f"min_count={min_count} times, the end symbol and {unk}); use at most "
        f"{most}, or 0 for all."
    )
  if vocab_size:
    kept = kept[: vocab_size - 1]
    if unk not in kept:
      kept = kept[: vocab_size - 2] + [unk]
  elif unk not in kept:
    kept.append(unk)
  return [end] + kept


def sample_lines(lines: Iterator[str], max_bytes: int, seed: int = 0) -> list[str]:
  """A uniform random sample of ``lines`` of at most ``max_bytes`` UTF-8 bytes, in order.

  Every line gets a random key; the lines with the smallest keys are kept
  while they fit (bottom-k sampling with a byte budget), so memory stays
  under ``max_bytes`` whatever the number of lines, and the result is the
  same for the same lines and ``seed``.  All lines when they fit.
  """
  rng = random.Random(seed)
  heap: list[tuple[float, int, str]] = []  # (-key, position, line): the largest key on top
  total = 0
  for position, line in enumerate(lines):
    key, size = rng.random(), len(line.encode("utf-8")) + 1
    if size > max_bytes or (total + size > max_bytes and heap and -heap[0][0] < key):
      continue
    heapq.heappush(heap, (-key, position, line))
    total += size
    while total > max_bytes:
      total -= len(heapq.heappop(heap)[2].encode("utf-8")) + 1
  return [line for _, _, line in sorted(heap, key=lambda item: item[1])]


def _trainer_reason(err: RuntimeError) -> str:
  """The reason in a SentencePiece trainer error, e.g. ``INTERNAL:
  src/trainer_interface.cc(744) [check] Vocabulary size too high (300). ...``:
  its message, else the check that failed."""
  text = str(err).strip()
  check, _, message = text.partition("] ")
  reason = message.strip().rstrip(".") or check.partition("[")[2].strip() or text
  return reason


def _mb_at_least(num_bytes: int) -> str:
  """The smallest ``data.spm_sample_mb`` (to the byte: 6 decimals) whose
  budget (``int(mb * 1e6)`` bytes, as ``train_sentencepiece`` counts) holds
  ``num_bytes``."""
  while True:
    text = f"{num_bytes / 1e6:.6f}".rstrip("0").rstrip(".")
    if int(float(text) * 1e6) >= num_bytes:
      return text
    num_bytes += 1


def train_sentencepiece(lines: Iterator[str], s: TextSettings, name: str) -> bytes:
  """A SentencePiece model trained on a random sample of the training lines
  (``sample_lines``, ``data.spm_sample_mb``) with the trainer options of ``s``.

  Blank lines, and lines longer than ``data.spm_max_sentence_length`` bytes
  (which SentencePiece would skip) or than the sample, are left out of the
  sample before it is drawn (reported when some are); the corpus keeps them.

  Args:
    lines: the training lines (no line breaks).
    s: the settings: ``vocab_size``, ``spm_model_type``, ``spm_sample_mb``
      (MB, 1e6 bytes), ``spm_max_sentence_length`` (bytes) and the trainer
      options ``spm_allow_whitespace_only_pieces``, ``spm_split_digits``,
      ``spm_byte_fallback``, ``spm_character_coverage``.
    name: the corpus's name, for messages.

  Returns:
    The serialised model (a ``ModelProto``): ``unk_id`` 0, ``</s>`` 1, no
    ``<s>`` or padding; identity normalisation, every space kept.

  Raises:
    DataError: no line can be trained on (each too long: the message names
      the limit and the setting to raise), or the library refuses (e.g. a
      vocabulary larger than the text allows: its message gives the largest
      possible).
  """
  import sentencepiece  # pylint: disable=import-outside-toplevel

  budget = int(s.spm_sample_mb * 1e6)  # bytes, each line with its newline (sample_lines)
  seen = {"lines": 0, "too_long": 0, "too_big": 0}
  shortest = {"too_long": 0, "too_big": 0}  # bytes: the shortest line left out for each reason

  def trainable(line_iter: Iterator[str]) -> Iterator[str]:
    for line in line_iter:
      if not line.strip():
        continue
      seen["lines"] += 1
      size = len(line.encode("utf-8"))
      why = (
          "too_long" if size > s.spm_max_sentence_length else "too_big" if size + 1 > budget else ""
      )
      if why:
        seen[why] += 1
        shortest[why] = min(shortest[why] or size, size)
        continue
      yield line

  sample = sample_lines(trainable(lines), budget)
  phrases = {
      "too_long": (
          f"longer than data.spm_max_sentence_length={s.spm_max_sentence_length:,} bytes, "
          "SentencePiece's limit"
      ),
      "too_big": (
          f"too long for the sample of data.spm_sample_mb={s.spm_sample_mb:g} MB = {budget:,} "
          "bytes, newlines included"
      ),
  }
  left_out = [
      f"{seen[why]:,} {'is' if seen[why] == 1 else 'are'} {phrases[why]} (the shortest: "
      f"{shortest[why]:,} bytes)"
      for why in ("too_long", "too_big")
      if seen[why]
  ]
  if not sample:
    n = seen["lines"]
    if not n:
      raise DataError(
          f"{name}: SentencePiece cannot be trained: every training line is blank; give "
          "training text."
      )
    if len(left_out) == 2:
      why = f"of the {n:,} non-blank lines, {' and '.join(left_out)}"
    else:
      reason = "too_long" if seen["too_long"] else "too_big"
      why = (
          f"the only non-blank line ({shortest[reason]:,} bytes) is {phrases[reason]}"
          if n == 1
          else f"all {n:,} non-blank lines are {phrases[reason]} (the shortest: "
          f"{shortest[reason]:,} bytes)"
      )
    if seen["too_big"]:  # the smallest change: the shortest such line fits the sample
      fix = f"raise data.spm_sample_mb to at least {_mb_at_least(shortest['too_big'] + 1)}, or "
    elif shortest["too_long"] <= SPM_MAX_SENTENCE_LENGTH[1]:
      fix = f"raise data.spm_max_sentence_length to at least {shortest['too_long']:,}"
      if shortest["too_long"] + 1 > budget:
        fix += f" and data.spm_sample_mb to at least {_mb_at_least(shortest['too_long'] + 1)}"
      fix += ", or "
    else:
      fix = ""
    raise DataError(
        f"{name}: SentencePiece cannot be trained: no training line fits in its sample: "
        f"{why}. {(fix + 'break the text into shorter lines').capitalize()}."
    )
  if left_out:
    report.log(
        f"{name}: SentencePiece is trained without {seen['too_long'] + seen['too_big']:,} of the "
        f"{seen['lines']:,} non-blank training lines (the corpus keeps them): "
        f"{'; '.join(left_out)}."
    )
  options = dict(
      byte_fallback=s.spm_byte_fallback,
      split_digits=s.spm_split_digits,
      character_coverage=s.spm_character_coverage,
      max_sentence_length=s.spm_max_sentence_length,
  )
  if s.spm_allow_whitespace_only_pieces:  # at False not given, as before the option existed:
    options["allow_whitespace_only_pieces"] = True  # the same model, byte for byte
  model = io.BytesIO()
  sentencepiece.set_random_generator_seed(0)
  try:
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sample),
        model_writer=model,
        vocab_size=s.vocab_size,
        model_type=s.spm_model_type,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        unk_id=0,
        bos_id=-1,
        eos_id=1,
        pad_id=-1,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
        **options,
    )
  except RuntimeError as err:
    reason = _trainer_reason(err)
    if "vocabulary size" in reason.lower():
      raise DataError(
          f"{name}: SentencePiece cannot be trained with data.vocab_size="
          f"{s.vocab_size} (data.spm_model_type={s.spm_model_type}): {reason}. "
          "Change data.vocab_size."
      ) from None
    raise DataError(
        f"{name}: SentencePiece cannot be trained on the sample of {len(sample):,} training "
        f"lines ({reason}); check the data.spm_* settings."
    ) from None
  return model.getvalue()


def load_pretrained(path: str, name: str):
  """A SentencePiece ``.model`` or Hugging Face ``tokenizer.json`` tokenizer.

  Raises:
    DataError: the file is missing or does not load as either.
  """
  p = Path(path).expanduser()
  if not p.is_file():
    raise DataError(
        f"data.tokenizer=pretrained:{path}: no such file; give a SentencePiece "
        ".model or a Hugging Face tokenizer.json."
    )
  raw = p.read_bytes()
  errors = []
  try:
    tok = tokenizers.HuggingFaceTokenizer(name, raw.decode("utf-8"))
    _ = tok.tokenizer, tok.end_id  # load now: a bad file fails here, not mid-preparation
    return tok
  except DataError:
    raise
  except Exception as err:  # pylint: disable=broad-except  (UnicodeDecodeError, JSON, Rust errors)
    errors.append(f"as tokenizer.json: {str(err).splitlines()[0][:120]}")
  try:
    tok = tokenizers.SentencePieceTokenizer(name, raw)
    _ = tok.processor
    if tok.end_id < 0:
      raise DataError(
          f"data.tokenizer=pretrained:{path}: the SentencePiece model has no </s> "
          "(eos_id is -1) to end lines with; train it with an eos id."
      )
    return tok
  except DataError:
    raise
  except Exception as err:  # pylint: disable=broad-except
    errors.append(f"as SentencePiece: {str(err).splitlines()[0][:120]}")
  raise DataError(
      f"data.tokenizer=pretrained:{path} does not load ({'; '.join(errors)}); "
      "give a SentencePiece .model or a Hugging Face tokenizer.json."
  )


class _Damaged(ValueError):
  """A stored tokenizer record that does not load; the message says why
  (wrapped by ``tokenizer_from_metadata`` and ``load_saved_tokenizer``, which
  name the file and what to do)."""


def _why(err: BaseException) -> str:
  """The first line of an exception's message (at most 120 characters), with its type."""
  text = str(err).splitlines()[0][:120] if str(err) else ""
  return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _short(value) -> str:
  """``repr(value)``, shortened (nesting and length bounded) for a message."""
  return reprlib.repr(value)


def _tokenizer_of_record(t, name: str):
  """The tokenizer of a stored record (``tokenizer_record``), loaded now so that
  a damaged model fails here and not at the first encoding.

  Raises:
    _Damaged: not a record of a known kind, or its model does not load.
    ImportError: the library its kind needs is not installed.
  """
  if not isinstance(t, Mapping):
    raise _Damaged(f"its tokenizer is {type(t).__name__}, not a JSON object")
  kind = t.get("kind")
  if kind == "byte":
    return tokenizers.ByteTokenizer()
  if kind == "char":
    return tokenizers.CharTokenizer(name)
  if kind == "word":
    return tokenizers.LineTokenizer(name, end=tokenizers.EOS, unk=tokenizers.UNK)
  if kind not in ("sentencepiece", "huggingface"):
    raise _Damaged(f"unknown tokenizer kind {_short(kind)}")
  field = "model" if kind == "sentencepiece" else "json"
  if not isinstance(t.get(field), str):
    raise _Damaged(f"its {kind} tokenizer has no {field!r} string")
  try:
    if kind == "sentencepiece":
      tok = tokenizers.SentencePieceTokenizer(name, base64.b64decode(t[field], validate=True))
      _ = tok.processor
    else:
      tok = tokenizers.HuggingFaceTokenizer(name, t[field])
      _ = tok.tokenizer
  except ImportError:
    raise
  except Exception as err:  # pylint: disable=broad-except  (base64, protobuf, Rust errors)
    # SentencePiece's own: "INTERNAL: src/....cc(109) [the failed check] reason"
    detail = str(err).split("] ", 1)[-1].strip() if "] " in str(err) else _why(err)
    raise _Damaged(f"its {kind} model does not load{': ' + detail if detail else ''}") from None
  return tok


def tokenizer_from_metadata(md: Mapping, name: str, folder: str = ""):
  """The tokenizer a prepared dataset stored (metadata ``"tokenizer"``), loaded.

  Args:
    md: the dataset's metadata.json, read.
    name: the dataset's name, for messages.
    folder: the prepared dataset's folder, named in the message ("" when unknown).

  Raises:
    DataError: the stored record is not a tokenizer (the prepared dataset
      is damaged: ``prepared.damaged_message``'s words).
  """
  try:
    return _tokenizer_of_record(md["tokenizer"], name)
  except (_Damaged, KeyError, TypeError) as err:
    where = f" in {folder}" if folder else ""
    remove = f" (rm -r {folder})" if folder else ""
    raise DataError(
        f"The prepared dataset{where} is damaged: the tokenizer stored in its metadata.json does not load "
        f"({err if isinstance(err, _Damaged) else _why(err)}). Delete it to rebuild it{remove}; "
        "the next run prepares it again from the source files."
    ) from None


def tokenizer_record(tok) -> dict:
  """What ``tokenizer_from_metadata`` rebuilds ``tok`` from (JSON-serialisable)."""
  if isinstance(tok, tokenizers.SentencePieceTokenizer):
    return {"kind": "sentencepiece", "model": base64.b64encode(tok.model_proto).decode()}
  if isinstance(tok, tokenizers.HuggingFaceTokenizer):
    return {"kind": "huggingface", "json": tok.json}
  kinds = {
      tokenizers.ByteTokenizer: "byte",
      tokenizers.CharTokenizer: "char",
      tokenizers.LineTokenizer: "word",
  }
  return {"kind": kinds[type(tok)]}


TOKENIZER_FILE = "tokenizer.json"  # in a workdir: the text corpus's vocabulary and tokenizer


def save_tokenizer(corpus: Corpus, workdir) -> None:
  """Writes ``<workdir>/tokenizer.json`` (vocabulary, unit, boundary, tokenizer)
  for a corpus of one's own text, so that generation and scoring work
  without its files (``load_saved_tokenizer``); nothing for other corpora."""
  if corpus.name != "text" or corpus.tokenizer is None:
    return
  from etils import epath  # pylint: disable=import-outside-toplevel

  record = {
      "unit": corpus.unit,
      "vocab": list(corpus.vocab),
      "vocab_sha256": _vocab_sha256(corpus.vocab),
      "boundary_id": int(corpus.boundary_id),
      "tokenizer": tokenizer_record(corpus.tokenizer),
  }
  files.write_text_atomic(epath.Path(workdir) / TOKENIZER_FILE, json.dumps(record))


def check_saved_tokenizer(corpus: Corpus, workdir) -> None:
  """Checks that ``corpus`` tokenises as the run in ``workdir`` was trained
  (its ``tokenizer.json``, if any): same vocabulary, ids and tokenizer.

  Raises:
    DataError: they differ (the files, a setting or this package's
      tokenisation changed since the run was trained), or the workdir's
      ``tokenizer.json`` is damaged (``load_saved_tokenizer``).
  """
  saved = load_saved_tokenizer(workdir)
  if saved is None or corpus.name != "text":
    return
  if (
      list(saved.vocab) != list(corpus.vocab)
      or saved.boundary_id != corpus.boundary_id
      or tokenizer_record(saved.tokenizer) != tokenizer_record(corpus.tokenizer)
  ):
    raise DataError(
        f"the corpus now tokenises differently from the one the run in {workdir} was trained "
        f"on (its {TOKENIZER_FILE}): the text files, a data setting or the tokenisation "
        "changed. Give the run's files and settings (leave out --config to use its "
        "config.json), or train in a new --workdir."
    )


UNITS = ("byte", "char", "word", "subword")  # a corpus's unit, as tokenizer.json records it
_KIND_UNITS = {  # tokenizer kind -> the unit of its corpus (text_builder.py)
    "byte": "byte",
    "char": "char",
    "word": "word",
    "sentencepiece": "subword",
    "huggingface": "subword",
}


def _vocab_sha256(vocab: Sequence[str]) -> str:
  """The SHA-256 of a vocabulary (its JSON list), recorded in tokenizer.json."""
  return hashlib.sha256(json.dumps(list(vocab)).encode("utf-8")).hexdigest()


def _saved_corpus(record) -> Corpus:
  """The vocabulary-only corpus of a ``tokenizer.json`` record (``save_tokenizer``).

  Raises:
    _Damaged: a field missing or of the wrong type, a boundary outside the
      vocabulary, a tokenizer that does not load or does not fit the unit
      and the vocabulary.
  """
  if not isinstance(record, Mapping):
    raise _Damaged(f"a JSON {type(record).__name__}, not an object")
  missing = [k for k in ("unit", "vocab", "boundary_id", "tokenizer") if k not in record]
  if missing:
    raise _Damaged(f"no {', '.join(map(repr, missing))}")
  unit, vocab, boundary = record["unit"], record["vocab"], record["boundary_id"]
  if unit not in UNITS:
    raise _Damaged(f"unit {_short(unit)} is not one of {', '.join(UNITS)}")
  if not isinstance(vocab, list) or not vocab or not all(isinstance(v, str) for v in vocab):
    raise _Damaged("its vocab is not a non-empty list of strings")
  if "vocab_sha256" in record and record["vocab_sha256"] != _vocab_sha256(vocab):
    raise _Damaged(  # written since 2026-11-28: entries swapped, edited, cut or added
        f"its vocab of {len(vocab):,} symbols is not the one it was written with "
        "(vocab_sha256 differs)"
    )
  if type(boundary) is not int or not 0 <= boundary < len(vocab):  # noqa: E721  (not bool)
    raise _Damaged(f"boundary_id {_short(boundary)} is not an id of its {len(vocab):,} symbols")
  tok = _tokenizer_of_record(record["tokenizer"], "text")
  kind = record["tokenizer"]["kind"]
  if _KIND_UNITS[kind] != unit:
    raise _Damaged(f"a {kind} tokenizer with unit {unit!r}")
  try:
    if unit in ("byte", "subword"):  # the vocabulary is the tokenizer's own
      end = 10 if unit == "byte" else tok.end_id
      fits = list(tok.vocab) == vocab and boundary == end
    else:  # counted: the end symbol at the boundary, the unknown symbol present
      fits = vocab[boundary] == tok.end and tok.unk in vocab
  except DataError as err:  # a Hugging Face tokenizer without a newline token
    raise _Damaged(str(err)) from None
  if not fits:
    raise _Damaged(f"its vocab and boundary_id do not fit its {kind} tokenizer")
  return Corpus(
      name="text", unit=unit, vocab=tuple(vocab), boundary_id=boundary, splits={}, tokenizer=tok
  )


def load_saved_tokenizer(workdir) -> Corpus | None:
  """A vocabulary-only ``Corpus`` (no splits) from ``<workdir>/tokenizer.json``,
  or None if the workdir has none: encodes and decodes as the training corpus did.

  The record is checked whole (fields, types, the tokenizer's model loaded,
  its vocabulary and boundary those recorded), so that damage shows here,
  as one message, and not as a traceback at the first encoding.

  Raises:
    DataError: the file is damaged (cut short, not JSON, nested too deep,
      a field missing or wrong, a tokenizer model that does not load); the
      message names it and says what to do.
  """
  from etils import epath  # pylint: disable=import-outside-toplevel

  path = epath.Path(workdir) / TOKENIZER_FILE
  if not path.exists():
    return None
  try:
    return _saved_corpus(json.loads(path.read_text()))
  except (_Damaged, ValueError, RecursionError) as err:  # ValueError: JSON, UTF-8
    reason = str(err) if isinstance(err, _Damaged) else _why(err)
    raise DataError(
        f"{path} is damaged ({reason}): restore it from a copy, or delete it (resuming the "
        "training with its text files writes it again; without it, generation and scoring "
        "need those files)."
    ) from None


def line_encoder(unit: str, tok, vocab: Sequence[str], end: int):
  """A function: lines (no line breaks) -> (int32 ids of all of them, each line
  ended by ``end``; int64 tokens per line).  Vectorised where the tokenizer
  allows: bytes and characters in numpy, subwords in the tokenizer's batch call."""
  if unit == "byte":

    def encode(lines):
      ids = np.frombuffer(("\n".join(lines) + "\n").encode("utf-8"), np.uint8).astype(np.int32)
      return ids, np.diff(np.flatnonzero(ids == 10), prepend=-1)

    return encode
  if unit == "char":
    chars = [(ord(c), i) for i, c in enumerate(vocab) if len(c) == 1]
    keys = np.asarray(sorted(chars), np.int64)  # [n, 2]: code point, id; sorted by code point
    unk = list(vocab).index(tok.unk)

    def encode(lines):
      cp = np.frombuffer(("\n".join(lines) + "\n").encode("utf-32-le"), np.uint32)
      pos = np.minimum(np.searchsorted(keys[:, 0], cp), len(keys) - 1)
      ids = np.where(keys[pos, 0] == cp, keys[pos, 1], unk).astype(np.int32)
      return ids, np.diff(np.flatnonzero(cp == 10), prepend=-1)

    return encode
  if unit == "word":
    get, unk = {v: i for i, v in enumerate(vocab)}.get, list(vocab).index(tok.unk)

    def encode(lines):
      ids, counts = [], []
      for line in lines:
        words = line.split()
        ids += [get(w, unk) for w in words]
        ids.append(end)
        counts.append(len(words) + 1)
      return np.asarray(ids, np.int32), np.asarray(counts, np.int64)

    return encode

  def encode(lines):  # subwords: one batch call of the library
    pieces = tok.batch_line_ids(lines)
    counts = np.fromiter((len(p) + 1 for p in pieces), np.int64, len(pieces))
    ids = np.fromiter(
        itertools.chain.from_iterable(p + [end] for p in pieces), np.int32, int(counts.sum())
    )
    return ids, counts

  return encode
