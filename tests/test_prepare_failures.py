"""Preparing a dataset when things go wrong: one error line, nothing half-made.

A damaged ``metadata.json`` or ``dataset_info.json`` of a prepared dataset
(cut short, ``{}``, garbage bytes; one whose ``dataset_info.json`` names
files outside its folder), for one's own text and a built-in corpus (PTB
over a tiny archive), is a ``DataError`` naming the folder and saying to
delete it, after which the next load prepares it again; two processes
preparing one corpus in one data dir at once both get the same dataset,
prepared once; a full disk while preparing is one error line that names
the folder and leaves no partial dataset; a training split too short for
one step is a ``UserError`` before anything is compiled.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from transformer_xl import data, errors
from transformer_xl.cli import user_errors
from transformer_xl.data import text_builder
from transformer_xl.data.text_settings import TextSettings

from data_samples import CHUNK, _ptb_tgz
from helpers import REPO, tiny_config

SPLITS = ("train", "valid", "test")


def _text_files(folder: Path, n_lines=(300, 40, 40)) -> Path:
  """Three small text files, one per split."""
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(0)
  words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
  for split, n in zip(SPLITS, n_lines):
    lines = (" ".join(rng.choice(words, size=6)) for _ in range(n))
    (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
  return folder


def _text_settings(folder: Path, **kw) -> TextSettings:
  return TextSettings(
      train_files=str(folder / "train.txt"),
      valid_files=str(folder / "valid.txt"),
      test_files=str(folder / "test.txt"),
      **kw,
  )


class _Corpora:
  """The two kinds of prepared dataset: own text and a built-in corpus (ptb)."""

  def __init__(self, root: Path):
    self.root = root
    self.text = _text_files(root / "text")
    self.manual = root / "manual"
    _ptb_tgz(self.manual)

  def load(self, kind: str, data_dir: Path) -> data.Corpus:
    if kind == "text":
      return text_builder.load_text_corpus(_text_settings(self.text), data_dir=data_dir)
    return data.load_corpus(
        "ptb", data_dir=data_dir, manual_dir=self.manual, verify_checksums=False, chunk_size=CHUNK
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """(corpora, kind -> (data dir, the prepared dataset's folder, its train tokens))."""
  corpora = _Corpora(tmp_path_factory.mktemp("corpora"))
  out = {}
  for kind in ("text", "ptb"):
    data_dir = corpora.root / f"tfds_{kind}"
    corpus = corpora.load(kind, data_dir)
    (info,) = data_dir.rglob("dataset_info.json")
    out[kind] = (data_dir, info.parent, corpus.splits["train"].read(0, 50))
  return corpora, out


def _copy(prepared, kind: str, tmp_path: Path) -> tuple[Path, Path]:
  """A copy of the prepared data dir of ``kind``: (data dir, dataset folder)."""
  _, out = prepared
  data_dir, folder, _ = out[kind]
  copy = tmp_path / "tfds"
  shutil.copytree(data_dir, copy)
  return copy, copy / folder.relative_to(data_dir)


def _damage(path: Path, how: str) -> None:
  raw = path.read_bytes()
  path.write_bytes(
      {"cut short": raw[: len(raw) // 2], "{}": b"{}", "garbage": b"\xff\xfe\x00garbage\x9c"}[how]
  )


def _one_error_line(load) -> str:
  """What the command line prints for ``load()``'s error: its ``error: ...`` line."""
  with pytest.raises(SystemExit) as exit_info:
    with user_errors.report(debug=False):
      load()
  message = str(exit_info.value.code)
  assert message.startswith("error: ") and "\n" not in message, message
  return message


KINDS = ("text", "ptb")
DAMAGES = ("cut short", "{}", "garbage")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("file", ["metadata.json", "dataset_info.json"])
def test_a_damaged_prepared_dataset_is_one_error_that_says_to_delete_it(
    prepared, kind, damage, file, tmp_path
):
  corpora, out = prepared
  data_dir, folder = _copy(prepared, kind, tmp_path)
  _damage(folder / file, damage)
  with pytest.raises(errors.UserError) as err:
    corpora.load(kind, data_dir)
  assert isinstance(err.value, data.DataError)
  message = str(err.value)
  assert f"The prepared dataset in {folder} is damaged" in message, message
  assert file in message and f"rm -r {folder}" in message, message
  assert _one_error_line(lambda: corpora.load(kind, data_dir)) == f"error: {message}"
  # The advice works: deleted, it is prepared again, with the same tokens.
  shutil.rmtree(folder)
  again = corpora.load(kind, data_dir)
  np.testing.assert_array_equal(again.splits["train"].read(0, 50), out[kind][2])


@pytest.mark.parametrize(
    "entries",
    [
        {"tokenizer": {"kind": "sentencepiece", "model": "bm90IGEgbW9kZWw="}},  # not a model
        {"tokenizer": {"kind": "sentencepiece", "model": "%%"}},  # not base64
        {"tokenizer": "word"},
        {"num_documents": {"train": 3}},
        {"num_tokens": {"train": "many", "valid": 1, "test": 1}},
        {"vocab": "abc"},
        {"chunk_size": 0},
    ],
)
def test_metadata_entries_that_cannot_be_used_are_damage_too(prepared, entries, tmp_path):
  corpora, _ = prepared
  data_dir, folder = _copy(prepared, "text", tmp_path)
  md = json.loads((folder / "metadata.json").read_text())
  (folder / "metadata.json").write_text(json.dumps({**md, **entries}))
  with pytest.raises(data.DataError) as err:
    corpora.load("text", data_dir)
  message = str(err.value)
  assert f"The prepared dataset in {folder} is damaged: " in message, message
  assert "metadata.json" in message and "\n" not in message, message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("splits", ["missing", "empty", "no valid"])
def test_a_dataset_info_without_its_splits_is_refused_as_damaged(prepared, kind, splits, tmp_path):
  """A ``dataset_info.json`` that parses but lists no split (or not every
  one) was a ``KeyError`` traceback; it is damage, named, with the fix."""
  corpora, _ = prepared
  data_dir, folder = _copy(prepared, kind, tmp_path)
  info_path = folder / "dataset_info.json"
  info = json.loads(info_path.read_text())
  if splits == "missing":
    del info["splits"]
  else:
    info["splits"] = [s for s in info["splits"] if splits == "no valid" and s["name"] != "valid"]
  info_path.write_text(json.dumps(info))
  message = _one_error_line(lambda: corpora.load(kind, data_dir))
  assert f"The prepared dataset in {folder} is damaged" in message, message
  assert f"rm -r {folder}" in message, message
  if splits == "no valid":
    assert "split 'valid' cannot be opened" in message, message
  else:
    assert "its dataset_info.json lists no split" in message, message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_a_dataset_info_naming_files_outside_its_folder_is_refused_as_damaged(
    prepared, kind, where, tmp_path
):
  """tfds would read the split files wherever dataset_info.json's templates
  point: the records of a prepared dataset are the files of its folder."""
  corpora, _ = prepared
  data_dir, folder = _copy(prepared, kind, tmp_path)
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  for f in folder.glob("*.array_record*"):
    shutil.copy(f, elsewhere / f.name)  # the same records, outside the folder
  info_path = folder / "dataset_info.json"
  info = json.loads(info_path.read_text())
  prefix = os.path.relpath(elsewhere, folder) if where == "relative" else str(elsewhere)
  for split in info["splits"]:
    split["filepathTemplate"] = f"{prefix}/{split['filepathTemplate']}"
  info_path.write_text(json.dumps(info))
  with pytest.raises(data.DataError) as err:
    corpora.load(kind, data_dir)
  message = str(err.value)
  assert f"The prepared dataset in {folder} is damaged" in message, message
  assert "outside" in message and str(elsewhere.name) in message, message


# -- two preparations at once ---------------------------------------------------------------

_RACER = textwrap.dedent("""
    import hashlib, json, sys, time
    from pathlib import Path
    from transformer_xl.data import load_corpus, storage, text_builder, text_settings
    kind, root, data_dir, go = sys.argv[1:5]
    prepared = []
    original = storage.TokenStreamBuilder.download_and_prepare

    def slow(self, *args, **kwargs):  # a preparation long enough for the other to arrive
      prepared.append(1)
      time.sleep(3)
      return original(self, *args, **kwargs)

    storage.TokenStreamBuilder.download_and_prepare = slow
    while not Path(go).exists():  # both start together
      time.sleep(0.01)
    if kind == "text":
      settings = text_settings.TextSettings(
          **{f"{s}_files": f"{root}/text/{s}.txt" for s in ("train", "valid", "test")}
      )
      corpus = text_builder.load_text_corpus(settings, data_dir=data_dir)
    else:
      corpus = load_corpus(
          "ptb", data_dir=data_dir, manual_dir=f"{root}/manual", verify_checksums=False,
          chunk_size=64,
      )
    digest = {
        s: hashlib.sha256(src.read(0, src.num_tokens).tobytes()).hexdigest()
        for s, src in corpus.splits.items()
    }
    print(json.dumps({"prepared": len(prepared), "digest": digest, "vocab": list(corpus.vocab)}))
    """)


@pytest.mark.parametrize("kind", KINDS)
def test_two_preparations_of_one_corpus_at_once_both_get_the_one_dataset(prepared, kind, tmp_path):
  corpora, out = prepared
  data_dir, go = tmp_path / "tfds", tmp_path / "go"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
  procs = [
      subprocess.Popen(
          [sys.executable, "-c", _RACER, kind, str(corpora.root), str(data_dir), str(go)],
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for _ in range(2)
  ]
  go.touch()
  results = []
  for proc in procs:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    results.append(json.loads(stdout.strip().splitlines()[-1]))
  # The winner prepared it; the other waited (its download_and_prepare never ran) and used it.
  assert sorted(r["prepared"] for r in results) == [0, 1], results
  assert results[0]["digest"] == results[1]["digest"]
  assert results[0]["vocab"] == results[1]["vocab"]
  assert len(list(data_dir.rglob("dataset_info.json"))) == 1
  assert not list(data_dir.rglob("incomplete.*"))
  expected = out[kind][2]
  np.testing.assert_array_equal(corpora.load(kind, data_dir).splits["train"].read(0, 50), expected)


def test_a_preparation_waits_for_the_lock_and_then_uses_the_dataset(prepared, tmp_path, reports):
  """In one process: the lock is held (as by another run) while the dataset
  appears; the waiting preparation says that it waits, then loads it
  without preparing."""
  import filelock

  corpora, out = prepared
  data_dir = tmp_path / "tfds"
  builder = text_builder.TxlText(_text_settings(corpora.text), data_dir=data_dir)
  assert not builder.is_prepared()
  lock_path = Path(builder.lock_path())
  folder = Path(builder.data_dir).relative_to(data_dir)  # txl_text/<fingerprint>/1.0.0
  assert str(lock_path) == f"{data_dir / '.locks' / folder}.lock"
  lock_path.parent.mkdir(parents=True, exist_ok=True)
  held, go = threading.Event(), threading.Event()

  def other_run():  # holds the lock while its dataset appears, then releases it
    holder = filelock.FileLock(str(lock_path), thread_local=False)
    with holder:
      held.set()
      go.wait(timeout=60)
      time.sleep(1.0)
      shutil.copytree(out["text"][1], builder.data_dir)

  thread = threading.Thread(target=other_run)
  thread.start()
  held.wait(timeout=60)
  go.set()
  try:
    builder.prepare()
  finally:
    thread.join()
  assert f"Waiting for another run that prepares the dataset in {builder.data_dir}" in reports.text
  np.testing.assert_array_equal(builder.as_corpus().splits["train"].read(0, 50), out["text"][2])


# -- a full disk ----------------------------------------------------------------------------


def _left_behind(data_dir: Path, tmp_dir: Path) -> list[str]:
  return sorted(
      str(p)
      for p in [
          *data_dir.rglob("dataset_info.json"),
          *data_dir.rglob("*.array_record*"),
          *data_dir.rglob("incomplete.*"),
          *tmp_dir.glob("txl_text_*"),
      ]
  )


@pytest.fixture
def small_disk(tmp_path):
  """A 256 KiB tmpfs (root only), unmounted afterwards."""
  disk = tmp_path / "disk"
  disk.mkdir()
  if (
      os.geteuid() != 0
      or subprocess.run(
          ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True
      ).returncode
  ):
    pytest.skip("needs root and mount -t tmpfs")
  yield disk
  subprocess.run(["umount", str(disk)], check=False)


def _big_text(folder: Path) -> Path:
  """About 1.2 MB of training text (5 MB of byte tokens): more than the small disk holds."""
  _text_files(folder, n_lines=(30000, 40, 40))
  return folder


@pytest.mark.parametrize("full", ["data_dir", "TMPDIR"])
def test_a_full_disk_while_preparing_text_is_one_error_and_leaves_nothing(
    small_disk, full, tmp_path, monkeypatch
):
  folder = _big_text(tmp_path / "text")
  data_dir = small_disk / "tfds" if full == "data_dir" else tmp_path / "tfds"
  tmp_dir = tmp_path / "tmp" if full == "data_dir" else small_disk
  tmp_dir.mkdir(exist_ok=True)
  monkeypatch.setattr("tempfile.tempdir", str(tmp_dir))
  load = lambda: text_builder.load_text_corpus(
      _text_settings(folder, tokenizer="byte"), data_dir=data_dir
  )
  with pytest.raises(errors.UserError) as err:
    load()
  message = str(err.value)
  assert "no space left on the device" in message, message
  if full == "data_dir":
    assert "set data.data_dir" in message and str(data_dir) in message, message
  else:
    assert "TMPDIR" in message and str(small_disk) in message, message
  assert "Nothing of the unfinished dataset was kept" in message, message
  assert _left_behind(data_dir, tmp_dir) == []
  assert _one_error_line(load) == f"error: {message}"
  assert _left_behind(data_dir, tmp_dir) == []


def _array_record_full(*args, **kwargs):
  """What array_record raises on a full disk (seen on a 256 KiB tmpfs)."""
  raise RuntimeError(
      'Failed to finalize writing of split "train": write() failed: No space left on device; '
      "writing /x/incomplete.ABC_1.0.0/txl_text-train.array_record-00000-of-00001; at byte "
      "262144; Failed to close chunk_writer"
  )


@pytest.mark.parametrize("kind", KINDS)
def test_a_full_disk_reported_by_the_record_writer_is_one_error_line(
    prepared, kind, tmp_path, monkeypatch
):
  """The writer's RuntimeError as array_record raises it (any user, no mount)."""
  from tensorflow_datasets.core import file_adapters

  corpora, _ = prepared
  monkeypatch.setattr(
      file_adapters.ArrayRecordFileAdapter, "write_examples", classmethod(_array_record_full)
  )
  data_dir = tmp_path / "tfds"
  with pytest.raises(data.DataError) as err:
    corpora.load(kind, data_dir)
  message = str(err.value)
  assert "no space left on the device" in message and "set data.data_dir" in message, message
  assert "\n" not in message
  assert _left_behind(data_dir, tmp_path) == []


def test_a_full_temporary_disk_reported_as_an_os_error_names_the_folder(
    prepared, tmp_path, monkeypatch
):
  """ENOSPC from the temporary token file (any user, no mount)."""
  corpora, _ = prepared
  monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

  real_open = open

  class Full:  # a file whose writes find the disk full

    def __init__(self, f):
      self._f = f

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self._f.close()

    def write(self, b):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  def full_open(path, mode="r", *args, **kwargs):
    f = real_open(path, mode, *args, **kwargs)
    return Full(f) if str(path).endswith(".int32") and "a" in mode else f

  monkeypatch.setattr(text_builder, "open", full_open, raising=False)
  with pytest.raises(data.DataError) as err:
    corpora.load("text", tmp_path / "tfds")
  message = str(err.value)
  assert "no space left on the device" in message and "TMPDIR" in message, message
  assert str(tmp_path) in message
  assert _left_behind(tmp_path / "tfds", tmp_path) == []


# -- a training split too short for one step ------------------------------------------------


def _short_corpus(n_train: int) -> data.Corpus:
  stream = lambda n: data.ArraySource(np.arange(n, dtype=np.int32) % 16)
  return data.Corpus(
      name="short",
      unit="word",
      vocab=[f"w{i}" for i in range(16)],
      boundary_id=0,
      splits={"train": stream(n_train), "valid": stream(100), "test": stream(100)},
  )


def test_a_training_split_too_short_for_one_step_is_a_user_error_before_compiling(
    tmp_path, monkeypatch
):
  from transformer_xl import sharding
  from transformer_xl.training import train

  config = tiny_config(num_steps=4, eval_every=0)  # global_batch 8, tgt_len 6: 56 tokens a step
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)

  def never(*args, **kwargs):
    raise AssertionError("the train step was built")

  monkeypatch.setattr(train, "make_train_step", never)
  with pytest.raises(errors.UserError) as err:
    train.train_and_evaluate(config, str(tmp_path / "wd"), _short_corpus(40), mesh)
  message = str(err.value)
  assert "the training split has 40 tokens, too few for one training step" in message, message
  assert "train.global_batch" in message and "model.tgt_len" in message, message
  assert isinstance(err.value, ValueError)  # kept: except ValueError code still catches it
  assert "\n" not in message
  assert not (tmp_path / "wd" / "config.json").exists()


def test_a_training_split_too_short_from_the_command_line_is_one_error_line(tmp_path):
  """``--mode=train`` (``cli.modes.run``) on own text of 30 words."""
  from transformer_xl.cli import modes

  folder = _text_files(tmp_path / "text", n_lines=(5, 5, 5))
  config = tiny_config(num_steps=4, eval_every=0)
  config.data.update(
      dataset="text",
      train_files=str(folder / "train.txt"),
      valid_files=str(folder / "valid.txt"),
      test_files=str(folder / "test.txt"),
      data_dir=str(tmp_path / "tfds"),
  )
  with pytest.raises(SystemExit) as exit_info:
    modes.run(modes.Request(mode="train", workdir=str(tmp_path / "wd"), config=config))
  message = str(exit_info.value.code)
  assert message.startswith("error: ") and "\n" not in message, message
  assert "the training split has 35 tokens, too few for one training step" in message, message
