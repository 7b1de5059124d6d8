"""The associative memory of ARMT (model/memory/armt.py) against the authors'
code: tests/fixtures/armt_layer.npz, made by running their
``AssociativeLayerWrapper`` (scripts/make_armt_fixtures.py) around a toy
layer over four segments (the last one shorter), with and without the
correction: the reads, the matrix and normaliser after every write, the
layer outputs and the gradients of every projection and every segment's
input (through all later segments' reads) to 1e-5."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl.model.memory import armt

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "armt_layer.npz")
N_MEM = 3  # the fixture's memory tokens
SEGMENTS = 4
GRADS = (("w_q", "W_mq"), ("w_k", "W_mk"), ("w_v", "W_mv"), ("w_b", "W_mb_weight"))


@pytest.fixture(scope="module")
def authors():
  return dict(np.load(FIXTURE))


def _params(f):
  """Ours from theirs: [in, out] kernels (torch Linear weights transposed)."""
  return {
      "w_q": jnp.asarray(f["W_mq"].T),
      "w_k": jnp.asarray(f["W_mk"].T),
      "w_v": jnp.asarray(f["W_mv"].T),
      "w_b": jnp.asarray(f["W_mb_weight"].T),
      "b_b": jnp.asarray(f["W_mb_bias"]),
  }


def _run(params, xs, a_DxD, correction):
  """The wrapped toy layer over the segments from an empty memory: the
  reads, outputs and states, as their ``AssociativeLayerWrapper.forward``."""
  b, _, d = xs[0].shape
  k = armt.d_key(params["w_q"].shape[1])
  A, z = jnp.zeros((b, k, d)), jnp.zeros((b, k))
  first = jnp.ones((b,), bool)
  reads, outs, states = [], [], []
  for x in xs:
    r = armt.read(A, z, x, params["w_q"])
    out = jnp.tanh((x + r) @ a_DxD)
    A, z = armt.write(
        A,
        z,
        out[:, -N_MEM:],
        params["w_k"],
        params["w_v"],
        params["w_b"],
        params["b_b"],
        first,
        correction,
    )
    first = jnp.zeros_like(first)
    reads.append(r), outs.append(out), states.append((A, z))
  return reads, outs, states


@pytest.mark.parametrize("case", ["corr", "nocorr"])
def test_reads_writes_and_outputs_equal_the_authors_segment_by_segment(authors, case):
  f = authors
  xs = [jnp.asarray(f[f"{case}_x_s{s}"]) for s in range(SEGMENTS)]
  assert xs[-1].shape[1] < xs[0].shape[1]  # the ragged last segment
  reads, outs, states = _run(_params(f), xs, jnp.asarray(f["A"]), case == "corr")
  for s in range(SEGMENTS):
    np.testing.assert_allclose(reads[s], f[f"{case}_read_s{s}"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[s], f[f"{case}_out_s{s}"], rtol=1e-5, atol=1e-5)
    A, z = states[s]
    np.testing.assert_allclose(A, f[f"{case}_W_mem_s{s}"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, f[f"{case}_z_s{s}"], rtol=1e-5, atol=1e-5)
  assert np.abs(f[f"{case}_read_s1"]).max() > 1e-2  # the reads carry something


def test_the_correction_changes_only_the_normaliser(authors):
  f = authors
  for s in range(1, SEGMENTS):
    assert not np.allclose(f[f"corr_z_s{s}"], f[f"nocorr_z_s{s}"], atol=1e-4)
  # Segment 0 writes with the correction 1 either way: the same matrix and normaliser.
  np.testing.assert_allclose(f["corr_W_mem_s0"], f["nocorr_W_mem_s0"], atol=1e-7)
  np.testing.assert_allclose(f["corr_z_s0"], f["nocorr_z_s0"], atol=1e-7)


@pytest.mark.parametrize("case", ["corr", "nocorr"])
def test_gradients_through_every_segment_equal_the_authors(authors, case):
  """sum over segments of sum(out * cot): the gradients of the query, key,
  value and gate projections and of every segment's input (a later
  segment's read carries them back through the writes)."""
  f = authors
  xs = [jnp.asarray(f[f"{case}_x_s{s}"]) for s in range(SEGMENTS)]
  cots = [jnp.asarray(f[f"{case}_cot_s{s}"]) for s in range(SEGMENTS)]
  a_DxD = jnp.asarray(f["A"])

  def loss(params, xs):
    _, outs, _ = _run(params, xs, a_DxD, case == "corr")
    return sum(jnp.sum(o * c) for o, c in zip(outs, cots))

  value, (g_params, g_xs) = jax.value_and_grad(loss, argnums=(0, 1))(_params(f), xs)
  np.testing.assert_allclose(value, f[f"{case}_loss"], rtol=1e-5)
  pairs = [(g_params[o], f[f"{case}_grad_{t}"].T, o) for o, t in GRADS]
  pairs.append((g_params["b_b"], f[f"{case}_grad_W_mb_bias"], "b_b"))
  pairs += [(g_xs[s], f[f"{case}_grad_x_s{s}"], f"x_s{s}") for s in range(SEGMENTS)]
  for ours, theirs, name in pairs:
    # Two float32 computations of gradients up to ~10 (divided by q . z + 1e-5): within 1e-5
    # of the array's largest entry.
    scale = max(1.0, float(np.abs(theirs).max()))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * scale, err_msg=name)
  assert np.abs(f[f"{case}_grad_x_s0"][:, -N_MEM:]).max() > 1e-3  # the write's gradient


def test_an_untrained_value_projection_reads_zero():
  """Their W_mv starts at zeros: whatever is written, every read is 0, so a
  model given the memory starts as the model without it."""
  rng = np.random.default_rng(0)
  b, d, m = 2, 8, 4
  k = armt.d_key(m)
  A, z = jnp.zeros((b, k, d)), jnp.zeros((b, k))
  mem = jnp.asarray(rng.normal(size=(b, 3, d)), jnp.float32)
  w = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
  A, z = armt.write(A, z, mem, w(d, m), jnp.zeros((d, d)), w(d, 1), w(1), jnp.ones(b, bool))
  assert np.abs(z).max() > 0
  np.testing.assert_array_equal(armt.read(A, z, w(b, 5, d), w(d, m)), 0.0)


def test_dpfp_is_the_authors_feature_map_written_out():
  """phi(x) for nu = 3 and d_mem = 2, by hand: x' = [relu(x), relu(-x)]
  (4 values), then x' * roll(x', j) for j = 1, 2, 3, concatenated."""
  x = jnp.asarray([[0.5, -2.0]])
  xp = np.array([0.5, 0.0, 0.0, 2.0])
  want = np.concatenate([xp * np.roll(xp, j) for j in (1, 2, 3)])
  np.testing.assert_allclose(armt.dpfp(x)[0], want)
  assert armt.d_key(2) == 12
