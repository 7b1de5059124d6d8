"""One's own text files, or a tfds text dataset, as a corpus: the builder.

``data.dataset="text"`` reads the files of each split
(``text_reading.py``: the glob patterns ``data.train_files``,
``data.valid_files``, ``data.test_files``, plain or gzip, read line by
line), ``data.dataset="tfds:NAME[/CONFIG]"`` a tfds dataset's text feature
(``text_tfds.py``); ``TxlText`` tokenises either into a prepared dataset,
and ``load_text_corpus`` loads it as a ``Corpus``.

Every line becomes its tokens followed by an end symbol, whatever the
tokenizer (``data.tokenizer``):

* ``byte`` (unit: byte): its UTF-8 bytes, then the byte ``\\n`` (256 ids);
* ``char`` (unit: char): its characters, then ``\\n``; vocabulary: ``\\n``,
  the training characters by count, ``<unk>``;
* ``word`` (unit: word): ``line.split()``, then ``<eos>``; vocabulary:
  ``<eos>``, the training words by count (ties by first occurrence),
  ``<unk>`` (the reference's ``Vocab``, as ptb/wikitext: those files give
  the built-in corpora exactly);
* ``sentencepiece`` (unit: subword): a SentencePiece model's pieces, then
  ``</s>``; the model (``data.spm_model_type`` unigram or bpe,
  ``data.vocab_size`` pieces, identity normalisation, whitespace kept,
  the trainer options ``data.spm_*``: ``text_vocab.train_sentencepiece``)
  is trained here on a uniform random sample of the training lines of at
  most ``data.spm_sample_mb``;
* ``pretrained:P`` (unit: subword): P is a SentencePiece ``.model``, or a
  Hugging Face ``tokenizer.json`` (a line ends with its newline token).

``data.vocab_size`` caps the word/char vocabularies (0 = every symbol seen
``data.min_count`` times; the cap counts the end symbol and ``<unk>``).

Documents (``data.document_separator``): ``"file"`` (each file one
document), ``"paragraph"`` (a run of lines up to and including the blank
lines after it) or ``"line"``.  Documents add no token: their lengths are
stored beside the stream (split ``<split>_document_lengths``; their UTF-8
bytes and whitespace words in ``<split>_document_bytes`` and
``<split>_document_words``, for per-document results) and the
Corpus carries them as ``documents`` (a ``SentenceIndex`` per
split), for ``data.documents="reset"``.

Preparation streams (peak memory independent of the corpus size): one pass
over the training files counts symbols (or trains SentencePiece on a
sample), then each split is tokenised once as it is written; file sizes,
sha256s, bytes (for bits per byte), whitespace-separated words (for
word-level perplexity, counted as PG-19 does: ``str.split`` of the text)
and counts are recorded in the prepared
dataset's metadata.  The prepared dataset lives in
``<data_dir>/txl_text/<fingerprint>/1.0.0``, where the fingerprint hashes
the settings and each file's path, size and modification time: changing a
file or a setting prepares a new dataset, and an unchanged one loads
without reading the files.
"""

from __future__ import annotations

import collections
import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds
import tqdm

from transformer_xl import errors
from transformer_xl.data import text_vocab, tokenizers
from transformer_xl.data.corpus import Corpus, DataError
from transformer_xl.data.prepared import (
    SPLITS,
    ChunkedSentenceIndex,
    ChunkedSource,
    PreparedInfo,
    counts_problem,
    damaged_message,
    first_line,
)
from transformer_xl.data.storage import CorpusSpec, Plan, TokenStreamBuilder
from transformer_xl.data.text_reading import document_lines, fingerprint, resolve_files
from transformer_xl.data.text_settings import PRETRAINED, TextSettings, settings_problems
from transformer_xl.data.text_tfds import TfdsText

DOCUMENT_LENGTHS = "_document_lengths"  # suffix of the document-length splits
DOCUMENT_BYTES = "_document_bytes"  # suffix of the splits of each document's UTF-8 bytes
DOCUMENT_WORDS = "_document_words"  # ... and whitespace words (-1: more than int32 holds)
_INT32_MAX = (1 << 31) - 1


def _batches(items: Iterator, size: int = 4096) -> Iterator[list]:
  """``items`` in lists of ``size`` (the last shorter)."""
  batch = []
  for item in items:
    batch.append(item)
    if len(batch) == size:
      yield batch
      batch = []
  if batch:
    yield batch


class _Int32File:
  """int32 values appended to a temporary file, read back in blocks: a split's
  tokens or its document lengths, counted before tfds writes them."""

  def __init__(self, folder: str, name: str):
    self.path = Path(folder) / f"{name}.int32"
    self.count = 0
    self._buf: list[np.ndarray] = []
    self._pending = 0
    self.path.write_bytes(b"")

  def append(self, values) -> None:
    values = np.asarray(values, np.int32).reshape(-1)
    self._buf.append(values)
    self._pending += values.size
    if self._pending >= 1 << 20:
      self.flush()

  def flush(self) -> None:
    try:
      with open(self.path, "ab") as f:
        for values in self._buf:
          f.write(values.tobytes())
    except OSError as err:  # a full disk: the message names the file (storage.py)
      if err.filename is None:
        err.filename = str(self.path)
      raise
    self.count += self._pending
    self._buf, self._pending = [], 0

  def read(self) -> Iterator[np.ndarray]:
    with open(self.path, "rb") as f:
      while block := f.read(4 << 20):
        yield np.frombuffer(block, np.int32)


class TxlText(TokenStreamBuilder, skip_registration=True):
  """One's own text files, or a tfds text dataset (see the module docstring).

  Args:
    settings: the files (or ``tfds_name``) and the tokenisation.
    files: ``resolve_files(settings)`` if already done.
    **kwargs: ``data_dir`` (tfds data dir), ``chunk_size`` (tokens per
      record), as ``TokenStreamBuilder``.

  Raises:
    DataError: as ``resolve_files`` (or ``TfdsText``).
  """

  name = "txl_text"
  VERSION = tfds.core.Version("1.0.0")
  SPEC = CorpusSpec(
      name="text",
      unit="",
      boundary="",
      tokenizer=None,
      source=None,
      homepage="",
      manual_instructions="",
  )

  def __init__(self, settings: TextSettings, *, files=None, **kwargs):
    self.settings = settings
    if settings.tfds_name:
      self.files, self.tfds = None, TfdsText(settings, kwargs.get("data_dir"))
      name = self.tfds.fingerprint()
    else:
      self.files = resolve_files(settings) if files is None else files
      self.tfds, name = None, fingerprint(settings, self.files)
    config = tfds.core.BuilderConfig(name=name, description="text")
    super().__init__(config=config, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return PreparedInfo(  # a damaged dataset_info.json is a DataError (prepared.py)
        builder=self,
        description="Text files tokenised into one int32 stream per split.",
        features=tfds.features.FeaturesDict(
            {  # raw bytes: 5x faster to write than ints
                "tokens": tfds.features.Tensor(
                    shape=(None,), dtype=np.int32, encoding=tfds.features.Encoding.BYTES
                )
            }
        ),
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(),
    )

  def _prepare(self, *, manual_dir, download, verify_checksums) -> None:
    """Tokenises the files into the dataset (the arguments do not apply); ``prepare``
    (storage.py) holds the folder's lock and reports a full disk.  The tokens
    go to temporary files first (``tempfile``'s folder, ``$TMPDIR``), removed
    however the preparation ends."""
    del manual_dir, download, verify_checksums
    self._sources = self.files or {}
    self._verify_checksums = False
    with tempfile.TemporaryDirectory(prefix="txl_text_") as tmp:
      self._tmp = tmp
      self._write(tfds.download.DownloadConfig(manual_dir=tmp))

  def _tokenizer(self):
    """(tokenizer, unit, its record for the metadata), trained first for sentencepiece."""
    s, name = self.settings, "text"
    simple = {
        "byte": (tokenizers.ByteTokenizer(), "byte"),
        "char": (tokenizers.CharTokenizer(name), "char"),
        "word": (tokenizers.LineTokenizer(name, end=tokenizers.EOS, unk=tokenizers.UNK), "word"),
    }
    if s.tokenizer in simple:
      tok, unit = simple[s.tokenizer]
      return tok, unit, text_vocab.tokenizer_record(tok)
    if s.tokenizer == "sentencepiece":
      tok = tokenizers.SentencePieceTokenizer(
          name, text_vocab.train_sentencepiece(self._lines("train"), s, name)
      )
      return tok, "subword", text_vocab.tokenizer_record(tok)
    tok = text_vocab.load_pretrained(s.tokenizer[len(PRETRAINED) :], name)
    return tok, "subword", text_vocab.tokenizer_record(tok)

  def _plan(self, found, verify):
    del found, verify
    s = self.settings
    tok, unit, stored = self._tokenizer()
    if unit in ("char", "word"):
      counter: collections.Counter = collections.Counter()
      progress = tqdm.tqdm(
          desc="text: counting train symbols", unit=" lines", mininterval=5, disable=None
      )
      for batch in _batches(self._lines("train")):
        text = "\n".join(batch)
        counter.update(text.split() if unit == "word" else text)
        progress.update(len(batch))
      progress.close()
      vocab = text_vocab.count_vocab(
          counter,
          tok.end,
          tok.unk,
          s.vocab_size,
          s.min_count,
          "words" if unit == "word" else "characters",
      )
      end = 0
    else:
      vocab = list(tok.vocab)
      end = 10 if unit == "byte" else tok.end_id
      if s.tokenizer.startswith(PRETRAINED) and s.vocab_size and s.vocab_size != len(vocab):
        raise DataError(
            f"data.vocab_size={s.vocab_size} but the pretrained tokenizer has "
            f"{len(vocab):,} tokens; set data.vocab_size=0."
        )
    self._encode_lines = text_vocab.line_encoder(unit, tok, vocab, end)
    self._stats = {
        "num_bytes": {},
        "num_words": {},
        "num_documents": {},
        "num_tokens": {},
        "files": {},
    }
    self._lengths = {split: _Int32File(self._tmp, split + DOCUMENT_LENGTHS) for split in SPLITS}
    self._doc_sizes = {
        split: {k: _Int32File(self._tmp, split + k) for k in (DOCUMENT_BYTES, DOCUMENT_WORDS)}
        for split in SPLITS
    }
    streams = {}
    for split in SPLITS:
      streams[split] = lambda split=split: self._encode(split)
      streams[split + DOCUMENT_LENGTHS] = lambda split=split: self._lengths[split].read()
      for k in (DOCUMENT_BYTES, DOCUMENT_WORDS):
        streams[split + k] = lambda split=split, k=k: self._doc_sizes[split][k].read()
    return Plan(
        vocab=vocab,
        boundary_id=end,
        num_tokens=None,
        streams=streams,
        metadata={"unit": unit, "tokenizer": stored, "settings": dataclasses.asdict(s)},
    )

  def _document_lines(
      self, split: str, progress=None, hashes: dict | None = None
  ) -> Iterator[tuple[str, bool]]:
    """(line, starts a document) of ``split``: from the files or the tfds dataset."""
    if self.tfds is not None:
      return self.tfds.document_lines(split, progress)
    return document_lines(self.files[split], self.settings.document_separator, progress, hashes)

  def _lines(self, split: str) -> Iterator[str]:
    return (line for line, _ in self._document_lines(split))

  def _encode(self, split: str) -> Iterator[np.ndarray]:
    """The ids of ``split`` in pieces: tokenised into a temporary file first, so
    that their number is known before tfds writes the first record
    (``storage.key_stride``), then read back."""
    tokens = _Int32File(self._tmp, split)
    self._tokenize(split, tokens)
    self._counts[split] = tokens.count
    self._counts[split + DOCUMENT_LENGTHS] = self._lengths[split].count
    for k, f in self._doc_sizes[split].items():
      self._counts[split + k] = f.count
    yield from tokens.read()
    tokens.path.unlink()

  def _tokenize(self, split: str, tokens: _Int32File) -> None:
    """Writes the ids of ``split`` to ``tokens``, recording document lengths, bytes and
    words, and statistics."""
    stats = self._stats
    hashes: dict = {}
    lengths = self._lengths[split]
    doc_bytes, doc_words = (self._doc_sizes[split][k] for k in (DOCUMENT_BYTES, DOCUMENT_WORDS))

    def end_document(length: int, n_bytes: int, n_words: int) -> None:
      lengths.append([length])
      doc_bytes.append([n_bytes if n_bytes <= _INT32_MAX else -1])
      doc_words.append([n_words if n_words <= _INT32_MAX else -1])

    n_tokens = n_bytes = n_words = 0
    if self.tfds is None:
      total, unit = sum(f.stat().st_size for f in self.files[split]), "B"
    else:
      total, unit = self.tfds.num_documents(split), " documents"
    with tqdm.tqdm(
        total=total, desc=f"text: {split}", unit=unit, unit_scale=True, mininterval=5, disable=None
    ) as progress:
      doc_len = doc_b = doc_w = 0  # the open document's tokens, bytes and words
      for batch in _batches(self._document_lines(split, progress, hashes)):
        ids, counts = self._encode_lines([line for line, _ in batch])
        for (line, new_doc), count in zip(batch, counts.tolist()):
          if new_doc and doc_len:
            end_document(doc_len, doc_b, doc_w)
            doc_len = doc_b = doc_w = 0
          line_bytes, line_words = len(line.encode("utf-8")) + 1, len(line.split())
          doc_len, doc_b, doc_w = doc_len + count, doc_b + line_bytes, doc_w + line_words
          n_bytes += line_bytes
          n_words += line_words  # PG-19's words: str.split of the text
        n_tokens += len(ids)
        tokens.append(ids)
      if doc_len:
        end_document(doc_len, doc_b, doc_w)
    lengths.flush()
    doc_bytes.flush()
    doc_words.flush()
    tokens.flush()
    stats["num_tokens"][split] = n_tokens
    stats["num_tokens"][split + DOCUMENT_LENGTHS] = lengths.count
    stats["num_bytes"][split] = n_bytes
    stats["num_words"][split] = n_words
    stats["num_documents"][split] = lengths.count
    stats["files"][split] = (
        [
            {"path": str(f), "size": hashes[str(f)][1], "sha256": hashes[str(f)][0]}
            for f in self.files[split]
        ]
        if self.tfds is None
        else [
            {
                "tfds": self.settings.tfds_name,
                "split": self.tfds.splits[split],
                "examples": self.tfds.num_documents(split),
            }
        ]
    )
    self.info.metadata.update(
        {
            "num_tokens": {k: v for k, v in stats["num_tokens"].items() if k in SPLITS},
            **{k: dict(stats[k]) for k in ("num_bytes", "num_words", "num_documents", "files")},
        }
    )

  def as_corpus(self) -> Corpus:
    """The prepared dataset as a ``Corpus`` with its tokenizer and documents.

    Raises:
      DataError: as ``TokenStreamBuilder.as_corpus``; the documents, bytes or
        tokenizer of its metadata.json are missing or cannot be used.
    """
    corpus = super().as_corpus()
    path = str(self.data_dir)
    md = self.metadata(required=("num_documents", "num_bytes", "tokenizer"))
    problem = counts_problem(md, "num_documents") or counts_problem(md, "num_bytes")
    if problem:
      raise DataError(damaged_message(path, f"its metadata.json {problem}"))
    try:
      tokenizer = text_vocab.tokenizer_from_metadata(md, "text", path)
      # Bytes and subwords: the model's own pieces (loading it) are the stored vocabulary.
      pieces = getattr(tokenizer, "vocab", None)
    except errors.UserError:
      raise
    except Exception as err:  # pylint: disable=broad-except  (a damaged model: several kinds)
      raise DataError(
          damaged_message(
              path, f"the tokenizer in its metadata.json cannot be rebuilt ({first_line(err)})"
          )
      ) from None
    if pieces is not None and list(pieces) != list(md["vocab"]):
      raise DataError(
          damaged_message(
              path,
              f"the tokenizer in its metadata.json has {len(pieces):,} tokens that are not its "
              f"vocabulary of {len(md['vocab']):,}",
          )
      )
    # Words (for word-level perplexity) and each document's bytes and words are recorded
    # since issue 39; a dataset prepared before has none of them (and then no word-level
    # perplexity).
    num_words = dict(md["num_words"]) if "num_words" in md else None
    if num_words is not None and counts_problem(md, "num_words"):
      raise DataError(damaged_message(path, f"its metadata.json {counts_problem(md, 'num_words')}"))

    def per_document(suffix: str) -> dict | None:
      if num_words is None:
        return None
      return {
          split: ChunkedSource(
              self.data_source(split + suffix),
              md["num_documents"][split],
              md["chunk_size"],
              name=f"text/{split}{suffix}",
              path=path,
          )
          for split in SPLITS
      }

    documents = {
        split: ChunkedSentenceIndex(
            ChunkedSource(
                self.data_source(split + DOCUMENT_LENGTHS),
                md["num_documents"][split],
                md["chunk_size"],
                name=f"text/{split}{DOCUMENT_LENGTHS}",
                path=path,
            ),
            md["num_tokens"][split],
            name=f"text/{split}",
        )
        for split in SPLITS
    }
    return dataclasses.replace(
        corpus,
        tokenizer=tokenizer,
        documents=documents,
        num_bytes=dict(md["num_bytes"]),
        num_words=num_words,
        document_bytes=per_document(DOCUMENT_BYTES),
        document_words=per_document(DOCUMENT_WORDS),
    )


def load_text_corpus(
    settings: TextSettings, *, data_dir=None, chunk_size: int | None = None
) -> Corpus:
  """Loads (preparing first if needed) the corpus of ``settings``.

  Raises:
    DataError: the files or the tokenizer (see ``resolve_files``,
      ``load_pretrained``), or a vocabulary size the text does not allow.
  """
  problems = settings_problems(settings)
  if problems:
    raise DataError(" ".join(problems))
  kwargs = {} if chunk_size is None else {"chunk_size": chunk_size}
  builder = TxlText(settings, data_dir=data_dir, **kwargs)
  if not builder.is_prepared():
    builder.prepare()
  corpus = builder.as_corpus()
  if builder.files is not None:
    corpus = dataclasses.replace(
        corpus, num_files={split: len(files) for split, files in builder.files.items()}
    )
  return corpus


def _count(n: int, what: str) -> str:
  return f"{n:,} {what}" + ("" if n == 1 else "s")


def documents_report(corpus: Corpus, document_separator: str, documents: str) -> str:
  """One line for the start of a training: each split's documents, files
  (where read from files) and tokens, e.g. ``Text corpus (a document is a
  file; data.documents=stream): train: 569 documents in 569 files,
  1,101,422 tokens; valid: ...``.

  Args:
    corpus: a corpus of ``load_text_corpus`` (``documents`` set).
    document_separator: ``data.document_separator`` ("file", "paragraph",
      "line"); a tfds dataset's document is an example whatever it says.
    documents: ``data.documents`` ("stream" or "reset").
  """
  unit = document_separator if corpus.num_files is not None else "tfds example"
  parts = []
  for split in SPLITS:
    n_docs = corpus.documents[split].num_sentences if corpus.documents else 0
    where = f" in {_count(corpus.num_files[split], 'file')}" if corpus.num_files is not None else ""
    parts.append(
        f"{split}: {_count(n_docs, 'document')}{where}, "
        f"{_count(corpus.splits[split].num_tokens, 'token')}"
    )
  return f"Text corpus (a document is a {unit}; data.documents={documents}): " + "; ".join(parts)
