"""Evaluation with ``data.documents="reset"``: every document scored as if alone.

A split of documents of different lengths, some longer than an evaluation
row (``ceil(N / eval.global_batch)`` tokens), is evaluated with 1, 2 and 3
rows on meshes of 8 simulated devices.  Each document lies whole in one row,
and its NLL, token by token and summed, equals ``Evaluator.score`` of that
document alone (the boundary symbol, then its tokens, from an empty memory):
to float32 rounding with ``eval.same_length=True`` and relative positions,
where documents follow each other in a row; and also with
``same_length=False`` or absolute positions (``attn_type`` 2, 3), where a
query's keys depend on its place in the segment, because each document then
starts a segment of its row (``data.EvalIterator``'s ``align_documents``).
The split's token count is its length, and its total NLL the documents' sum.
"""

import numpy as np
import pytest

from transformer_xl import data
from transformer_xl.data.corpus import ArraySource

from helpers import (
    DOC_LENGTHS,
    DOC_SEP,
    documents_corpus,
    documents_eval_config,
    evaluator_and_params,
    scores_alone,
)

SLOW = pytest.mark.slow


def split_scores(evaluator, params):
  """One pass over the split: (NLL float64 [N] of every token, int64 [N] the row
  that scores it, {row: the tokens it scores, in order})."""
  n = evaluator.corpus.splits["valid"].num_tokens
  nll, row, per_row = np.full(n, np.nan), np.full(n, -1, np.int64), {}
  for nll_BxT, weights_BxT, pairs in evaluator._scored_batches(params, "valid"):  # pylint: disable=protected-access
    p, w = pairs(), np.asarray(weights_BxT)
    np.testing.assert_array_equal(w > 0, p >= 0)  # padding: weight 0
    x = np.asarray(nll_BxT)
    for r in range(p.shape[0]):
      j = p[r][p[r] >= 0]
      assert np.all(row[j] == -1), "a token scored twice"
      row[j], nll[j] = r, x[r][p[r] >= 0]
      per_row.setdefault(r, []).extend(j.tolist())
  assert np.all(row >= 0), "a token never scored"
  return nll, row, per_row


def assert_each_document_scores_as_alone(evaluator, params, docs, rtol):
  nll, row, per_row = split_scores(evaluator, params)
  for r, j in per_row.items():  # each row reads its tokens in stream order
    assert j == sorted(j), r
  start, total = 0, 0.0
  for k, (doc, alone) in enumerate(zip(docs, scores_alone(evaluator, params, docs))):
    span = slice(start, start + len(doc))
    assert len(set(row[span])) == 1, f"document {k} ({len(doc)} tokens) is cut between rows"
    np.testing.assert_allclose(
        nll[span], alone, rtol=1e-5, atol=1e-5, err_msg=f"document {k} ({len(doc)} tokens)"
    )
    np.testing.assert_allclose(
        nll[span].sum(), alone.sum(), rtol=rtol, err_msg=f"document {k}: the NLL sum"
    )
    start, total = start + len(doc), total + alone.sum()
  result = evaluator.evaluate(params, "valid")
  assert result["tokens"] == start == evaluator.corpus.splits["valid"].num_tokens
  np.testing.assert_allclose(result["loss_nats"] * result["tokens"], total, rtol=rtol)


@pytest.mark.parametrize(
    "global_batch,mesh_shape",
    [
        (1, (8, 1)),
        (2, (8, 1)),  # the case
        (3, (8, 1)),
        pytest.param(2, (4, 2), marks=SLOW),
        pytest.param(3, (2, 4), marks=SLOW),
    ],
)
def test_each_document_scores_as_alone_with_same_length(global_batch, mesh_shape):
  """``eval.same_length=True`` (every config's): documents longer than a row
  stay whole, and score as alone to float32 rounding (~1e-7 of a document's sum)."""
  corpus, docs = documents_corpus(DOC_LENGTHS)
  evaluator, params = evaluator_and_params(documents_eval_config(global_batch, mesh_shape), corpus)
  assert not evaluator.align_documents  # packed: the layout of documents="reset" as before
  assert max(DOC_LENGTHS) > -(-sum(DOC_LENGTHS) // global_batch) or global_batch == 1
  assert_each_document_scores_as_alone(evaluator, params, docs, rtol=1e-6)


@pytest.mark.parametrize(
    "global_batch,mesh_shape,same_length,attn_type",
    [
        (1, (8, 1), False, 0),
        (2, (8, 1), False, 0),
        (2, (8, 1), True, 2),
        pytest.param(3, (4, 2), False, 0, marks=SLOW),
        pytest.param(2, (8, 1), False, 1, marks=SLOW),
        pytest.param(3, (8, 1), False, 3, marks=SLOW),
    ],
)
def test_each_document_scores_as_alone_where_the_place_in_the_segment_matters(
    global_batch, mesh_shape, same_length, attn_type
):
  """``eval.same_length=False`` (query i of a segment sees mem_len + i keys) and the
  absolute positions (types 2, 3, counted from the window's end): a document scores
  as alone only if it starts a segment, as it does alone; so each one does (before
  the fix, packed: 1e-2 of a document's sum apart, 1e-1 for the absolute types)."""
  corpus, docs = documents_corpus(DOC_LENGTHS)
  config = documents_eval_config(
      global_batch, mesh_shape, same_length=same_length, attn_type=attn_type
  )
  evaluator, params = evaluator_and_params(config, corpus)
  assert evaluator.align_documents
  assert_each_document_scores_as_alone(evaluator, params, docs, rtol=1e-6)
  # Not vacuous: documents packed without alignment (the layout of same_length=True)
  # score otherwise.
  evaluator.align_documents = False
  packed, _, _ = split_scores(evaluator, params)
  start, worst = 0, 0.0
  for doc, alone in zip(docs, scores_alone(evaluator, params, docs)):
    worst = max(worst, abs(packed[start : start + len(doc)].sum() / alone.sum() - 1))
    start += len(doc)
  assert worst > 1e-3


# ---------------------------------------------------------------------------
# The iterator's layout, against a plain loop.


def naive_aligned_rows(lengths, global_batch, tgt_len):
  """Per row, the documents it holds (indices, in order), by a plain loop: the
  documents in order, a row boundary before the first document that starts at
  or after row r's share ``r * ceil(S / B)`` of the S segments (each document
  takes ceil(length / T) segments)."""
  segs = [-(-n // tgt_len) for n in lengths]
  share = -(-sum(segs) // global_batch)
  rows, before = [[] for _ in range(global_batch)], 0
  for k, s in enumerate(segs):
    r = 0
    while r + 1 < global_batch and before >= (r + 1) * share:
      r += 1
    rows[r].append(k)
    before += s
  return rows


@pytest.mark.parametrize(
    "lengths,global_batch,tgt_len",
    [
        (DOC_LENGTHS, 1, 4),
        pytest.param(DOC_LENGTHS, 2, 4, marks=pytest.mark.smoke),
        (DOC_LENGTHS, 3, 5),
        ([1, 1, 1], 5, 3),  # more rows than documents
        ([40], 3, 7),  # one document longer than every row
        ([4, 8, 12, 3, 5], 2, 4),  # lengths multiple of T: no padding between documents
    ],
)
def test_aligned_layout_against_a_loop(lengths, global_batch, tgt_len):
  """Every document starts at position 0 of a segment of its row, its tokens in
  order, then padding (weight 0, boundary ids) to the segment's end; rows hold
  the documents in order; every token once with weight 1; inputs are the
  previous tokens (the boundary before the first); doc_pos counts from 0 at
  each document's first target."""
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  n = int(offsets[-1])
  tokens = np.arange(n, dtype=np.int32) + 100
  stream = np.concatenate([[DOC_SEP], tokens])
  index = data.ArraySentenceIndex(data.sentence_offsets(np.asarray(lengths)))
  it = data.EvalIterator(
      ArraySource(tokens), global_batch, tgt_len, DOC_SEP, documents=index, align_documents=True
  )
  batches = list(it)
  assert len(batches) == it.num_steps == len(it)
  cat = lambda key: np.concatenate([b[key] for b in batches], axis=1)  # noqa: E731
  inputs, targets, weights, doc_pos = (cat(k) for k in ("inputs", "targets", "weights", "doc_pos"))
  assert weights.sum() == n
  want_rows = naive_aligned_rows(lengths, global_batch, tgt_len)
  for r, docs in enumerate(want_rows):
    want_w, want_t, want_i, want_d = [], [], [], []
    for k in docs:
      m = lengths[k]
      pad = -m % tgt_len
      j = np.arange(offsets[k], offsets[k + 1])
      want_w += [1.0] * m + [0.0] * pad
      want_t += list(tokens[j]) + [DOC_SEP] * pad
      want_i += list(stream[j]) + [DOC_SEP] * pad
      want_d += list(range(m)) + [0] * pad
    width = len(want_w)
    assert width <= weights.shape[1]
    np.testing.assert_array_equal(weights[r, :width], want_w)
    np.testing.assert_array_equal(targets[r, :width], want_t)
    np.testing.assert_array_equal(inputs[r, :width], want_i)
    np.testing.assert_array_equal(doc_pos[r, :width], want_d)
    assert not weights[r, width:].any() and np.all(targets[r, width:] == DOC_SEP)
    for s, b in enumerate(batches):
      np.testing.assert_array_equal(it.pairs(s)[r] >= 0, b["weights"][r] > 0)
  assert max(len(d) for d in want_rows) >= 1 and [k for d in want_rows for k in d] == list(
      range(len(lengths))
  )
  resets = [bool(np.all(b["reset"])) for b in batches]
  assert resets[0] and not any(np.any(b["reset"]) for b in batches[1:])


def test_aligned_layout_state_and_rows_of_a_process():
  """get_state/set_state resume the aligned pass; a process's rows are those rows
  of the global layout."""
  index = data.ArraySentenceIndex(data.sentence_offsets(np.asarray(DOC_LENGTHS)))
  source = ArraySource(np.arange(sum(DOC_LENGTHS), dtype=np.int32) + 100)
  make = lambda rows=None: data.EvalIterator(  # noqa: E731
      source, 3, 4, DOC_SEP, row_ids=rows, documents=index, align_documents=True
  )
  full = list(make())
  part = make([1, 2])
  for b_full, b_part in zip(full, part):
    for key in b_full:
      np.testing.assert_array_equal(b_part[key], b_full[key][1:])
  it = make()
  next(it)
  state = it.get_state()
  resumed = make()
  resumed.set_state(state)
  for key, value in next(resumed).items():
    np.testing.assert_array_equal(value, full[1][key])


def test_align_documents_needs_documents():
  with pytest.raises(ValueError, match="align_documents"):
    data.EvalIterator(ArraySource(np.arange(10)), 2, 4, DOC_SEP, align_documents=True)
