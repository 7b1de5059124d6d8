"""The kNN memory's store and reads (model/memory/knn.py) against the
authors' code and naive implementations.

``tests/fixtures/knn_meliad.npz`` was written by running google-research/
meliad's ``MemoryOnTpu``/``BatchedMemory`` and its ``TransformerLayer``'s
external-memory path (``scripts/make_knn_fixtures.py``): six segments of
two rows and two heads into a store of 16 slots (it wraps around after
four), row 1 restarting at segment 3, a repeated key (a tie inside a
bucket) and a zero key (an empty slot).  Each check is to 1e-5.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl.model.memory import knn

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "knn_meliad.npz")
K = 4  # the fixture's neighbours


@pytest.fixture(scope="module")
def meliad():
  with np.load(FIXTURE) as f:
    return dict(f)


def _bh(x):
  """[B, T, H, ...] -> [B, H, T, ...]."""
  return jnp.swapaxes(jnp.asarray(x), 1, 2)


@pytest.mark.smoke
def test_store_and_retrieval_equal_the_authors_segment_by_segment(meliad):
  """Reset, read, write per segment, as their ``_query_external_memory``:
  the slots and scores of the neighbours, their keys and values, the store
  and its index after each write (the wrap-around and the reset row)."""
  n_seg, b, _, h, d = meliad["q_SxBxTxHxD"].shape
  s = meliad["key_db_SxBxHxSxD"].shape[3]
  keys, values = jnp.zeros((b, h, s, d)), jnp.zeros((b, h, s, d))
  index = jnp.zeros((b,), jnp.int32)
  for seg in range(n_seg):
    keys, values, index = knn.reset(keys, values, index, jnp.asarray(meliad["sos_SxB"][seg]))
    rk, rv, score, slot = knn.retrieve(_bh(meliad["q_SxBxTxHxD"][seg]), keys, values, K)
    np.testing.assert_array_equal(slot, meliad["slots_SxBxHxTxK"][seg], err_msg=f"segment {seg}")
    np.testing.assert_allclose(score, meliad["scores_SxBxHxTxK"][seg], atol=1e-5)
    np.testing.assert_allclose(_bh(rk), meliad["rkeys_SxBxTxHxKxD"][seg], atol=1e-5)
    np.testing.assert_allclose(_bh(rv), meliad["rvals_SxBxTxHxKxD"][seg], atol=1e-5)
    keys, values, index = knn.write(
        keys,
        values,
        index,
        _bh(meliad["k_SxBxTxHxD"][seg]),
        _bh(meliad["v_SxBxTxHxD"][seg]),
    )
    np.testing.assert_allclose(keys, meliad["key_db_SxBxHxSxD"][seg], atol=1e-6)
    np.testing.assert_allclose(values, meliad["value_db_SxBxHxSxD"][seg], atol=1e-6)
    np.testing.assert_array_equal(index, meliad["index_SxB"][seg])
  # The fixture exercises what it says: a wrap-around, a reset row, an empty slot.
  assert meliad["index_SxB"][-1, 0] > s and meliad["index_SxB"][-1, 1] < meliad["index_SxB"][-1, 0]
  assert (meliad["scores_SxBxHxTxK"] == knn.EMPTY_SCORE).any()


def _memory_path(meliad, seg, raw_q, bias, scale):
  """The layer's gated output given its local attention: our functions in
  the order of their layer (the queries normalised, the scale's absolute
  value, the neighbours their layer retrieved)."""
  q = knn.normalize(raw_q)
  ext = knn.attend(
      q,
      meliad["layer_rkeys_SxBxTxHxKxD"][seg],
      meliad["layer_rvals_SxBxTxHxKxD"][seg],
      jnp.abs(scale),
  )
  return knn.gate(meliad["local_SxBxTxHxD"][seg], ext, bias), ext


def test_gated_memory_attention_and_its_gradients_equal_the_authors(meliad):
  """Their layer's memory attention, its gated combination with the local
  attention, and the gradients of sum(gated * cotangent) with respect to the
  gate bias, the attention scale and the raw queries."""
  bias, scale = jnp.asarray(meliad["bias_H"]), jnp.asarray(meliad["scale_H"])
  for seg in range(meliad["q_SxBxTxHxD"].shape[0]):
    raw_q = jnp.asarray(meliad["q_SxBxTxHxD"][seg])  # their layer input: the raw queries
    gated, ext = _memory_path(meliad, seg, raw_q, bias, scale)
    np.testing.assert_allclose(ext, meliad["ext_SxBxTxHxD"][seg], atol=1e-5)
    np.testing.assert_allclose(gated, meliad["gated_SxBxTxHxD"][seg], atol=1e-5)
    cot = meliad["cot_SxBxTxHxD"][seg]
    loss = lambda b_, s_, q_: jnp.sum(_memory_path(meliad, seg, q_, b_, s_)[0] * cot)
    g_bias, g_scale, g_q = jax.grad(loss, argnums=(0, 1, 2))(bias, scale, raw_q)
    np.testing.assert_allclose(g_bias, meliad["grad_bias_SxH"][seg], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(g_scale, meliad["grad_scale_SxH"][seg], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(g_q, meliad["grad_xq_SxBxTxHxD"][seg], atol=1e-5, rtol=1e-5)


def _store(rng, b=2, h=3, s=24, d=5, empty=5):
  keys = knn.normalize(rng.normal(size=(b, h, s, d)))
  keys = keys.at[:, :, rng.choice(s, empty, replace=False)].set(0.0)  # empty slots
  values = jnp.asarray(rng.normal(size=(b, h, s, d)), jnp.float32)
  q = knn.normalize(rng.normal(size=(b, h, 7, d)))
  return q, keys, values


def test_bucketed_retrieval_is_the_best_slot_of_each_group_by_index_mod_k():
  """Neighbour n is the argmax over the slots s = n (mod k) (numpy), its key
  and value exactly that slot's; a group with no written slot gives zeros."""
  rng = np.random.default_rng(0)
  q, keys, values = _store(rng)
  k = 6
  rk, rv, score, slot = knn.retrieve(q, keys, values, k)
  raw = np.einsum("bhed,bhsd->bhes", q, keys)
  raw = raw + np.where(np.asarray(keys).sum(-1) == 0, knn.EMPTY_SCORE, 0)[:, :, None, :]
  for n in range(k):
    group = np.arange(n, keys.shape[2], k)
    best = group[np.argmax(raw[..., group], axis=-1)]
    np.testing.assert_array_equal(slot[..., n], best)
    np.testing.assert_allclose(
        score[..., n], np.take_along_axis(raw, best[..., None], -1)[..., 0], atol=1e-6
    )
    want = np.take_along_axis(np.asarray(keys)[:, :, None], best[..., None, None], axis=3)[
        ..., 0, :
    ]
    np.testing.assert_allclose(rk[..., n, :], want, atol=1e-6)
  # Group 2 never written (keys and values zero, as a new or reset store's).
  keys, values = keys.at[:, :, 2::6].set(0.0), values.at[:, :, 2::6].set(0.0)
  rk, rv, score, _ = knn.retrieve(q, keys, values, k)
  np.testing.assert_array_equal(rk[..., 2, :], 0.0)
  np.testing.assert_array_equal(rv[..., 2, :], 0.0)
  np.testing.assert_array_equal(score[..., 2], knn.EMPTY_SCORE)


@pytest.mark.parametrize("mode", ["exact", "approx"])
def test_exact_and_approximate_retrieval_are_the_true_top_k(mode):
  """``exact`` (and ``approx`` on the CPU, where approx_max_k is exact) read
  the k best slots, best first, their keys and values gathered."""
  rng = np.random.default_rng(1)
  q, keys, values = _store(rng)
  k = 5
  rk, rv, score, slot = knn.retrieve(q, keys, values, k, mode=mode)
  raw = np.asarray(knn.scores(q, keys))
  want = np.argsort(-raw, axis=-1, kind="stable")[..., :k]
  np.testing.assert_array_equal(np.sort(slot, -1), np.sort(want, -1))
  assert (np.diff(np.asarray(score), axis=-1) <= 0).all()
  gathered = np.take_along_axis(np.asarray(values)[:, :, None], np.asarray(slot)[..., None], 3)
  np.testing.assert_allclose(rv, gathered, atol=0)


def test_writes_are_a_ring_buffer_of_whole_segments():
  """The store after any writes equals a naive ring buffer (numpy): entry j
  of the n-th write at slot (n T + j) mod S; a reset empties a row only."""
  rng = np.random.default_rng(2)
  b, h, s, t, d = 2, 1, 12, 4, 3
  keys, values = jnp.zeros((b, h, s, d)), jnp.zeros((b, h, s, d))
  index = jnp.zeros((b,), jnp.int32)
  naive = np.zeros((b, h, s, d), np.float32)
  count = np.zeros(b, int)
  for step in range(7):
    if step == 4:
      keys, values, index = knn.reset(keys, values, index, jnp.array([False, True]))
      naive[1], count[1] = 0, 0
    new = rng.normal(size=(b, h, t, d)).astype(np.float32)
    keys, values, index = knn.write(keys, values, index, new, new * 2)
    for r in range(b):
      for j in range(t):
        naive[r, :, (count[r] + j) % s] = new[r, :, j]
      count[r] += t
    np.testing.assert_array_equal(keys, naive)
    np.testing.assert_array_equal(values, naive * 2)
    np.testing.assert_array_equal(index, count)


def test_no_gradient_flows_into_the_store():
  """The read and the write stop the gradient: the store's keys and values
  get none from the memory attention; the queries do."""
  rng = np.random.default_rng(3)
  q, keys, values = _store(rng, empty=0)

  def loss(q, keys, values):
    rk, rv, _, _ = knn.retrieve(q, keys, values, 4)
    out = knn.attend(
        jnp.swapaxes(q, 1, 2), jnp.swapaxes(rk, 1, 2), jnp.swapaxes(rv, 1, 2), jnp.full((3,), 3.0)
    )
    return jnp.sum(out**2)

  g_q, g_k, g_v = jax.grad(loss, argnums=(0, 1, 2))(q, keys, values)
  assert float(jnp.abs(g_q).max()) > 0
  assert float(jnp.abs(g_k).max()) == 0 and float(jnp.abs(g_v).max()) == 0
  # Nor from what is written: the written entries are constants.
  new_k, new_v = keys[:, :, :4], values[:, :, :4]
  written = lambda nk, nv: sum(
      jnp.sum(x**2) for x in knn.write(keys, values, jnp.zeros(2, jnp.int32), nk, nv)[:2]
  )
  g_nk, g_nv = jax.grad(written, argnums=(0, 1))(new_k, new_v)
  assert float(jnp.abs(g_nk).max()) == 0 and float(jnp.abs(g_nv).max()) == 0


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda k, v: knn.retrieve(k[:, :, :3], k, v, 5), "k must be at most S and divide it"),
        (lambda k, v: knn.retrieve(k[:, :, :3], k, v, 5, mode="exact"), None),
        (lambda k, v: knn.retrieve(k[:, :, :3], k, v, 13, mode="exact"), "k must be at most S."),
        (lambda k, v: knn.retrieve(k[:, :, :3], k, v, 4, mode="faiss"), "use one of"),
        (
            lambda k, v: knn.write(k, v, jnp.zeros(1, jnp.int32), k[:, :, :5], v[:, :, :5]),
            "multiple",
        ),
    ],
)
def test_bad_shapes_and_modes_are_refused_in_one_message(call, words):
  keys = values = jnp.ones((1, 1, 12, 2))
  if words is None:
    call(keys, values)  # exact retrieval needs no divisor
    return
  with pytest.raises(ValueError, match=words):
    call(keys, values)
