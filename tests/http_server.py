"""A local HTTP server for download tests: files with Range support and injected faults.

Serves ``files`` (URL path -> bytes) on 127.0.0.1; nothing leaves the machine.
"""

from __future__ import annotations

import collections
import hashlib
import http.server
import threading


class FileServer:
  """Serves ``files`` (URL path -> bytes) with Range support and injected faults.

  Attributes:
    files: URL path -> body.
    faults: URL path -> a list consumed one per GET of that path:
      "truncate" (announce the whole length, send half, close), "corrupt"
      (flip a byte in the middle), "no length" (no Content-Length: send
      half, close), "no content-range" (a 206 without its Content-Range),
      or an HTTP status to answer instead (e.g. 503).
    honour_range: answer a Range request with 206 from its offset (False:
      200 and the whole body, as a server without range support); an
      ``If-Range`` that is not the file's ETag gets 200 and the whole body.
    validators: send an ETag (a hash of the body) with every GET; False: none.
    etags: URL path -> the ETag a HEAD request answers with (HuggingFace
      Hub metadata); a path without one answers HEAD with 404.
    requests: (path, Range header or None) of every GET, in order.
    url: the server's base URL (``http://127.0.0.1:PORT``).
  """

  def __init__(self, files: dict[str, bytes] | None = None):
    self.files: dict[str, bytes] = dict(files or {})
    self.faults: dict[str, list] = collections.defaultdict(list)
    self.honour_range = True
    self.validators = True
    self.etags: dict[str, str] = {}
    self.requests: list[tuple[str, str | None]] = []
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):
        pass

      def do_HEAD(self):  # noqa: N802  (the Hub's metadata request, huggingface_hub)
        body = server.files.get(self.path)
        if body is None or self.path not in server.etags:
          self.send_error(404)
          return
        self.send_response(200)
        self.send_header("X-Repo-Commit", "0123456789abcdef0123456789abcdef01234567")
        self.send_header("ETag", f'"{server.etags[self.path]}"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()

      def do_GET(self):  # noqa: N802 (http.server's name)
        rng = self.headers.get("Range")
        server.requests.append((self.path, rng))
        body = server.files.get(self.path)
        if body is None:
          self.send_error(404)
          return
        fault = server.faults[self.path].pop(0) if server.faults[self.path] else None
        if isinstance(fault, int):
          self.send_error(fault)
          return
        etag = f'"{hashlib.sha256(body).hexdigest()[:16]}"'
        if_range = self.headers.get("If-Range")
        partial = bool(rng) and server.honour_range and if_range in (None, etag)
        start = int(rng.split("=")[1].split("-")[0]) if partial else 0
        if partial and start >= len(body):
          self.send_response(416)
          self.send_header("Content-Length", "0")
          self.end_headers()
          return
        chunk = body[start:]
        if fault == "corrupt":
          mid = len(chunk) // 2
          chunk = chunk[:mid] + bytes([chunk[mid] ^ 0xFF]) + chunk[mid + 1 :]
        self.send_response(206 if partial else 200)
        if server.validators:
          self.send_header("ETag", etag)
        if fault != "no length":
          self.send_header("Content-Length", str(len(chunk)))
        if partial and fault != "no content-range":
          self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        if fault in ("truncate", "no length"):
          self.wfile.write(chunk[: len(chunk) // 2])
          self.wfile.flush()
          self.close_connection = True
          return
        self.wfile.write(chunk)

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
    self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
    self.thread.start()

  def gets(self, suffix: str) -> list[str | None]:
    """The Range headers of the GETs of paths ending in ``suffix``."""
    return [r for p, r in self.requests if p.endswith(suffix)]

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()
