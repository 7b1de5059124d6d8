"""The converter's error type and its report printer."""
from __future__ import annotations


class ConvertError(ValueError):
  """A conversion input that cannot work; the message names the file, the
  tensor or the hparam, what was expected and what was found."""


def log(msg: str) -> None:
  """Conversion reports go to stdout (they are what the user reads)."""
  print(msg, flush=True)
