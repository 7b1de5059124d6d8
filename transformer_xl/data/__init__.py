"""Corpora as token streams, and the iterators that cut them into batches.

The rest of the package uses only the names of this module:

* ``load_configured`` (a config's ``data`` section: a built-in corpus
  or one's own text files) and ``load_corpus`` -> ``Corpus``: a split is a ``TokenSource``
  (random access to its int32 token stream); sentence-level corpora (One
  Billion Word) also have a ``SentenceIndex`` per split;
  ``Corpus.encode`` tokenises new text, ``Corpus.decode`` (and the
  incremental ``Corpus.decoder``) turns ids back into text; ``DataError``;
  ``CORPUS_NAMES``.
* training batches: ``make_train_iterator`` (an ordered
  ``TrainIterator``, or a ``ShuffledSentenceIterator`` for
  sentence-level corpora); evaluation batches: ``EvalIterator``
  (segments carrying memory) or ``SlidingWindowIterator`` (the vanilla
  Transformer's sliding window).
* several processes: ``process_row_ids``, ``to_global_batch``.
* ``Prefetcher``: batches made ready on a background thread, each with
  the iterator position to checkpoint after it.

Modules, one role each:

* ``corpus.py``: ``Corpus``, ``TokenSource``/``ArraySource``,
  ``SentenceIndex``, ``DataError``;
* ``tokenizers.py``: tokenisation rules (the builders and
  ``Corpus.encode``) and their inverses (``Corpus.decode``);
* ``sources.py``: locating, downloading and checksumming source files;
* ``download.py``: ``fetch``, the one downloader (resumed, retried,
  bounded), of the corpora and of the released models;
* ``storage.py``: chunked array_record storage: the base tfds builder;
* ``prepared.py``: a prepared dataset read back (``ChunkedSource``,
  ``ChunkedSentenceIndex``), its files checked;
* ``enwik8_text8.py``: builders of the byte/char corpora of one file;
* ``ptb_wikitext.py``: builders of the corpora of one text file per split;
* ``lm1b.py``: the builder of One Billion Word;
* ``text_reading.py``: one's own text files (``data.dataset="text"``)
  found and read as lines;
* ``text_tfds.py``: a tfds text dataset (``data.dataset="tfds:NAME"``)
  read as lines;
* ``text_builder.py``: the builder of either (tokenised into a prepared
  dataset) and ``load_text_corpus``;
* ``text_vocab.py``: their vocabularies and tokenizers; the workdir's
  tokenizer.json;
* ``text_settings.py``: their settings (checked without tfds);
* ``synthetic.py``: the long-range synthetic tasks
  (``data.dataset="synthetic:copy|reverse|associative_retrieval|armt_retrieval|passkey"``), drawn
  in memory, and their iterators over whole examples;
* ``babilong.py``: BABILong (``data.dataset="babilong:qa1"`` ... ``qa20``):
  bAbI facts hidden in background text, laid out as the synthetic tasks;
* ``builders.py``: corpus name -> builder;
* ``checks.py``: argument and state checks of the iterators;
* ``iterators.py``: ``TrainIterator``, ``EvalIterator``,
  ``SlidingWindowIterator``, ``make_train_iterator``;
* ``shuffled.py``: ``ShuffledSentenceIterator``;
* ``placement.py``: ``process_row_ids``, ``to_global_batch``;
* ``prefetch.py``: ``Prefetcher`` (a background thread a few batches
  ahead).

Importing this package imports numpy and jax but not tensorflow_datasets:
tfds is imported by ``load_corpus`` (``builders.py`` and the builder
modules import it).

**Batch contract.** Every iterator yields, per ``next()``, a dict of numpy
arrays holding only this process's rows of the global batch of
``B = global_batch`` rows: ``b = len(row_ids)`` rows, in the order of
``row_ids`` (all ``B`` when ``row_ids`` is None), of ``T = tgt_len``
positions:

* ``inputs``: int32 [b, T], the token ids fed to the model;
* ``targets``: int32 [b, T], the next token of each input position;
* ``weights``: float32 [b, T], 1 for a real position, 0 for padding (all
  ones in training; only evaluation pads);
* ``reset``: bool [b], True where the row's memory must be cleared before
  this segment.

``SlidingWindowIterator`` adds ``front_pad`` int32 [b]: how many
positions at the front of the row are padding (to be masked as keys).

Transformer-XL (Dai et al. 2019, Sec. 3.2) carries a memory of hidden
states from one segment to the next, so row ``r`` of the batch at step
``t + 1`` continues exactly where row ``r`` stopped at step ``t``, unless
``reset`` says otherwise.

**Local rows and the global batch.** Each process builds its iterators with
``row_ids = process_row_ids(sharding, B, T)``, the global rows its
addressable devices hold, and reads from the ``TokenSource`` only those
rows' token ranges; ``to_global_batch(local, sharding, B)`` assembles the
global ``jax.Array`` batch from every process's local rows: ``inputs``,
``targets`` and ``weights`` [B, T] with ``sharding``, ``reset`` [B] sharded
like the batch axis.

**Position state.** ``get_state()`` returns a JSON-serialisable dict and
``set_state()`` restores it, so that a restored iterator yields exactly
what the original would have yielded next (the checkpoints save it).  The
state also records the layout (``global_batch``, ``tgt_len``,
``num_tokens``, ...), so that restoring into an iterator with a different
layout raises ValueError instead of silently resuming at a different place
of the stream.  It does not depend on ``row_ids``: every process saves and
restores the same dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer_xl.data import babilong, synthetic
from transformer_xl.data.corpus import (
    ArraySentenceIndex,
    ArraySource,
    Corpus,
    DataError,
    SentenceIndex,
    Tokenizer,
    TokenSource,
    sentence_offsets,
)
from transformer_xl.data.iterators import (
    EvalIterator,
    SegmentWindows,
    SlidingWindowIterator,
    TrainIterator,
    make_train_iterator,
    split_documents,
)
from transformer_xl.data.placement import process_row_ids, to_global_batch
from transformer_xl.data.prefetch import Prefetcher
from transformer_xl.data.shuffled import ShuffledSentenceIterator

# Names accepted by load_corpus (launch/common.sh reads this literal).
CORPUS_NAMES = ("enwik8", "text8", "ptb", "ptb_char", "wikitext2", "wikitext103", "lm1b")
# data.dataset of a model converted without --dataset: token ids with no corpus to name them.
CONVERTED = "converted"
TEXT = "text"  # data.dataset of one's own text files (text_builder.py)
# The data config fields that describe one's own text (text_settings.TextSettings).
TEXT_FIELDS = (
    "train_files",
    "valid_files",
    "test_files",
    "allow_split_overlap",
    "tokenizer",
    "vocab_size",
    "min_count",
    "document_separator",
    "spm_model_type",
    "spm_sample_mb",
    "spm_allow_whitespace_only_pieces",
    "spm_split_digits",
    "spm_byte_fallback",
    "spm_character_coverage",
    "spm_max_sentence_length",
    "text_key",
    "tfds_splits",
)
TFDS_PREFIX = "tfds:"  # data.dataset="tfds:NAME[/CONFIG]": a tfds text dataset
SYNTHETIC_PREFIX = synthetic.PREFIX  # data.dataset="synthetic:TASK" (synthetic.py)


def load_configured(data_cfg: Mapping[str, Any]) -> Corpus:
  """The corpus a config's ``data`` section names (``config.data.to_dict()``).

  ``dataset`` is one of ``CORPUS_NAMES`` (``load_corpus`` with
  ``data_dir``, ``manual_dir``, ``download``, ``verify_checksums``),
  ``"text"`` or ``"tfds:NAME[/CONFIG]"`` (``text_builder.load_text_corpus``
  with the ``TEXT_FIELDS`` and ``data_dir``), or ``"synthetic:TASK"``
  (``synthetic.load`` with the ``synthetic_*`` fields: drawn in memory).
  Other fields are not the corpus's.

  Raises:
    DataError, ValueError: as ``load_corpus`` / ``load_text_corpus`` /
      ``synthetic.load``.
  """
  dataset = data_cfg["dataset"]
  if dataset == CONVERTED:
    raise DataError(
        "data.dataset='converted': this model was converted without --dataset, so no corpus "
        "names its token ids: score ids with --mode=score --tokens=ids.npy, or name the corpus "
        "it was trained on with --config.data.dataset=NAME (its vocabulary must be the "
        "model's; convert with --dataset=NAME --vocab=FILE to map the reference's ids)."
    )
  if babilong.is_babilong(dataset):  # generated now, from the bAbI files and the noise
    return babilong.load(
        babilong.BabilongSettings.from_data_config(data_cfg),
        manual_dir=data_cfg.get("manual_dir"),
        data_dir=data_cfg.get("data_dir"),
        download=data_cfg.get("download", True),
    )
  if synthetic.is_synthetic(dataset):
    return synthetic.load(synthetic.TaskSettings.from_data_config(data_cfg))
  if dataset == TEXT or dataset.startswith(TFDS_PREFIX):
    from transformer_xl.data import text_builder, text_settings  # imports tfds

    settings = text_settings.TextSettings(
        **{k: data_cfg[k] for k in TEXT_FIELDS if k in data_cfg},
        tfds_name=dataset[len(TFDS_PREFIX) :] if dataset.startswith(TFDS_PREFIX) else "",
    )
    return text_builder.load_text_corpus(settings, data_dir=data_cfg.get("data_dir"))
  return load_corpus(
      data_cfg["dataset"],
      **{
          k: data_cfg[k]
          for k in ("data_dir", "manual_dir", "download", "verify_checksums")
          if k in data_cfg
      },
  )


def load_corpus(
    name: str,
    *,
    data_dir=None,
    manual_dir=None,
    download: bool = True,
    verify_checksums: bool = True,
    chunk_size: int | None = None,
) -> Corpus:
  """Loads a corpus, preparing its tfds dataset first if needed.

  If the dataset (builder ``txl_<name>``, see ``builders.py``) is not
  prepared in ``data_dir``, its source files are located, checked and
  tokenised into array_record chunks (``download_and_prepare``).  The
  returned splits read only the chunks covering a requested range, via
  ``builder.as_data_source()`` (no TensorFlow needed).  A prepared dataset
  loads without its source files.

  Args:
    name: one of ``CORPUS_NAMES``: "enwik8" (bytes, 256 ids), "text8"
      (27 chars), "ptb" (words), "ptb_char" (chars of PTB), "wikitext2",
      "wikitext103" (words), "lm1b" (One Billion Word: words, sentences
      ended by ``<S>``, with ``sentence_offsets``; see ``lm1b.TxlLm1b``).
    data_dir: tfds data dir; default tfds's (``~/tensorflow_datasets`` or
      ``$TFDS_DATA_DIR``).
    manual_dir: where the canonical archive or the extracted files are looked
      for; default ``<data_dir>/downloads/manual``.
    download: try the canonical URL (a few seconds' timeout) when no local
      copy exists.
    verify_checksums: check the published sizes/checksums of the source files
      (and documented token counts where known).  Must be False for files
      that are not the canonical ones (tests).
    chunk_size: tokens per stored record when preparing (default 65536,
      8192 for lm1b, whose training reads short random sentences); a
      prepared dataset keeps the chunk size it was written with.

  Returns:
    A ``Corpus`` whose ``splits`` ("train", "valid", "test") are
    TokenSources of int32 ids; splits of enwik8/text8 are 90M/5M/5M symbols
    (Dai et al. 2019, Sec. 4).  Only lm1b has ``sentence_offsets``.  Its
    ``tokenizer`` is set, so ``Corpus.encode`` works.

  Raises:
    ValueError: unknown ``name``.
    DataError: source files missing (message: file names, manual dir,
      canonical URL, expected checksums; raised before any tokenisation and
      without waiting on the network for more than a few seconds), a
      checksum mismatch, or an unusable source.
  """
  if name not in CORPUS_NAMES:
    raise ValueError(f"Unknown corpus {name!r}; valid names: {', '.join(CORPUS_NAMES)}.")
  from transformer_xl.data import builders  # imports tfds: only when a corpus is loaded

  kwargs = {} if chunk_size is None else {"chunk_size": chunk_size}
  builder = builders.BUILDERS[name](data_dir=data_dir, **kwargs)
  if not builder.is_prepared():
    builder.prepare(manual_dir=manual_dir, download=download, verify_checksums=verify_checksums)
  return builder.as_corpus()


__all__ = [
    "ArraySentenceIndex",
    "ArraySource",
    "CORPUS_NAMES",
    "Corpus",
    "DataError",
    "EvalIterator",
    "Prefetcher",
    "SegmentWindows",
    "SentenceIndex",
    "ShuffledSentenceIterator",
    "SlidingWindowIterator",
    "TokenSource",
    "TEXT",
    "TEXT_FIELDS",
    "TFDS_PREFIX",
    "SYNTHETIC_PREFIX",
    "Tokenizer",
    "TrainIterator",
    "load_configured",
    "load_corpus",
    "make_train_iterator",
    "process_row_ids",
    "sentence_offsets",
    "split_documents",
    "to_global_batch",
]
