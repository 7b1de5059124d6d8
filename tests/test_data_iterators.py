"""Tests of transformer_xl.data.iterators (ordered Transformer-XL segments)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_xl import data
from transformer_xl.data import ArraySource

from data_samples import BOUNDARY, RecordingSource, _assert_batches_equal, _random_stream, _take

# ---------------------------------------------------------------------------
# Training.


@pytest.mark.smoke
@pytest.mark.parametrize(
    "n,batch,tgt_len", [(100, 4, 5), (103, 4, 5), (64, 2, 7), (41, 3, 3), (12, 1, 11)]
)
def test_train_rows_are_contiguous_and_targets_shifted(n, batch, tgt_len):
  tokens = _random_stream(n, seed=n)
  it = data.TrainIterator(ArraySource(tokens), batch, tgt_len)
  row_len = n // batch
  spe = (row_len - 1) // tgt_len
  assert it.row_len == row_len and it.steps_per_epoch == spe
  batches = _take(it, spe)
  for b in batches:
    assert b["inputs"].shape == (batch, tgt_len) and b["inputs"].dtype == np.int32
    assert b["targets"].shape == (batch, tgt_len) and b["targets"].dtype == np.int32
    assert b["weights"].dtype == np.float32 and np.all(b["weights"] == 1.0)
    assert b["reset"].shape == (batch,) and b["reset"].dtype == np.bool_
  for r in range(batch):
    row = tokens[r * row_len : (r + 1) * row_len]
    inputs = np.concatenate([b["inputs"][r] for b in batches])
    targets = np.concatenate([b["targets"][r] for b in batches])
    # Concatenating a row's inputs over an epoch reproduces the row's stream
    # (each step starts right after the previous one ended) ...
    np.testing.assert_array_equal(inputs, row[: spe * tgt_len])
    # ... and targets are the inputs shifted by one, within the same row.
    np.testing.assert_array_equal(targets, row[1 : spe * tgt_len + 1])


def test_train_with_arange_positions():
  n, batch, tgt_len = 50, 3, 4  # row_len 16, 3 steps, 2 tokens dropped.
  it = data.TrainIterator(ArraySource(np.arange(n)), batch, tgt_len)
  b0, b1 = next(it), next(it)
  np.testing.assert_array_equal(b0["inputs"][1], [16, 17, 18, 19])
  np.testing.assert_array_equal(b0["targets"][1], [17, 18, 19, 20])
  np.testing.assert_array_equal(b1["inputs"][2], [36, 37, 38, 39])
  # Step t+1 starts right after step t ended, for every row.
  np.testing.assert_array_equal(b1["inputs"][:, 0], b0["inputs"][:, -1] + 1)


@pytest.mark.smoke
def test_train_epoch_wraps_with_reset_only_at_first_step():
  tokens = _random_stream(200)
  it = data.TrainIterator(ArraySource(tokens), 4, 6)  # row_len 50 -> 8 steps.
  spe = it.steps_per_epoch
  assert spe == 8
  epoch0 = _take(it, spe)
  assert it.get_state()["epoch"] == 1 and it.get_state()["step"] == 0
  epoch1 = _take(it, spe)
  for t, (a, b) in enumerate(zip(epoch0, epoch1)):
    _assert_batches_equal(a, b)
    assert np.all(a["reset"]) if t == 0 else not np.any(a["reset"])
  assert it.get_state()["epoch"] == 2


def test_train_reads_only_needed_range_per_step():
  src = RecordingSource(np.arange(1000))
  it = data.TrainIterator(src, 4, 10)
  _take(it, 3)
  # One read of T + 1 tokens per row per step, never the whole row.
  assert len(src.reads) == 12
  assert all(stop - start == 11 for start, stop in src.reads)


def test_train_errors():
  src = ArraySource(np.arange(100))
  with pytest.raises(ValueError, match="global_batch"):
    data.TrainIterator(src, 0, 5)
  with pytest.raises(ValueError, match="tgt_len"):
    data.TrainIterator(src, 4, 0)
  # 4 rows of 25 tokens need tgt_len + 1 <= 25.
  data.TrainIterator(src, 4, 24)
  with pytest.raises(ValueError, match=r"100 tokens.*at least 104"):
    data.TrainIterator(src, 4, 25)
  with pytest.raises(ValueError, match="outside"):
    data.TrainIterator(src, 4, 5, row_ids=[0, 4])
  with pytest.raises(ValueError, match="outside"):
    data.TrainIterator(src, 4, 5, row_ids=[-1, 0])
  with pytest.raises(ValueError, match="sorted"):
    data.TrainIterator(src, 4, 5, row_ids=[2, 1])
  with pytest.raises(ValueError, match="duplicates"):
    data.TrainIterator(src, 4, 5, row_ids=[1, 1])
  with pytest.raises(ValueError, match="empty"):
    data.TrainIterator(src, 4, 5, row_ids=[])


# ---------------------------------------------------------------------------
# Evaluation.


EVAL_SHAPES = [
    (100, 4, 5),  # N divisible by B and by row_len's T.
    (100, 4, 7),  # row_len 25 not divisible by T.
    (103, 4, 5),  # N not divisible by B.
    (101, 3, 4),  # neither.
    (10, 8, 3),  # B > N / T.
    (5, 8, 4),  # B > N: some rows entirely padding.
    (1, 1, 1),
    (1, 3, 2),
    (37, 1, 37),
    (37, 1, 40),
]


def _full_eval_pass(n, batch, tgt_len, row_ids=None):
  tokens = np.arange(n, dtype=np.int32) + 100  # Distinct from BOUNDARY.
  it = data.EvalIterator(ArraySource(tokens), batch, tgt_len, BOUNDARY, row_ids=row_ids)
  batches = list(it)
  return tokens, it, batches


@pytest.mark.smoke
@pytest.mark.parametrize("n,batch,tgt_len", EVAL_SHAPES)
def test_eval_scores_every_token_exactly_once(n, batch, tgt_len):
  tokens, it, batches = _full_eval_pass(n, batch, tgt_len)
  row_len = -(-n // batch)
  assert it.row_len == row_len
  assert len(batches) == it.num_steps == len(it) == -(-row_len // tgt_len)
  positions = []
  total_weight = 0.0
  for b in batches:
    assert b["inputs"].shape == b["targets"].shape == b["weights"].shape == (batch, tgt_len)
    assert b["inputs"].dtype == b["targets"].dtype == np.int32
    assert b["weights"].dtype == np.float32
    assert set(np.unique(b["weights"])) <= {0.0, 1.0}
    total_weight += float(b["weights"].sum())
    positions.extend((b["targets"][b["weights"] == 1] - 100).tolist())
  assert total_weight == n
  assert sorted(positions) == list(range(n))


@pytest.mark.parametrize("n,batch,tgt_len", EVAL_SHAPES)
def test_eval_inputs_are_previous_tokens_and_first_context_is_boundary(n, batch, tgt_len):
  tokens, _, batches = _full_eval_pass(n, batch, tgt_len)
  stream = np.concatenate([[BOUNDARY], tokens])
  first = batches[0]
  assert first["inputs"][0, 0] == BOUNDARY
  assert first["targets"][0, 0] == tokens[0]
  assert first["weights"][0, 0] == 1.0
  for b in batches:
    real = b["weights"] == 1
    target_pos = b["targets"][real] - 100  # Position j of the target in tokens.
    np.testing.assert_array_equal(b["inputs"][real], stream[target_pos])


@pytest.mark.parametrize("n,batch,tgt_len", EVAL_SHAPES)
def test_eval_rows_are_contiguous_and_padding_is_at_row_end(n, batch, tgt_len):
  tokens, it, batches = _full_eval_pass(n, batch, tgt_len)
  weights = np.concatenate([b["weights"] for b in batches], axis=1)  # [B, steps*T]
  targets = np.concatenate([b["targets"] for b in batches], axis=1)
  for r in range(batch):
    w = weights[r]
    n_real = int(w.sum())
    # All real positions first, then only padding.
    assert np.all(w[:n_real] == 1) and np.all(w[n_real:] == 0)
    lo, hi = min(r * it.row_len, n), min((r + 1) * it.row_len, n)
    assert n_real == hi - lo
    np.testing.assert_array_equal(targets[r, :n_real], tokens[lo:hi])
  resets = [bool(np.all(b["reset"])) for b in batches]
  assert resets[0] and not any(np.any(b["reset"]) for b in batches[1:])


def test_eval_stops_after_one_pass():
  it = data.EvalIterator(ArraySource(np.arange(20)), 2, 4, BOUNDARY)
  assert len(list(it)) == 3
  with pytest.raises(StopIteration):
    next(it)


def test_eval_errors():
  src = ArraySource(np.arange(20))
  with pytest.raises(ValueError, match="global_batch"):
    data.EvalIterator(src, 0, 4, BOUNDARY)
  with pytest.raises(ValueError, match="tgt_len"):
    data.EvalIterator(src, 2, -1, BOUNDARY)
  with pytest.raises(ValueError, match="boundary_id"):
    data.EvalIterator(src, 2, 4, -1)
  with pytest.raises(ValueError, match="0 tokens"):
    data.EvalIterator(ArraySource(np.zeros((0,), np.int32)), 2, 4, BOUNDARY)
  with pytest.raises(ValueError, match="sorted"):
    data.EvalIterator(src, 4, 4, BOUNDARY, row_ids=[3, 0])


# ---------------------------------------------------------------------------
# Process split.


@pytest.mark.smoke
@pytest.mark.parametrize("kind", ["train", "eval"])
def test_process_split_matches_single_iterator(kind):
  tokens = _random_stream(203, seed=3)

  def make(row_ids=None):
    if kind == "train":
      return data.TrainIterator(ArraySource(tokens), 4, 6, row_ids=row_ids)
    return data.EvalIterator(ArraySource(tokens), 4, 6, BOUNDARY, row_ids=row_ids)

  full, p0, p1 = make(), make([0, 1]), make([2, 3])
  steps = 2 * full.steps_per_epoch + 1 if kind == "train" else full.num_steps
  for _ in range(steps):
    a, b0, b1 = next(full), next(p0), next(p1)
    assert b0["inputs"].shape[0] == 2 and b1["inputs"].shape[0] == 2
    for key in a:
      np.testing.assert_array_equal(np.concatenate([b0[key], b1[key]]), a[key], err_msg=key)


def test_process_split_noncontiguous_rows_in_given_order():
  tokens = _random_stream(300, seed=4)
  full = data.TrainIterator(ArraySource(tokens), 6, 5)
  part = data.TrainIterator(ArraySource(tokens), 6, 5, row_ids=[1, 4, 5])
  for _ in range(4):
    a, b = next(full), next(part)
    for key in a:
      np.testing.assert_array_equal(b[key], a[key][[1, 4, 5]], err_msg=key)


def test_process_reads_only_its_rows():
  n, batch, tgt_len = 403, 4, 7
  # Train: row r spans [r*n_step, (r+1)*n_step); the last target of an epoch
  # is still inside the row, so no token beyond row 1 is read.
  src = RecordingSource(np.arange(n))
  it = data.TrainIterator(src, batch, tgt_len, row_ids=[0, 1])
  n_step = n // batch
  for _ in range(2 * it.steps_per_epoch):
    next(it)
  assert src.reads
  for start, stop in src.reads:
    assert 0 <= start < stop <= 2 * n_step, (start, stop)
  assert max(stop for _, stop in src.reads) > n_step  # Row 1 was read.
  # Eval: rows [0, 1] hold pairs [0, 2*row_len); inputs need one token before.
  src = RecordingSource(np.arange(n))
  it = data.EvalIterator(src, batch, tgt_len, BOUNDARY, row_ids=[0, 1])
  list(it)
  for start, stop in src.reads:
    assert 0 <= start < stop <= 2 * it.row_len, (start, stop)
  # Process 1's rows start one token before its first pair.
  src = RecordingSource(np.arange(n))
  it = data.EvalIterator(src, batch, tgt_len, BOUNDARY, row_ids=[2, 3])
  list(it)
  assert min(start for start, _ in src.reads) == 2 * it.row_len - 1
  assert max(stop for _, stop in src.reads) == n


# ---------------------------------------------------------------------------
# Position state.


@pytest.mark.smoke
@pytest.mark.parametrize("k", [0, 1, 5, 8, 13])
def test_train_state_roundtrip(k):
  tokens = _random_stream(250, seed=k)
  it = data.TrainIterator(ArraySource(tokens), 4, 6)  # 10 steps per epoch.
  _take(it, k)
  state = json.loads(json.dumps(it.get_state()))
  fresh = data.TrainIterator(ArraySource(tokens), 4, 6, row_ids=None)
  fresh.set_state(state)
  assert fresh.get_state() == it.get_state()
  for _ in range(12):
    _assert_batches_equal(next(fresh), next(it))


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_eval_state_roundtrip(k):
  tokens = _random_stream(123, seed=k)
  it = data.EvalIterator(ArraySource(tokens), 4, 7, BOUNDARY)  # row_len 31 -> 5 steps.
  _take(it, k)
  state = json.loads(json.dumps(it.get_state()))
  fresh = data.EvalIterator(ArraySource(tokens), 4, 7, BOUNDARY)
  fresh.set_state(state)
  rest_a, rest_b = list(it), list(fresh)
  assert len(rest_a) == len(rest_b) == 5 - k
  for a, b in zip(rest_a, rest_b):
    _assert_batches_equal(a, b)


def test_state_is_independent_of_row_ids():
  tokens = _random_stream(250)
  full = data.TrainIterator(ArraySource(tokens), 4, 6)
  _take(full, 3)
  part = data.TrainIterator(ArraySource(tokens), 4, 6, row_ids=[2, 3])
  part.set_state(full.get_state())
  a, b = next(full), next(part)
  np.testing.assert_array_equal(b["inputs"], a["inputs"][2:])


def test_set_state_validation():
  tokens = ArraySource(np.arange(250))
  it = data.TrainIterator(tokens, 4, 6)
  good = it.get_state()
  with pytest.raises(ValueError, match="keys"):
    it.set_state({"epoch": 0})
  with pytest.raises(ValueError, match="keys"):
    it.set_state({**good, "extra": 1})
  with pytest.raises(ValueError, match="step"):
    it.set_state({**good, "step": it.steps_per_epoch})
  with pytest.raises(ValueError, match="step"):
    it.set_state({**good, "step": -1})
  with pytest.raises(ValueError, match="epoch"):
    it.set_state({**good, "epoch": -1})
  with pytest.raises(ValueError, match="integer"):
    it.set_state({**good, "step": 1.5})
  with pytest.raises(ValueError, match="global_batch"):
    it.set_state({**good, "global_batch": 8})
  with pytest.raises(ValueError, match="dict"):
    it.set_state([0, 0])
  ev = data.EvalIterator(tokens, 4, 6, BOUNDARY)
  ev.set_state({**ev.get_state(), "step": ev.num_steps})  # Finished pass is valid.
  assert list(ev) == []
  with pytest.raises(ValueError, match="step"):
    ev.set_state({**ev.get_state(), "step": ev.num_steps + 1})
  with pytest.raises(ValueError, match="tgt_len"):
    ev.set_state({**ev.get_state(), "tgt_len": 5})
  with pytest.raises(ValueError, match="keys"):
    ev.set_state(it.get_state())


@pytest.mark.smoke
@pytest.mark.parametrize(
    "n,batch,window,stride", [(23, 4, 6, 4), (17, 3, 5, 1), (9, 8, 4, 4), (30, 2, 7, 7)]
)
def test_sliding_windows_score_every_pair_once_with_its_window_as_context(n, batch, window, stride):
  tokens = np.arange(1, n + 1, dtype=np.int32)  # token j is j + 1: positions are readable
  s = np.concatenate([[0], tokens])
  it = data.SlidingWindowIterator(data.ArraySource(tokens), batch, window, stride, boundary_id=0)
  seen = []
  for step, b in enumerate(it):
    pairs = it.pairs(step)
    assert b["inputs"].shape == b["targets"].shape == b["weights"].shape == (batch, window)
    np.testing.assert_array_equal(b["weights"], (pairs >= 0).astype(np.float32))
    for r in range(batch):
      pad = b["front_pad"][r]
      real = np.arange(window) >= pad
      # The real positions are consecutive pairs that end at the row's last position.
      if real.any():
        j_end = (step * batch + r + 1) * stride
        j = np.arange(min(j_end, n) - (window - pad), min(j_end, n))
        np.testing.assert_array_equal(b["inputs"][r, real], s[j])
        np.testing.assert_array_equal(b["targets"][r, real], s[j + 1])
        assert j[0] == max(0, (step * batch + r) * stride - (window - stride))
      seen.extend(pairs[r][pairs[r] >= 0].tolist())
  assert sorted(seen) == list(range(n))
  # A process holding some rows gets exactly those rows.
  part = data.SlidingWindowIterator(
      data.ArraySource(tokens), batch, window, stride, 0, row_ids=[batch - 1]
  )
  full = data.SlidingWindowIterator(data.ArraySource(tokens), batch, window, stride, 0)
  for a, b in zip(part, full):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k][batch - 1 :])
