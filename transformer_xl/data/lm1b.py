"""One Billion Word (lm1b): the tfds builder and its vocabulary rules.

Word level by sentence: each split's stream is its sentences, each followed
by one ``<S>``, and the sentence lengths are stored beside the stream
(``TxlLm1b``).  The vocabulary is the reference's file
``1b_word_vocab.txt`` if present, else built by ``build_lm1b_vocab``.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from transformer_xl.data import sources
from transformer_xl.data.corpus import Corpus, DataError
from transformer_xl.data.prepared import SPLITS, ChunkedSentenceIndex, ChunkedSource
from transformer_xl.data.storage import CorpusSpec, Plan, TokenStreamBuilder
from transformer_xl.data.tokenizers import LM1B_S, LM1B_UNK, LineTokenizer

LM1B_MIN_FREQ = 3  # Chelba et al. 2013: words seen < 3 times are <UNK>
LM1B_VOCAB_FILE = "1b_word_vocab.txt"
LM1B_VOCAB_SIZE = 793_471  # lines of the reference's 1b_word_vocab.txt
LM1B_CHUNK_SIZE = 8192  # tokens per record: sentences are read at random
SENTENCE_LENGTHS = "_sentence_lengths"  # suffix of the sentence-length splits
_LM1B_TOP = "1-billion-word-language-modeling-benchmark-r13output"


def _lm1b_source() -> sources.ShardedSourceSpec:
  train = tuple(
      sources.SourceFile(
          name=f"news.en-{i:05d}-of-00100",
          member=(f"{_LM1B_TOP}/training-monolingual.tokenized.shuffled/news.en-{i:05d}-of-00100"),
      )
      for i in range(1, 100)
  )
  heldout = sources.SourceFile(
      name="news.en.heldout-00000-of-00050",
      member=(f"{_LM1B_TOP}/heldout-monolingual.tokenized.shuffled/news.en.heldout-00000-of-00050"),
  )
  return sources.ShardedSourceSpec(
      corpus="lm1b",
      archive=f"{_LM1B_TOP}.tar.gz",
      url=f"http://www.statmt.org/lm-benchmark/{_LM1B_TOP}.tar.gz",
      train=train,
      heldout=heldout,
      extras=(LM1B_VOCAB_FILE,),
      note=(
          "No published checksum is known for the One Billion Word files; "
          "with verify_checksums=True the build checks the documented "
          "structure instead: all 99 training shards "
          "news.en-00001..00099-of-00100 and the held-out shard "
          "news.en.heldout-00000-of-00050 present, and, if "
          f"{LM1B_VOCAB_FILE} is used, its {LM1B_VOCAB_SIZE:,} entries. "
          f"Optional: the reference vocabulary {LM1B_VOCAB_FILE} "
          "(https://github.com/rafaljozefowicz/lm/raw/master/"
          f"{LM1B_VOCAB_FILE}) in the manual dir; without it the "
          "vocabulary is built from the training shards."
      ),
  )


LM1B = CorpusSpec(
    name="lm1b",
    unit="word",
    boundary=LM1B_S,
    tokenizer=LineTokenizer("lm1b", end=LM1B_S, unk=LM1B_UNK),
    homepage="https://www.statmt.org/lm-benchmark/",
    source=_lm1b_source(),
    manual_instructions=(
        f"Put {_LM1B_TOP}.tar.gz or its extracted directory tree (and "
        f"optionally {LM1B_VOCAB_FILE}) into the manual dir."
    ),
)


def build_lm1b_vocab(counts: Mapping[str, int], min_freq: int = LM1B_MIN_FREQ) -> list[str]:
  """The lm1b vocabulary built from training counts (no vocabulary file).

  Rule (deterministic; Chelba et al. 2013's vocabulary rule "words seen
  fewer than 3 times in training become ``<UNK>``", laid out like the
  reference's ``1b_word_vocab.txt``, which lists "symbol count" lines by
  descending count with ``<S>`` and ``<UNK>`` among the words):

  * ``counts`` are over the training stream as stored: every word of every
    sentence, plus one ``<S>`` per sentence;
  * a symbol with count >= ``min_freq`` is kept; ``<S>`` and ``<UNK>`` are
    always kept; ``<UNK>``'s count is the sum of the counts of the symbols
    dropped (plus any literal ``<UNK>`` in the text);
  * order: descending count, ties by code-point order of the symbol (so the
    result does not depend on the order the shards are read in).

  Args:
    counts: symbol -> count (e.g. a ``collections.Counter``).
    min_freq: smallest count of a kept word, >= 1.

  Returns:
    The vocabulary, id -> symbol.

  Raises:
    ValueError: min_freq < 1.
  """
  if min_freq < 1:
    raise ValueError(f"min_freq must be >= 1, got {min_freq}")
  counts = dict(counts)
  s_count = counts.pop(LM1B_S, 0)
  unk_count = counts.pop(LM1B_UNK, 0)
  kept = [(c, w) for w, c in counts.items() if c >= min_freq]
  unk_count += sum(c for c in counts.values() if c < min_freq)
  kept += [(s_count, LM1B_S), (unk_count, LM1B_UNK)]
  kept.sort(key=lambda cw: (-cw[0], cw[1]))
  return [w for _, w in kept]


def read_lm1b_vocab_file(source: sources.Source) -> list[str]:
  """Reads a vocabulary file as the reference does (``_build_from_file``).

  One entry per line; the symbol is the line's first whitespace-separated
  field (``1b_word_vocab.txt`` lines are "symbol count"); a repeated symbol
  keeps its first id.

  Returns:
    id -> symbol.

  Raises:
    DataError: a blank line (the reference fails on it), or ``<S>`` or
      ``<UNK>`` missing (the reference needs ``<UNK>``; ``<S>`` is the
      sentence boundary).
  """
  vocab, seen = [], set()
  with source.open_text() as f:
    for lineno, line in enumerate(f, 1):
      fields = line.split()
      if not fields:
        raise DataError(
            f"{source} line {lineno} is blank; every line of a "
            "vocabulary file must start with a symbol."
        )
      if fields[0] not in seen:
        seen.add(fields[0])
        vocab.append(fields[0])
  for special in (LM1B_S, LM1B_UNK):
    if special not in seen:
      raise DataError(
          f"{source} lacks the symbol {special}, which the lm1b "
          "vocabulary needs (sentence boundary and unknown word)."
      )
  return vocab


class TxlLm1b(TokenStreamBuilder):
  """One Billion Word benchmark (Chelba et al. 2013), word level, by sentence.

  Tokenisation (reference ``utils/vocabulary.py``, ``add_double_eos``):
  each line of a shard is one sentence; its words are ``line.split()`` (no
  lower-casing).  The reference wraps a sentence as ``<S> w1 ... wn <S>``;
  here each split is stored as one stream in which every sentence is
  followed by ONE ``<S>`` (``w1 ... wn <S>``), so ``<S>`` plays the role
  ``<eos>`` plays for WikiText: ``boundary_id`` is the id of ``<S>``, the
  evaluator's ``[<S>] + stream`` gives exactly the reference's pairs
  (``<S>``->w1, ..., wn->``<S>``) for every sentence, and valid/test ppl
  scores every word and one ``<S>`` per sentence exactly once.  A word
  outside the vocabulary becomes ``<UNK>`` (the reference's spelling, as in
  ``1b_word_vocab.txt``; the reference's ``Vocab`` looks up ``'<UNK>'``).

  Sentence boundaries: besides "train", "valid" and "test", the dataset
  stores for each split the splits ``<split>_sentence_lengths``: chunk
  records of int32 sentence lengths (words + 1), in stream order; the
  corpus exposes them as ``Corpus.sentence_offsets[split]``
  (``ChunkedSentenceIndex``), which the
  training iterator (``ShuffledSentenceIterator``) shuffles.

  Splits: train = every training shard present, in shard order (all 99,
  ``news.en-00001`` .. ``news.en-00099-of-00100``, when
  ``verify_checksums``); valid = test = held-out shard
  ``news.en.heldout-00000-of-00050``, as the reference does (its
  ``getdata.sh`` copies that shard to both valid.txt and test.txt).  The
  held-out shard is fixed (choosing another would need a separate dataset
  version; not provided).

  Vocabulary: if ``1b_word_vocab.txt`` (the reference's file, from
  https://github.com/rafaljozefowicz/lm, 793,471 entries incl. ``<S>`` and
  ``<UNK>``) is in the manual dir it is used as the reference uses it: one
  entry per line, the first field is the symbol, id = line number (checked
  for 793,471 entries when ``verify_checksums``).  Otherwise the vocabulary
  is built from the training shards by ``build_lm1b_vocab`` (count >= 3,
  ``<S>`` and ``<UNK>`` always in, by descending count then code point); its
  ids then differ from the reference file's.  The metadata records which
  (``vocab_source``), and the training shards used (``train_shards``).

  Source: ``1-billion-word-language-modeling-benchmark-r13output.tar.gz``
  from http://www.statmt.org/lm-benchmark/ (about 1.7 GB), or its extracted
  tree.  No checksum is published; with ``verify_checksums`` the documented
  structure is checked instead (see ``LM1B.source.note``).  A tarball is
  extracted once into ``<data_dir>/downloads/extracted/lm1b`` (about 4 GB;
  may be deleted after the build).  Building reads the training shards
  twice (counting, then encoding): several minutes for the full corpus.
  Default chunk size ``LM1B_CHUNK_SIZE`` (training reads short random
  sentences; smaller records mean less decoding per sentence).
  """

  SPEC = LM1B

  def __init__(self, *, chunk_size: int = LM1B_CHUNK_SIZE, data_dir=None, **kwargs):
    super().__init__(chunk_size=chunk_size, data_dir=data_dir, **kwargs)

  def locate_sources(
      self,
      *,
      manual_dir=None,
      download: bool = True,
      verify_checksums: bool = True,
  ) -> dict[str, sources.Source]:
    """Finds the shards (see ``sources.locate_sharded``).

    With ``verify_checksums`` all 99 training shards must be present (the
    documented structure; no checksum is published), else at least one.

    Returns:
      file name -> ``sources.Source``: the training shards found (in
      shard order), the held-out shard, and ``1b_word_vocab.txt`` if it is
      in the manual dir.

    Raises:
      DataError: shards missing or an unreadable/incomplete archive.
    """
    return sources.locate_sharded(
        self.SPEC.source,
        manual_dir=(Path(manual_dir) if manual_dir else self.default_manual_dir()),
        download_dir=Path(self.data_dir_root) / "downloads",
        download=download,
        require_all_train=verify_checksums,
    )

  def _sentence_lengths(
      self, source: sources.Source, counter: collections.Counter | None
  ) -> np.ndarray:
    """int32 [n_lines]: words + 1 per line; counts the words if asked."""
    symbols_of = self.SPEC.tokenizer.symbols
    lengths = []
    with source.open_text() as f:
      for line in f:
        words = symbols_of(line)
        if counter is not None:
          counter.update(words)
        lengths.append(len(words) + 1)
    return np.asarray(lengths, dtype=np.int32)

  def _encode(
      self, source: sources.Source, index: Mapping[str, int], step: int
  ) -> Iterator[np.ndarray]:
    """Ids of ``source``, each sentence followed by ``<S>``, in pieces."""
    tokenizer = self.SPEC.tokenizer
    boundary, unk = index[tokenizer.end], index[tokenizer.unk]
    get, symbols_of, buf = index.get, tokenizer.symbols, []
    with source.open_text() as f:
      for line in f:
        buf.extend(map(get, symbols_of(line), itertools.repeat(unk)))
        buf.append(boundary)
        if len(buf) >= step:
          yield np.asarray(buf, dtype=np.int32)
          buf = []
    if buf:
      yield np.asarray(buf, dtype=np.int32)

  def _plan(self, found, verify):
    shards = self.SPEC.source
    train = [found[f.name] for f in shards.train if f.name in found]
    heldout = found[shards.heldout.name]
    vocab_file = found.get(LM1B_VOCAB_FILE)
    counter = collections.Counter() if vocab_file is None else None
    train_lengths = [self._sentence_lengths(src, counter) for src in train]
    heldout_lengths = self._sentence_lengths(heldout, None)
    n_train_sentences = sum(len(x) for x in train_lengths)
    if vocab_file is not None:
      vocab = read_lm1b_vocab_file(vocab_file)
      if verify and len(vocab) != LM1B_VOCAB_SIZE:
        raise DataError(
            f"{vocab_file} has {len(vocab):,} entries, the reference's "
            f"{LM1B_VOCAB_FILE} has {LM1B_VOCAB_SIZE:,}; replace it with the "
            "reference file, or pass --config.data.verify_checksums=false to use it on "
            "purpose."
        )
      vocab_source = f"file {LM1B_VOCAB_FILE}"
    else:
      counter[LM1B_S] += n_train_sentences
      vocab = build_lm1b_vocab(counter)
      vocab_source = (
          f"built from the training shards (min_freq "
          f"{LM1B_MIN_FREQ}, by descending count, then code point)"
      )
    index = {s: i for i, s in enumerate(vocab)}
    step = self._chunk_size
    lengths = {"train": train_lengths, "valid": [heldout_lengths], "test": [heldout_lengths]}
    streams = {
        "train": lambda: itertools.chain.from_iterable(
            self._encode(src, index, step) for src in train
        ),
        "valid": lambda: self._encode(heldout, index, step),
        "test": lambda: self._encode(heldout, index, step),
    }
    num_tokens = {s: int(sum(int(x.sum(dtype=np.int64)) for x in lengths[s])) for s in SPLITS}
    num_sentences = {s: int(sum(len(x) for x in lengths[s])) for s in SPLITS}
    for s in SPLITS:
      streams[s + SENTENCE_LENGTHS] = lambda s=s: iter(lengths[s])
      num_tokens[s + SENTENCE_LENGTHS] = num_sentences[s]
    return Plan(
        vocab=vocab,
        boundary_id=index[self.SPEC.boundary],
        num_tokens=num_tokens,
        streams=streams,
        metadata={
            "num_sentences": num_sentences,
            "vocab_source": vocab_source,
            "train_shards": [src.file.name for src in train],
            "heldout_shard": shards.heldout.name,
        },
    )

  def as_corpus(self) -> Corpus:
    """The prepared dataset as a ``Corpus`` with ``sentence_offsets``.

    ``splits`` are ``ChunkedSource`` token streams, as for every
    corpus; ``sentence_offsets[split]`` is a ``ChunkedSentenceIndex``
    over the split's stored sentence lengths.

    Raises:
      DataError: the dataset is not prepared or its metadata is incomplete.
    """
    corpus = super().as_corpus()
    md = self.info.metadata
    if "num_sentences" not in md:
      raise DataError(
          f"{self.data_dir}: metadata.json lacks num_sentences; delete the "
          "directory to rebuild the dataset."
      )
    index = {
        split: ChunkedSentenceIndex(
            ChunkedSource(
                self.data_source(split + SENTENCE_LENGTHS),
                md["num_sentences"][split],
                md["chunk_size"],
                name=f"{self.SPEC.name}/{split}{SENTENCE_LENGTHS}",
                cache_chunks=0,
                path=str(self.data_dir),
            ),
            num_tokens=corpus.splits[split].num_tokens,
            name=f"{self.SPEC.name}/{split}",
        )
        for split in SPLITS
    }
    return dataclasses.replace(corpus, sentence_offsets=index)
