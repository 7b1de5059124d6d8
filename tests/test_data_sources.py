"""Tests of transformer_xl.data.sources: finding, fetching and checking source files.

Through ``load_corpus``: missing files fail fast with a message naming the
files, the manual dir, the canonical URL and the checksums; downloads time
out; checksums and archive contents are checked before any tokenisation.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import socket
import threading
import time

import pytest

from transformer_xl.data import DataError, load_corpus, sources
from transformer_xl.data.builders import BUILDERS
from transformer_xl.data.enwik8_text8 import TxlText8
from transformer_xl.data.ptb_wikitext import TxlPtb

from data_samples import _PTB, CHUNK, _enwik8_bytes, _ptb_tgz, _text8_text, _zip


def _with_url(builder, url):
  """builder's SPEC with its source fetched from ``url`` instead."""
  spec = builder.SPEC
  return dataclasses.replace(spec, source=dataclasses.replace(spec.source, url=url))


@pytest.mark.parametrize(
    "name,files,checksum",
    [
        ("enwik8", ["enwik8"], "a1fa5ffddb56f4953e226637dabbb36a"),
        ("text8", ["text8"], "6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7"),
        (
            "ptb",
            ["ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"],
            "f26c4b92c5fdc7b3f8c7cdcb991d8420",
        ),
        ("ptb_char", ["ptb.train.txt"], "8b80168b89c18661a38ef683c0dc3721"),
        (
            "wikitext2",
            ["wiki.train.tokens", "wiki.test.tokens"],
            "781c9418ab9414bd09e4aad825aae752",
        ),
        ("wikitext103", ["wiki.valid.tokens"], "No published checksum"),
    ],
)
def test_missing_files(tmp_path, name, files, checksum):
  manual = tmp_path / "manual"
  spec = BUILDERS[name].SPEC.source
  start = time.monotonic()
  with pytest.raises(DataError) as err:
    load_corpus(name, data_dir=tmp_path / "tfds", manual_dir=manual, download=False)
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
    load_corpus(
        "ptb", data_dir=tmp_path / "tfds", manual_dir=manual, download=False, verify_checksums=False
    )


def test_unreachable_url_fails_fast(tmp_path, monkeypatch):
  """A host that accepts the connection but never answers: no hang."""
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(8)
  port = server.getsockname()[1]
  monkeypatch.setattr(
      TxlPtb, "SPEC", _with_url(TxlPtb, f"http://127.0.0.1:{port}/simple-examples.tgz")
  )
  monkeypatch.setattr(sources, "DOWNLOAD_TIMEOUT_S", 1.0)
  try:
    start = time.monotonic()
    with pytest.raises(DataError) as err:
      load_corpus("ptb", data_dir=tmp_path / "tfds", manual_dir=tmp_path / "manual")
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
    load_corpus("enwik8", data_dir=tmp_path / "tfds", manual_dir=tmp_path / "manual")
  assert time.monotonic() - start < 3 * sources.DOWNLOAD_TIMEOUT_S


def test_download_from_url(tmp_path, monkeypatch):
  """download=True fetches the archive into <data_dir>/downloads and builds."""
  served = tmp_path / "served"
  served.mkdir()
  text = _text8_text(300)
  _zip(served / "text8.zip", {"text8": text.encode()})
  handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
  handler.log_message = lambda *args: None
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  monkeypatch.setattr(
      TxlText8, "SPEC", _with_url(TxlText8, f"http://127.0.0.1:{server.server_port}/text8.zip")
  )
  try:
    corpus = load_corpus(
        "text8",
        data_dir=tmp_path / "tfds",
        manual_dir=tmp_path / "manual",
        verify_checksums=False,
        chunk_size=CHUNK,
    )
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
    load_corpus(
        "ptb", data_dir=tmp_path / "tfds", manual_dir=manual, download=False, verify_checksums=True
    )
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
    load_corpus("enwik8", data_dir=tmp_path / "tfds", manual_dir=manual, download=False)


def test_archive_without_the_member(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  _zip(manual / "wikitext-2-v1.zip", {"wikitext-2/wiki.train.tokens": b"a\n"})
  with pytest.raises(DataError, match="does not contain wikitext-2/wiki.valid"):
    load_corpus(
        "wikitext2",
        data_dir=tmp_path / "tfds",
        manual_dir=manual,
        download=False,
        verify_checksums=False,
    )
