"""Bad input, refused by construction (2): every reader of a user file fed an
empty file, a truncated one, one that is not UTF-8 and random bytes.

Each reader is called as the command line calls it, on a good file first
(so that what breaks is the file, not the call), then on each damaged
form.  Each must raise one of the package's user errors
(``errors.UserError``: the command line prints it as one ``error:`` line,
exit 1, no traceback) whose message is one line naming the file; a reader
that prepares something from the file (a text corpus) leaves nothing
behind.  Formats that are binary (``.npy``, ``.npz``, torch and
safetensors state dicts, a SentencePiece model) have no "not UTF-8" form; a
text format that any bytes parse into (a --text file that is UTF-8) has no
"random bytes" form beyond non-UTF-8.

The readers (``READERS``): bAbI task files (``data.dataset="babilong:qaN"``),
own text corpora (``data.dataset="text"``), ``--prompt_file``, ``--tokens``
and ``--dynamic_stats`` arrays, ``--text`` and ``--dynamic_stats`` text,
converter hparams JSON (``--from=pytorch``, ``armt``), state dicts
(``.npz``, torch ``.pt``, ``.safetensors``), reference vocabulary files
(``--vocab``), pretrained tokenizers (``tokenizer.json``, SentencePiece
``.model``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from transformer_xl import errors

from helpers import REPO

FIX = REPO / "tests" / "fixtures"
RNG = np.random.default_rng(0)
RANDOM = bytes(RNG.integers(0, 256, size=4096, dtype=np.uint8))


def _good_babi(d: Path) -> Path:
  from transformer_xl.data import babi_like

  babi_like.write_task(d, "qa1", train_stories=12, test_stories=4, seed=0)
  return next(d.glob("qa1_*_train.txt"))


def _read_babi(path: Path, tmp: Path) -> None:
  """bAbI: ``babilong.load`` with the file as the task's train file (the
  fixtures' tokenizer and background text)."""
  from transformer_xl import data

  from helpers import babilong_data_cfg

  (tmp / "cfg").mkdir()
  cfg = babilong_data_cfg(tmp / "cfg")
  babi = Path(cfg["manual_dir"])
  target = next(babi.glob("qa1_*_train.txt"))
  target.write_bytes(path.read_bytes())
  corpus = data.load_configured(cfg)
  corpus.examples["valid"]  # the samples are generated when read


def _good_text(d: Path) -> Path:
  p = d / "train.txt"
  p.write_text("the cat sat on the mat .\nthe dog sat on the log .\n" * 40)
  return p


def _read_text_corpus(path: Path, tmp: Path) -> None:
  """Own text (``data.dataset="text"``): the file as the training split,
  prepared under ``tmp/tfds``; nothing of it may stay there on failure."""
  from transformer_xl import data

  (tmp / "valid").mkdir()
  (tmp / "test").mkdir()
  cfg = {
      "dataset": "text",
      "train_files": str(path),
      "valid_files": str(_good_text(tmp / "valid")),
      "test_files": str(_good_text(tmp / "test")),
      "tokenizer": "word",
      "data_dir": str(tmp / "tfds"),
  }
  try:
    data.load_configured(cfg)
  except errors.UserError:
    left = [p for p in (tmp / "tfds").rglob("*") if p.is_file()] if (tmp / "tfds").exists() else []
    assert not left, f"a failed preparation left {left[:5]}"
    raise


def _good_prompts(d: Path) -> Path:
  p = d / "prompts.txt"
  p.write_text("the cat\nthe dog\n")
  return p


def _read_prompts(path: Path, tmp: Path) -> None:
  from transformer_xl.cli import generate_mode

  generate_mode.read_prompts(None, str(path))


def _good_tokens(d: Path) -> Path:
  p = d / "tokens.npy"
  np.save(p, np.arange(40, dtype=np.int32).reshape(2, 20))
  return p


def _read_tokens(path: Path, tmp: Path) -> None:
  from transformer_xl.cli import user_errors

  user_errors.load_tokens(str(path))


def _read_stats_tokens(path: Path, tmp: Path) -> None:
  from transformer_xl.cli import user_errors

  user_errors.load_tokens(str(path), flag="--dynamic_stats")


def _read_score_text(path: Path, tmp: Path) -> None:
  from transformer_xl.cli import user_errors

  user_errors.read_text(str(path))


def _good_hparams(d: Path) -> Path:
  import hf_reference

  p = d / "hparams.json"
  p.write_text(json.dumps(hf_reference.hparams("plain")))
  return p


def _read_hparams(path: Path, tmp: Path) -> None:
  from transformer_xl.convert import hparams

  hparams.read_hparams(str(path))


def _good_armt_hparams(d: Path) -> Path:
  from helpers import armt_fixture_inputs

  _, h = armt_fixture_inputs(d)
  return h


def _read_armt_hparams(path: Path, tmp: Path) -> None:
  from transformer_xl.convert import armt

  armt.load_armt_hparams(str(path))


def _state(d: Path, suffix: str) -> Path:
  from transformer_xl.convert import pytorch

  p = d / f"state{suffix}"
  pytorch.save_state_dict({"a.weight": np.ones((3, 4), np.float32)}, str(p))
  return p


def _read_state(path: Path, tmp: Path) -> None:
  from transformer_xl.convert import pytorch

  pytorch.read_state_dict(str(path))


def _good_vocab(d: Path) -> Path:
  p = d / "vocab.txt"
  p.write_text("<eos>\nthe\ncat\n")
  return p


def _read_vocab(path: Path, tmp: Path) -> None:
  from transformer_xl.convert import vocab

  vocab.read_vocab(str(path))


def _good_tokenizer_json(d: Path) -> Path:
  p = d / "tokenizer.json"
  p.write_bytes((FIX / "babilong" / "tokenizer.json").read_bytes())
  return p


def _good_spm(d: Path) -> Path:
  import io

  import sentencepiece as spm

  model = io.BytesIO()
  words = "the quick brown fox jumps over a lazy dog while cats sleep in warm sun".split()
  lines = [" ".join(words[i % 7 :] + words[: i % 5]) for i in range(200)]
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=36, minloglevel=2
  )
  p = d / "spm.model"
  p.write_bytes(model.getvalue())
  return p


def _read_tokenizer(path: Path, tmp: Path) -> None:
  from transformer_xl.data import text_vocab

  text_vocab.load_pretrained(str(path), "text")


# name -> (write a good file into a folder, read a file, its damaged forms).
TEXT, BINARY = ("empty", "truncated", "not_utf8", "random"), ("empty", "truncated", "random")
READERS: dict[str, tuple[Callable, Callable, tuple[str, ...]]] = {
    "babi": (_good_babi, _read_babi, TEXT),
    "text_corpus": (_good_text, _read_text_corpus, ("empty", "not_utf8", "random")),
    "prompt_file": (_good_prompts, _read_prompts, ("empty", "not_utf8", "random")),
    "tokens_npy": (_good_tokens, _read_tokens, BINARY),
    "dynamic_stats_npy": (_good_tokens, _read_stats_tokens, BINARY),
    "score_text": (_good_text, _read_score_text, ("not_utf8", "random")),
    "hparams_json": (_good_hparams, _read_hparams, TEXT),
    "armt_hparams_json": (_good_armt_hparams, _read_armt_hparams, TEXT),
    "state_npz": (lambda d: _state(d, ".npz"), _read_state, BINARY),
    "state_pt": (lambda d: _state(d, ".pt"), _read_state, BINARY),
    "state_safetensors": (lambda d: _state(d, ".safetensors"), _read_state, BINARY),
    "vocab": (_good_vocab, _read_vocab, ("empty", "not_utf8", "random")),
    "tokenizer_json": (_good_tokenizer_json, _read_tokenizer, TEXT),
    "sentencepiece_model": (_good_spm, _read_tokenizer, BINARY),
}


def _damaged(good: Path, kind: str, where: Path) -> Path:
  """A copy of ``good`` (same name, in ``where``) damaged as ``kind`` says."""
  raw = good.read_bytes()
  out = where / good.name
  if kind == "empty":
    out.write_bytes(b"")
  elif kind == "truncated":
    out.write_bytes(raw[: max(1, len(raw) // 2)])
  elif kind == "not_utf8":
    cut = len(raw) // 3
    out.write_bytes(raw[:cut] + b"\xff\xfe caf\xe9 " + raw[cut:])
  else:
    out.write_bytes(RANDOM)
  return out


CASES = [(name, kind) for name, (_, _, kinds) in READERS.items() for kind in kinds]


@pytest.mark.parametrize("name, kind", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_a_damaged_file_is_one_line_naming_it(name, kind, tmp_path):
  make, read, _ = READERS[name]
  dirs = {k: tmp_path / k for k in ("good", "bad", "ok", "run")}
  for d in dirs.values():
    d.mkdir()
  good = make(dirs["good"])
  read(good, dirs["ok"])  # the call is right: a good file reads
  bad = _damaged(good, kind, dirs["bad"])
  with pytest.raises(errors.UserError) as info:
    read(bad, dirs["run"])
  message = str(info.value)
  assert "\n" not in message.strip(), message
  assert bad.name in message, message
  assert "Traceback" not in message


def test_every_reader_has_its_good_file_read(tmp_path):
  """The list itself: every reader named in the module docstring is here."""
  assert len(READERS) == 14 and len(CASES) >= 40
  assert os.path.exists(FIX / "babilong" / "tokenizer.json")
