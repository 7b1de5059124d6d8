"""Tests of transformer_xl.datasets: tfds token-stream builders and load_corpus.

Each builder is fed a tiny file in its canonical archive format and the
decoded streams are compared with an independent tokenisation of the same
text.  A small chunk size makes every split span several records.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import http.server
import io
import socket
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from transformer_xl.datasets import (CORPUS_NAMES, ArraySource, DataError,
                                     load_corpus)
from transformer_xl.datasets import builders, sources

CHUNK = 64
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


# -- independent reference tokenisation -------------------------------------


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
  builder = builders.BUILDERS[name](data_dir=data_dir)
  for split, want in expected.items():
    src = corpus.splits[split]
    n = len(want)
    assert src.num_tokens == n
    records = builder.as_data_source(split=split)
    assert len(records) == -(-n // CHUNK) >= 2
    for i in range(len(records)):
      got = records[i]["tokens"]
      assert got.dtype == np.int32
      np.testing.assert_array_equal(got, want[i * CHUNK:(i + 1) * CHUNK])
    full = src.read(0, n)
    assert full.dtype == np.int32 and full.shape == (n,)
    np.testing.assert_array_equal(full, want)
    # Ranges across chunk boundaries, inside one chunk, empty, at the end.
    for start, stop in [(CHUNK - 3, CHUNK + 5), (1, 2 * CHUNK + 1),
                        (CHUNK, 2 * CHUNK), (5, 5), (n - 1, n), (0, n)]:
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
  page = "<page>\n  <title>Città</title>\n".encode("utf-8")
  data[300:300 + len(page)] = page  # UTF-8 text with newlines (id 10)
  return bytes(data)


def _text8_text(n_words: int = 700) -> str:
  rng = np.random.default_rng(1)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
  words = ["".join(rng.choice(letters, rng.integers(1, 9)))
           for _ in range(n_words)]
  return " " + " ".join(words)


_PTB = {
    "train": (" the cat sat on the mat \n the dog <unk> on a log \n"
              " N dogs and N cats \n a cat is not a dog \n") * 9
             + " rare words here once quiz bulb \n the end \n",
    "valid": " the cat saw a zebra \n N dogs <unk> \n the end \n" * 5,
    "test": " a dog sat on the cat \n on a mat N times \n" * 6,
}


def _ptb_tgz(manual: Path, texts=_PTB) -> Path:
  manual.mkdir(parents=True, exist_ok=True)
  return _tgz(manual / "simple-examples.tgz", {
      f"./simple-examples/data/ptb.{s}.txt": t.encode()
      for s, t in texts.items()
  })


_WIKI = {
    "train": (" \n = Valkyria Chronicles III = \n \n"
              " Senjō no Valkyria 3 : <unk> Chronicles ( 戦場のヴァルキュリア3 ) , "
              "commonly referred to as Valkyria Chronicles III . \n \n"
              " = = Gameplay = = \n \n"
              " The game 's battle system , the <unk> , is carried over . \n") * 6,
    "valid": " \n = Tower Building = \n \n The tower is tall . \n \n" * 8,
    "test": " \n = Robert Boulter = \n \n Robert is an English actor . \n" * 8,
}


def _wiki_zip(manual: Path, top: str, texts=_WIKI) -> Path:
  manual.mkdir(parents=True, exist_ok=True)
  return _zip(manual / f"{top}-v1.zip", {
      f"{top}/wiki.{s}.tokens": t.encode("utf-8") for s, t in texts.items()
  })


# -- one test per builder -----------------------------------------------------


@pytest.mark.parametrize("as_archive", [True, False])
def test_enwik8(tmp_path, as_archive):
  data = _enwik8_bytes()
  manual = tmp_path / "manual"
  manual.mkdir()
  if as_archive:
    _zip(manual / "enwik8.zip", {"enwik8": data})
  else:
    (manual / "enwik8").write_bytes(data)
  corpus = load_corpus("enwik8", data_dir=tmp_path / "tfds", manual_dir=manual,
                       verify_checksums=False, chunk_size=CHUNK)
  ids = np.frombuffer(data, np.uint8).astype(np.int32)
  k = len(data) // 20  # 5% valid, 5% test (90M/5M/5M on the real file)
  expected = {"train": ids[:-2 * k], "valid": ids[-2 * k:-k], "test": ids[-k:]}
  assert len(expected["train"]) == 5400
  _check_corpus(corpus, "enwik8", tmp_path / "tfds", "byte",
                [chr(i) for i in range(256)], 10, expected)
  text = "".join(corpus.vocab[t] for t in corpus.splits["train"].read(0, 400))
  assert text.encode("latin-1") == data[:400]


def test_text8(tmp_path):
  text = _text8_text()
  manual = tmp_path / "manual"
  manual.mkdir()
  _zip(manual / "text8.zip", {"text8": text.encode("ascii")})
  corpus = load_corpus("text8", data_dir=tmp_path / "tfds", manual_dir=manual,
                       verify_checksums=False, chunk_size=CHUNK)
  alphabet = " abcdefghijklmnopqrstuvwxyz"
  ids = np.array([alphabet.index(c) for c in text], np.int32)
  k = len(text) // 20
  expected = {"train": ids[:-2 * k], "valid": ids[-2 * k:-k], "test": ids[-k:]}
  _check_corpus(corpus, "text8", tmp_path / "tfds", "char", list(alphabet), 0,
                expected)


def test_text8_rejects_other_characters(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "text8").write_bytes(b" anarchism originated\nas a term " * 20)
  with pytest.raises(DataError, match="byte 10 at offset 21"):
    load_corpus("text8", data_dir=tmp_path / "tfds", manual_dir=manual,
                download=False, verify_checksums=False)


def test_ptb(tmp_path):
  manual = tmp_path / "manual"
  _ptb_tgz(manual)
  corpus = load_corpus("ptb", data_dir=tmp_path / "tfds", manual_dir=manual,
                       verify_checksums=False, chunk_size=CHUNK)
  symbols = {s: _word_symbols(t) for s, t in _PTB.items()}
  vocab = _vocab_from(symbols["train"])
  assert vocab[:3] == ["<eos>", "the", "a"]  # "the" and "a" tie: first wins
  assert "zebra" not in vocab  # valid-only word -> <unk>
  expected = {s: _ids(sym, vocab) for s, sym in symbols.items()}
  # valid: "saw", "zebra" (not in train) and the literal <unk>, 5 times.
  assert (expected["valid"] == vocab.index("<unk>")).sum() == 15
  _check_corpus(corpus, "ptb", tmp_path / "tfds", "word", vocab, 0, expected)


def test_ptb_char(tmp_path):
  manual = tmp_path / "manual"
  _ptb_tgz(manual)
  corpus = load_corpus("ptb_char", data_dir=tmp_path / "tfds",
                       manual_dir=manual, verify_checksums=False,
                       chunk_size=CHUNK)
  symbols = {s: _char_symbols(t) for s, t in _PTB.items()}
  assert symbols["train"][:9] == ["t", "h", "e", "_", "c", "a", "t", "_", "s"]
  vocab = _vocab_from(symbols["train"])
  expected = {s: _ids(sym, vocab) for s, sym in symbols.items()}
  _check_corpus(corpus, "ptb_char", tmp_path / "tfds", "char", vocab,
                vocab.index("<eos>"), expected)


@pytest.mark.parametrize("name,top", [("wikitext2", "wikitext-2"),
                                      ("wikitext103", "wikitext-103")])
def test_wikitext(tmp_path, name, top):
  manual = tmp_path / "manual"
  _wiki_zip(manual, top)
  corpus = load_corpus(name, data_dir=tmp_path / "tfds", manual_dir=manual,
                       verify_checksums=False, chunk_size=CHUNK)
  symbols = {s: _word_symbols(t) for s, t in _WIKI.items()}
  vocab = _vocab_from(symbols["train"])
  expected = {s: _ids(sym, vocab) for s, sym in symbols.items()}
  # A blank line (" ") is one <eos>: the stream starts
  # <eos> = Valkyria Chronicles III = <eos> <eos>.
  assert list(expected["train"][:2]) == [0, vocab.index("=")]
  assert list(expected["train"][6:8]) == [0, 0]
  assert "戦場のヴァルキュリア3" in vocab
  _check_corpus(corpus, name, tmp_path / "tfds", "word", vocab, 0, expected)


def test_oov_without_unk_is_an_error(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "wiki.train.tokens").write_text(" a b c \n" * 40)
  (manual / "wiki.valid.tokens").write_text(" a b \n a zebra \n")
  (manual / "wiki.test.tokens").write_text(" c \n")
  with pytest.raises(DataError, match="'zebra' is not in the vocabulary"):
    load_corpus("wikitext2", data_dir=tmp_path / "tfds", manual_dir=manual,
                download=False, verify_checksums=False)


# -- load_corpus behaviour ----------------------------------------------------


def test_prepared_dataset_loads_without_sources(tmp_path):
  manual = tmp_path / "manual"
  archive = _ptb_tgz(manual)
  first = load_corpus("ptb", data_dir=tmp_path / "tfds", manual_dir=manual,
                      verify_checksums=False, chunk_size=CHUNK)
  archive.unlink()
  start = time.monotonic()
  again = load_corpus("ptb", data_dir=tmp_path / "tfds", download=False,
                      chunk_size=4 * CHUNK)  # ignored: stored chunk size wins
  assert time.monotonic() - start < 10
  assert again.vocab == first.vocab
  assert again.splits["train"].chunk_size == CHUNK
  for split in ("train", "valid", "test"):
    n = first.splits[split].num_tokens
    np.testing.assert_array_equal(again.splits[split].read(0, n),
                                  first.splits[split].read(0, n))


def test_unknown_name():
  with pytest.raises(ValueError, match="valid names: enwik8, text8, ptb"):
    load_corpus("ptb_word")
  assert set(CORPUS_NAMES) == set(builders.BUILDERS)
  assert {b.name for b in builders.BUILDERS.values()} == {
      "txl_enwik8", "txl_text8", "txl_ptb", "txl_ptb_char", "txl_wikitext2",
      "txl_wikitext103", "txl_lm1b"}


@pytest.mark.parametrize("name,files,checksum", [
    ("enwik8", ["enwik8"], "a1fa5ffddb56f4953e226637dabbb36a"),
    ("text8", ["text8"],
     "6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7"),
    ("ptb", ["ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"],
     "f26c4b92c5fdc7b3f8c7cdcb991d8420"),
    ("ptb_char", ["ptb.train.txt"], "8b80168b89c18661a38ef683c0dc3721"),
    ("wikitext2", ["wiki.train.tokens", "wiki.test.tokens"],
     "781c9418ab9414bd09e4aad825aae752"),
    ("wikitext103", ["wiki.valid.tokens"], "No published checksum"),
])
def test_missing_files(tmp_path, name, files, checksum):
  manual = tmp_path / "manual"
  spec = builders.BUILDERS[name].SOURCE
  start = time.monotonic()
  with pytest.raises(DataError) as err:
    load_corpus(name, data_dir=tmp_path / "tfds", manual_dir=manual,
                download=False)
  assert time.monotonic() - start < 5
  message = str(err.value)
  for piece in files + [str(manual), spec.archive, spec.url, checksum]:
    assert piece in message
  assert not (tmp_path / "tfds" / f"txl_{name}").exists()


def test_missing_default_manual_dir_is_named(tmp_path):
  with pytest.raises(DataError) as err:
    load_corpus("ptb", data_dir=tmp_path / "tfds", download=False)
  assert str(tmp_path / "tfds" / "downloads" / "manual") in str(err.value)


def test_partial_extracted_files_name_the_missing_one(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "ptb.train.txt").write_text(_PTB["train"])
  (manual / "ptb.valid.txt").write_text(_PTB["valid"])
  with pytest.raises(DataError, match=r"ptb\.test\.txt not found"):
    load_corpus("ptb", data_dir=tmp_path / "tfds", manual_dir=manual,
                download=False, verify_checksums=False)


def test_unreachable_url_fails_fast(tmp_path, monkeypatch):
  """A host that accepts the connection but never answers: no hang."""
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(8)
  port = server.getsockname()[1]
  spec = builders.TxlPtb.SOURCE
  monkeypatch.setattr(builders.TxlPtb, "SOURCE", dataclasses.replace(
      spec, url=f"http://127.0.0.1:{port}/simple-examples.tgz"))
  monkeypatch.setattr(sources, "DOWNLOAD_TIMEOUT_S", 1.0)
  try:
    start = time.monotonic()
    with pytest.raises(DataError) as err:
      load_corpus("ptb", data_dir=tmp_path / "tfds",
                  manual_dir=tmp_path / "manual")
    assert time.monotonic() - start < 5
  finally:
    server.close()
  message = str(err.value)
  assert f"Downloading http://127.0.0.1:{port}/" in message
  assert "ptb.train.txt" in message and str(tmp_path / "manual") in message
  assert not list((tmp_path / "tfds" / "downloads").glob("*.part"))


def test_canonical_url_fails_fast(tmp_path):
  """The real URL: unreachable here, so an error within seconds.

  Skipped where the host answers, so that the test never downloads 36 MB.
  """
  try:
    socket.create_connection(("mattmahoney.net", 80), timeout=2).close()
    pytest.skip("mattmahoney.net is reachable; would download the real file")
  except OSError:
    pass
  start = time.monotonic()
  with pytest.raises(DataError, match="Downloading http://mattmahoney.net"):
    load_corpus("enwik8", data_dir=tmp_path / "tfds",
                manual_dir=tmp_path / "manual")
  assert time.monotonic() - start < 3 * sources.DOWNLOAD_TIMEOUT_S


def test_download_from_url(tmp_path, monkeypatch):
  """download=True fetches the archive into <data_dir>/downloads and builds."""
  served = tmp_path / "served"
  served.mkdir()
  text = _text8_text(300)
  _zip(served / "text8.zip", {"text8": text.encode()})
  handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                              directory=str(served))
  handler.log_message = lambda *args: None
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  spec = builders.TxlText8.SOURCE
  monkeypatch.setattr(builders.TxlText8, "SOURCE", dataclasses.replace(
      spec, url=f"http://127.0.0.1:{server.server_port}/text8.zip"))
  try:
    corpus = load_corpus("text8", data_dir=tmp_path / "tfds",
                         manual_dir=tmp_path / "manual",
                         verify_checksums=False, chunk_size=CHUNK)
  finally:
    server.shutdown()
    server.server_close()
  assert (tmp_path / "tfds" / "downloads" / "text8.zip").is_file()
  k = len(text) // 20
  assert corpus.splits["test"].num_tokens == k
  got = corpus.splits["test"].read(0, k)
  assert "".join(corpus.vocab[t] for t in got) == text[-k:]


def test_checksum_mismatch(tmp_path):
  manual = tmp_path / "manual"
  _ptb_tgz(manual)
  with pytest.raises(DataError) as err:
    load_corpus("ptb", data_dir=tmp_path / "tfds", manual_dir=manual,
                download=False, verify_checksums=True)
  message = str(err.value)
  actual = __import__("hashlib").md5(_PTB["train"].encode()).hexdigest()
  assert "ptb.train.txt" in message
  assert "f26c4b92c5fdc7b3f8c7cdcb991d8420" in message and actual in message
  assert not (tmp_path / "tfds" / "txl_ptb").exists()


def test_size_mismatch_enwik8(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  _zip(manual / "enwik8.zip", {"enwik8": _enwik8_bytes(1000)})
  with pytest.raises(DataError, match="expected size 100000000, got 1000"):
    load_corpus("enwik8", data_dir=tmp_path / "tfds", manual_dir=manual,
                download=False)


def test_archive_without_the_member(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  _zip(manual / "wikitext-2-v1.zip", {"wikitext-2/wiki.train.tokens": b"a\n"})
  with pytest.raises(DataError, match="does not contain wikitext-2/wiki.valid"):
    load_corpus("wikitext2", data_dir=tmp_path / "tfds", manual_dir=manual,
                download=False, verify_checksums=False)


def test_chunked_source_checks_records():
  records = [{"tokens": np.arange(4, dtype=np.int32)},
             {"tokens": np.arange(3, dtype=np.int32)}]
  with pytest.raises(DataError, match="2 records stored, expected 3"):
    builders.ChunkedSource(records, num_tokens=9, chunk_size=4)
  src = builders.ChunkedSource(records, num_tokens=6, chunk_size=4)
  with pytest.raises(DataError, match="record 1 holds 3 tokens, expected 2"):
    src.read(0, 6)
  np.testing.assert_array_equal(src.read(1, 3), [1, 2])
  np.testing.assert_array_equal(ArraySource(np.arange(6)).read(2, 5), [2, 3, 4])


# -- real files ---------------------------------------------------------------


def _real(subdir: str) -> Path:
  path = SHARED_DATA / subdir
  if not path.is_dir():
    pytest.skip(f"{path} does not exist (real corpus files not provided)")
  return path


def test_real_ptb(tmp_path):
  start = time.monotonic()
  corpus = load_corpus("ptb", data_dir=tmp_path, manual_dir=_real("ptb"),
                       download=False, verify_checksums=True)
  print(f"real PTB build: {time.monotonic() - start:.1f} s")
  assert {s: src.num_tokens for s, src in corpus.splits.items()} == {
      "train": 929_589, "valid": 73_760, "test": 82_430}
  assert corpus.vocab_size == 10_000
  assert corpus.vocab[corpus.boundary_id] == "<eos>"
  first = corpus.splits["valid"].read(0, 8)
  assert [corpus.vocab[t] for t in first] == [
      "consumers", "may", "want", "to", "move", "their", "telephones", "a"]


def test_real_wikitext2(tmp_path):
  start = time.monotonic()
  corpus = load_corpus("wikitext2", data_dir=tmp_path,
                       manual_dir=_real("wikitext-2"), download=False,
                       verify_checksums=True)
  print(f"real WikiText-2 build: {time.monotonic() - start:.1f} s")
  assert {s: src.num_tokens for s, src in corpus.splits.items()} == {
      "train": 2_088_628, "valid": 217_646, "test": 245_569}
  assert corpus.vocab_size == 33_278
  assert [corpus.vocab[t] for t in corpus.splits["test"].read(0, 6)] == [
      "<eos>", "=", "Robert", "<unk>", "=", "<eos>"]
