"""Tests of transformer_xl.data.prefetch: order, states, errors, shutdown."""

import threading
import time

import numpy as np
import pytest

from transformer_xl import data


def _stream(n=400):
  return data.ArraySource(np.arange(n, dtype=np.int32))


def test_prefetched_batches_and_states_equal_the_iterator_s():
  plain = data.TrainIterator(_stream(), 4, 5)
  want = []
  for _ in range(30):  # past an epoch boundary (19 steps per epoch)
    batch = next(plain)
    want.append((batch, plain.get_state()))
  with data.Prefetcher(data.TrainIterator(_stream(), 4, 5), size=3) as it:
    for (batch, state), (want_batch, want_state) in zip(it, want):
      for k in batch:
        np.testing.assert_array_equal(batch[k], want_batch[k])
      assert state == want_state
  # Resuming from a prefetched state continues with the next batch.
  resumed = data.TrainIterator(_stream(), 4, 5)
  resumed.set_state(want[12][1])
  np.testing.assert_array_equal(next(resumed)["inputs"], want[13][0]["inputs"])


def test_the_transform_runs_in_the_thread_and_the_end_passes_through():
  names = []

  def transform(batch):
    names.append(threading.current_thread().name)
    return batch["inputs"].sum()

  it = data.EvalIterator(_stream(50), 2, 5, boundary_id=0)
  n = len(it)
  got = list(data.Prefetcher(it, transform))
  assert len(got) == n and set(names) == {"prefetch"}


def test_an_error_in_the_thread_is_raised_by_next():
  class Failing:

    def __init__(self):
      self.i = 0

    def __next__(self):
      self.i += 1
      if self.i == 3:
        raise OSError("disk gone")
      return self.i

    def get_state(self):
      return {"i": self.i}

  it = data.Prefetcher(Failing())
  assert next(it) == (1, {"i": 1}) and next(it) == (2, {"i": 2})
  with pytest.raises(OSError, match="disk gone"):
    next(it)


def test_close_stops_a_thread_blocked_on_a_full_queue():
  it = data.Prefetcher(data.TrainIterator(_stream(), 4, 5), size=1)
  time.sleep(0.2)  # the thread fills the queue and waits
  it.close()
  assert not it._thread.is_alive()  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="size=0"):
    data.Prefetcher(iter([]), size=0)
