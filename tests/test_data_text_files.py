"""data.dataset="text": one's own text files (transformer_xl/data/text_builder.py,
text_reading.py, text_tfds.py).

The generic path is checked against the built-in corpora it must reproduce
(PTB and WikiText-2 given as plain files), the stream and the documents
against a naive reading of the files, and every tokenizer by round trips.
"""

import gzip
import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from transformer_xl import data
from transformer_xl.data import text_builder, text_vocab, tokenizers
from transformer_xl.data.text_settings import TextSettings

from helpers import REPO, mock_tfds_module, run_main, tiny_flags

SHARED = REPO.parent / "shared" / "data"

DOCS = {  # file name -> text: blank lines, a blank first line, unicode, no final newline
    "a.txt": "The cat sat.\nOn the mat.\n\n\nA new paragraph here.\n",
    "b.txt.gz": "\nüber café ñ 中文 text.\nsecond   line  with   spaces\n\nlast paragraph",
    "c.txt": "one line only\n",
}


def _write(folder: Path, texts: dict) -> Path:
  for name, text in texts.items():
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    raw = text.encode("utf-8")
    (folder / name).write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
  return folder


def _settings(folder: Path, **kw) -> TextSettings:
  kw.setdefault("train_files", f"{folder}/*.txt,{folder}/*.gz")
  kw.setdefault("valid_files", f"{folder}/c.txt")
  kw.setdefault("test_files", f"{folder}/a.txt")
  kw.setdefault("allow_split_overlap", True)  # train's patterns match valid's and test's files
  return TextSettings(**kw)


TRAIN_ORDER = ["a.txt", "c.txt", "b.txt.gz"]  # the patterns' order, each pattern's matches sorted


def _naive_lines(names) -> list[str]:
  """Each file's lines in the order given, line breaks removed (universal newlines)."""
  out = []
  for name in names:
    text = DOCS[name]
    out += io.StringIO(text, newline=None).read().splitlines()
  return out


def _naive_documents(names, separator: str) -> list[list[str]]:
  docs = []
  for name in names:
    lines = DOCS[name].splitlines()
    if separator == "file":
      docs.append(lines)
    elif separator == "line":
      docs += [[line] for line in lines]
    else:  # paragraph: a run of lines with the blank lines after it
      current, blank_before = [], False
      for line in lines:
        blank = not line.strip()
        if current and blank_before and not blank:
          docs.append(current)
          current = []
        current.append(line)
        blank_before = blank
      docs.append(current)
  return docs


def test_word_stream_documents_and_bytes_equal_a_naive_reading(tmp_path):
  folder = _write(tmp_path / "files", DOCS)
  lines = _naive_lines(TRAIN_ORDER)
  for separator in ("file", "paragraph", "line"):
    corpus = text_builder.load_text_corpus(
        _settings(folder, document_separator=separator), data_dir=tmp_path / "tfds", chunk_size=7
    )
    vocab = list(corpus.vocab)
    assert vocab[0] == "<eos>" and vocab[-1] == "<unk>" and corpus.boundary_id == 0
    words = [w for line in lines for w in line.split()]
    assert sorted(vocab[1:-1]) == sorted(set(words))
    counts = [words.count(w) for w in vocab[1:-1]]
    assert counts == sorted(counts, reverse=True)  # by descending count
    expected = [i for line in lines for i in [vocab.index(w) for w in line.split()] + [0]]
    train = corpus.splits["train"]
    np.testing.assert_array_equal(train.read(0, train.num_tokens), expected)
    docs = _naive_documents(TRAIN_ORDER, separator)
    lengths = [sum(len(line.split()) + 1 for line in doc) for doc in docs]
    offsets = corpus.documents["train"].read_offsets(0, len(lengths) + 1)
    np.testing.assert_array_equal(np.diff(offsets), lengths)
    assert corpus.num_bytes["train"] == sum(len(line.encode()) + 1 for line in lines)
    assert corpus.unit == "word"


def test_gzip_and_plain_files_give_the_same_stream_and_a_change_rebuilds(tmp_path):
  plain = _write(
      tmp_path / "plain",
      {"x.txt": DOCS["b.txt.gz"], "c.txt": DOCS["c.txt"], "a.txt": DOCS["a.txt"]},
  )
  gz = _write(
      tmp_path / "gz",
      {"x.txt.gz": DOCS["b.txt.gz"], "c.txt": DOCS["c.txt"], "a.txt": DOCS["a.txt"]},
  )
  tfds_dir = tmp_path / "tfds"
  read = lambda c: c.splits["train"].read(0, c.splits["train"].num_tokens)  # noqa: E731
  a = text_builder.load_text_corpus(
      _settings(plain, train_files=f"{plain}/x.txt"), data_dir=tfds_dir
  )
  b = text_builder.load_text_corpus(_settings(gz, train_files=f"{gz}/x.txt.gz"), data_dir=tfds_dir)
  np.testing.assert_array_equal(read(a), read(b))
  assert list(a.vocab) == list(b.vocab)
  # An unchanged file loads the prepared dataset; a changed one is prepared again.
  builder = text_builder.TxlText(_settings(plain, train_files=f"{plain}/x.txt"), data_dir=tfds_dir)
  assert builder.is_prepared()
  (plain / "x.txt").write_text("entirely different words\n")
  builder = text_builder.TxlText(_settings(plain, train_files=f"{plain}/x.txt"), data_dir=tfds_dir)
  assert not builder.is_prepared()
  c = text_builder.load_text_corpus(
      _settings(plain, train_files=f"{plain}/x.txt"), data_dir=tfds_dir
  )
  assert c.decode(read(c)) == "entirely different words\n"
  md = text_builder.TxlText(
      _settings(plain, train_files=f"{plain}/x.txt"), data_dir=tfds_dir
  ).info.metadata
  (record,) = md["files"]["train"]
  assert record["size"] == len("entirely different words\n")
  assert record["sha256"] == hashlib.sha256(b"entirely different words\n").hexdigest()


@pytest.mark.parametrize(
    "name,split_files,builtin",
    [
        ("ptb", {s: f"ptb/ptb.{s}.txt" for s in ("train", "valid", "test")}, "ptb"),
        pytest.param(
            "wikitext2",
            {s: f"wikitext-2/wiki.{s}.tokens" for s in ("train", "valid", "test")},
            "wikitext2",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_the_real_files_as_text_give_exactly_the_builtin_corpus(
    tmp_path, name, split_files, builtin
):
  del name
  if not SHARED.is_dir():
    pytest.skip("no ../shared/data")
  cfg = dict(
      dataset="text",
      data_dir=str(tmp_path / "tfds"),
      tokenizer="word",
      vocab_size=0,
      min_count=1,
      document_separator="file",
      spm_model_type="unigram",
      spm_sample_mb=1.0,
      **{f"{s}_files": str(SHARED / f) for s, f in split_files.items()},
  )
  text = data.load_configured(cfg)
  manual = SHARED / Path(split_files["train"]).parent
  ref = data.load_corpus(builtin, data_dir=tmp_path / "tfds", manual_dir=manual)
  assert list(text.vocab) == list(ref.vocab) and text.boundary_id == ref.boundary_id
  for split in ("train", "valid", "test"):
    a, b = text.splits[split], ref.splits[split]
    assert a.num_tokens == b.num_tokens
    np.testing.assert_array_equal(a.read(0, a.num_tokens), b.read(0, b.num_tokens))


def test_char_and_byte_tokenizers(tmp_path):
  folder = _write(tmp_path / "files", DOCS)
  lines = _naive_lines(TRAIN_ORDER)
  char = text_builder.load_text_corpus(
      _settings(folder, tokenizer="char"), data_dir=tmp_path / "tfds"
  )
  vocab = list(char.vocab)
  assert vocab[0] == "\n" and vocab[-1] == "<unk>" and char.unit == "char"
  assert sorted(vocab[1:-1]) == sorted(set("".join(lines)))
  train = char.splits["train"].read(0, char.splits["train"].num_tokens)
  assert char.decode(train) == "".join(line + "\n" for line in lines)
  assert char.decode(char.encode("über Ω\n")) == "über \ufffd\n"  # Ω was not in train
  byte = text_builder.load_text_corpus(
      _settings(folder, tokenizer="byte"), data_dir=tmp_path / "tfds"
  )
  train = byte.splits["train"].read(0, byte.splits["train"].num_tokens)
  assert bytes(train.astype(np.uint8)) == "".join(line + "\n" for line in lines).encode()
  assert byte.vocab_size == 256 and byte.boundary_id == 10 and byte.unit == "byte"
  assert byte.num_bytes["train"] == byte.splits["train"].num_tokens


@pytest.mark.parametrize("tokenizer", ["byte", "char", "subword"])
def test_document_lengths_of_every_unit_equal_a_naive_count(tokenizer, spm_corpus, tmp_path):
  """Each document's token count (``data.documents="reset"``) is its lines'
  tokens, each line ended by one end token: UTF-8 bytes, characters, or a
  SentencePiece model's pieces (the model of ``spm_corpus``, as pretrained)
  of each line, counted here one line at a time."""
  folder = _write(tmp_path / "files", DOCS)
  if tokenizer == "subword":
    import sentencepiece

    model = tmp_path / "m.model"
    model.write_bytes(spm_corpus[0].tokenizer.model_proto)
    processor = sentencepiece.SentencePieceProcessor(model_proto=model.read_bytes())
    per_line, setting = lambda line: len(processor.encode(line)), f"pretrained:{model}"  # noqa: E731
  else:
    per_line = {"byte": lambda line: len(line.encode("utf-8")), "char": len}[tokenizer]
    setting = tokenizer
  for separator in ("file", "paragraph", "line"):
    corpus = text_builder.load_text_corpus(
        _settings(folder, tokenizer=setting, document_separator=separator),
        data_dir=tmp_path / "tfds",
        chunk_size=7,
    )
    docs = _naive_documents(TRAIN_ORDER, separator)
    lengths = [sum(per_line(line) + 1 for line in doc) for doc in docs]
    index = corpus.documents["train"]
    assert index.num_sentences == len(docs), separator
    offsets = index.read_offsets(0, len(lengths) + 1)
    np.testing.assert_array_equal(np.diff(offsets), lengths, err_msg=separator)
    assert corpus.splits["train"].num_tokens == sum(lengths)


def test_word_vocab_size_and_min_count(tmp_path):
  folder = _write(tmp_path / "files", {"t.txt": "a a a b b c\nd\n", "v.txt": "a z\n"})
  s = dict(
      train_files=f"{folder}/t.txt",
      valid_files=f"{folder}/v.txt",
      test_files=f"{folder}/v.txt",
      allow_split_overlap=True,
  )
  corpus = text_builder.load_text_corpus(TextSettings(**s, vocab_size=4), data_dir=tmp_path / "t")
  assert list(corpus.vocab) == ["<eos>", "a", "b", "<unk>"]
  np.testing.assert_array_equal(corpus.splits["valid"].read(0, 3), [1, 3, 0])
  corpus = text_builder.load_text_corpus(TextSettings(**s, min_count=2), data_dir=tmp_path / "t")
  assert list(corpus.vocab) == ["<eos>", "a", "b", "<unk>"]
  corpus = text_builder.load_text_corpus(TextSettings(**s), data_dir=tmp_path / "t")
  assert list(corpus.vocab) == ["<eos>", "a", "b", "c", "d", "<unk>"]
  with pytest.raises(data.DataError, match="data.vocab_size=7 is larger .* at most 6"):
    text_builder.load_text_corpus(TextSettings(**s, vocab_size=7), data_dir=tmp_path / "t")


UNICODE = (
    "Grüße aus Köln! Ça va? 東京タワー  double  spaces\n"
    "tabs\tand trailing space \n"
    "emoji 🙂 and digits 12345\n"
) * 30


@pytest.fixture(scope="module")
def spm_corpus(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("spm")
  folder = _write(tmp / "files", {"train.txt": UNICODE, "valid.txt": "Köln 12 🙂\n"})
  settings = TextSettings(
      train_files=f"{folder}/train.txt",
      valid_files=f"{folder}/valid.txt",
      test_files=f"{folder}/valid.txt",
      allow_split_overlap=True,
      tokenizer="sentencepiece",
      vocab_size=300,
      spm_model_type="bpe",
  )
  return text_builder.load_text_corpus(settings, data_dir=tmp / "tfds"), folder, tmp


def test_sentencepiece_round_trips_exactly_and_streams(spm_corpus):
  corpus, _, _ = spm_corpus
  assert corpus.unit == "subword" and corpus.vocab_size == 300
  train = corpus.splits["train"].read(0, corpus.splits["train"].num_tokens)
  assert corpus.decode(train) == UNICODE  # identity normalisation, whitespace kept
  assert corpus.num_bytes["train"] == len(UNICODE.encode())
  unseen = "Ωmega ≠ 𝔘nicode  \n"  # byte fallback: characters never seen in training
  ids = corpus.encode(unseen)
  assert corpus.decode(ids) == unseen
  decoder = corpus.decoder()  # one id at a time, as generation streams
  assert "".join(decoder.decode([i]) for i in ids) + decoder.decode([], final=True) == unseen
  assert corpus.tokenizer.end_id == corpus.boundary_id == int(ids[-1])
  prompt = corpus.encode("Grüße", end_last_line=False)
  assert corpus.boundary_id not in prompt.tolist()


def test_a_pretrained_sentencepiece_model_and_tokenizer_json(spm_corpus, tmp_path):
  corpus, folder, _ = spm_corpus
  model = tmp_path / "m.model"
  model.write_bytes(corpus.tokenizer.model_proto)
  settings = TextSettings(
      train_files=f"{folder}/train.txt",
      valid_files=f"{folder}/valid.txt",
      test_files=f"{folder}/valid.txt",
      allow_split_overlap=True,
      tokenizer=f"pretrained:{model}",
  )
  again = text_builder.load_text_corpus(settings, data_dir=tmp_path / "tfds")
  n = corpus.splits["train"].num_tokens
  np.testing.assert_array_equal(again.splits["train"].read(0, n), corpus.splits["train"].read(0, n))
  import tokenizers as hf

  bpe = hf.Tokenizer(hf.models.BPE())
  bpe.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = hf.decoders.ByteLevel()
  bpe.train_from_iterator(
      [UNICODE],
      hf.trainers.BpeTrainer(
          vocab_size=400, initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet()
      ),
  )
  path = tmp_path / "tokenizer.json"
  bpe.save(str(path))
  settings = TextSettings(
      train_files=f"{folder}/train.txt",
      valid_files=f"{folder}/valid.txt",
      test_files=f"{folder}/valid.txt",
      allow_split_overlap=True,
      tokenizer=f"pretrained:{path}",
  )
  hf_corpus = text_builder.load_text_corpus(settings, data_dir=tmp_path / "tfds")
  train = hf_corpus.splits["train"].read(0, hf_corpus.splits["train"].num_tokens)
  assert hf_corpus.decode(train) == UNICODE
  assert hf_corpus.vocab[hf_corpus.boundary_id] == "Ċ"  # GPT-2's byte-level "\n"


def _bad(tmp_path, folder, **kw) -> str:
  with pytest.raises(data.DataError) as err:
    text_builder.load_text_corpus(_settings(folder, **kw), data_dir=tmp_path / "tfds")
  return str(err.value)


def test_bad_inputs_name_the_problem(tmp_path):
  folder = _write(tmp_path / "files", DOCS)
  assert "no file matches" in _bad(tmp_path, folder, train_files=f"{folder}/nothing*.txt")
  (folder / "empty.txt").write_bytes(b"")
  assert "would be empty" in _bad(tmp_path, folder, valid_files=f"{folder}/empty.txt")
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)))
  assert "a NUL byte at offset 8" in _bad(tmp_path, folder, train_files=f"{bad}/image.png")
  (bad / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
  assert "byte 0xe9 at offset 3" in _bad(tmp_path, folder, test_files=f"{bad}/latin1.txt")
  # Past the first 8 KiB the reading itself finds it, naming the line.
  (bad / "late.txt").write_bytes(b"fine words\n" * 2000 + "caf\xe9\n".encode("latin-1"))
  assert "late.txt is not UTF-8 text (line 2,001: byte 0xe9 at offset 22,003)" in _bad(
      tmp_path, folder, valid_files=f"{bad}/late.txt"
  )
  assert "larger than" in _bad(tmp_path, folder, vocab_size=10_000)
  assert "SentencePiece cannot be trained" in _bad(
      tmp_path, folder, tokenizer="sentencepiece", vocab_size=5000
  )
  (bad / "junk.model").write_bytes(b"not a model")
  assert "does not load" in _bad(tmp_path, folder, tokenizer=f"pretrained:{bad}/junk.model")
  assert "no such file" in _bad(tmp_path, folder, tokenizer=f"pretrained:{folder}/none.model")
  assert "data.tokenizer='bpe'" in _bad(tmp_path, folder, tokenizer="bpe")


@pytest.mark.slow
def test_bad_input_on_the_command_line_is_one_line(tmp_path):
  folder = _write(tmp_path / "files", DOCS)
  (folder / "binary.txt").write_bytes(bytes(range(256)) * 4)
  for extra, needle in [
      ([f"--config.data.train_files={folder}/missing/*.txt"], "no file matches"),
      (["--config.data.vocab_size=0"], "needs data.vocab_size"),
      ([f"--config.data.tokenizer=pretrained:{folder}/a.txt"], "does not load"),
      (["--config.data.vocab_size=100000"], "SentencePiece cannot be trained"),
      (["--config.data.dataset=ptb"], "apply only to data.dataset='text'"),
      ([f"--config.data.valid_files={folder}/binary.txt"], "is not UTF-8 text"),
      (
          [
              "--config.data.dataset=tfds:pg19",
              "--config.data.text_key=nope",
              "--config.data.train_files=",
              "--config.data.valid_files=",
              "--config.data.test_files=",
          ],
          "no such feature",
      ),
  ]:
    r = _main(
        [
            f"--config={REPO / 'configs/text.py'}",
            f"--workdir={tmp_path / 'run'}",
            f"--config.data.data_dir={tmp_path / 'tfds'}",
            f"--config.data.train_files={folder}/a.txt",
            f"--config.data.valid_files={folder}/c.txt",
            f"--config.data.test_files={folder}/b.txt.gz",
            *extra,
        ],
        timeout=300,
    )
    assert r.returncode != 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    # One message: a line, or the config's list of problems under its one line.
    assert len(errors) == 1 and needle in r.stderr[r.stderr.index("error:") :], r.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_subword_decoder_holds_back_an_incomplete_character():
  # A decoder over bytes-as-ids: "é" is two bytes; the first alone must not emit U+FFFD.
  decode_line = lambda ids: bytes(ids).decode("utf-8", errors="replace")  # noqa: E731
  decoder = tokenizers.SubwordDecoder(decode_line, end_id=10, vocab_size=256)
  out = [decoder.decode([b]) for b in "aé\nb".encode()]
  assert out == ["a", "", "é", "\n", "b"]
  decoder = tokenizers.SubwordDecoder(decode_line, end_id=10, vocab_size=256)
  assert decoder.decode([0xC3]) == "" and decoder.decode([], final=True) == "\ufffd"


BOOKS = {
    "train": [
        "Call me Ishmael.\nSome years ago, never mind how long.",
        "It was the best of times,\nit was the worst of times.",
        "Happy families are all alike.",
    ],
    "validation": ["It is a truth universally acknowledged."],
    "test": ["All this happened, more or less.\nThe war parts, anyway."],
}


def _tfds_cfg(tmp_path, name, **kw):
  cfg = dict(
      dataset=f"tfds:{name}",
      data_dir=str(tmp_path / "tfds"),
      train_files="",
      valid_files="",
      test_files="",
      tokenizer="word",
      vocab_size=0,
      min_count=1,
      document_separator="file",
      spm_model_type="unigram",
      spm_sample_mb=1.0,
      text_key="text",
      tfds_splits="train,validation,test",
  )
  cfg.update(kw)
  return cfg


def _check_books(corpus, split, books):
  vocab = list(corpus.vocab)
  expected = [
      i
      for book in books
      for line in book.splitlines()
      for i in [vocab.index(w) if w in vocab else vocab.index("<unk>") for w in line.split()] + [0]
  ]
  source = corpus.splits[split]
  np.testing.assert_array_equal(source.read(0, source.num_tokens), expected)
  offsets = corpus.documents[split].read_offsets(0, len(books) + 1)
  np.testing.assert_array_equal(
      np.diff(offsets), [sum(len(line.split()) + 1 for line in b.splitlines()) for b in books]
  )


def _mock_tfds_but_ours(num_examples: int):
  """``tfds.testing.mock_data`` for every dataset but our own (scripts/mock_tfds.py's)."""
  return mock_tfds_module().mock_tfds_but_ours(num_examples)


def test_a_tfds_text_dataset_under_mock_data(tmp_path):
  import tensorflow_datasets as tfds

  with _mock_tfds_but_ours(num_examples=4):
    corpus = data.load_configured(_tfds_cfg(tmp_path, "pg19", text_key="book_text"))
    books = {
        split: [ex["book_text"] for ex in tfds.builder("pg19").as_data_source(split)]
        for split in ("train", "validation", "test")
    }
    with pytest.raises(data.DataError, match=r"no such feature; its text features are \["):
      data.load_configured(_tfds_cfg(tmp_path, "pg19", text_key="text"))
  assert len(books["train"]) == 4 and all(isinstance(b, str) and b for b in books["train"])
  _check_books(corpus, "train", books["train"])
  _check_books(corpus, "valid", books["validation"])
  _check_books(corpus, "test", books["test"])
  assert corpus.documents["train"].num_sentences == 4
  with pytest.raises(data.DataError, match="tfds cannot load it"):
    data.load_configured(_tfds_cfg(tmp_path, "no_such_dataset_anywhere"))


def test_a_local_tfds_builder_is_prepared_by_tfds_and_read(tmp_path):
  import tensorflow_datasets as tfds

  class TxlTestLocalBooks(tfds.core.GeneratorBasedBuilder):
    """Three splits of short books (a test's own builder)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self,
          features=tfds.features.FeaturesDict({"text": tfds.features.Text(), "id": np.int32}),
      )

    def _split_generators(self, dl_manager):
      return {split: self._generate_examples(split) for split in BOOKS}

    def _generate_examples(self, split):
      for i, text in enumerate(BOOKS[split]):
        yield i, {"text": text, "id": i}

  corpus = data.load_configured(_tfds_cfg(tmp_path, "txl_test_local_books"))
  _check_books(corpus, "train", BOOKS["train"])
  _check_books(corpus, "test", BOOKS["test"])
  again = data.load_configured(_tfds_cfg(tmp_path, "txl_test_local_books"))  # reused
  assert again.splits["train"].num_tokens == corpus.splits["train"].num_tokens


def _naive_doc_pos(lengths, target_index):
  """The offset of target ``target_index`` from the first target of its document."""
  start = 0
  for n in lengths:
    if target_index < start + n:
      return target_index - start
    start += n
  raise IndexError(target_index)


def test_iterators_give_each_position_its_offset_in_its_document():
  lengths = [2, 3, 7, 12, 1, 9, 4, 30, 5]
  tokens = np.arange(sum(lengths), dtype=np.int32) % 11
  documents = data.ArraySentenceIndex(data.sentence_offsets(np.asarray(lengths)))
  source = data.ArraySource(tokens)
  train = data.TrainIterator(source, global_batch=3, tgt_len=5, documents=documents)
  for step in range(train.steps_per_epoch):
    batch = next(train)
    for r in range(3):
      for k in range(5):
        target = r * train.row_len + step * 5 + k + 1
        assert batch["doc_pos"][r, k] == _naive_doc_pos(lengths, target), (step, r, k)
  ev = data.EvalIterator(source, global_batch=2, tgt_len=6, boundary_id=0, documents=documents)
  for step, batch in enumerate(ev):
    pairs = ev.pairs(step)
    for r in range(2):
      for k in range(6):
        want = _naive_doc_pos(lengths, pairs[r, k]) if pairs[r, k] >= 0 else 0
        assert batch["doc_pos"][r, k] == want
  assert "doc_pos" not in next(data.TrainIterator(source, global_batch=3, tgt_len=5))


def _main(args, timeout=600):
  # One CPU device: the 8 simulated ones add nothing here, and their collectives
  # can time out when the machine is loaded (XLA aborts the process).
  return run_main(args, devices=1, timeout=timeout)


# 3 steps of segments and memory of 16, evaluation in segments of 64 with memory 32 (WikiText-2's
# splits in 16 rows: ~200 steps each), a checkpoint at step 3.
TINY = tiny_flags(
    model__tgt_len=16,
    model__mem_len=16,
    train__num_steps=3,
    train__warmup_steps=0,
    eval__tgt_len=64,
    eval__mem_len=32,
    eval__global_batch=16,
    checkpoint__every_steps=3,
)


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["gzip_files", "wikitext2_files"])
def test_train_eval_score_generate_on_own_files_with_sentencepiece(tmp_path, corpus):
  """One command each, as configs/text.py's docstring gives them; then the files and
  the prepared corpus are removed and generation still works (the workdir's tokenizer)."""
  if corpus == "gzip_files":
    folder = tmp_path / "files"
    rng = np.random.default_rng(0)
    words = UNICODE.split() + ["the", "a", "of", "and"] * 20
    for i in range(6):
      text = "\n".join(" ".join(rng.choice(words, 12)) for _ in range(300)) + "\n\n"
      _write(folder, {f"train/part{i}.txt.gz": text})
    _write(folder, {"valid.txt": UNICODE[:2000], "test.txt": UNICODE[2000:4000]})
    files = [
        f"--config.data.train_files={folder}/train/*.gz",
        f"--config.data.valid_files={folder}/valid.txt",
        f"--config.data.test_files={folder}/test.txt",
        "--config.data.vocab_size=300",
    ]
  else:
    if not SHARED.is_dir():
      pytest.skip("no ../shared/data")
    files = [
        f"--config.data.{s}_files={SHARED}/wikitext-2/wiki.{s}.tokens"
        for s in ("train", "valid", "test")
    ]
    files += ["--config.data.vocab_size=2000", "--config.data.spm_sample_mb=2"]
  workdir, tfds_dir = tmp_path / "run", tmp_path / "tfds"
  r = _main(
      [
          f"--config={REPO / 'configs/text.py'}",
          f"--workdir={workdir}",
          f"--config.data.data_dir={tfds_dir}",
          "--config.data.documents=reset",
          *files,
          *TINY,
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert (workdir / "tokenizer.json").is_file()
  r = _main([f"--workdir={workdir}", "--mode=eval"])
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads((workdir / "eval_results.json").read_text())
  for split in ("valid", "test"):
    assert results[split]["documents"] >= 1 and 0 < results[split]["bits_per_byte"] < 20
  (tmp_path / "some.txt").write_text("Grüße aus Köln, and the a of.\n")
  r = _main(
      [
          f"--workdir={workdir}",
          "--mode=score",
          f"--text={tmp_path / 'some.txt'}",
          f"--out={tmp_path / 'nll.npy'}",
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert np.load(tmp_path / "nll.npy").shape[1] >= 10
  r = _main(
      [
          f"--workdir={workdir}",
          "--mode=generate",
          "--prompt=Grüße aus",
          "--num_tokens=12",
          "--seed=1",
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  first = r.stdout  # an untrained model's byte pieces may not be UTF-8: U+FFFD allowed
  assert first.strip()
  shutil.rmtree(tfds_dir)
  if corpus == "gzip_files":
    shutil.rmtree(tmp_path / "files")
    r = _main(
        [
            f"--workdir={workdir}",
            "--mode=generate",
            "--prompt=Grüße aus",
            "--num_tokens=12",
            "--seed=1",
        ]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "using the tokenizer saved in" in r.stderr and r.stdout == first


def test_a_corpus_that_tokenises_differently_from_the_run_is_refused(tmp_path):
  folder = _write(tmp_path / "files", DOCS)
  settings = _settings(
      folder,
      train_files=f"{folder}/a.txt,{folder}/b.txt.gz",
      valid_files=f"{folder}/c.txt",
      test_files=f"{folder}/c.txt",
  )
  load = lambda: text_builder.load_text_corpus(settings, data_dir=tmp_path / "tfds")  # noqa: E731
  corpus = load()
  workdir = tmp_path / "run"
  workdir.mkdir()
  text_vocab.save_tokenizer(corpus, workdir)
  text_vocab.check_saved_tokenizer(corpus, workdir)  # the same: fine
  saved = text_vocab.load_saved_tokenizer(workdir)
  assert list(saved.vocab) == list(corpus.vocab)
  np.testing.assert_array_equal(saved.encode("The cat sat.\n"), corpus.encode("The cat sat.\n"))
  (folder / "c.txt").write_text("one line only, now changed\n")  # valid/test: same vocabulary
  text_vocab.check_saved_tokenizer(load(), workdir)
  (folder / "a.txt").write_text("different training words\n")  # train: another vocabulary
  with pytest.raises(data.DataError, match="tokenises differently"):
    text_vocab.check_saved_tokenizer(load(), workdir)
