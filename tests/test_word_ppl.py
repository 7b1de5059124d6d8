"""Word-level perplexity in evaluation results (issue 39: PG-19's measure).

word_ppl = exp(total NLL of the split / whitespace-separated words of the
split's raw text), beside bits per byte.  The words are counted here by
hand from the files (``str.split``), the NLL by scoring the split as one
stream with ``Evaluator.score``, independently of ``Evaluator.evaluate``.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.data import text_builder
from transformer_xl.data.text_settings import TextSettings
from transformer_xl.inference import evaluate
from transformer_xl.model import models
from transformer_xl.run import metrics

from data_samples import _PTB, _WIKI, SHARED_DATA, _ptb_tgz, _wiki_zip
from helpers import write_ptb_sample

SPLITS = ("train", "valid", "test")


def _ptb_as_text(folder, data_dir):
  return text_builder.load_text_corpus(
      TextSettings(
          train_files=f"{folder}/ptb.train.txt",
          valid_files=f"{folder}/ptb.valid.txt",
          test_files=f"{folder}/ptb.test.txt",
          tokenizer="word",
      ),
      data_dir=data_dir,
  )


def _words(path) -> int:
  return len(path.read_text("utf-8").split())


@pytest.mark.smoke
def test_a_ptb_sample_as_text_and_built_in_counts_the_files_words(tmp_path):
  folder = write_ptb_sample(tmp_path / "ptb", n_lines=(60, 20, 25))
  text = _ptb_as_text(folder, tmp_path / "tfds")
  built_in = data.load_corpus(
      "ptb", data_dir=str(tmp_path / "tfds"), manual_dir=str(folder), verify_checksums=False
  )
  for split in SPLITS:
    words = _words(folder / f"ptb.{split}.txt")
    assert text.num_words[split] == words, split
    assert built_in.num_words[split] == words, split


def test_the_built_in_word_corpora_count_words_as_the_raw_text(tmp_path):
  """PTB and WikiText-2 samples in their archives: the tokens that are not
  ``<eos>`` are the raw text's whitespace words; ptb_char has no word count."""
  manual = tmp_path / "manual"
  _ptb_tgz(manual)
  _wiki_zip(manual, "wikitext-2")
  kw = dict(data_dir=str(tmp_path / "tfds"), manual_dir=str(manual), verify_checksums=False)
  for name, texts in (("ptb", _PTB), ("wikitext2", _WIKI)):
    corpus = data.load_corpus(name, **kw)
    assert {s: corpus.num_words[s] for s in SPLITS} == {
        s: len(texts[s].split()) for s in SPLITS
    }, name
  assert data.load_corpus("ptb_char", **kw).num_words is None


@pytest.mark.slow
@pytest.mark.parametrize("name,folder", [("ptb", "ptb"), ("wikitext2", "wikitext-2")])
def test_the_real_ptb_and_wikitext2_files(tmp_path, name, folder):
  """The shared copies: words = tokens - lines = the files' whitespace words
  (PTB valid 70,390 and test 78,669; WikiText-2 213,886 and 241,211)."""
  if not (SHARED_DATA / folder).is_dir():
    pytest.skip(f"{SHARED_DATA / folder} is not here")
  corpus = data.load_corpus(
      name, data_dir=str(tmp_path / "tfds"), manual_dir=str(SHARED_DATA / folder)
  )
  for split in ("valid", "test"):
    path = next((SHARED_DATA / folder).glob(f"*.{split}.*"))
    lines = path.read_text("utf-8").count("\n")
    assert corpus.num_words[split] == _words(path), split
    assert corpus.num_words[split] == corpus.splits[split].num_tokens - lines, split


def _tiny(corpus):
  config = default_config.get_config()
  config.model.update(
      n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=8, mem_len=8, dropout=0.0
  )
  config.eval.update(tgt_len=8, mem_len=8, global_batch=1)  # one stream, as score
  mcfg = default_config.model_config(config, corpus.vocab_size)
  params = nn.unbox(models.init_params(models.TransformerXL(mcfg), jax.random.PRNGKey(0)))
  return config, mcfg, params


@pytest.mark.smoke
def test_ptb_as_text_gives_word_ppl_exp_of_nll_over_words(tmp_path):
  folder = write_ptb_sample(tmp_path / "ptb", n_lines=(60, 20, 25))
  corpus = _ptb_as_text(folder, tmp_path / "tfds")
  config, mcfg, params = _tiny(corpus)
  evaluator = evaluate.Evaluator(
      config, mcfg, corpus, sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  )
  r = evaluator.evaluate(params, "valid")
  out = metrics.corpus_level(r["loss_nats"], r["tokens"], corpus, "valid")
  # By hand: the split as one stream after the boundary symbol, every token's NLL summed.
  stream = corpus.splits["valid"].read(0, corpus.splits["valid"].num_tokens)
  nll = evaluator.score(params, np.concatenate([[corpus.boundary_id], stream])[None])
  words = _words(folder / "ptb.valid.txt")
  assert out["words"] == words
  assert out["word_ppl"] == pytest.approx(
      math.exp(float(nll.astype(np.float64).sum()) / words), rel=1e-6
  )
  assert out["bits_per_byte"] == pytest.approx(
      float(nll.astype(np.float64).sum()) / (corpus.num_bytes["valid"] * math.log(2))
  )
  assert "word_ppl" not in metrics.corpus_level(r["loss_nats"], r["tokens"] - 1, corpus, "valid")


def test_each_documents_bytes_and_words_are_recorded(tmp_path):
  """Per document (a file each): UTF-8 bytes (a line break per line) and
  whitespace words, as counted here from the files."""
  texts = ["Grüße  aus Köln\n\nzwei\tWörter\n", "one\n", "a b c d\ne f\n"]
  for k, t in enumerate(texts):
    (tmp_path / f"d{k}.txt").write_text(t, "utf-8")
  corpus = text_builder.load_text_corpus(
      TextSettings(
          train_files=f"{tmp_path}/d*.txt",
          valid_files=f"{tmp_path}/d*.txt",
          test_files=f"{tmp_path}/d*.txt",
          allow_split_overlap=True,
          tokenizer="char",
      ),
      data_dir=tmp_path / "tfds",
  )
  for split in SPLITS:
    n = corpus.documents[split].num_sentences
    assert n == len(texts)
    assert corpus.document_bytes[split].read(0, n).tolist() == [len(t.encode()) for t in texts]
    assert corpus.document_words[split].read(0, n).tolist() == [len(t.split()) for t in texts]
    assert corpus.num_words[split] == sum(len(t.split()) for t in texts)


def test_a_text_dataset_prepared_before_words_were_recorded_loads_without_them(tmp_path):
  """A metadata.json without ``num_words`` (prepared before): the corpus loads, with no
  word counts (so no word_ppl) and no per-document bytes or words."""
  import json

  folder = write_ptb_sample(tmp_path / "ptb", n_lines=(60, 20, 25))
  corpus = _ptb_as_text(folder, tmp_path / "tfds")
  assert corpus.num_words is not None
  (path,) = (tmp_path / "tfds").glob("txl_text/*/1.0.0/metadata.json")
  md = json.loads(path.read_text())
  del md["num_words"]
  path.write_text(json.dumps(md))
  old = _ptb_as_text(folder, tmp_path / "tfds")
  assert old.num_words is None and old.document_bytes is None and old.document_words is None
  assert "word_ppl" not in metrics.corpus_level(2.0, old.splits["valid"].num_tokens, old, "valid")
  assert "bits_per_byte" in metrics.corpus_level(2.0, old.splits["valid"].num_tokens, old, "valid")
