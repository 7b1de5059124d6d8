"""``eval.documents="whole"``: every document scored from an empty memory to its end.

Per-document results (tokens, mean NLL, bits per byte and word-level
perplexity where the corpus records each document's bytes and words) are
compared with ``Evaluator.score`` of each document alone (the boundary
symbol, then the document, from an empty memory), computed independently;
the corpus-level loss is the token-weighted mean of the documents.  The
split is built as in ``tests/test_eval_documents.py`` (``helpers.documents_corpus``);
``data.documents`` stays "stream": whole-document evaluation does not depend on it.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from transformer_xl import data, default_config
from transformer_xl.data.corpus import ArraySource

from helpers import (
    DOC_LENGTHS,
    documents_corpus,
    documents_eval_config,
    evaluator_and_params,
    scores_alone,
)


def whole_config(global_batch, mesh_shape, same_length=True, attn_type=0):
  config = documents_eval_config(
      global_batch, mesh_shape, same_length=same_length, attn_type=attn_type
  )
  config.data.documents = "stream"
  config.eval.documents = "whole"
  return config


def with_sizes(corpus, docs):
  """The corpus with made-up bytes and words per document (3 and 2 per token, a
  document of one token without words) and their split totals."""
  n_bytes = np.asarray([3 * len(d) for d in docs], np.int32)
  n_words = np.asarray([2 * len(d) if len(d) > 1 else 0 for d in docs], np.int32)
  return data.Corpus(
      **{
          **{f: getattr(corpus, f) for f in ("name", "unit", "vocab", "boundary_id", "splits")},
          "documents": corpus.documents,
          "num_bytes": {"valid": int(n_bytes.sum())},
          "num_words": {"valid": int(n_words.sum())},
          "document_bytes": {"valid": ArraySource(n_bytes)},
          "document_words": {"valid": ArraySource(n_words)},
      }
  )


@pytest.mark.parametrize(
    "global_batch,mesh_shape,same_length,attn_type",
    [
        pytest.param(2, (8, 1), True, 0, marks=pytest.mark.smoke),  # the default path: packed
        (3, (8, 1), False, 0),  # each document starts a segment
        pytest.param(1, (8, 1), True, 0, marks=pytest.mark.slow),
        pytest.param(2, (4, 2), True, 2, marks=pytest.mark.slow),
    ],
)
def test_each_document_equals_it_scored_alone(
    global_batch, mesh_shape, same_length, attn_type, reports
):
  corpus, docs = documents_corpus(DOC_LENGTHS)
  corpus = with_sizes(corpus, docs)
  config = whole_config(global_batch, mesh_shape, same_length, attn_type)
  evaluator, params = evaluator_and_params(config, corpus)
  result = evaluator.evaluate_documents(params, "valid")
  alone = [a.sum() for a in scores_alone(evaluator, params, docs)]
  per = result["per_document"]
  assert [d["document"] for d in per] == list(range(len(docs)))
  assert [d["tokens"] for d in per] == [len(d) for d in docs]
  for k, (d, nll) in enumerate(zip(per, alone)):
    np.testing.assert_allclose(d["loss_nats"] * d["tokens"], nll, rtol=1e-5, err_msg=str(k))
    assert d["ppl"] == pytest.approx(math.exp(nll / len(docs[k])), rel=1e-5)
    assert d["bits_per_byte"] == pytest.approx(nll / (3 * len(docs[k]) * math.log(2)), rel=1e-5)
    if len(docs[k]) > 1:
      assert d["words"] == 2 * len(docs[k])
      assert d["word_ppl"] == pytest.approx(math.exp(nll / (2 * len(docs[k]))), rel=1e-5)
    else:
      assert d["word_ppl"] is None and d["words"] == 0
  assert result["tokens"] == sum(DOC_LENGTHS) and result["documents_scored"] == len(docs)
  np.testing.assert_allclose(result["loss_nats"] * result["tokens"], sum(alone), rtol=1e-5)
  # Progress by documents, ending with all of them.
  progress = [line for line in reports.lines if "documents scored" in line]
  assert progress and progress[-1].startswith(f"eval valid: {len(docs)}/{len(docs)} documents")


def test_the_stream_layout_would_not_score_documents_alone():
  """Not vacuous: without eval.documents="whole" (data.documents="stream"), a
  document sees the documents before it, and its loss is another."""
  corpus, docs = documents_corpus(DOC_LENGTHS)
  config = whole_config(2, (8, 1))
  config.eval.documents = "split"
  evaluator, params = evaluator_and_params(config, corpus)
  result = evaluator.evaluate(params, "valid")
  alone = sum(a.sum() for a in scores_alone(evaluator, params, docs))
  assert abs(result["loss_nats"] * result["tokens"] / alone - 1) > 1e-3


def test_whole_documents_need_documents_and_the_segment_method():
  corpus, _ = documents_corpus(DOC_LENGTHS)
  bare = data.Corpus(
      **{f: getattr(corpus, f) for f in ("name", "unit", "vocab", "boundary_id")},
      splits=corpus.splits,
  )
  with pytest.raises(data.DataError, match="eval.documents='whole' needs a corpus with documents"):
    evaluator_and_params(whole_config(2, (8, 1)), bare)
  for key, value, needle in (
      ("documents", "books", "eval.documents='books': use 'split' or 'whole'"),
      ("method", "sliding", "eval.documents='whole' needs eval.method='segments'"),
  ):
    config = whole_config(2, (8, 1))
    config.eval[key] = value
    with pytest.raises(default_config.ConfigError, match=needle):
      default_config.validate(config, jax.device_count(), training=False)
  config = whole_config(2, (8, 1))
  config.data.dataset = "ptb"
  with pytest.raises(default_config.ConfigError, match="built-in corpus 'ptb' does not have"):
    default_config.validate(config, jax.device_count(), training=False)
  config = whole_config(2, (8, 1))
  config.data.update(dataset="tfds:pg19", text_key="book_text")
  default_config.validate(
      config, jax.device_count(), training=False
  )  # a corpus with documents: fine
  config.eval.dynamic.lr = 0.1
  with pytest.raises(default_config.ConfigError, match="not go with dynamic evaluation"):
    default_config.validate(config, jax.device_count(), training=False)
