"""Byte and character corpora of one 10^8-symbol file: enwik8 and text8.

Both are Matt Mahoney's Wikipedia extracts; their vocabularies are fixed
(``tokenizers.ByteTokenizer``, ``tokenizers.AlphabetTokenizer``) and each
split is a contiguous part of the file: 90M / 5M / 5M symbols (Dai et al.
2019, Sec. 4; ``split_bounds``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from transformer_xl.data import sources
from transformer_xl.data.corpus import DataError
from transformer_xl.data.storage import CorpusSpec, Plan, TokenStreamBuilder
from transformer_xl.data.tokenizers import TEXT8_VOCAB, AlphabetTokenizer, ByteTokenizer

_MAHONEY_SIZE = 100_000_000
_MAHONEY_HOMEPAGE = "http://mattmahoney.net/dc/textdata.html"

ENWIK8 = CorpusSpec(
    name="enwik8",
    unit="byte",
    boundary="\n",
    tokenizer=ByteTokenizer(),
    homepage=_MAHONEY_HOMEPAGE,
    source=sources.SourceSpec(
        corpus="enwik8",
        archive="enwik8.zip",
        url="http://mattmahoney.net/dc/enwik8.zip",
        files=(
            sources.SourceFile(
                name="enwik8",
                member="enwik8",
                size=_MAHONEY_SIZE,
                md5="a1fa5ffddb56f4953e226637dabbb36a",
                sha256="2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8",
            ),
        ),
    ),
    manual_instructions="Put enwik8.zip or enwik8 into the manual dir.",
)

TEXT8 = CorpusSpec(
    name="text8",
    unit="char",
    boundary=" ",
    tokenizer=AlphabetTokenizer("text8", TEXT8_VOCAB, "space and a-z"),
    homepage=_MAHONEY_HOMEPAGE,
    source=sources.SourceSpec(
        corpus="text8",
        archive="text8.zip",
        url="http://mattmahoney.net/dc/text8.zip",
        files=(
            sources.SourceFile(
                name="text8",
                member="text8",
                size=_MAHONEY_SIZE,
                sha256="6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7",
            ),
        ),
        note="text8 must hold only the bytes a-z and space, no newline.",
    ),
    manual_instructions="Put text8.zip or text8 into the manual dir.",
)


def split_bounds(n: int) -> dict[str, tuple[int, int]]:
  """[start, stop) of train/valid/test in a stream of n symbols.

  The last 5% is test, the 5% before it valid, the rest train: for
  n = 10^8 exactly 90M/5M/5M (Dai et al. 2019, Sec. 4, following the
  reference ``prep_enwik8.py``: ``num_test_chars = 5000000``).  For other n
  (only with ``verify_checksums=False``) valid = test = n // 20.
  """
  k = n // 20
  return {"train": (0, n - 2 * k), "valid": (n - 2 * k, n - k), "test": (n - k, n)}


def _lookup_stream(data: np.ndarray, table: np.ndarray | None, step: int) -> Iterator[np.ndarray]:
  for i in range(0, len(data), step):
    piece = data[i : i + step]
    yield table[piece] if table is not None else piece.astype(np.int32)


class _MahoneyBuilder(TokenStreamBuilder, skip_registration=True):
  """Shared code of enwik8 and text8: one 10^8-symbol file, 90/5/5 split."""

  def _plan(self, found, verify):
    (source,) = found.values()
    data = np.frombuffer(source.read_bytes(), dtype=np.uint8)
    if verify and len(data) != _MAHONEY_SIZE:
      raise DataError(
          f"{source}: {len(data):,} bytes, expected "
          f"{_MAHONEY_SIZE:,}; use the canonical file, or pass "
          "--config.data.verify_checksums=false to use this one on purpose."
      )
    tokenizer = self.SPEC.tokenizer
    vocab, table = list(tokenizer.vocab), tokenizer.byte_table()
    if table is not None:
      counts = np.bincount(data, minlength=256)
      bad = np.flatnonzero((counts > 0) & (table < 0))
      if bad.size:
        position = int(np.argmax(data == bad[0]))
        raise DataError(
            f"{source}: byte {int(bad[0])} at offset {position} is outside "
            f"the {self.SPEC.name} alphabet {''.join(vocab)!r}."
        )
    bounds = split_bounds(len(data))
    step = self._chunk_size
    streams = {
        s: (lambda a=a, b=b: _lookup_stream(data[a:b], table, step)) for s, (a, b) in bounds.items()
    }
    return Plan(
        vocab=vocab,
        boundary_id=vocab.index(self.SPEC.boundary),
        num_tokens={s: b - a for s, (a, b) in bounds.items()},
        streams=streams,
    )


class TxlEnwik8(_MahoneyBuilder):
  """enwik8 (Hutter Prize): the first 10^8 bytes of English Wikipedia XML.

  Byte level over all 256 byte values: token id = byte value, vocab[i] =
  ``chr(i)``; ``boundary_id`` = 10 (newline).  This models the raw bytes,
  every one of them a token.  The reference implementation instead
  rewrites the file as lines of decimal byte values, one line per newline
  (``prep_enwik8.py``), and builds a 204-symbol vocabulary from its train
  file (``data_utils.py``), so its ids, and its treatment of newline bytes,
  differ.  Split: first 90M bytes train, next 5M valid, last 5M test.

  Source: ``enwik8`` from http://mattmahoney.net/dc/enwik8.zip, checked
  against its size (100,000,000 bytes), md5 and sha256 of the unzipped file,
  as published (``ENWIK8.source``).
  """

  SPEC = ENWIK8


class TxlText8(_MahoneyBuilder):
  """text8: 10^8 characters of cleaned Wikipedia (a-z and space only).

  Character level, 27 symbols in code-point order: id 0 = " " (space), ids
  1..26 = "a".."z"; ``boundary_id`` = 0 (space, the word separator; the file
  has no newline).  Split: first 90M characters train, next 5M valid, last
  5M test.  Any byte outside the alphabet raises DataError.

  Source: ``text8`` from http://mattmahoney.net/dc/text8.zip.  Mahoney's page
  publishes no checksum; with ``verify_checksums`` the file is checked for
  its documented size (100,000,000 bytes) and alphabet, and for sha256
  6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7 of the
  unzipped file, the value recorded by several independent public projects
  (which also agree on the zip's sha256, a6640522afe8...).
  """

  SPEC = TEXT8
