"""Tests of transformer_xl.data.shuffled: the shuffled-sentence iterator (lm1b).

The iterator is compared with a line-by-line port of the reference's
``LMShuffledIterator.stream_iterator`` and checked for its properties
(every sentence once per epoch, continuous rows, processes, resumption,
reads); then with a built One Billion Word corpus.
"""

from __future__ import annotations

import collections
import itertools
import json

import numpy as np
import pytest

from transformer_xl import data
from transformer_xl.data import ArraySentenceIndex, ArraySource, Corpus, sentence_offsets

from data_samples import (
    _HELDOUT,
    ARCHIVE,
    RecordingSource,
    _assert_batches_equal,
    _load_lm1b,
    _members,
    _sentences,
    _take,
    _tarball,
)

BOUNDARY = 1


def _sentence_corpus(n_sentences=23, seed=0, max_words=12, long_every=7, tgt_len=5):
  """Sentence i: a word unique to it (1000 + i), random words in [10, 99],
  then BOUNDARY; every ``long_every``-th sentence spans several segments."""
  rng = np.random.default_rng(seed)
  sentences = []
  for i in range(n_sentences):
    k = (3 * tgt_len + 2) if i % long_every == 3 else int(rng.integers(0, max_words))
    words = [1000 + i] + rng.integers(10, 100, size=k).tolist()
    sentences.append(words + [BOUNDARY])
  tokens = np.array([t for s in sentences for t in s], np.int32)
  offsets = sentence_offsets(np.array([len(s) for s in sentences]))
  return tokens, offsets


def _iterator(tokens, offsets, batch, tgt_len, seed=0, row_ids=None, source=None):
  return data.ShuffledSentenceIterator(
      source if source is not None else ArraySource(tokens),
      ArraySentenceIndex(offsets),
      batch,
      tgt_len,
      seed=seed,
      boundary_id=BOUNDARY,
      row_ids=row_ids,
  )


def _reference_batches(tokens, offsets, order, bsz, bptt):
  """The reference's LMShuffledIterator.stream_iterator (no extended context),
  ported line by line to lists; sentences are ``<S> w1 .. wn <S>``
  (add_double_eos), dealt in ``order``.  Yields batch-major (data, target)."""

  def sentences():
    for sid in order:
      words = tokens[offsets[sid] : offsets[sid + 1] - 1].tolist()
      yield [BOUNDARY] + words + [BOUNDARY]

  sent_stream = sentences()
  streams = [None] * bsz
  while True:
    data = np.full((bptt, bsz), -1)
    target = np.full((bptt, bsz), -1)
    for i in range(bsz):
      n_filled = 0
      while n_filled < bptt:
        if streams[i] is None or len(streams[i]) <= 1:
          streams[i] = next(sent_stream)
        n_new = min(len(streams[i]) - 1, bptt - n_filled)
        data[n_filled : n_filled + n_new, i] = streams[i][:n_new]
        target[n_filled : n_filled + n_new, i] = streams[i][1 : n_new + 1]
        streams[i] = streams[i][n_new:]
        n_filled += n_new
    yield data.T, target.T


def _endless_order(it):
  return itertools.chain.from_iterable(it.epoch_order(e) for e in itertools.count())


@pytest.mark.parametrize(
    "batch,tgt_len,n_sentences", [(4, 5, 23), (3, 8, 9), (1, 4, 5), (6, 3, 40)]
)
def test_matches_the_reference_stream_iterator(batch, tgt_len, n_sentences):
  tokens, offsets = _sentence_corpus(n_sentences, tgt_len=tgt_len)
  it = _iterator(tokens, offsets, batch, tgt_len, seed=3)
  # Enough steps for about three epochs.
  n_steps = 3 * len(tokens) // (batch * tgt_len) + 2
  ref = _reference_batches(tokens, offsets, _endless_order(it), batch, tgt_len)
  for step in range(n_steps):
    got = next(it)
    data, target = next(ref)
    np.testing.assert_array_equal(got["inputs"], data, err_msg=f"step {step}")
    np.testing.assert_array_equal(got["targets"], target)
    assert got["inputs"].dtype == got["targets"].dtype == np.int32
    assert got["inputs"].shape == (batch, tgt_len)
    assert got["weights"].dtype == np.float32 and np.all(got["weights"] == 1)
    assert got["reset"].dtype == np.bool_ and got["reset"].shape == (batch,)
    assert np.all(got["reset"] == (step == 0))
  assert it.epoch >= 2


def test_epoch_order_is_a_seeded_permutation():
  tokens, offsets = _sentence_corpus(50)
  a = _iterator(tokens, offsets, 2, 4, seed=7)
  b = _iterator(tokens, offsets, 3, 6, seed=7)
  c = _iterator(tokens, offsets, 2, 4, seed=8)
  for e in range(3):
    np.testing.assert_array_equal(np.sort(a.epoch_order(e)), np.arange(50))
    np.testing.assert_array_equal(a.epoch_order(e), b.epoch_order(e))
    np.testing.assert_array_equal(a.epoch_order(e), np.random.default_rng([7, e]).permutation(50))
  assert not np.array_equal(a.epoch_order(0), a.epoch_order(1))
  assert not np.array_equal(a.epoch_order(0), c.epoch_order(0))


def _row_streams(batches):
  """Per row: the concatenated inputs and targets over the batches."""
  inputs = np.concatenate([b["inputs"] for b in batches], axis=1)
  targets = np.concatenate([b["targets"] for b in batches], axis=1)
  return inputs, targets


def _dealt_sentences(batches, tokens, offsets):
  """Reconstructs, from the emitted targets only, every sentence each row
  started: returns [(step, row, position, sentence id)] in emission order
  and checks each completed sentence's tokens against the stream."""
  tgt_len = batches[0]["targets"].shape[1]
  _, targets = _row_streams(batches)
  started = []
  for r, row in enumerate(targets):
    k = 0
    while k < len(row):
      sid = int(row[k]) - 1000
      assert 0 <= sid < len(offsets) - 1, "a sentence must start here"
      want = tokens[offsets[sid] : offsets[sid + 1]]
      got = row[k : k + len(want)]
      np.testing.assert_array_equal(got, want[: len(got)])
      started.append((k // tgt_len, r, k % tgt_len, sid))
      k += len(want)
  started.sort()
  return started


def test_every_sentence_once_per_epoch_and_rows_continue():
  batch, tgt_len, n = 4, 5, 23
  tokens, offsets = _sentence_corpus(n, tgt_len=tgt_len)
  it = _iterator(tokens, offsets, batch, tgt_len, seed=11)
  steps = 3 * len(tokens) // (batch * tgt_len)
  batches = _take(it, steps)
  started = _dealt_sentences(batches, tokens, offsets)
  dealt = [sid for _, _, _, sid in started]
  assert len(dealt) >= 2 * n
  # Sentences are dealt in (step, row) order: epoch 0's n sentences are a
  # permutation (each exactly once), then epoch 1's, in a different order.
  epoch0, epoch1 = dealt[:n], dealt[n : 2 * n]
  assert sorted(epoch0) == list(range(n)) == sorted(epoch1)
  assert epoch0 != epoch1
  assert epoch0 == it.epoch_order(0).tolist()
  assert epoch1 == it.epoch_order(1).tolist()
  # Some sentences straddle steps (and the epoch boundary falls mid-step).
  assert any(offsets[s + 1] - offsets[s] > tgt_len for s in range(n))
  # Each row is one continuous stream: targets are the inputs shifted by
  # one, across sentences and steps; the first input is the boundary.
  inputs, targets = _row_streams(batches)
  np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
  assert np.all(inputs[:, 0] == BOUNDARY)
  for t in range(steps - 1):
    np.testing.assert_array_equal(batches[t + 1]["inputs"][:, 0], batches[t]["targets"][:, -1])
  # Same seed, same batches; another seed, other batches.
  again = _take(_iterator(tokens, offsets, batch, tgt_len, seed=11), steps)
  for a, b in zip(batches, again):
    _assert_batches_equal(a, b)
  other = _take(_iterator(tokens, offsets, batch, tgt_len, seed=12), steps)
  assert any(not np.array_equal(a["targets"], b["targets"]) for a, b in zip(batches, other))


@pytest.mark.parametrize("row_ids", [[[0, 1, 2], [3, 4, 5]], [[1, 4], [0, 2, 3, 5]]])
def test_processes_together_see_one_process(row_ids):
  batch, tgt_len = 6, 4
  tokens, offsets = _sentence_corpus(31, tgt_len=tgt_len)
  full = _iterator(tokens, offsets, batch, tgt_len)
  parts = [_iterator(tokens, offsets, batch, tgt_len, row_ids=r) for r in row_ids]
  for _ in range(3 * len(tokens) // (batch * tgt_len)):
    want = next(full)
    got = [next(p) for p in parts]
    for rows, part in zip(row_ids, got):
      for key in want:
        np.testing.assert_array_equal(part[key], want[key][rows], err_msg=key)
    assert parts[0].get_state() == parts[1].get_state() == full.get_state()


def test_process_reads_only_its_rows():
  batch, tgt_len = 6, 4
  tokens, offsets = _sentence_corpus(31, tgt_len=tgt_len)
  steps = 3 * len(tokens) // (batch * tgt_len)
  full = _take(_iterator(tokens, offsets, batch, tgt_len), steps)
  started = _dealt_sentences(full, tokens, offsets)
  local = [0, 2, 3]
  src = RecordingSource(tokens)
  it = _iterator(tokens, offsets, batch, tgt_len, row_ids=local, source=src)
  for t in range(steps):
    src.reads.clear()
    next(it)
    # Sentences held by each row during step t: those started up to t.
    held = collections.defaultdict(set)
    for step, row, _, sid in started:
      if step <= t:
        held[row].add(sid)
    mine = set().union(*(held[r] for r in local))
    n_read = 0
    for a, z in src.reads:
      sid = int(np.searchsorted(offsets, a, side="right")) - 1
      assert offsets[sid] <= a < z <= offsets[sid + 1], "one sentence a read"
      assert sid in mine, f"step {t}: read of sentence {sid}, not a local row's"
      n_read += z - a
    # At most one token per piece beyond the pairs emitted.
    assert n_read <= len(local) * tgt_len + len(src.reads)


@pytest.mark.parametrize("k", [0, 1, 3, 9, 12, 20, 31])
def test_state_roundtrip(k):
  batch, tgt_len = 4, 5
  tokens, offsets = _sentence_corpus(23, tgt_len=tgt_len)
  # An epoch is len(tokens) / 20 ~ 11 steps: k = 12, 20, 31 are in later
  # epochs, and the 12 steps after k cross an epoch boundary.
  a = _iterator(tokens, offsets, batch, tgt_len, seed=5)
  _take(a, k)
  assert (a.get_state()["epoch"] >= 1) == (k >= 12)
  state = json.loads(json.dumps(a.get_state()))
  assert len(json.dumps(state)) < 400
  want = _take(a, 12)
  for rows in (None, [1, 3]):
    b = _iterator(tokens, offsets, batch, tgt_len, seed=5, row_ids=rows)
    _take(b, 2)  # anywhere; set_state moves it
    b.set_state(state)
    for w, g in zip(want, _take(b, 12)):
      sel = slice(None) if rows is None else rows
      for key in w:
        np.testing.assert_array_equal(g[key], w[key][sel], err_msg=key)
  assert a.get_state()["step"] == k + 12


def test_set_state_validation():
  tokens, offsets = _sentence_corpus(10)
  it = _iterator(tokens, offsets, 2, 4, seed=1)
  next(it)
  good = it.get_state()

  def bad(**changes):
    state = dict(good, **changes)
    with pytest.raises(ValueError):
      it.set_state(state)

  bad(seed=2)
  bad(global_batch=3)
  bad(tgt_len=5)
  bad(num_tokens=good["num_tokens"] + 1)
  bad(num_sentences=11)
  bad(position=11)
  bad(epoch=-1)
  bad(step=1.5)
  bad(row_sentence=[0])
  bad(row_sentence=[10, 0])
  bad(row_used=[0, 10**6])
  bad(row_sentence=[-1, good["row_sentence"][1]], row_used=[1, good["row_used"][1]])
  with pytest.raises(ValueError, match="missing"):
    it.set_state({k: v for k, v in good.items() if k != "epoch"})
  with pytest.raises(ValueError):
    it.set_state([1, 2])
  assert it.get_state() == good  # failed restores change nothing


def test_constructor_errors():
  tokens, offsets = _sentence_corpus(10)
  src, index = ArraySource(tokens), ArraySentenceIndex(offsets)
  with pytest.raises(ValueError, match="seed"):
    data.ShuffledSentenceIterator(src, index, 2, 4, seed=-1, boundary_id=1)
  with pytest.raises(ValueError, match="boundary_id"):
    data.ShuffledSentenceIterator(src, index, 2, 4, seed=0, boundary_id=None)
  with pytest.raises(ValueError, match="SentenceIndex"):
    data.ShuffledSentenceIterator(src, src, 2, 4, seed=0, boundary_id=1)
  with pytest.raises(ValueError, match="does not belong"):
    data.ShuffledSentenceIterator(ArraySource(tokens[:-1]), index, 2, 4, seed=0, boundary_id=1)
  with pytest.raises(ValueError, match="row_ids"):
    data.ShuffledSentenceIterator(src, index, 2, 4, seed=0, boundary_id=1, row_ids=[2])
  with pytest.raises(ValueError):
    ArraySentenceIndex(np.array([0, 3, 3, 5]))


def test_failed_read_leaves_the_position_unchanged():
  tokens, offsets = _sentence_corpus(10)

  class Flaky(RecordingSource):
    fail = False

    def read(self, start, stop):
      if self.fail:
        raise OSError("disk gone")
      return super().read(start, stop)

  src = Flaky(tokens)
  it = _iterator(tokens, offsets, 2, 4, source=src)
  reference = _iterator(tokens, offsets, 2, 4)
  next(it), next(reference)
  before = it.get_state()
  src.fail = True
  with pytest.raises(OSError):
    next(it)
  assert it.get_state() == before
  src.fail = False
  _assert_batches_equal(next(it), next(reference))


def test_make_train_iterator_picks_by_corpus():
  tokens, offsets = _sentence_corpus(20)
  plain = Corpus(
      name="x",
      unit="word",
      vocab=tuple(map(str, range(2000))),
      boundary_id=BOUNDARY,
      splits={"train": ArraySource(tokens)},
  )
  it = data.make_train_iterator(plain, "train", 2, 4, seed=0)
  assert type(it) is data.TrainIterator
  sentences = Corpus(
      name="x",
      unit="word",
      vocab=plain.vocab,
      boundary_id=BOUNDARY,
      splits=plain.splits,
      sentence_offsets={"train": ArraySentenceIndex(offsets)},
  )
  it = data.make_train_iterator(sentences, "train", 4, 5, seed=3, row_ids=[1, 2])
  assert isinstance(it, data.ShuffledSentenceIterator)
  assert it.row_ids == (1, 2) and it.seed == 3
  want = _iterator(tokens, offsets, 4, 5, seed=3, row_ids=[1, 2])
  _assert_batches_equal(next(it), next(want))
  with pytest.raises(ValueError, match="not in the corpus"):
    data.make_train_iterator(sentences, "valid", 4, 5, seed=3)


def test_end_to_end_with_the_built_corpus(tmp_path):
  """Training batches over the built corpus, and evaluation of the valid
  split: the reference's double-eos pairs, each scored exactly once."""
  manual = tmp_path / "manual"
  _tarball(manual / ARCHIVE, _members())
  corpus = _load_lm1b(tmp_path, manual)
  s = corpus.boundary_id
  it = data.make_train_iterator(corpus, "train", 3, 6, seed=0)
  assert isinstance(it, data.ShuffledSentenceIterator)
  batches = _take(it, 12)
  inputs, targets = _row_streams(batches)
  np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
  assert np.all(inputs[:, 0] == s)
  # Valid: per sentence the pairs (<S>, w1) ... (wn, <S>).
  src = corpus.splits["valid"]
  ev = data.EvalIterator(src, 2, 5, boundary_id=s)
  pairs = []
  for b in ev:
    for r in range(2):
      for t in range(5):
        if b["weights"][r, t]:
          pairs.append((int(b["inputs"][r, t]), int(b["targets"][r, t])))
  pairs.sort(key=lambda p: p)  # order within rows is checked elsewhere
  index = {w: i for i, w in enumerate(corpus.vocab)}
  want = []
  for sentence in _sentences(_HELDOUT[0]):
    ids = [s] + [index.get(w, index["<UNK>"]) for w in sentence] + [s]
    want += list(zip(ids[:-1], ids[1:]))
  assert sorted(want) == pairs and len(pairs) == src.num_tokens
