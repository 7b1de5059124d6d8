"""The converter's error type and its one-line messages.

Every input the converter cannot use (a flag, a checkpoint, the hparams,
a vocabulary, a workdir) raises ``ConvertError``, whose message names
the file and says what is wrong and what to do; the command line
(``__main__.main``) prints it as one ``error: ...`` line on stderr and exits
with status 1, without a traceback.  ``one_line`` and ``describe``
keep messages that quote another library's error on one line.
"""

from __future__ import annotations

import re

from transformer_xl import errors

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


ConvertError = errors.ConvertError  # re-exported (transformer_xl.errors)


def one_line(text: object, limit: int = 0) -> str:
  """``text`` as one line: terminal escapes dropped, every run of whitespace
  (newlines included) made one space; cut to ``limit`` characters (0: no
  limit) with "..." where cut."""
  out = " ".join(_ANSI.sub("", str(text)).split())
  return out if not limit or len(out) <= limit else out[: limit - 3].rstrip() + "..."


def describe(err: BaseException, limit: int = 200) -> str:
  """One short line for another library's exception, to quote in a message:
  ``"<Type>: <its message>"`` (numpy, zipfile, torch and TensorFlow raise
  many types, and some of their messages span lines)."""
  text = one_line(err, limit)
  return f"{type(err).__name__}: {text}" if text else type(err).__name__
