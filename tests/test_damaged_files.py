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
from pathlib import Path

import numpy as np
import pytest

from transformer_xl import data, default_config
from transformer_xl.data import text_vocab, tokenizers
from transformer_xl.data.corpus import Corpus
from transformer_xl.inference import trained_model
from transformer_xl.run import workdir as wd

from helpers import run_main, tiny_model_config

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


@pytest.mark.parametrize("change", ["two entries swapped", "last entries cut"])
def test_a_word_vocabulary_changed_inside_tokenizer_json_is_damage(change, tmp_path):
  """A word-level vocabulary is the only record of its ids: two entries
  swapped (every later score and generation wrong) or entries cut (the
  model's n_token no longer the vocabulary's) are refused, naming the file,
  by generation's and scoring's loader as by eval's check."""
  tok = tokenizers.LineTokenizer("text")
  vocab = ("<eos>", "<unk>", *sorted({w for line in LINES for w in line.split()}))
  corpus = Corpus(name="text", unit="word", vocab=vocab, boundary_id=0, splits={}, tokenizer=tok)
  text_vocab.save_tokenizer(corpus, tmp_path)
  path = tmp_path / text_vocab.TOKENIZER_FILE
  assert text_vocab.load_saved_tokenizer(tmp_path).vocab == vocab
  record = json.loads(path.read_text())
  v = record["vocab"]
  record["vocab"] = [v[0], v[1], v[3], v[2], *v[4:]] if change == "two entries swapped" else v[:-3]
  path.write_text(json.dumps(record))
  for call in (
      lambda: text_vocab.load_saved_tokenizer(tmp_path),
      lambda: text_vocab.check_saved_tokenizer(corpus, tmp_path),
  ):
    with pytest.raises(data.DataError) as err:
      call()
    assert str(err.value).startswith(f"{path} is damaged (its vocab of "), str(err.value)
    assert "is not the one it was written with" in str(err.value)
  # A file of before the checksum: entries cut are told by the model's n_token, naming it.
  del record["vocab_sha256"]
  path.write_text(json.dumps(record))
  config = default_config.get_config()
  config.data.dataset = "text"
  model_cfg = tiny_model_config(n_token=len(vocab))
  if change == "last entries cut":
    with pytest.raises(data.DataError) as err:
      trained_model.load_corpus(config, model_cfg, tmp_path)
    assert str(err.value).startswith(f"{path} is damaged (its vocab has {len(vocab) - 3} ")


def _hf_corpus() -> Corpus:
  """A vocabulary-only corpus of a small byte-level BPE ``tokenizers`` tokenizer."""
  import tokenizers as hf

  bpe = hf.Tokenizer(hf.models.BPE())
  bpe.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = hf.decoders.ByteLevel()
  bpe.train_from_iterator(
      LINES,
      hf.trainers.BpeTrainer(
          vocab_size=300, initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet()
      ),
  )
  tok = tokenizers.HuggingFaceTokenizer("text", bpe.to_str())
  return Corpus("text", "subword", tok.vocab, tok.end_id, {}, tokenizer=tok)


@pytest.mark.parametrize("kind", ["byte", "char", "word", "sentencepiece", "huggingface"])
def test_every_kind_of_good_tokenizer_json_loads_back(kind, spm_corpus, tmp_path):
  """The checks refuse no file that training writes: the same vocabulary and ids back."""
  corpus = {
      "byte": lambda: Corpus(
          "text", "byte", tokenizers.ByteTokenizer().vocab, 10, {}, tokenizer=tokenizers.ByteTokenizer()
      ),
      "char": lambda: Corpus(
          "text", "char", ("\n", "t", "h", "e", " ", "<unk>"), 0, {},
          tokenizer=tokenizers.CharTokenizer("text"),
      ),
      "word": lambda: Corpus(
          "text", "word", ("<eos>", "the", "cat", "<unk>"), 0, {},
          tokenizer=tokenizers.LineTokenizer("text"),
      ),
      "sentencepiece": lambda: spm_corpus,
      "huggingface": _hf_corpus,
  }[kind]()  # fmt: skip
  text_vocab.save_tokenizer(corpus, tmp_path)
  saved = text_vocab.load_saved_tokenizer(tmp_path)
  assert (saved.unit, saved.vocab, saved.boundary_id) == (
      corpus.unit,
      tuple(corpus.vocab),
      corpus.boundary_id,
  )
  text = "the cat\nthe hat Köln\n"
  np.testing.assert_array_equal(saved.encode(text), corpus.encode(text))
  text_vocab.check_saved_tokenizer(corpus, tmp_path)


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
  sizes = dict(n_layer=1, d_model=8, n_head=2, d_head=4, d_inner=16, tgt_len=4, mem_len=4)
  config.model.update(sizes)  # config.json's model is the trained one, as training saves it
  wd.save_config(str(workdir), config)
  cfg = tiny_model_config(n_token=corpus.vocab_size, **sizes)
  wd.save_model_config(str(workdir), cfg, "subword", "text")


@pytest.mark.slow
def test_generate_on_a_damaged_tokenizer_json_prints_one_error_line(spm_corpus, tmp_path):
  workdir = tmp_path / "run"
  _text_workdir(workdir, spm_corpus, tmp_path / "gone")
  text_vocab.save_tokenizer(spm_corpus, workdir)
  path = workdir / text_vocab.TOKENIZER_FILE
  path.write_text(path.read_text()[:100])  # cut short
  r = run_main(
      [f"--workdir={workdir}", "--mode=generate", "--prompt=the cat", "--num_tokens=2"], devices=1
  )
  errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  assert len(errors) == 1 and errors[0].startswith(f"error: {path} is damaged ("), r.stderr


# ---------------------------------------------------------------------------
# config.json and model_config.json with a key this version does not know
# ---------------------------------------------------------------------------

NEWER = "written by a newer version of transformer_xl (unknown key {}); upgrade, or remove the key"


def _saved_workdir(tmp_path: Path) -> Path:
  workdir = tmp_path / "run"
  workdir.mkdir()
  wd.save_config(str(workdir), default_config.get_config())
  cfg = tiny_model_config(n_token=50, n_layer=1, d_model=8, d_head=4, d_inner=16)
  wd.save_model_config(str(workdir), cfg, "word", "ptb")
  return workdir


def _edit(path: Path, change) -> None:
  record = json.loads(path.read_text())
  change(record)
  path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda c: c["model"].update(rope_base=10000), "model.rope_base"),
        (lambda c: c["data"].update(new_option=True), "data.new_option"),
        (lambda c: c.update(newsection={"a": 1}), "newsection"),
    ],
)
def test_an_unknown_key_in_config_json_says_newer_version(change, key, tmp_path):
  workdir = _saved_workdir(tmp_path)
  path = workdir / "config.json"
  _edit(path, change)
  with pytest.raises(wd.WorkdirError) as err:
    wd.load_config(str(workdir))
  message = str(err.value)
  assert message == f"{path} was {NEWER.format(key)}.", message


def test_an_unknown_key_in_model_config_json_says_newer_version(tmp_path):
  workdir = _saved_workdir(tmp_path)
  path = workdir / "model_config.json"
  _edit(path, lambda m: m["model"].update(rope_base=10000))
  with pytest.raises(wd.WorkdirError) as err:
    wd.load_model_config(str(workdir))
  assert str(err.value) == f"{path} was {NEWER.format('model.rope_base')}.", str(err.value)


@pytest.mark.parametrize("name", ["config.json", "model_config.json"])
def test_an_unreadable_config_is_still_damaged(name, tmp_path):
  workdir = _saved_workdir(tmp_path)
  load = wd.load_config if name == "config.json" else wd.load_model_config
  path = workdir / name
  good = path.read_text()
  path.write_text(good[: len(good) // 2])  # cut short
  with pytest.raises(wd.WorkdirError, match=f"^{path} is damaged"):
    load(str(workdir))
  # An unknown key beside a wrong value: the file is not otherwise valid.
  path.write_text(good)
  _edit(path, lambda c: c["model"].update(rope_base=1, d_model="wide"))
  with pytest.raises(wd.WorkdirError, match=f"^{path} is damaged") as err:
    load(str(workdir))
  assert "newer version" not in str(err.value)
  # Nested 200,000 deep: json.loads runs out of recursion (a RecursionError, not a ValueError).
  path.write_text("[" * 200_000 + "]" * 200_000)
  with pytest.raises(wd.WorkdirError, match=f"^{path} is damaged"):
    load(str(workdir))


@pytest.mark.parametrize(
    "name, section",
    [("config.json", "model"), ("config.json", "data"), ("model_config.json", "model")],
)
def test_a_config_without_a_section_it_always_has_is_damaged(name, section, tmp_path):
  """Without its "model" section config.json was read as the defaults and
  blamed one of them (or a legacy key) as unknown; it is damaged."""
  workdir = _saved_workdir(tmp_path)
  load = wd.load_config if name == "config.json" else wd.load_model_config
  path = workdir / name
  _edit(path, lambda c: c.pop(section))
  with pytest.raises(wd.WorkdirError) as err:
    load(str(workdir))
  assert str(err.value).startswith(f"{path} is damaged (it has no '{section}' section)")


# ---------------------------------------------------------------------------
# Converter: integer parameters in a .safetensors file; an existing output
# ---------------------------------------------------------------------------


def _convert_cli(*args: str) -> str | None:
  """``python -m transformer_xl.convert ARGS`` in process: None, or its one ``error:`` line."""
  from transformer_xl.convert.__main__ import main

  try:
    main(["transformer_xl.convert", *args])
  except SystemExit as exit_info:
    message = exit_info.code
    assert isinstance(message, str) and message.startswith("error: "), message
    assert "\n" not in message, message
    return message
  return None


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
  """(directory, hparams.json, float32 state dict of random parameters, ModelConfig)."""
  from transformer_xl import convert

  root = tmp_path_factory.mktemp("small_model")
  cfg = tiny_model_config(
      n_token=50, n_layer=1, d_model=8, d_head=4, d_inner=16, tgt_len=4, mem_len=4
  )
  rng = np.random.default_rng(0)
  params = convert.unflatten_params(
      {
          p: rng.normal(size=s).astype(np.float32)
          for p, s in convert.expected_param_shapes(cfg).items()
      }
  )
  hparams = root / "hparams.json"
  hparams.write_text(json.dumps(convert.hparams_from_model_config(cfg)))
  return root, hparams, convert.state_dict_from_params(params, cfg), cfg


WEIGHT = "layers.0.pos_ff.CoreNet.0.weight"


def _relabel(path: Path, name: str, old: str, new: str) -> None:
  """Changes the dtype of tensor ``name`` in a .safetensors header (same length)."""
  raw = path.read_bytes()
  size = int.from_bytes(raw[:8], "little")
  header = json.loads(raw[8 : 8 + size])
  assert header[name]["dtype"] == old
  header[name]["dtype"] = new
  text = json.dumps(header, separators=(",", ":")).encode().ljust(size)
  assert len(text) == size
  path.write_bytes(raw[:8] + text + raw[8 + size :])


@pytest.mark.parametrize("case", ["stored as int32", "float32 relabelled I32"])
def test_integer_parameters_in_safetensors_are_refused(case, small_model, tmp_path):
  import safetensors.numpy

  _, hparams, state, _ = small_model
  path = tmp_path / "model.safetensors"
  if case == "stored as int32":
    tensors = {**state, WEIGHT: np.round(state[WEIGHT] * 100).astype(np.int32)}
    safetensors.numpy.save_file(tensors, str(path))
  else:
    safetensors.numpy.save_file(dict(state), str(path))
    _relabel(path, WEIGHT, "F32", "I32")
  workdir = tmp_path / "wd"
  message = _convert_cli(
      "--from=safetensors", f"--checkpoint={path}", f"--hparams={hparams}", f"--workdir={workdir}"
  )
  assert message is not None, "converted"
  assert str(path) in message and f"{WEIGHT} has dtype int32" in message, message
  assert "float" in message, message
  assert not (workdir / "checkpoints").exists()


@pytest.mark.parametrize("to, name", [("safetensors", "out.safetensors"), ("pytorch", "out.npz")])
def test_export_onto_an_existing_file_needs_overwrite(to, name, small_model, tmp_path):
  from transformer_xl import convert

  _, _, state, cfg = small_model
  workdir = tmp_path / "wd"
  convert.write_workdir(str(workdir), convert.params_from_state_dict(state, cfg), cfg)
  out = tmp_path / name
  hparams = tmp_path / "out.hparams.json"
  out.write_bytes(b"someone's file")
  message = _convert_cli(f"--to={to}", f"--workdir={workdir}", f"--checkpoint={out}")
  assert message == (
      f"error: --checkpoint={out} already exists; pass --overwrite to replace it, or "
      "choose another path."
  ), message
  assert out.read_bytes() == b"someone's file" and not hparams.exists()
  out.unlink()
  hparams.write_text("{}")  # the hparams file beside it is protected alike
  message = _convert_cli(f"--to={to}", f"--workdir={workdir}", f"--checkpoint={out}")
  assert message is not None and f"--hparams={hparams} already exists" in message, message
  assert not out.exists() and hparams.read_text() == "{}"
  out.write_bytes(b"someone's file")
  assert (
      _convert_cli(f"--to={to}", f"--workdir={workdir}", f"--checkpoint={out}", "--overwrite")
      is None
  )
  got = convert.read_state_dict(str(out))
  assert set(got) == set(state)
  for k, v in state.items():
    np.testing.assert_array_equal(got[k], v, err_msg=k)
  assert json.loads(hparams.read_text()) == convert.hparams_from_model_config(cfg)
  # Another format of the same model: the hparams beside it are the same, so they may be shared.
  other = tmp_path / ("out.npz" if to == "safetensors" else "out.pt")
  assert _convert_cli("--to=pytorch", f"--workdir={workdir}", f"--checkpoint={other}") is None
  assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
