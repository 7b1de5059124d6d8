"""transformer_xl.data.download.fetch: the one downloader, against a local HTTP server.

A server on 127.0.0.1 serves one file; it can honour or ignore a Range
request, cut a response short, answer an HTTP error, and logs every GET
with its Range header.  A socket that accepts connections but never
answers, and a name lookup that hangs, stand for a dead host and a dead
name server.
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import logging
import socket
import threading
import time

import pytest

from transformer_xl import errors
from transformer_xl.data import download, sources

BODY = bytes(range(256)) * 40  # 10,240 bytes


class FileServer:
  """Serves ``body`` at every path.

  Attributes:
    honour_range: answer a Range request with 206 from its offset (False:
      200 and the whole body, as a server without range support).
    faults: consumed one per GET: "truncate" (announce the whole length,
      send half, close) or an HTTP status to answer instead (e.g. 503).
    requests: the Range header (or None) of every GET, in order.
  """

  def __init__(self, body: bytes = BODY):
    self.body = body
    self.honour_range = True
    self.faults: collections.deque = collections.deque()
    self.requests: list[str | None] = []
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):
        pass

      def do_GET(self):  # noqa: N802 (http.server's name)
        rng = self.headers.get("Range")
        server.requests.append(rng)
        fault = server.faults.popleft() if server.faults else None
        if isinstance(fault, int):
          self.send_error(fault)
          return
        body, start = server.body, 0
        if rng and server.honour_range:
          start = int(rng.split("=")[1].split("-")[0])
          if start >= len(body):
            self.send_response(416)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        chunk = body[start:]
        partial = bool(rng) and server.honour_range
        self.send_response(206 if partial else 200)
        self.send_header("Content-Length", str(len(chunk)))
        if partial:
          self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        if fault == "truncate":
          self.wfile.write(chunk[: len(chunk) // 2])
          self.wfile.flush()
          self.close_connection = True
          return
        self.wfile.write(chunk)

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/file.bin"
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def server():
  s = FileServer()
  yield s
  s.close()


@pytest.fixture
def silent_port():
  """A port that accepts connections (the kernel's backlog) and never answers."""
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  sock.listen(8)
  yield sock.getsockname()[1]
  sock.close()


def test_a_part_file_is_resumed_with_a_range_request(server, tmp_path):
  dest = tmp_path / "d" / "file.bin"
  dest.parent.mkdir()
  part = dest.with_name("file.bin.part")
  part.write_bytes(BODY[:100])
  download.fetch(server.url, dest, progress=False)
  assert dest.read_bytes() == BODY and not part.exists()
  assert server.requests == ["bytes=100-"]


def test_a_server_that_ignores_the_range_gets_a_fresh_download(server, tmp_path):
  server.honour_range = False
  dest = tmp_path / "file.bin"
  part = tmp_path / "file.bin.part"
  part.write_bytes(b"x" * 100)  # not a prefix: would corrupt the file if appended to
  download.fetch(server.url, dest, progress=False)
  assert dest.read_bytes() == BODY and not part.exists()
  assert server.requests == ["bytes=100-"]


def test_a_refused_range_gets_a_fresh_download(server, tmp_path):
  dest = tmp_path / "file.bin"
  (tmp_path / "file.bin.part").write_bytes(BODY + b"extra")  # longer than the file: 416
  download.fetch(server.url, dest, progress=False)
  assert dest.read_bytes() == BODY
  assert server.requests == [f"bytes={len(BODY) + 5}-", None]


def test_a_download_cut_short_is_resumed_and_the_retry_is_logged(server, tmp_path, caplog):
  server.faults.append("truncate")
  dest = tmp_path / "file.bin"
  with caplog.at_level(logging.INFO):
    download.fetch(server.url, dest, progress=False)
  assert dest.read_bytes() == BODY
  assert server.requests == [None, f"bytes={len(BODY) // 2}-"]
  assert (
      f"file.bin: the connection ended after {len(BODY) // 2:,} of {len(BODY):,} bytes; "
      f"trying again (2 of 3, {len(BODY) // 2:,} bytes kept)." in caplog.text
  )


def test_404_fails_at_once_with_its_status(server, tmp_path):
  server.faults.extend([404, 404, 404])
  dest = tmp_path / "file.bin"
  with pytest.raises(download.DownloadError) as err:
    download.fetch(server.url, dest, progress=False)
  e = err.value
  assert isinstance(e, errors.UserError) and isinstance(e, OSError)
  assert (e.url, e.status, e.tries, e.reason) == (server.url, 404, 1, "HTTP 404 Not Found")
  assert str(e).startswith(f"{server.url}: HTTP 404 Not Found")
  assert server.requests == [None]
  assert not dest.exists() and not (tmp_path / "file.bin.part").exists()


def test_after_every_try_the_error_names_the_last_reason_and_keeps_the_part(server, tmp_path):
  server.faults.extend(["truncate", 503, 503])
  dest = tmp_path / "file.bin"
  with pytest.raises(download.DownloadError) as err:
    download.fetch(server.url, dest, progress=False)
  e = err.value
  assert (e.status, e.tries) == (503, 3) and e.reason.startswith("HTTP 503")
  assert f"cannot download {server.url} (HTTP 503" in str(e)
  assert len(server.requests) == 3
  assert not dest.exists()
  assert (tmp_path / "file.bin.part").read_bytes() == BODY[: len(BODY) // 2]  # for the next run
  download.fetch(server.url, dest, progress=False)  # ... which resumes it
  assert dest.read_bytes() == BODY and server.requests[-1] == f"bytes={len(BODY) // 2}-"


def test_keep_partial_false_leaves_no_file_after_a_failure(server, tmp_path):
  server.faults.extend(["truncate", "truncate", "truncate"])
  dest = tmp_path / "file.bin"
  with pytest.raises(download.DownloadError, match="the connection ended after"):
    download.fetch(server.url, dest, progress=False, keep_partial=False)
  assert list(tmp_path.iterdir()) == []
  assert len(server.requests) == 3  # each try resumed the part of the one before
  assert server.requests[1] == f"bytes={len(BODY) // 2}-"


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
  server.faults.extend(["truncate", "truncate", "truncate"])
  spec = sources.SourceSpec(
      corpus="tiny",
      archive="tiny.zip",
      url=server.url,
      files=(sources.SourceFile(name="tiny.txt", member="tiny/tiny.txt"),),
  )
  downloads = tmp_path / "downloads"
  with pytest.raises(errors.DataError) as err:
    sources.locate(
        spec, manual_dir=tmp_path / "manual", download_dir=downloads, download=True, timeout_s=2
    )
  assert (
      f"Downloading {server.url} failed: the connection ended after "
      f"{len(BODY) * 7 // 8:,} of {len(BODY):,} bytes (3 tries)" in str(err.value)  # 1/2+1/4+1/8
  )
  assert not downloads.exists() or list(downloads.iterdir()) == []


def test_sha256_of(tmp_path):
  path = tmp_path / "f"
  path.write_bytes(BODY * 300)  # two 1 MiB blocks and a partial one
  assert download.sha256_of(path) == hashlib.sha256(BODY * 300).hexdigest()
