"""Damaged or foreign files a run reads back, each refused as one ``error:`` line.

* ``<workdir>/tokenizer.json`` (issue 37): cut short, ``{}``, nested
  200,000 deep, a damaged SentencePiece model inside it; through the
  functions generation (``load_saved_tokenizer``), eval and resume
  (``check_saved_tokenizer``) call, and once through the command line.
* ``config.json`` and ``model_config.json`` with a key this version does not
  know: "written by a newer version", not "damaged" (that stays for files
  that do not parse).
* ``.safetensors`` parameters stored as integers (or float data relabelled
  I32 in the header): refused, naming the tensor and its dtype.
* ``--to=safetensors`` / ``--to=pytorch`` onto an existing file: refused
  unless ``--overwrite``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_xl import data, default_config
from transformer_xl.data import text_vocab, tokenizers
from transformer_xl.data.corpus import Corpus
from transformer_xl.model import models
from transformer_xl.run import workdir as wd

REPO = Path(__file__).resolve().parents[1]
LINES = [
    "the cat sat on the mat and the dog sat on the log",
    "a new line of text with some other words in it",
    "Grüße aus Köln, 1234 and 5678.",
] * 20


def _spm_corpus() -> Corpus:
  """A vocabulary-only text corpus with a small SentencePiece model (no preparation)."""
  import io

  import sentencepiece

  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(LINES),
      model_writer=model,
      vocab_size=300,
      byte_fallback=True,
      unk_id=0,
      bos_id=-1,
      eos_id=1,
      pad_id=-1,
      minloglevel=2,
  )
  tok = tokenizers.SentencePieceTokenizer("text", model.getvalue())
  return Corpus(
      name="text", unit="subword", vocab=tok.vocab, boundary_id=tok.end_id, splits={}, tokenizer=tok
  )


@pytest.fixture(scope="module")
def spm_corpus() -> Corpus:
  return _spm_corpus()


def _damage(case: str, good: dict) -> str:
  """The text of a damaged ``tokenizer.json`` made from the good record."""
  text = json.dumps(good)
  if case == "cut short":
    return text[: len(text) // 2]
  if case == "empty object":
    return "{}"
  if case == "nested 200,000 deep":
    return "[" * 200_000 + "]" * 200_000
  if case == "damaged SentencePiece model":
    proto = base64.b64decode(good["tokenizer"]["model"])
    bad = {
        **good,
        "tokenizer": {**good["tokenizer"], "model": base64.b64encode(proto[:-7]).decode()},
    }
    return json.dumps(bad)
  raise AssertionError(case)


DAMAGE = ["cut short", "empty object", "nested 200,000 deep", "damaged SentencePiece model"]


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_tokenizer_json_is_one_error_line(case, spm_corpus, tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  text_vocab.save_tokenizer(spm_corpus, workdir)
  path = workdir / text_vocab.TOKENIZER_FILE
  good = json.loads(path.read_text())
  assert text_vocab.load_saved_tokenizer(workdir).vocab == spm_corpus.vocab  # the good one loads
  path.write_text(_damage(case, good))
  # generation's call (the corpus files gone) and eval's and resume's call (the corpus loaded)
  for call in (
      lambda: text_vocab.load_saved_tokenizer(workdir),
      lambda: text_vocab.check_saved_tokenizer(spm_corpus, workdir),
  ):
    with pytest.raises(data.DataError) as err:
      call()
    message = str(err.value)
    assert "\n" not in message, message
    assert message.startswith(f"{path} is damaged ("), message
    assert "delete it" in message and "restore it" in message, message


@pytest.mark.parametrize(
    "change",
    [
        lambda r: {**r, "unit": 3},
        lambda r: {**r, "vocab": "abc"},
        lambda r: {**r, "boundary_id": len(r["vocab"])},
        lambda r: {**r, "tokenizer": {"kind": "sentencepiece", "model": "!!not base64!!"}},
        lambda r: {**r, "tokenizer": {"kind": "huggingface", "json": "{"}},
        lambda r: {**r, "tokenizer": {"kind": "klingon"}},
        lambda r: [r],
    ],
)
def test_other_damage_to_tokenizer_json_is_reported_alike(change, spm_corpus, tmp_path):
  text_vocab.save_tokenizer(spm_corpus, tmp_path)
  path = tmp_path / text_vocab.TOKENIZER_FILE
  path.write_text(json.dumps(change(json.loads(path.read_text()))))
  with pytest.raises(data.DataError, match=f"^{path} is damaged \\(") as err:
    text_vocab.load_saved_tokenizer(tmp_path)
  assert "\n" not in str(err.value)


def _text_workdir(workdir: Path, corpus: Corpus, folder: Path) -> None:
  """config.json (a text corpus whose files are gone) and model_config.json of a
  tiny model of ``corpus``'s vocabulary, as training leaves them (no checkpoint)."""
  workdir.mkdir(parents=True)
  config = default_config.get_config()
  config.data.dataset = "text"
  config.data.tokenizer = "sentencepiece"
  config.data.vocab_size = corpus.vocab_size
  config.data.data_dir = str(folder / "tfds")
  for split in ("train", "valid", "test"):
    config.data[f"{split}_files"] = f"{folder}/{split}.txt"
  wd.save_config(str(workdir), config)
  cfg = models.ModelConfig(
      n_token=corpus.vocab_size, n_layer=1, d_model=8, n_head=2, d_head=4, d_inner=16,
      tgt_len=4, mem_len=4,
  )  # fmt: skip
  wd.save_model_config(str(workdir), cfg, "subword", "text")


@pytest.mark.slow
def test_generate_on_a_damaged_tokenizer_json_prints_one_error_line(spm_corpus, tmp_path):
  workdir = tmp_path / "run"
  _text_workdir(workdir, spm_corpus, tmp_path / "gone")
  text_vocab.save_tokenizer(spm_corpus, workdir)
  path = workdir / text_vocab.TOKENIZER_FILE
  path.write_text(path.read_text()[:100])  # cut short
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  r = subprocess.run(
      [sys.executable, "-m", "transformer_xl.main", f"--workdir={workdir}", "--mode=generate",
       "--prompt=the cat", "--num_tokens=2"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert len(errors) == 1 and errors[0].startswith(f"error: {path} is damaged ("), r.stderr
