"""transformer_xl.data.download.fetch: the one downloader, against a local HTTP server.

A server on 127.0.0.1 serves one file; it can honour or ignore a Range
request, cut a response short, answer an HTTP error, and logs every GET
with its Range header.  A socket that accepts connections but never
answers, and a name lookup that hangs, stand for a dead host and a dead
name server.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time

import pytest
from http_server import FileServer

from transformer_xl import errors
from transformer_xl.data import download, sources

BODY = bytes(range(256)) * 40  # 10,240 bytes


PATH = "/file.bin"


@pytest.fixture
def server():
  """BODY at PATH (``file_url``)."""
  s = FileServer({PATH: BODY})
  yield s
  s.close()


def file_url(server: FileServer) -> str:
  return server.url + PATH


@pytest.fixture
def silent_port():
  """A port that accepts connections (the kernel's backlog) and never answers."""
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  sock.listen(8)
  yield sock.getsockname()[1]
  sock.close()


def interrupted(server, dest) -> bytes:
  """Leaves the ``.part`` (and its record) of a run cut short after half the file."""
  server.faults[PATH].append("truncate")
  with pytest.raises(download.DownloadError):
    download.fetch(file_url(server), dest, tries=1, progress=False)
  part = dest.with_name(dest.name + ".part")
  assert part.read_bytes() == BODY[: len(BODY) // 2] and not dest.exists()
  return part.read_bytes()


def test_the_part_file_of_an_interrupted_run_is_resumed_with_a_range_request(server, tmp_path):
  dest = tmp_path / "d" / "file.bin"
  interrupted(server, dest)
  download.fetch(file_url(server), dest, progress=False)
  assert dest.read_bytes() == BODY
  assert not list(dest.parent.glob("*.part*"))  # the .part and its record
  assert server.gets(PATH) == [None, f"bytes={len(BODY) // 2}-"]


@pytest.mark.parametrize("how", ["no record", "another url", "no validator"])
def test_a_part_file_not_known_to_be_a_prefix_is_downloaded_afresh(server, tmp_path, how, caplog):
  """A stale ``.part`` of other content would make a file of the right size
  and the wrong bytes if resumed: without its record, with the record of
  another URL, or from a server that gives no validator, it is not."""
  dest = tmp_path / "file.bin"
  part = tmp_path / "file.bin.part"
  if how == "no validator":
    server.validators = False
    interrupted(server, dest)
  else:
    interrupted(server, dest)
    if how == "another url":
      server.files["/other.bin"] = BODY
      download.fetch(server.url + "/other.bin", tmp_path / "other.bin", progress=False)
      record = part.with_name("file.bin.part.json")
      record.write_text(record.read_text().replace(PATH, "/other.bin"))
    else:
      part.with_name("file.bin.part.json").unlink()
  part.write_bytes(b"x" * len(part.read_bytes()))  # other content, same length
  with caplog.at_level(logging.INFO):
    download.fetch(file_url(server), dest, progress=False)
  assert dest.read_bytes() == BODY and not part.exists()
  assert server.gets(PATH)[1:] == [None]
  assert "file.bin.part: not known to be a prefix of" in caplog.text


def test_a_file_changed_on_the_server_since_the_part_gets_a_fresh_download(server, tmp_path):
  """The record's ETag goes as If-Range: a changed file comes whole (200)."""
  dest = tmp_path / "file.bin"
  interrupted(server, dest)
  server.files[PATH] = BODY[::-1]
  download.fetch(file_url(server), dest, progress=False)
  assert dest.read_bytes() == BODY[::-1]
  assert server.gets(PATH)[1:] == [f"bytes={len(BODY) // 2}-"]


def test_a_server_that_ignores_the_range_gets_a_fresh_download(server, tmp_path):
  dest = tmp_path / "file.bin"
  interrupted(server, dest)
  server.honour_range = False
  download.fetch(file_url(server), dest, progress=False)
  assert dest.read_bytes() == BODY and not (tmp_path / "file.bin.part").exists()
  assert server.gets(PATH)[1:] == [f"bytes={len(BODY) // 2}-"]


def test_a_partial_answer_without_content_range_gets_a_fresh_download(server, tmp_path):
  dest = tmp_path / "file.bin"
  interrupted(server, dest)
  server.faults[PATH].append("no content-range")
  download.fetch(file_url(server), dest, progress=False)
  assert dest.read_bytes() == BODY
  assert server.gets(PATH)[1:] == [f"bytes={len(BODY) // 2}-", None]


def test_a_refused_range_gets_a_fresh_download(server, tmp_path):
  dest = tmp_path / "file.bin"
  interrupted(server, dest)
  part = tmp_path / "file.bin.part"
  part.write_bytes(BODY + b"extra")  # longer than the file: 416
  download.fetch(file_url(server), dest, progress=False)
  assert dest.read_bytes() == BODY
  assert server.gets(PATH)[1:] == [f"bytes={len(BODY) + 5}-", None]


def test_an_answer_without_length_is_never_taken_as_complete(server, tmp_path, caplog):
  """A 200 without Content-Length (not chunked) cut short cannot be told from
  a whole file: it is not renamed, and the try counts as failed."""
  dest = tmp_path / "file.bin"
  server.faults[PATH].extend(["no length"] * 3)
  with pytest.raises(download.DownloadError) as err:
    download.fetch(file_url(server), dest, progress=False)
  assert "the server gave no Content-Length" in err.value.reason
  assert not dest.exists() and not list(tmp_path.glob("*.part*"))
  server.faults[PATH].append("no length")
  with caplog.at_level(logging.INFO):
    download.fetch(file_url(server), dest, progress=False)
  assert dest.read_bytes() == BODY
  assert server.gets(PATH)[3:] == [None, None]
  assert f"the {len(BODY) // 2:,} bytes received cannot be checked" in caplog.text


def test_a_download_cut_short_is_resumed_and_the_retry_is_logged(server, tmp_path, caplog):
  server.faults[PATH].append("truncate")
  dest = tmp_path / "file.bin"
  with caplog.at_level(logging.INFO):
    download.fetch(file_url(server), dest, progress=False)
  assert dest.read_bytes() == BODY
  assert server.gets(PATH) == [None, f"bytes={len(BODY) // 2}-"]
  assert (
      f"file.bin: the connection ended after {len(BODY) // 2:,} of {len(BODY):,} bytes; "
      f"trying again (2 of 3, {len(BODY) // 2:,} bytes kept)." in caplog.text
  )


def test_404_fails_at_once_with_its_status(server, tmp_path):
  server.faults[PATH].extend([404, 404, 404])
  dest = tmp_path / "file.bin"
  with pytest.raises(download.DownloadError) as err:
    download.fetch(file_url(server), dest, progress=False)
  e = err.value
  assert isinstance(e, errors.UserError) and isinstance(e, OSError)
  assert (e.url, e.status, e.tries, e.reason) == (file_url(server), 404, 1, "HTTP 404 Not Found")
  assert str(e).startswith(f"{file_url(server)}: HTTP 404 Not Found")
  assert server.gets(PATH) == [None]
  assert not dest.exists() and not (tmp_path / "file.bin.part").exists()


def test_after_every_try_the_error_names_the_last_reason_and_keeps_the_part(server, tmp_path):
  server.faults[PATH].extend(["truncate", 503, 503])
  dest = tmp_path / "file.bin"
  with pytest.raises(download.DownloadError) as err:
    download.fetch(file_url(server), dest, progress=False)
  e = err.value
  assert (e.status, e.tries) == (503, 3) and e.reason.startswith("HTTP 503")
  assert f"cannot download {file_url(server)} (HTTP 503" in str(e)
  assert len(server.gets(PATH)) == 3
  assert not dest.exists()
  assert (tmp_path / "file.bin.part").read_bytes() == BODY[: len(BODY) // 2]  # for the next run
  download.fetch(file_url(server), dest, progress=False)  # ... which resumes it
  assert dest.read_bytes() == BODY and server.gets(PATH)[-1] == f"bytes={len(BODY) // 2}-"


def test_keep_partial_false_leaves_no_file_after_a_failure(server, tmp_path):
  server.faults[PATH].extend(["truncate", "truncate", "truncate"])
  dest = tmp_path / "file.bin"
  with pytest.raises(download.DownloadError, match="the connection ended after"):
    download.fetch(file_url(server), dest, progress=False, keep_partial=False)
  assert list(tmp_path.iterdir()) == []
  assert len(server.gets(PATH)) == 3  # each try resumed the part of the one before
  assert server.gets(PATH)[1] == f"bytes={len(BODY) // 2}-"


def test_a_host_that_never_answers_is_bounded_by_timeout_s(silent_port, tmp_path):
  dest = tmp_path / "file.bin"
  start = time.monotonic()
  with pytest.raises(download.DownloadError) as err:
    download.fetch(f"http://127.0.0.1:{silent_port}/file.bin", dest, timeout_s=1.0, tries=3)
  assert time.monotonic() - start < 3  # one try: a silent host is not asked again
  assert (err.value.reason, err.value.tries, err.value.status) == ("no answer within 1 s", 1, None)
  assert list(tmp_path.iterdir()) == []


def test_a_hanging_name_lookup_is_bounded_by_timeout_s(monkeypatch, tmp_path):
  """Socket timeouts do not bound getaddrinfo; the daemon thread does."""
  release = threading.Event()

  def hang(*args, **kwargs):
    release.wait(60)
    raise socket.gaierror(socket.EAI_AGAIN, "name lookup hung")

  monkeypatch.setattr(socket, "getaddrinfo", hang)
  try:
    start = time.monotonic()
    with pytest.raises(download.DownloadError, match="no answer within 0.5 s"):
      download.fetch("http://dead-dns.invalid/file.bin", tmp_path / "f", timeout_s=0.5)
    assert time.monotonic() - start < 2
  finally:
    release.set()


def test_a_malformed_url_fails_at_once(tmp_path):
  with pytest.raises(download.DownloadError, match="unknown url type") as err:
    download.fetch("nonsense/file.bin", tmp_path / "f", progress=False)
  assert err.value.tries == 0 and not list(tmp_path.iterdir())


def test_the_corpus_path_leaves_no_file_after_a_failure(server, tmp_path):
  """``sources.locate``: a download that fails leaves neither the archive nor a .part."""
  server.faults[PATH].extend(["truncate", "truncate", "truncate"])
  spec = sources.SourceSpec(
      corpus="tiny",
      archive="tiny.zip",
      url=file_url(server),
      files=(sources.SourceFile(name="tiny.txt", member="tiny/tiny.txt"),),
  )
  downloads = tmp_path / "downloads"
  with pytest.raises(errors.DataError) as err:
    sources.locate(
        spec, manual_dir=tmp_path / "manual", download_dir=downloads, download=True, timeout_s=2
    )
  assert (
      f"Downloading {file_url(server)} failed: the connection ended after "
      f"{len(BODY) * 7 // 8:,} of {len(BODY):,} bytes (3 tries)" in str(err.value)  # 1/2+1/4+1/8
  )
  assert not downloads.exists() or list(downloads.iterdir()) == []


def test_sha256_of(tmp_path):
  path = tmp_path / "f"
  path.write_bytes(BODY * 300)  # two 1 MiB blocks and a partial one
  assert download.sha256_of(path) == hashlib.sha256(BODY * 300).hexdigest()
