"""SentencePiece trained on one's own text (``text_vocab.train_sentencepiece``):
the trainer options from the config (``data.spm_*``), their validation and
fingerprint, and what it says when no training line can be trained on.

Each option is checked on the trained model's pieces (a run of spaces as one
piece, digits apart, ``<0xNN>`` byte pieces, a rare character's own piece),
not on the arguments passed, so a test fails if an option stops reaching the
trainer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import re
from pathlib import Path

import pytest
import sentencepiece

from transformer_xl import data, default_config
from transformer_xl.data import text_builder, text_reading, text_settings, text_vocab
from transformer_xl.data.text_settings import SPM_OPTIONS_BEFORE, TextSettings
from transformer_xl.run import workdir

NEW_OPTIONS = tuple(SPM_OPTIONS_BEFORE)  # the trainer options this version added


def _words(n: int, seed: int = 0) -> str:
  """``n`` pseudo-random lowercase words of 2-9 letters, one space apart."""
  rng = random.Random(seed)
  return " ".join(
      "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
      for _ in range(n)
  )


def _files(folder: Path, train: str) -> TextSettings:
  """Settings of a corpus whose training file holds ``train`` (and small valid/test files)."""
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "train.txt").write_text(train, encoding="utf-8")
  (folder / "valid.txt").write_text("a short valid line\n", encoding="utf-8")
  (folder / "test.txt").write_text("a short test line\n", encoding="utf-8")
  return TextSettings(
      train_files=str(folder / "train.txt"),
      valid_files=str(folder / "valid.txt"),
      test_files=str(folder / "test.txt"),
      tokenizer="sentencepiece",
      vocab_size=300,
  )


def _load_error(settings: TextSettings, tmp_path: Path) -> str:
  with pytest.raises(data.DataError) as err:
    text_builder.load_text_corpus(settings, data_dir=tmp_path / "tfds")
  return str(err.value)


# -- no line can be trained on: the reason and the setting to change ---------------------------


def test_a_corpus_whose_only_line_is_longer_than_the_sample_says_so_and_what_to_raise(tmp_path):
  """The issue's case: the only training line (2,000+ bytes) is longer than
  ``spm_sample_mb`` (0.001 MB = 1,000 bytes) with ``vocab_size=300``.  The
  message was "cannot be trained with data.vocab_size=300 ...: . Change
  data.vocab_size." (an empty reason, the wrong setting); it must name the
  sample and the value of ``spm_sample_mb`` that makes the line fit, and that
  value must then train."""
  line = _words(400)
  size = len(line.encode())
  settings = dataclasses.replace(_files(tmp_path / "files", line + "\n"), spm_sample_mb=0.001)
  message = _load_error(settings, tmp_path)
  assert "vocab_size" not in message and ": ." not in message, message
  assert f"the only non-blank line ({size:,} bytes) is too long for the sample" in message
  assert "data.spm_sample_mb=0.001 MB = 1,000 bytes" in message, message
  advised = re.search(r"Raise data\.spm_sample_mb to at least ([0-9.]+), or break", message)
  assert advised, message
  assert float(advised.group(1)) * 1e6 < size + 2  # the least that fits: the line, its newline
  corpus = text_builder.load_text_corpus(
      dataclasses.replace(settings, spm_sample_mb=float(advised.group(1))),
      data_dir=tmp_path / "tfds",
  )
  train = corpus.splits["train"]
  assert corpus.decode(train.read(0, train.num_tokens)) == line + "\n"


def test_a_corpus_whose_only_line_is_longer_than_the_sentence_limit_says_so(tmp_path):
  """A line longer than SentencePiece's ``max_sentence_length`` (65,536
  bytes by default), which SentencePiece skips and then fails on with an
  empty reason: the message names the limit, the line's length and the
  setting, and following it trains."""
  line = _words(11000)
  size = len(line.encode())
  assert 65_536 < size < 100_000
  settings = _files(tmp_path / "files", line + "\n")
  message = _load_error(settings, tmp_path)
  assert "vocab_size" not in message and ": ." not in message, message
  assert (
      f"the only non-blank line ({size:,} bytes) is longer than "
      "data.spm_max_sentence_length=65,536 bytes, SentencePiece's limit" in message
  ), message
  assert f"Raise data.spm_max_sentence_length to at least {size:,}, or break" in message
  corpus = text_builder.load_text_corpus(
      dataclasses.replace(settings, spm_max_sentence_length=size), data_dir=tmp_path / "tfds"
  )
  assert corpus.vocab_size == 300


def test_lines_too_long_for_both_limits_name_both_and_blank_text_says_so():
  lines = ["x" * 70_000, "y" * 2_000, ""]
  s = TextSettings("a", "b", "c", tokenizer="sentencepiece", vocab_size=300, spm_sample_mb=0.001)
  with pytest.raises(data.DataError) as err:
    text_vocab.train_sentencepiece(iter(lines), s, "text")
  message = str(err.value)
  assert "of the 2 non-blank lines, 1 is longer than data.spm_max_sentence_length" in message
  assert "1 is too long for the sample of data.spm_sample_mb=0.001 MB" in message
  assert "Raise data.spm_sample_mb to at least 0.002001, or break" in message
  big = dataclasses.replace(s, spm_sample_mb=0.05)  # the sample holds 70,001 bytes; the limit not
  with pytest.raises(data.DataError, match=r"at least 70,000 and data\.spm_sample_mb to at least"):
    text_vocab.train_sentencepiece(iter(lines[:1]), big, "text")
  with pytest.raises(data.DataError, match="every training line is blank"):
    text_vocab.train_sentencepiece(iter(["", "   ", "\t"]), s, "text")


def test_a_vocabulary_too_large_still_gets_its_own_advice(tmp_path):
  """The other refusal keeps its message: the largest size SentencePiece
  allows, and ``data.vocab_size`` to change; that size then trains."""
  settings = _files(tmp_path / "files", "the cat sat on the mat\n" * 20)
  message = _load_error(settings, tmp_path)
  largest = re.search(r"set it to a value <= (\d+)\. Change data\.vocab_size\.$", message)
  assert largest and "SentencePiece cannot be trained with data.vocab_size=300" in message
  corpus = text_builder.load_text_corpus(
      dataclasses.replace(settings, vocab_size=int(largest.group(1))), data_dir=tmp_path / "tfds"
  )
  assert corpus.vocab_size == int(largest.group(1))


def test_lines_left_out_of_the_sample_are_reported_and_the_rest_trains_as_without_them(reports):
  """A line over the sentence limit among trainable ones: reported, and the
  model is the one trained on the other lines alone (SentencePiece itself
  would skip it; the sample's budget is not spent on it)."""
  lines = [_words(30, seed=i) for i in range(60)]
  s = TextSettings("a", "b", "c", tokenizer="sentencepiece", vocab_size=300)
  with_long = text_vocab.train_sentencepiece(iter(lines[:30] + ["z" * 70_000] + lines[30:]), s, "t")
  assert with_long == text_vocab.train_sentencepiece(iter(lines), s, "t")
  assert (
      "t: SentencePiece is trained without 1 of the 61 non-blank training lines (the corpus "
      "keeps them): 1 is longer than data.spm_max_sentence_length=65,536 bytes" in reports.text
  )


# -- the trainer options reach the trainer -----------------------------------------------------


def _train(lines, **options) -> sentencepiece.SentencePieceProcessor:
  s = TextSettings("a", "b", "c", tokenizer="sentencepiece", **{"vocab_size": 400, **options})
  return sentencepiece.SentencePieceProcessor(
      model_proto=text_vocab.train_sentencepiece(iter(lines), s, "text")
  )


def _pieces(sp) -> list[str]:
  return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


CODE = [  # indented Python-like lines, names of pseudo-random words
    line
    for i in range(60)
    for a, b, c in [_words(3, seed=i).split()]
    for line in (
        f"def {a}_{b}({c}, other):",
        f"    if {c} > other.{a}:",
        f"        {b} = {c} - other",
        f"        return {b}",
        f"    for item in range({c}):",
        f"        {a} += item",
        f"    return {a}",
        "",
    )
]


def test_whitespace_only_pieces_make_indentation_one_piece():
  """With ``spm_allow_whitespace_only_pieces`` (the default) eight spaces of
  indentation are one piece (with the space SentencePiece puts before a
  line: nine); without it, one piece per space."""
  line = " " * 8 + "return value"
  sp = _train(CODE)
  assert sp.encode(line, out_type=str)[0] == "\u2581" * 9
  assert any(set(p) == {"\u2581"} and len(p) >= 4 for p in _pieces(sp))
  sp = _train(CODE, spm_allow_whitespace_only_pieces=False)
  assert not any(set(p) == {"\u2581"} and len(p) > 1 for p in _pieces(sp))
  assert sp.encode(line, out_type=str)[:9] == ["\u2581"] * 9


def test_split_digits_keeps_digits_apart():
  numbers = [" ".join(f"{n * 7919 % 100000}" for n in range(i, i + 20)) for i in range(200)]
  lines = numbers + [_words(20, seed=i) for i in range(100)]
  multi = lambda sp: [  # noqa: E731  (pieces of two digits or more; not the <0xNN> bytes)
      p for p in _pieces(sp) if sum(c.isdigit() for c in p) > 1 and not p.startswith("<0x")
  ]
  assert not multi(_train(lines))  # the default: split
  assert multi(_train(lines, spm_split_digits=False))


def test_byte_fallback_gives_byte_pieces_for_unseen_characters():
  lines = [_words(30, seed=i) for i in range(100)]
  unseen = "snow \u2603 man"
  sp = _train(lines)  # the default: byte fallback
  pieces = sp.encode(unseen, out_type=str)
  assert ["<0xE2>", "<0x98>", "<0x83>"] == [p for p in pieces if p.startswith("<0x")]
  assert sp.decode(sp.encode(unseen)) == unseen
  sp = _train(lines, vocab_size=100, spm_byte_fallback=False)
  assert not any(p.startswith("<0x") for p in _pieces(sp))
  assert sp.unk_id() in sp.encode(unseen) and sp.decode(sp.encode(unseen)) != unseen


def test_character_coverage_decides_whether_a_rare_character_is_a_piece():
  """A character of 1 in about 25,000 (under the 0.05% that the default
  coverage 0.9995 leaves out) gets no piece of its own; with coverage 1 it does."""
  lines = [_words(30, seed=i) for i in range(100)] + ["\u0436"]
  assert "\u0436" not in _pieces(_train(lines))
  assert "\u0436" in _pieces(_train(lines, spm_character_coverage=1.0))


def test_the_earlier_options_train_the_earlier_model_byte_for_byte():
  """At ``SPM_OPTIONS_BEFORE`` the model is byte for byte the one this
  package trained before the options existed (its call, copied here), so a
  workdir's saved ``tokenizer.json`` still matches its re-prepared corpus."""
  lines = CODE + [_words(30, seed=i) for i in range(50)]
  s = TextSettings("a", "b", "c", tokenizer="sentencepiece", vocab_size=400, **SPM_OPTIONS_BEFORE)
  model = io.BytesIO()
  sentencepiece.set_random_generator_seed(0)
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(text_vocab.sample_lines((x for x in lines if x.strip()), 32_000_000)),
      model_writer=model,
      vocab_size=400,
      model_type="unigram",
      byte_fallback=True,
      normalization_rule_name="identity",
      remove_extra_whitespaces=False,
      split_digits=True,
      character_coverage=0.9995,
      max_sentence_length=1 << 16,
      unk_id=0,
      bos_id=-1,
      eos_id=1,
      pad_id=-1,
      num_threads=os.cpu_count() or 1,
      minloglevel=2,
  )
  assert text_vocab.train_sentencepiece(iter(lines), s, "text") == model.getvalue()


# -- the config, validation and the fingerprint ------------------------------------------------


def test_every_option_is_a_config_field_with_the_settings_default():
  config = default_config.get_config()
  fields = {f.name: f.default for f in dataclasses.fields(TextSettings)}
  for name in NEW_OPTIONS:
    assert name in data.TEXT_FIELDS  # so load_configured passes it to TextSettings
    assert config.data[name] == fields[name], name
  assert fields["spm_allow_whitespace_only_pieces"] is True  # the decided default (the guide)


@pytest.mark.parametrize(
    "name, value, needle",
    [
        ("spm_character_coverage", 0.5, "must be in [0.98, 1.0]"),
        ("spm_character_coverage", 1.01, "must be in [0.98, 1.0]"),
        ("spm_character_coverage", float("nan"), "must be in [0.98, 1.0]"),
        ("spm_max_sentence_length", 9, "in [10, 1,073,741,824]"),
        ("spm_max_sentence_length", 1 << 31, "in [10, 1,073,741,824]"),
        ("spm_max_sentence_length", 1000.5, "a whole number of bytes"),
        ("spm_split_digits", "yes", "use True or False"),
        ("spm_byte_fallback", 1, "use True or False"),
        ("spm_allow_whitespace_only_pieces", None, "use True or False"),
    ],
)
def test_bad_option_values_are_refused_naming_the_field(name, value, needle):
  s = TextSettings("a", "b", "c", tokenizer="sentencepiece", vocab_size=8000)
  assert text_settings.settings_problems(s) == []
  problems = text_settings.settings_problems(dataclasses.replace(s, **{name: value}))
  assert len(problems) == 1 and f"data.{name}=" in problems[0] and needle in problems[0]


def test_the_config_refuses_a_bad_option_before_anything_runs():
  config = default_config.get_config()
  config.data.update(
      dataset="text", train_files="t", valid_files="v", test_files="t", spm_character_coverage=0.9
  )
  with pytest.raises(default_config.ConfigError, match=r"data\.spm_character_coverage=0\.9"):
    default_config.validate(config, 1)


def _earlier_fingerprint(s: TextSettings, files) -> str:
  """The fingerprint as this package computed it before the options existed
  (``text_reading.fingerprint`` then: every settings field of that time)."""
  later = set(NEW_OPTIONS) | set(text_settings.NOT_FINGERPRINTED)  # fields added since
  settings = {k: v for k, v in dataclasses.asdict(s).items() if k not in later}
  desc = {
      "format": text_settings.STORAGE_FORMAT,
      "settings": settings,
      "files": {
          split: [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in fs]
          for split, fs in files.items()
      },
  }
  return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]


def test_each_option_changes_the_fingerprint_and_earlier_datasets_keep_theirs(tmp_path):
  s = dataclasses.replace(_files(tmp_path / "files", "some text\n"), vocab_size=8000)
  files = text_reading.resolve_files(s)
  changed = {
      "spm_allow_whitespace_only_pieces": False,
      "spm_split_digits": False,
      "spm_byte_fallback": False,
      "spm_character_coverage": 1.0,
      "spm_max_sentence_length": 4192,
  }
  assert set(changed) == set(NEW_OPTIONS)
  prints = {text_reading.fingerprint(s, files)}
  for name, value in changed.items():
    prints.add(text_reading.fingerprint(dataclasses.replace(s, **{name: value}), files))
  assert len(prints) == 1 + len(changed)  # each option, alone, names another dataset
  # At the earlier values, SentencePiece's dataset keeps the name it had.
  before = dataclasses.replace(s, **SPM_OPTIONS_BEFORE)
  assert text_reading.fingerprint(before, files) == _earlier_fingerprint(before, files)
  assert text_reading.fingerprint(s, files) != _earlier_fingerprint(s, files)  # whitespace pieces
  # Another tokenizer's dataset does not depend on them: its name as before, whatever they are.
  word = dataclasses.replace(s, tokenizer="word", vocab_size=0)
  for name, value in changed.items():
    other = dataclasses.replace(word, **{name: value})
    assert text_reading.fingerprint(other, files) == _earlier_fingerprint(word, files)


def test_a_dataset_prepared_with_other_options_is_not_reused(tmp_path):
  settings = dataclasses.replace(_files(tmp_path / "files", "\n".join(CODE) + "\n"), vocab_size=400)
  tfds_dir = tmp_path / "tfds"
  first = text_builder.load_text_corpus(settings, data_dir=tfds_dir)
  again = text_builder.load_text_corpus(settings, data_dir=tfds_dir)
  assert again.tokenizer.model_proto == first.tokenizer.model_proto
  assert len(list((tfds_dir / "txl_text").iterdir())) == 1  # the same settings: reused
  other = text_builder.load_text_corpus(
      dataclasses.replace(settings, spm_allow_whitespace_only_pieces=False), data_dir=tfds_dir
  )
  assert len(list((tfds_dir / "txl_text").iterdir())) == 2
  assert other.tokenizer.model_proto != first.tokenizer.model_proto
  n = first.splits["train"].num_tokens
  assert other.splits["train"].num_tokens > n  # one piece per indentation space


def test_a_saved_config_without_the_options_keeps_the_earlier_values(tmp_path):
  """A workdir's ``config.json`` written before the options existed: its
  own-text run keeps the values it was trained with (its dataset and
  tokenizer); another corpus's config loads and validates as it is."""
  saved = json.loads(default_config.get_config().to_json_best_effort())
  for name in NEW_OPTIONS:
    del saved["data"][name]
  defaults = default_config.get_config().data
  for dataset in ("text", "enwik8"):
    run = tmp_path / dataset
    run.mkdir()
    saved["data"]["dataset"] = dataset
    (run / "config.json").write_text(json.dumps(saved))
    config = workdir.load_config(str(run))
    got = {k: config.data[k] for k in NEW_OPTIONS}
    assert got == (SPM_OPTIONS_BEFORE if dataset == "text" else {k: defaults[k] for k in got})
    if dataset == "enwik8":
      default_config.validate(config, 1)  # no "applies only to data.dataset='text'"
