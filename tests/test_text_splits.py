"""Which files a text corpus's splits read, and what a document is (issue 37).

A file matched by two splits is refused (unless ``data.allow_split_overlap``),
``**`` follows no directory link, ``configs/text.py``'s document is a file
as the guide says, training reports each split's documents, a BOM at the
start of a file is not text, and ``tokenizer=byte`` refuses a vocabulary
size.
"""

import dataclasses
import glob
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.cli import user_errors
from transformer_xl.data import text_builder, text_reading
from transformer_xl.data.text_settings import TextSettings, settings_problems
from transformer_xl.training import train

from helpers import REPO, tiny_config


def _write(folder: Path, texts: dict[str, str]) -> Path:
  for name, text in texts.items():
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
  return folder


# -- 1. a file in two splits --------------------------------------------------------------------


@pytest.fixture
def corp(tmp_path, monkeypatch):
  """The issue's layout: corp/ holds the training files and the valid and test files;
  the test runs in its parent, so that the patterns are relative as a user types them."""
  _write(
      tmp_path / "corp",
      {
          "a.txt": "first training file\n",
          "b.txt": "second training file\n",
          "valid.txt": "the valid text\n",
          "test.txt": "the test text\n",
      },
  )
  monkeypatch.chdir(tmp_path)
  return tmp_path / "corp"


def _split_settings(**kw) -> TextSettings:
  kw.setdefault("train_files", "corp/*.txt")
  kw.setdefault("valid_files", "corp/valid.txt")
  kw.setdefault("test_files", "corp/test.txt")
  return TextSettings(**kw)


def test_a_file_in_two_splits_is_refused_before_any_work(corp, tmp_path):
  data_dir = tmp_path / "tfds"
  with pytest.raises(data.DataError) as err:
    text_builder.load_text_corpus(_split_settings(tokenizer="byte"), data_dir=data_dir)
  msg = str(err.value)
  assert "\n" not in msg
  # the first file two splits share (valid's, as train's pattern comes first), both patterns,
  # both splits, and the opt-out
  assert str((corp / "valid.txt").resolve()) in msg
  assert "data.train_files ('corp/*.txt')" in msg and "data.valid_files ('corp/valid.txt')" in msg
  assert "data.allow_split_overlap=True" in msg
  assert not data_dir.exists()  # nothing prepared


@pytest.mark.parametrize(
    "spelling",
    ["corp/../corp/test.txt", "{abs}/corp/./test.txt", "link/test.txt", "test_link.txt"],
)
def test_two_spellings_of_one_file_are_one_file(corp, tmp_path, spelling):
  (tmp_path / "link").symlink_to(corp, target_is_directory=True)
  (tmp_path / "test_link.txt").symlink_to(corp / "test.txt")
  s = _split_settings(
      train_files="corp/a.txt,corp/b.txt",
      valid_files="corp/valid.txt",
      test_files=f"corp/test.txt,{spelling.format(abs=tmp_path)}",
  )
  assert [f.name for f in text_reading.resolve_files(s)["test"]] == ["test.txt"]  # once
  s = dataclasses.replace(s, valid_files=spelling.format(abs=tmp_path), test_files="corp/b.txt")
  with pytest.raises(data.DataError, match=r"data.train_files \('corp/b.txt'\)"):
    text_reading.resolve_files(s)  # b.txt in train and test
  s = dataclasses.replace(s, test_files="corp/test.txt")
  with pytest.raises(data.DataError) as err:
    text_reading.resolve_files(s)  # test.txt in valid (spelled otherwise) and test
  assert f"data.valid_files ({spelling.format(abs=tmp_path)!r})" in str(err.value)
  assert "data.test_files ('corp/test.txt')" in str(err.value)


def test_split_overlap_can_be_allowed_explicitly(corp, tmp_path):
  s = _split_settings(tokenizer="byte", allow_split_overlap=True)
  files = text_reading.resolve_files(s)
  assert [f.name for f in files["train"]] == ["a.txt", "b.txt", "test.txt", "valid.txt"]
  # the opt-out changes no data: the same prepared dataset either way
  assert text_reading.fingerprint(s, files) == text_reading.fingerprint(
      dataclasses.replace(s, allow_split_overlap=False), files
  )
  # through the config, as --config.data.allow_split_overlap=True gives it
  config = default_config.get_config()
  assert config.data.allow_split_overlap is False
  config.data.update(
      dataset="text",
      train_files=s.train_files,
      valid_files=s.valid_files,
      test_files=s.test_files,
      tokenizer="byte",
      data_dir=str(tmp_path / "tfds"),
  )
  with pytest.raises(data.DataError, match="allow_split_overlap"):
    data.load_configured(config.data.to_dict())
  config.data.allow_split_overlap = True
  corpus = data.load_configured(config.data.to_dict())
  assert corpus.splits["train"].num_tokens == sum(
      (corp / n).stat().st_size for n in ("a.txt", "b.txt", "test.txt", "valid.txt")
  )
  # a built-in corpus has no files to overlap: the setting is refused there
  builtin = default_config.get_config()
  builtin.data.allow_split_overlap = True
  with pytest.raises(default_config.ConfigError, match="allow_split_overlap"):
    default_config.validate(builtin, 1)


# -- 2. ** and directory links ----------------------------------------------------------------

_RESOLVE = textwrap.dedent("""
    import json, sys
    from transformer_xl.data import text_reading
    from transformer_xl.data.text_settings import TextSettings
    s = TextSettings(train_files=sys.argv[1], valid_files="v/v.txt", test_files="v/t.txt")
    print(json.dumps([str(f) for f in text_reading.resolve_files(s)["train"]]))
    """)


def _resolve_in_subprocess(folder: Path, pattern: str) -> list[str]:
  """The train files of ``pattern`` (relative to ``folder``), resolved in a
  subprocess that is killed after 60 s (a glob that never ends fails the test)."""
  env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
  start = time.monotonic()
  try:
    out = subprocess.run(
        [sys.executable, "-c", _RESOLVE, pattern],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
  except subprocess.TimeoutExpired:
    pytest.fail(f"resolving {pattern!r} did not end in 60 s (a ** glob following links?)")
  assert time.monotonic() - start < 60
  return [os.path.relpath(p, folder.resolve()) for p in json.loads(out.stdout)]


def test_recursive_glob_follows_no_directory_link(tmp_path):
  """The issue's folder: two links to ``..`` under the corpus made ``**`` recurse
  exponentially.  ``**`` now follows no directory link; a link named in the
  pattern (or matched by a one-level wildcard) is followed, and a link to a
  file is a file wherever it is."""
  _write(
      tmp_path,
      {
          "corp/a.txt": "a\n",
          "corp/sub/b.txt": "b\n",
          "corp/sub/deeper/c.txt": "c\n",
          "elsewhere/d.txt": "d\n",
          "elsewhere/inner/e.txt": "e\n",
          "v/v.txt": "v\n",
          "v/t.txt": "t\n",
      },
  )
  (tmp_path / "corp/sub/up2").symlink_to("..", target_is_directory=True)
  (tmp_path / "corp/loop1").symlink_to("..", target_is_directory=True)
  (tmp_path / "corp/loop2").symlink_to("..", target_is_directory=True)
  (tmp_path / "corp/linked").symlink_to("../elsewhere", target_is_directory=True)
  (tmp_path / "corp/sub/f.txt").symlink_to("../../elsewhere/d.txt")
  recursive = ["corp/a.txt", "corp/sub/b.txt", "corp/sub/deeper/c.txt", "elsewhere/d.txt"]
  assert _resolve_in_subprocess(tmp_path, "corp/**/*.txt") == recursive
  # a directory link named in the pattern: followed, and ** recurses inside it
  assert _resolve_in_subprocess(tmp_path, "corp/linked/**/*.txt") == [
      "elsewhere/d.txt",
      "elsewhere/inner/e.txt",
  ]
  # matched by a one-level wildcard: followed (the depth is bounded by the pattern)
  assert _resolve_in_subprocess(tmp_path, "corp/*/d.txt") == ["elsewhere/d.txt"]


def test_recursive_glob_without_links_is_globs(tmp_path, monkeypatch):
  """Without links, the patterns match exactly what ``glob.glob(recursive=True)``
  matches (hidden names skipped by ``*`` and ``**`` alike, several ``**``)."""
  _write(
      tmp_path,
      {
          name: "x\n"
          for name in (
              "top.txt",
              "a/x.txt",
              "a/b/y.txt",
              "a/b/c/z.md",
              "a/.hidden/h.txt",
              "a/.h.txt",
              ".dot/q.txt",
              "b/a/b/w.txt",
              "[odd]/o.txt",
          )
      },
  )
  monkeypatch.chdir(tmp_path)
  patterns = [
      "**/*.txt",
      "**",
      "a/**",
      "a/**/*.txt",
      "**/b/**/*.txt",
      "**/**/*.txt",
      "a/**/b/*.txt",
      "a/.hidden/**/*.txt",
      f"{tmp_path}/**/*.md",
      "*/**/?.txt",
      "[[]odd]/**",
  ]
  for pattern in patterns:
    want = sorted({p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)})
    assert text_reading.expand_pattern(pattern) == want, pattern


# -- 3. configs/text.py's document ------------------------------------------------------------


def _load_config(path: Path):
  import importlib.util

  spec = importlib.util.spec_from_file_location("text_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def test_text_config_reads_each_file_as_one_document(tmp_path):
  """The guide (own_text.md) says a document is a file: configs/text.py on N
  files gives N documents (each file of several paragraphs)."""
  texts = {
      f"train/{i}.txt": f"Paragraph one of {i}.\nStill one.\n\nParagraph two.\n\n\nThree.\n"
      for i in range(5)
  }
  _write(tmp_path, {**texts, "valid.txt": "v one\n\nv two\n", "test.txt": "t one\n\nt two\n"})
  config = _load_config(REPO / "configs" / "text.py")
  config.data.update(
      train_files=f"{tmp_path}/train/*.txt",
      valid_files=f"{tmp_path}/valid.txt",
      test_files=f"{tmp_path}/test.txt",
      tokenizer="byte",
      vocab_size=0,
      data_dir=str(tmp_path / "tfds"),
  )
  corpus = data.load_configured(config.data.to_dict())
  assert corpus.documents["train"].num_sentences == 5
  assert corpus.documents["valid"].num_sentences == 1
  # what the guide says a document is: the default, which the config keeps
  assert "what one document is: `file` (default," in (REPO / "docs/guide/own_text.md").read_text()
  assert config.data.document_separator == default_config.get_config().data.document_separator


# -- 4. training reports the documents ----------------------------------------------------------


class _Stop(Exception):
  pass


def test_training_reports_each_splits_documents(tmp_path, monkeypatch, reports):
  _write(
      tmp_path / "c",
      {
          "t1.txt": "one\n\ntwo\n",
          "t2.txt": "three\n",
          "t3.txt": "four\n\nfive\n\nsix\n",
          "v.txt": "valid\n",
          "x.txt": "test\n\nmore\n",
      },
  )
  s = TextSettings(
      train_files=f"{tmp_path}/c/t*.txt",
      valid_files=f"{tmp_path}/c/v.txt",
      test_files=f"{tmp_path}/c/x.txt",
      tokenizer="byte",
      document_separator="paragraph",
  )
  corpus = text_builder.load_text_corpus(s, data_dir=tmp_path / "tfds")

  def stop(*args, **kwargs):
    raise _Stop  # the report is made before the train step is built: nothing to compile

  monkeypatch.setattr(train, "make_train_step", stop)
  config = tiny_config(num_steps=1, eval_every=0, global_batch=2)
  config.data.update(dataset="text", document_separator="paragraph")
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  with pytest.raises(_Stop):
    train.train_and_evaluate(config, str(tmp_path / "wd"), corpus, mesh)
  lines = [line for line in reports.lines if "documents" in line]
  assert len(lines) == 1, reports.text
  # counted by hand: paragraphs, files, tokens (bytes: each line and its \n)
  assert "train: 6 documents in 3 files, 31 tokens" in lines[0]
  assert "valid: 1 document in 1 file, 6 tokens" in lines[0]
  assert "test: 2 documents in 1 file, 11 tokens" in lines[0]
  assert "a document is a paragraph" in lines[0]


# -- 5. a BOM, and byte with a vocabulary size ------------------------------------------------------


def test_a_bom_at_the_start_of_each_file_is_not_text(tmp_path):
  bom = "\ufeff"
  texts = {"1.txt": "Hello world\nsecond line\n", "2.txt": "Hello again\n"}
  for name, text in texts.items():
    (tmp_path / "bom").mkdir(exist_ok=True)
    (tmp_path / "bom" / name).write_text(bom + text, encoding="utf-8")
    (tmp_path / "plain").mkdir(exist_ok=True)
    (tmp_path / "plain" / name).write_text(text, encoding="utf-8")

  def load(folder, tokenizer):
    s = TextSettings(
        train_files=f"{tmp_path}/{folder}/*.txt",
        valid_files=f"{tmp_path}/{folder}/2.txt",
        test_files=f"{tmp_path}/{folder}/1.txt",
        tokenizer=tokenizer,
        allow_split_overlap=True,
    )
    return text_builder.load_text_corpus(s, data_dir=tmp_path / "tfds")

  for tokenizer in ("word", "byte"):
    with_bom, without = load("bom", tokenizer), load("plain", tokenizer)
    assert list(with_bom.vocab) == list(without.vocab)
    assert "Hello" in with_bom.vocab or tokenizer == "byte"
    for split in ("train", "valid", "test"):
      a, b = with_bom.splits[split], without.splits[split]
      assert a.num_tokens == b.num_tokens
      assert (a.read(0, a.num_tokens) == b.read(0, b.num_tokens)).all()
    assert with_bom.num_bytes == without.num_bytes
  # a BOM later in a file is text (as utf-8-sig keeps it)
  (tmp_path / "mid.txt").write_text("a\n" + bom + "b\n", encoding="utf-8")
  lines = [line for line, _ in text_reading.document_lines([tmp_path / "mid.txt"], "file")]
  assert lines == ["a", bom + "b"]
  # the same for a --text file scored against the corpus
  (tmp_path / "score.txt").write_text(bom + "Hello world\n", encoding="utf-8")
  assert user_errors.read_text(str(tmp_path / "score.txt")) == "Hello world\n"


def test_byte_tokenizer_refuses_a_vocabulary_size():
  base = dict(train_files="t", valid_files="v", test_files="t", tokenizer="byte")
  problems = settings_problems(TextSettings(**base, vocab_size=1000))
  assert len(problems) == 1 and "\n" not in problems[0]
  assert "data.vocab_size=1000" in problems[0] and "data.tokenizer=byte" in problems[0]
  assert "data.vocab_size=0" in problems[0]
  assert settings_problems(TextSettings(**base)) == []  # the default
  assert settings_problems(TextSettings(**base, vocab_size=256)) == []  # what it is anyway
  config = default_config.get_config()
  config.data.update(dataset="text", train_files="t", valid_files="v", test_files="t")
  config.data.update(tokenizer="byte", vocab_size=1000)
  with pytest.raises(default_config.ConfigError, match="data.tokenizer=byte"):
    default_config.validate(config, 1)
