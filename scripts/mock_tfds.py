r"""The command line over tfds's mock data: a tfds dataset's pipeline run offline.

    python scripts/mock_tfds.py [--mock_examples=N] --config=configs/pg19_small.py \
        --workdir=/tmp/txl_pg19_small
    python scripts/mock_tfds.py [--mock_examples=N] --workdir=/tmp/txl_pg19_small --mode=eval

``python -m transformer_xl.main`` with its arguments, inside
``tfds.testing.mock_data(num_examples=N)`` (default 64): every tfds dataset
(``data.dataset="tfds:pg19"``) gives N generated examples per split from
its features (PG-19's ``book_text``: short random strings of the letters
a to j and spaces, the same in every run), without a download or
TensorFlow; this package's own datasets (the tokenised corpus a
``tfds:NAME`` dataset is prepared into, a ``storage.TokenStreamBuilder``)
are written and read for real, through the same preparation as with the
real data.  For trying a config and for tests (``tests/test_pg19.py``);
the numbers it gives mean nothing about the real corpus.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's package


@contextlib.contextmanager
def mock_tfds_but_ours(num_examples: int):
  """``tfds.testing.mock_data`` for every dataset but this package's own (a
  ``TokenStreamBuilder``), which must be written and read for real: mock_data
  replaces ``__init__``'s data_dir, ``download_and_prepare`` and
  ``as_data_source`` of every builder; here ours keep their own."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  from transformer_xl.data.storage import (  # pylint: disable=import-outside-toplevel
      TokenStreamBuilder,
  )

  cls = tfds.core.DatasetBuilder
  names = ("__init__", "download_and_prepare", "as_data_source")
  real = {n: getattr(cls, n) for n in names}
  with tfds.testing.mock_data(num_examples=num_examples):
    mocked = {n: getattr(cls, n) for n in names}

    def dispatch(name):
      def method(self, *args, **kw):
        fn = real[name] if isinstance(self, TokenStreamBuilder) else mocked[name]
        return fn(self, *args, **kw)

      return method

    with contextlib.ExitStack() as stack:
      for n in names:
        stack.enter_context(mock.patch.object(cls, n, dispatch(n)))
      yield


def _examples(argv: list[str]) -> tuple[int, list[str]]:
  """(``--mock_examples``, default 64; the other arguments)."""
  n, rest = 64, []
  for arg in argv:
    if arg.startswith("--mock_examples="):
      n = int(arg.split("=", 1)[1])
    else:
      rest.append(arg)
  return n, rest


if __name__ == "__main__":
  num_examples, sys.argv[1:] = _examples(sys.argv[1:])
  from absl import app

  from transformer_xl import main
  from transformer_xl.cli import user_errors

  with mock_tfds_but_ours(num_examples):
    app.run(main.main, flags_parser=user_errors.parse_flags)
