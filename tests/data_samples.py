"""Tiny corpus files in the canonical formats, and helpers shared by the tests.

The data tests (``test_data_*.py``) and the tests that build a small corpus
(``test_score.py``, ``test_configs.py``) take their samples from here: each
builder is fed a tiny file in its canonical archive format and the decoded
streams are compared with an independent tokenisation of the same text.
"""

from __future__ import annotations

import collections
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from transformer_xl.data import ArraySource, load_corpus
from transformer_xl.data.builders import BUILDERS

CHUNK = 64
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TOP = "1-billion-word-language-modeling-benchmark-r13output"
TRAIN_DIR = f"{TOP}/training-monolingual.tokenized.shuffled"
HELDOUT_DIR = f"{TOP}/heldout-monolingual.tokenized.shuffled"
ARCHIVE = f"{TOP}.tar.gz"
URL = f"http://www.statmt.org/lm-benchmark/{ARCHIVE}"


# -- independent reference tokenisation ---------------------------------------


def _lines(text: str) -> list[str]:
  lines = text.split("\n")
  return lines[:-1] if text.endswith("\n") else lines


def _word_symbols(text: str) -> list[str]:
  return [s for line in _lines(text) for s in line.split() + ["<eos>"]]


def _char_symbols(text: str) -> list[str]:
  out = []
  for line in _lines(text):
    out += list("_".join(line.split())) + ["<eos>"]
  return out


def _vocab_from(train_symbols: list[str]) -> list[str]:
  """<eos>, then by descending count, ties by first occurrence."""
  counts = collections.Counter(s for s in train_symbols if s != "<eos>")
  first = {}
  for i, s in enumerate(train_symbols):
    first.setdefault(s, i)
  return ["<eos>"] + sorted(counts, key=lambda s: (-counts[s], first[s]))


def _ids(symbols: list[str], vocab: list[str]) -> np.ndarray:
  index = {s: i for i, s in enumerate(vocab)}
  return np.array([index.get(s, index.get("<unk>")) for s in symbols], np.int32)


def _check_corpus(corpus, name, data_dir, unit, vocab, boundary_id, expected):
  """Compares a loaded Corpus with the expected id streams, record by record."""
  assert corpus.name == name
  assert corpus.unit == unit
  assert list(corpus.vocab) == list(vocab)
  assert corpus.vocab_size == len(vocab)
  assert corpus.boundary_id == boundary_id
  assert set(corpus.splits) == {"train", "valid", "test"}
  # Records as stored: in stream order, all but the last exactly CHUNK long.
  builder = BUILDERS[name](data_dir=data_dir)
  for split, want in expected.items():
    src = corpus.splits[split]
    n = len(want)
    assert src.num_tokens == n
    records = builder.as_data_source(split=split)
    assert len(records) == -(-n // CHUNK) >= 2
    for i in range(len(records)):
      got = records[i]["tokens"]
      assert got.dtype == np.int32
      np.testing.assert_array_equal(got, want[i * CHUNK : (i + 1) * CHUNK])
    full = src.read(0, n)
    assert full.dtype == np.int32 and full.shape == (n,)
    np.testing.assert_array_equal(full, want)
    # Ranges across chunk boundaries, inside one chunk, empty, at the end.
    for start, stop in [
        (CHUNK - 3, CHUNK + 5),
        (1, 2 * CHUNK + 1),
        (CHUNK, 2 * CHUNK),
        (5, 5),
        (n - 1, n),
        (0, n),
    ]:
      stop = min(stop, n)
      start = min(start, stop)
      np.testing.assert_array_equal(src.read(start, stop), want[start:stop])
    with pytest.raises(IndexError):
      src.read(0, n + 1)
    with pytest.raises(IndexError):
      src.read(-1, 2)
    with pytest.raises(IndexError):
      src.read(3, 2)


# -- canonical archives -------------------------------------------------------


def _zip(path: Path, members: dict[str, bytes]) -> Path:
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
    for name, data in members.items():
      zf.writestr(name, data)
  return path


def _tgz(path: Path, members: dict[str, bytes]) -> Path:
  with tarfile.open(path, "w:gz") as tf:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tf.addfile(info, io.BytesIO(data))
  return path


def _enwik8_bytes(n: int = 6000) -> bytes:
  rng = np.random.default_rng(0)
  data = bytearray(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
  data[:256] = bytes(range(256))  # every byte value, incl. non-ASCII
  page = "<page>\n  <title>Città</title>\n".encode()
  data[300 : 300 + len(page)] = page  # UTF-8 text with newlines (id 10)
  return bytes(data)


def _text8_text(n_words: int = 700) -> str:
  rng = np.random.default_rng(1)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
  words = ["".join(rng.choice(letters, rng.integers(1, 9))) for _ in range(n_words)]
  return " " + " ".join(words)


_PTB = {
    "train": (
        " the cat sat on the mat \n the dog <unk> on a log \n"
        " N dogs and N cats \n a cat is not a dog \n"
    )
    * 9
    + " rare words here once quiz bulb \n the end \n",
    "valid": " the cat saw a zebra \n N dogs <unk> \n the end \n" * 5,
    "test": " a dog sat on the cat \n on a mat N times \n" * 6,
}


def _ptb_tgz(manual: Path, texts=_PTB) -> Path:
  manual.mkdir(parents=True, exist_ok=True)
  return _tgz(
      manual / "simple-examples.tgz",
      {f"./simple-examples/data/ptb.{s}.txt": t.encode() for s, t in texts.items()},
  )


_WIKI = {
    "train": (
        " \n = Valkyria Chronicles III = \n \n"
        " Senjō no Valkyria 3 : <unk> Chronicles ( 戦場のヴァルキュリア3 ) , "
        "commonly referred to as Valkyria Chronicles III . \n \n"
        " = = Gameplay = = \n \n"
        " The game 's battle system , the <unk> , is carried over . \n"
    )
    * 6,
    "valid": " \n = Tower Building = \n \n The tower is tall . \n \n" * 8,
    "test": " \n = Robert Boulter = \n \n Robert is an English actor . \n" * 8,
}


def _wiki_zip(manual: Path, top: str, texts=_WIKI) -> Path:
  manual.mkdir(parents=True, exist_ok=True)
  return _zip(
      manual / f"{top}-v1.zip",
      {f"{top}/wiki.{s}.tokens": t.encode("utf-8") for s, t in texts.items()},
  )


# -- One Billion Word shards --------------------------------------------------


def _train_name(i: int) -> str:
  return f"news.en-{i:05d}-of-00100"


def _heldout_name(i: int) -> str:
  return f"news.en.heldout-{i:05d}-of-00050"


# Shards 00001..00003 (shard order matters for the stream), held-out 00000
# (valid and test) and 00001 (must not be used).  Words seen < 3 times in
# train become <UNK>; a tab and repeated spaces are whitespace; "Città" is
# non-ASCII.
_TRAIN = {
    1: (
        "The cat sat on the mat .\n"
        "The dog ate the cat 's food .\n"
        "Città is a city .\n"
        "the  cat\tsat .\n"
    )
    * 2,
    2: (
        "Stocks fell on Monday .\n"
        "The cat sat .\n"
        "A very long sentence with many words that goes on and on and on "
        "and on until it is longer than one segment .\n"
    )
    * 2,
    3: ("zebra\nThe dog sat on the cat .\nMonday is a day .\n") * 3,
}


_HELDOUT = {
    0: ("The cat sat on a zebra .\nAn unseen word appears : aardvark .\nthe dog\n"),
    1: "This shard is not used .\n",
}


def _sentences(text: str) -> list[list[str]]:
  return [line.split() for line in _lines(text)]


def _members(train=(1, 2, 3), heldout=(0, 1)) -> dict[str, bytes]:
  members = {f"{TOP}/README": b"One Billion Word benchmark\n"}
  for i in train:
    members[f"{TRAIN_DIR}/{_train_name(i)}"] = _TRAIN.get(i, "a b c\n").encode("utf-8")
  for i in heldout:
    members[f"{HELDOUT_DIR}/{_heldout_name(i)}"] = _HELDOUT[i].encode("utf-8")
  return members


def _tarball(path: Path, members: dict[str, bytes]) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  with tarfile.open(path, "w:gz") as tf:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tf.addfile(info, io.BytesIO(data))
  return path


def _write_files(manual: Path, members: dict[str, bytes], flat: bool) -> None:
  for name, data in members.items():
    path = manual / (name.rsplit("/", 1)[-1] if flat else name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _load_lm1b(tmp_path, manual, **kwargs):
  """The lm1b corpus built from the files in ``manual`` under ``tmp_path / "tfds"``
  (chunks of 16 tokens, nothing downloaded, checksums not verified unless
  ``kwargs`` say so)."""
  kwargs.setdefault("verify_checksums", False)
  return load_corpus(
      "lm1b",
      data_dir=tmp_path / "tfds",
      manual_dir=manual,
      download=False,
      chunk_size=16,
      **kwargs,
  )


# -- real files ---------------------------------------------------------------


def _real(subdir: str) -> Path:
  path = SHARED_DATA / subdir
  if not path.is_dir():
    pytest.skip(f"{path} does not exist (real corpus files not provided)")
  return path


# -- iterators ----------------------------------------------------------------

BOUNDARY = 7  # the boundary symbol of the evaluation iterators' streams


def _random_stream(n, seed=0):
  return np.random.default_rng(seed).integers(0, 1000, size=n).astype(np.int32)


class RecordingSource:
  """A TokenSource that records every read(start, stop) range."""

  def __init__(self, tokens):
    self._inner = ArraySource(np.asarray(tokens, dtype=np.int32))
    self.reads = []

  @property
  def num_tokens(self):
    return self._inner.num_tokens

  def read(self, start, stop):
    self.reads.append((start, stop))
    return self._inner.read(start, stop)


def _take(it, k):
  return [next(it) for _ in range(k)]


def _assert_batches_equal(a, b):
  assert a.keys() == b.keys()
  for key in a:
    assert a[key].dtype == b[key].dtype, key
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
