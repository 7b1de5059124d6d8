"""What a user can get wrong: one base class, ``UserError``, and its kinds.

Every error a user can cause (a config value, a corpus file, a workdir, a
checkpoint, training that diverged, score input, a conversion input, an
analysis command line, a download) is a ``UserError``.  Its message is
complete on its own (what is wrong, where, and what to do), so the command
line reports it as one ``error: ...`` line with exit status 1 and no
traceback (``transformer_xl.cli.user_errors.report``); anything else is a
bug.  Each kind also keeps the built-in base it always had (``ValueError``,
``FileNotFoundError``, ``RuntimeError``, ``OSError``), so ``except
ValueError`` code keeps working.  The modules that raise them re-export
their own kind (``default_config.ConfigError``, ``data.DataError``, ...).
"""

from __future__ import annotations


class UserError(Exception):
  """An error the user caused and can fix; the message says how."""


class ConfigError(UserError, ValueError):
  """A config value that cannot work; the message says which and how to fix it."""


class DataError(UserError, FileNotFoundError):
  """A corpus cannot be built or read.

  The message names the missing or bad file, where to put it (the manual
  dir), and its expected checksum.  Raised before any compilation.
  """


class WorkdirError(UserError, RuntimeError):
  """A --workdir (or output path) that cannot be used; the message says why and what to do."""


class CheckpointError(UserError, RuntimeError):
  """A checkpoint that cannot be used or written; the message names the
  path, the reason and what to do."""


class NonFiniteError(UserError, RuntimeError):
  """A loss, gradient norm, parameter or result that is not finite; the
  message says where, what was kept and what to try."""


class ScoreInputError(UserError, ValueError):
  """Bad ``--mode=score`` input (the token array, the text, or the --out
  path); the message says what is wrong and what is expected."""


class ConvertError(UserError, ValueError):
  """A conversion input that cannot work; the message names the file, the
  tensor or the hparam, what was expected and what was found."""


class DownloadError(UserError, OSError):
  """A download that cannot complete: the server refused the file (HTTP 403,
  404, 410), a malformed URL, or no complete file after every try.

  The message names the URL and the reason on its own; the attributes let
  a caller phrase its own advice (a manual dir, ``--manual_dir``):

  Attributes:
    url: the URL that was requested.
    reason: what went wrong, one line ("HTTP 404 Not Found", "no answer
      within 5 s", "the connection ended after 1,024 of 4,096 bytes").
    status: the HTTP status of the last answer, or None (no HTTP answer).
    tries: the requests made (1 when the server refused the file at once,
      0 for a malformed URL).
  """

  def __init__(
      self,
      message: str,
      *,
      url: str = "",
      reason: str = "",
      status: int | None = None,
      tries: int = 0,
  ):
    super().__init__(message)
    self.url = url
    self.reason = reason or message
    self.status = status
    self.tries = tries


class UsageError(UserError, ValueError):
  """Bad command-line input of an analysis tool; printed as one ``error: ...`` line."""
