"""Every corpus builder, by corpus name (importing this imports tfds).

Corpus name: builder, unit, tokens (module):

* ``enwik8``: ``txl_enwik8``, byte; raw bytes, 256 ids (``enwik8_text8``).
* ``text8``: ``txl_text8``, char; " " + a..z, 27 ids (``enwik8_text8``).
* ``ptb``: ``txl_ptb``, word; words + ``<eos>`` per line (``ptb_wikitext``,
  as the next three).
* ``ptb_char``: ``txl_ptb_char``, char; characters, "_" between words,
  ``<eos>``.
* ``wikitext2``: ``txl_wikitext2``, word; words + ``<eos>`` per line.
* ``wikitext103``: ``txl_wikitext103``, word; words + ``<eos>`` per line.
* ``lm1b``: ``txl_lm1b``, word; words + ``<S>`` per sentence, and the
  sentence lengths (``lm1b``).

The builder names carry a ``txl_`` prefix so they cannot collide with tfds's
own datasets; a prepared dataset lives in ``<data_dir>/<builder>/1.0.0``.
"""

from __future__ import annotations

from transformer_xl.data.enwik8_text8 import TxlEnwik8, TxlText8
from transformer_xl.data.lm1b import TxlLm1b
from transformer_xl.data.ptb_wikitext import TxlPtb, TxlPtbChar, TxlWikitext2, TxlWikitext103
from transformer_xl.data.storage import TokenStreamBuilder

BUILDERS: dict[str, type[TokenStreamBuilder]] = {
    b.SPEC.name: b
    for b in (TxlEnwik8, TxlText8, TxlPtb, TxlPtbChar, TxlWikitext2, TxlWikitext103, TxlLm1b)
}
