"""The package's one downloader: corpora and released models, resumed and bounded.

``fetch`` downloads a URL through ``<dest>.part`` and renames it to ``dest``
only when complete; it is used by ``transformer_xl.data.sources`` (the
corpus archives: enwik8, text8, PTB, WikiText, One Billion Word) and by
``transformer_xl.convert.pretrained`` (the released models' files).  What
it guarantees:

* **Resume, only where it is sure.**  A ``.part`` left by an earlier try (a
  dropped connection, a read that timed out, fewer bytes than the server's
  Content-Length) or by an earlier run is continued with an HTTP ``Range``
  request only if its record ``<dest>.part.json`` names the same URL and
  the server's validator of the file (ETag, else Last-Modified), sent as
  ``If-Range``: a 206 whose ``Content-Range`` starts at the ``.part``'s end
  (and names the recorded length) appends; anything else (a ``.part``
  without a record or of another URL, a server without validators, a 200,
  a 416, a 206 without ``Content-Range`` or from another offset) gets a
  fresh download.
* **Complete, or not renamed.**  A response's end is checked against its
  ``Content-Length`` (or, chunked, by the chunking); a response with
  neither cannot be checked and counts as a failed try.
* **Retries.**  ``tries`` tries, a short pause between them, each noted in
  the log (``transformer_xl.util.report.log``); HTTP 403, 404 and 410 fail at once, as
  does a host that never answers (see next).
* **Bounded waits.**  The request runs in a daemon thread that must answer
  within ``timeout_s`` seconds, which bounds the name lookup too (socket
  timeouts do not: a dead name server could hang the process); a host that
  gives no answer in that time is not tried again (it would not answer the
  next try either), so a machine without network waits ``timeout_s`` once.
  Reads then time out after ``timeout_s`` of silence (and are retried).
* **Atomic.**  ``dest`` appears, renamed from the ``.part``, only complete;
  with ``keep_partial=False`` the ``.part`` is also removed after a failure.
* An optional tqdm bar on stderr; ``sha256_of`` for the callers' checksums.

Failures raise ``DownloadError`` (``transformer_xl.errors``) with ``url``,
``reason``, ``status`` and ``tries``, from which each caller phrases its
advice (the manual dir).  Why not a library: pooch (1.9) streams into a
temporary file that it deletes on failure and retries from byte 0 (no
Range resume, and requests' timeouts do not bound the name lookup), and
tfds's download manager rewrites the file from the start with no timeout,
its checksums registered per dataset; neither keeps a partial download.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from transformer_xl import errors
from transformer_xl.util import report

DownloadError = errors.DownloadError  # re-exported (transformer_xl.errors)

CHUNK = 1 << 20  # bytes per read and per hash update (1 MiB)
TRIES = 3
TIMEOUT_S = 60.0  # seconds to answer (name lookup included), and of silence between reads
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-\d+/(\d+|\*)")


def sha256_of(path: Path) -> str:
  """Hex SHA-256 of a file, read in ``CHUNK`` (1 MiB) blocks."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(CHUNK):
      h.update(chunk)
  return h.hexdigest()


class _NoAnswer(Exception):
  """The host did not answer within the bounded connect."""


class _Unusable(Exception):
  """A request that no try can send (a malformed URL); the message says why."""


def fetch(
    url: str,
    dest: Path,
    *,
    tries: int = TRIES,
    timeout_s: float = TIMEOUT_S,
    progress: bool | None = True,
    keep_partial: bool = True,
) -> None:
  """Downloads ``url`` to ``dest`` through ``<dest>.part``, resuming it.

  See the module docstring for the guarantees.  The parent directory of
  ``dest`` is created.

  Args:
    url: an http(s) URL.
    dest: the file to write; replaced (atomically) once complete.
    tries: how many requests at most (at least 1).
    timeout_s: seconds the host has to answer a request (name lookup,
      connection and response headers), and the longest silence between two
      reads.
    progress: a tqdm bar on stderr; None: only when stderr is a terminal.
    keep_partial: keep the ``.part`` after a failure, for the next run to
      resume (False: remove it, so that a failure leaves no file).

  Raises:
    DownloadError: HTTP 403/404/410 (at once, ``status`` set), a malformed
      URL, a host that gave no answer within ``timeout_s``, or no complete
      file after ``tries`` tries; ``reason`` says which.
  """
  dest = Path(dest)
  dest.parent.mkdir(parents=True, exist_ok=True)
  part = dest.with_name(dest.name + ".part")
  if progress is None:
    progress = sys.stderr.isatty()
  done = False
  try:
    _fetch(url, dest, part, max(1, tries), timeout_s, progress)
    done = True
  finally:
    if not done and not keep_partial:
      _discard(part, _PartRecord(part))


def _fetch(url: str, dest: Path, part: Path, tries: int, timeout_s: float, progress: bool) -> None:
  try:
    urllib.request.Request(url)
  except ValueError as err:  # "unknown url type": no try can work
    reason = _describe(err)
    raise DownloadError(f"cannot download {url}: {reason}.", url=url, reason=reason) from None
  last, status = "no try", None
  record = _PartRecord(part)
  for attempt in range(tries):
    have = part.stat().st_size if part.exists() else 0
    resumable = have and record.resumes(url)
    if have and not resumable:
      report.log(f"  {part.name}: not known to be a prefix of {url}; downloading it afresh.")
      _discard(part, record)
      have = 0
    headers = {"Range": f"bytes={have}-", "If-Range": record.validator} if have else {}
    request = urllib.request.Request(url, headers=headers)
    try:
      with _open(request, timeout_s) as resp:
        status = resp.status
        resumed = have > 0 and resp.status == 206
        if resumed and _range(resp) not in ((have, record.total), (have, None)):
          _discard(part, record)  # a range that does not continue the .part: start again
          last = f"the server answered the range bytes={have}- with {_range(resp) or 'none'}"
          continue
        if not resumed:
          have = 0
          record.start(url, resp)
        length = resp.headers.get("Content-Length", "")
        chunked = "chunked" in resp.headers.get("Transfer-Encoding", "").lower()
        total = have + int(length) if length.isdigit() else None
        with (
            open(part, "ab" if resumed else "wb") as f,
            _bar(dest.name, total, have, progress) as bar,
        ):
          while chunk := resp.read(CHUNK):
            f.write(chunk)
            bar.update(len(chunk))
      size = part.stat().st_size
      if total is not None and size < total:
        last = f"the connection ended after {size:,} of {total:,} bytes"
      elif total is None and not chunked:
        _discard(part, record)  # what arrived may be cut short: nothing to resume
        last = (
            f"the server gave no Content-Length: the {size:,} bytes received cannot be "
            "checked for completeness"
        )
      else:
        part.replace(dest)
        record.remove()
        return
    except _NoAnswer:
      raise DownloadError(
          f"cannot download {url}: no answer within {timeout_s:g} s; check the network.",
          url=url,
          reason=f"no answer within {timeout_s:g} s",
          tries=attempt + 1,
      ) from None
    except urllib.error.HTTPError as err:
      err.close()
      status = err.code
      if err.code == 416:  # the .part is not a prefix the server recognises: start again
        _discard(part, record)
        last = "the server refused to resume (HTTP 416)"
        continue
      if err.code in (403, 404, 410):
        reason = f"HTTP {err.code} {err.reason}"
        raise DownloadError(
            f"{url}: {reason}; the file is not at this address.",
            url=url,
            reason=reason,
            status=err.code,
            tries=attempt + 1,
        ) from None
      last = f"HTTP {err.code} {err.reason}"
    except _Unusable as err:
      raise DownloadError(
          f"cannot download {url}: {err}.", url=url, reason=str(err), tries=attempt + 1
      ) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
      last, status = _describe(getattr(err, "reason", err)), None
    if attempt + 1 < tries:
      kept = part.stat().st_size if part.exists() else 0
      report.log(
          f"  {dest.name}: {last}; trying again ({attempt + 2} of {tries}, {kept:,} bytes kept)."
      )
      time.sleep(0.5 * (attempt + 1))
  raise DownloadError(
      f"cannot download {url} ({last}, {tries} tr{'y' if tries == 1 else 'ies'}); check the "
      "network and run again.",
      url=url,
      reason=last,
      status=status,
      tries=tries,
  )


@contextlib.contextmanager
def _open(request: urllib.request.Request, timeout_s: float):
  """``urlopen(request)`` in a daemon thread that must answer within ``timeout_s``.

  Yields the response (closed on exit).

  Raises:
    _NoAnswer: no answer within ``timeout_s`` (a hanging name lookup, a
      host that accepts the connection and stays silent, a connect timeout);
      a late answer is closed by the thread.
    _Unusable: a malformed URL (``urlopen``'s ValueError).
    urllib.error.HTTPError, URLError, OSError: as ``urlopen``.
  """
  answer: dict[str, object] = {}
  lock = threading.Lock()

  def run():
    try:
      resp = urllib.request.urlopen(request, timeout=timeout_s)
    except BaseException as err:  # pylint: disable=broad-except  (re-raised by the caller)
      with lock:
        answer["error"] = err
      return
    with lock:
      if answer.get("abandoned"):
        resp.close()
      else:
        answer["response"] = resp

  thread = threading.Thread(target=run, name=f"download {request.full_url}", daemon=True)
  thread.start()
  thread.join(timeout_s)
  with lock:
    if "response" not in answer and "error" not in answer:
      answer["abandoned"] = True
      raise _NoAnswer
  err = answer.get("error")
  if err is not None:
    if _is_timeout(err):
      raise _NoAnswer
    if isinstance(err, ValueError):  # "unknown url type", a bad host name
      raise _Unusable(_describe(err))
    raise err  # type: ignore[misc]
  with answer["response"] as resp:  # type: ignore[attr-defined]
    yield resp


def _is_timeout(err: object) -> bool:
  """A connect that timed out (socket timeout), bare or wrapped in a URLError."""
  return isinstance(getattr(err, "reason", err), (TimeoutError, socket.timeout))


def _range(resp) -> tuple[int, int | None] | None:
  """(first byte, the file's length or None for "*") of a 206 answer's
  Content-Range; None if it has none."""
  match = _CONTENT_RANGE.match(resp.headers.get("Content-Range", "").strip())
  if not match:
    return None
  return int(match.group(1)), None if match.group(2) == "*" else int(match.group(2))


class _PartRecord:
  """``<dest>.part.json``: what the ``.part`` beside it is a prefix of (the
  URL, the server's validator of the file: its ETag, else Last-Modified, and
  the file's length when known), written when the ``.part`` is started."""

  def __init__(self, part: Path):
    self.path = part.with_name(part.name + ".json")
    try:
      saved = json.loads(self.path.read_text())
      self.url, self.validator, self.total = saved["url"], saved["validator"], saved["total"]
    except (OSError, ValueError, KeyError, TypeError):
      self.url = self.validator = self.total = None

  def resumes(self, url: str) -> bool:
    """Whether the ``.part`` may be continued from ``url`` (same URL, a validator)."""
    return self.url == url and isinstance(self.validator, str) and bool(self.validator)

  def start(self, url: str, resp) -> None:
    """Records the response that starts a fresh ``.part``."""
    length = resp.headers.get("Content-Length", "")
    self.url = url
    etag = resp.headers.get("ETag") or ""
    # A weak ETag may not validate a range (RFC 9110, 13.1.5): then Last-Modified.
    self.validator = (etag if not etag.startswith("W/") else "") or resp.headers.get(
        "Last-Modified"
    )
    self.total = int(length) if length.isdigit() else None
    with contextlib.suppress(OSError):  # without it, the .part is only not resumed later
      self.path.write_text(
          json.dumps({"url": url, "validator": self.validator, "total": self.total})
      )

  def remove(self) -> None:
    self.url = self.validator = self.total = None
    self.path.unlink(missing_ok=True)


def _discard(part: Path, record: _PartRecord) -> None:
  """Removes a ``.part`` and its record."""
  part.unlink(missing_ok=True)
  record.remove()


def _describe(err: object) -> str:
  """``"<Type>: <message>"`` on one line, to quote another library's error."""
  text = " ".join(str(err).split())
  return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _bar(name: str, total: int | None, initial: int, enabled: bool):
  import tqdm

  return tqdm.tqdm(
      total=total,
      initial=initial,
      unit="B",
      unit_scale=True,
      unit_divisor=1024,
      desc=name,
      file=sys.stderr,
      disable=not enabled,
      leave=False,
  )
