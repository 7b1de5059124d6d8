"""The settings of a corpus of one's own text files (``data.dataset="text"``).

Kept apart from ``text_builder.py`` (which imports tfds) so that config
validation checks them without importing tfds.  Meanings: ``text_builder.py``
(and ``text_reading.py`` for the files).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

SPLITS = ("train", "valid", "test")
TOKENIZERS = ("byte", "char", "word", "sentencepiece")  # and "pretrained:PATH"
PRETRAINED = "pretrained:"
DOCUMENT_SEPARATORS = ("file", "paragraph", "line")
SPM_MODEL_TYPES = ("unigram", "bpe")
# SentencePiece's own limits (its trainer_interface.cc refuses values outside them).
SPM_CHARACTER_COVERAGE = (0.98, 1.0)
SPM_MAX_SENTENCE_LENGTH = (10, 1 << 30)  # bytes
# The SentencePiece options added after datasets were first prepared, at the
# values those datasets were trained with: at these values an option does not
# enter the fingerprint (``fingerprint_settings``), so a dataset prepared before
# the option existed is still found; any other value prepares a new one.
SPM_OPTIONS_BEFORE = {
    "spm_allow_whitespace_only_pieces": False,
    "spm_split_digits": True,
    "spm_byte_fallback": True,
    "spm_character_coverage": 0.9995,
    "spm_max_sentence_length": 1 << 16,
}
BYTE_VOCAB_SIZE = 256
# Fields that choose which files are accepted, not what is prepared from them: left out of
# the prepared dataset's fingerprint (text_reading.fingerprint, TfdsText.fingerprint).
NOT_FINGERPRINTED = ("allow_split_overlap",)
STORAGE_FORMAT = 1  # in the fingerprint: a change of how corpora are stored prepares them again


@dataclasses.dataclass(frozen=True)
class TextSettings:
  """What ``data.dataset="text"`` is built from (the ``data`` config fields).

  Attributes:
    train_files, valid_files, test_files: comma-separated glob patterns
      (``**`` recursive, following no directory link); every split needs at
      least one non-empty file, and no file may be in two splits.
    allow_split_overlap: let one file (compared by its real path, links and
      ``..`` resolved) be in two splits, e.g. train on the valid text on
      purpose; the prepared data does not depend on it.
    tokenizer: "byte", "char", "word", "sentencepiece" or "pretrained:PATH".
    vocab_size: word/char: cap (0 = all); sentencepiece: number of pieces
      (required); byte: 0 (or 256, what it is anyway).
    min_count: word/char: a symbol must occur this often in train.
    document_separator: "file", "paragraph" or "line".
    spm_model_type: "unigram" or "bpe" (sentencepiece).
    spm_sample_mb: MB of training text SentencePiece is trained on at most:
      a uniform random sample of the training lines (its trainer needs about
      30 times this in memory).
    spm_allow_whitespace_only_pieces: SentencePiece may learn pieces made
      only of spaces, so a run of spaces (code's indentation) can be one
      piece instead of one piece per space.
    spm_split_digits: every digit is its own piece (numbers are not merged).
    spm_byte_fallback: a character outside the pieces becomes its UTF-8
      bytes (``<0xNN>`` pieces) instead of ``<unk>``, so decoding gives the
      text back exactly.
    spm_character_coverage: the share of the training characters (by
      count) that get pieces of their own, in [0.98, 1]; the rarest others
      become bytes (with byte fallback) or ``<unk>``.
    spm_max_sentence_length: bytes; SentencePiece trains on no line longer
      than this (such lines are left out of its sample, not of the corpus).
    tfds_name: instead of files, a tfds dataset ``NAME[/CONFIG]``
      (``data.dataset="tfds:NAME"``), each example one document.
    text_key: the tfds feature holding the text (e.g. ``book_text``).
    tfds_splits: the tfds splits read as train, valid and test.
  """

  train_files: str
  valid_files: str
  test_files: str
  allow_split_overlap: bool = False
  tokenizer: str = "word"
  vocab_size: int = 0
  min_count: int = 1
  document_separator: str = "file"
  spm_model_type: str = "unigram"
  spm_sample_mb: float = 32.0
  spm_allow_whitespace_only_pieces: bool = True
  spm_split_digits: bool = True
  spm_byte_fallback: bool = True
  spm_character_coverage: float = 0.9995
  spm_max_sentence_length: int = 1 << 16
  tfds_name: str = ""
  text_key: str = "text"
  tfds_splits: str = "train,validation,test"

  def patterns(self, split: str) -> list[str]:
    """The glob patterns of ``split``."""
    return [p.strip() for p in getattr(self, f"{split}_files").split(",") if p.strip()]


def settings_problems(s: TextSettings) -> list[str]:
  """What is wrong with ``s`` without reading any file (config validation)."""
  problems = []
  if s.tfds_name:
    if any(s.patterns(split) for split in SPLITS):
      problems.append(
          f"data.train_files/valid_files/test_files are not read with "
          f"data.dataset='tfds:{s.tfds_name}': remove them."
      )
    if s.allow_split_overlap:
      problems.append(
          f"data.allow_split_overlap is for text files, not data.dataset='tfds:"
          f"{s.tfds_name}' (its splits are tfds's): remove it."
      )
    if len([x for x in s.tfds_splits.split(",") if x.strip()]) != 3 or not s.text_key:
      problems.append(
          f"data.tfds_splits={s.tfds_splits!r} must name three tfds splits (train,"
          f"valid,test, e.g. 'train,validation,test') and data.text_key="
          f"{s.text_key!r} the text feature."
      )
  for split in SPLITS if not s.tfds_name else ():
    if not s.patterns(split):
      problems.append(
          f"data.{split}_files is empty: give the {split} text files as glob "
          f"patterns, e.g. --config.data.{split}_files='corpus/{split}/*.txt'."
      )
  if s.tokenizer not in TOKENIZERS and not (
      s.tokenizer.startswith(PRETRAINED) and len(s.tokenizer) > len(PRETRAINED)
  ):
    problems.append(
        f"data.tokenizer={s.tokenizer!r}: use one of {', '.join(TOKENIZERS)} or "
        "pretrained:PATH (a SentencePiece .model or a tokenizer.json)."
    )
  if s.tokenizer == "sentencepiece" and s.vocab_size < 1:
    problems.append(
        "data.tokenizer=sentencepiece needs data.vocab_size (the number of pieces, e.g. 8000)."
    )
  if s.tokenizer == "byte" and s.vocab_size not in (0, BYTE_VOCAB_SIZE):
    problems.append(
        f"data.vocab_size={s.vocab_size} does not apply to data.tokenizer=byte (always the "
        f"{BYTE_VOCAB_SIZE} byte values): set data.vocab_size=0."
    )
  if s.vocab_size < 0 or s.min_count < 1:
    problems.append(
        f"data.vocab_size={s.vocab_size} must be >= 0 and data.min_count={s.min_count} >= 1."
    )
  if s.document_separator not in DOCUMENT_SEPARATORS:
    problems.append(
        f"data.document_separator={s.document_separator!r}: use one of "
        f"{', '.join(DOCUMENT_SEPARATORS)}."
    )
  if s.spm_model_type not in SPM_MODEL_TYPES:
    problems.append(f"data.spm_model_type={s.spm_model_type!r}: use unigram or bpe.")
  if not s.spm_sample_mb > 0:
    problems.append(f"data.spm_sample_mb={s.spm_sample_mb} must be > 0.")
  for name in ("spm_allow_whitespace_only_pieces", "spm_split_digits", "spm_byte_fallback"):
    if not isinstance(getattr(s, name), bool):
      problems.append(f"data.{name}={getattr(s, name)!r}: use True or False.")
  low, high = SPM_CHARACTER_COVERAGE
  if not low <= s.spm_character_coverage <= high:
    problems.append(
        f"data.spm_character_coverage={s.spm_character_coverage} must be in [{low}, {high}] "
        "(SentencePiece's range; 1 gives every training character a piece)."
    )
  low, high = SPM_MAX_SENTENCE_LENGTH
  if isinstance(s.spm_max_sentence_length, bool) or not (
      isinstance(s.spm_max_sentence_length, int) and low <= s.spm_max_sentence_length <= high
  ):
    problems.append(
        f"data.spm_max_sentence_length={s.spm_max_sentence_length!r} must be a whole number "
        f"of bytes in [{low}, {high:,}] (SentencePiece's range)."
    )
  return problems


def fingerprint_settings(s: TextSettings) -> dict:
  """The settings as they enter a prepared dataset's fingerprint.

  Every field but ``NOT_FINGERPRINTED``'s, except that the SentencePiece options of ``SPM_OPTIONS_BEFORE``
  enter only with ``tokenizer="sentencepiece"`` and a value other than the
  one datasets were prepared with before the option existed: these options
  prepare no new dataset of another tokenizer, and a dataset prepared
  before they existed keeps its name (and is found again).
  """
  settings = {k: v for k, v in dataclasses.asdict(s).items() if k not in NOT_FINGERPRINTED}
  for name, before in SPM_OPTIONS_BEFORE.items():
    if s.tokenizer != "sentencepiece" or settings[name] == before:
      del settings[name]
  return settings


def with_earlier_defaults(saved_data: Mapping) -> dict:
  """A saved config's ``data`` section (a workdir's ``config.json``) with the
  SentencePiece options it lacks at the values runs had before the options
  existed (``SPM_OPTIONS_BEFORE``), for one's own text (``dataset`` "text"
  or "tfds:NAME"); other corpora's sections as they are.  A run trained
  before then keeps its dataset and tokenizer."""
  dataset = str(saved_data.get("dataset", ""))
  if dataset != "text" and not dataset.startswith("tfds:"):
    return dict(saved_data)
  return {**SPM_OPTIONS_BEFORE, **saved_data}
