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


# ---- The whole model against their wrapper around HuggingFace's TransfoXLLMHeadModel ----

MODEL_FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "armt_model.npz")
PREFIX = "memory_cell.model."
SEGMENT = 4  # their segment_size


def _model_cfg(correction, memory="armt"):
  """The fixture's model (HF_CONFIG of the script); ``memory="xl"``: its base."""
  from transformer_xl.model import models

  armt_fields = {"num_mem_tokens": 3, "d_mem": 4, "correction": correction}
  return models.ModelConfig.from_dict(
      dict(
          n_token=24,
          n_layer=2,
          d_model=16,
          n_head=2,
          d_head=8,
          d_inner=32,
          tgt_len=SEGMENT,
          mem_len=0,
          untie_r=True,
          tie_weight=True,
          dropout=0.0,
          dropatt=0.0,
          memory=memory,
          **({"armt": armt_fields} if memory == "armt" else {}),
      )
  )


def _their_params(f, case, cfg):
  """Our parameter tree from their state dict: the base model's names (less
  their wrapper's ``.layer.``) through the package's converter, the
  memory's by hand; the duplicated ``memory_cell.layers.*`` must equal the
  model's."""
  from transformer_xl.convert import pytorch

  state = {k[len(f"{case}/state/") :]: v for k, v in f.items() if k.startswith(f"{case}/state/")}
  for name, x in state.items():
    if name.startswith("memory_cell.layers."):
      twin = PREFIX + "transformer.layers." + name[len("memory_cell.layers.") :]
      np.testing.assert_array_equal(x, state[twin])
  base = {
      k[len(PREFIX) :].replace(".layer.", "."): v
      for k, v in state.items()
      if k.startswith(PREFIX) and ".W_m" not in k
  }
  params = pytorch.params_from_state_dict(
      base, _model_cfg(cfg.memory_settings[0][1].correction, "xl")
  )
  layer = lambda i, n: state[f"{PREFIX}transformer.layers.{i}.{n}"]
  stack = lambda n, fn: np.stack([fn(layer(i, n)) for i in range(cfg.n_layer)])
  params["layers"].update(
      armt_w_q=stack("W_mq.weight", np.transpose),
      armt_w_k=stack("W_mk.weight", np.transpose),
      armt_w_v=stack("W_mv.weight", np.transpose),
      armt_w_b=stack("W_mb.weight", np.transpose),
      armt_b_b=stack("W_mb.bias", lambda x: x),
  )
  params["armt_mem_tokens"] = state["memory_cell.memory"]
  return jax.tree_util.tree_map(jnp.asarray, params)


def _our_nll(cfg, params, tokens_BxL):
  """Per-token NLL [B, L - 1] of their layout: segments of SEGMENT from the
  row's start, the last one shorter, from an empty memory; position t
  predicts token t + 1 (a segment's last position the next one's first)."""
  from transformer_xl.model import memory, models

  model = models.TransformerXL(cfg)
  mem = memory.init_memory(cfg, tokens_BxL.shape[0])
  padded = jnp.concatenate([tokens_BxL, tokens_BxL[:, :1]], axis=1)  # a target for the last
  out = []
  for a in range(0, tokens_BxL.shape[1], SEGMENT):
    b = min(a + SEGMENT, tokens_BxL.shape[1])
    nll, mem = model.apply({"params": params}, padded[:, a:b], mem, padded[:, a + 1 : b + 1])
    out.append(nll)
  return jnp.concatenate(out, axis=1)[:, :-1]


@pytest.mark.parametrize("case", ["corr", "nocorr"])
def test_the_model_scores_as_their_wrapper_around_huggingface_transfo_xl(case):
  """Their AssociativeRecurrentWrapper(AssociativeMemoryCell(TransfoXLLMHeadModel))
  over 4 segments (the last of 3 tokens), their parameters converted: the
  per-token NLLs to 1e-5, and the gradients of their mean loss for the
  memory's projections and tokens and the base model's attention."""
  f = dict(np.load(MODEL_FIXTURE))
  cfg = _model_cfg(case == "corr")
  params = _their_params(f, case, cfg)
  tokens = jnp.asarray(f["tokens"])
  nll = _our_nll(cfg, params, tokens)
  np.testing.assert_allclose(nll, f[f"{case}/nll"], rtol=1e-5, atol=1e-5)
  without = _our_nll(
      cfg,
      {**params, "layers": {**params["layers"], "armt_w_v": 0 * params["layers"]["armt_w_v"]}},
      tokens,
  )
  assert np.abs(without[:, SEGMENT:] - nll[:, SEGMENT:]).max() > 1e-3  # the memory is read

  grads = jax.grad(lambda p: jnp.mean(_our_nll(cfg, p, tokens)))(params)
  layer = lambda i, n: f[f"{case}/grad/{PREFIX}transformer.layers.{i}.{n}"]
  theirs = {
      "armt_w_q": np.stack([layer(i, "W_mq.weight").T for i in range(2)]),
      "armt_w_k": np.stack([layer(i, "W_mk.weight").T for i in range(2)]),
      "armt_w_v": np.stack([layer(i, "W_mv.weight").T for i in range(2)]),
      "armt_w_b": np.stack([layer(i, "W_mb.weight").T for i in range(2)]),
  }
  for name, want in theirs.items():
    got = grads["layers"][name]
    np.testing.assert_allclose(
        got, want, rtol=0, atol=1e-5 * max(1, np.abs(want).max()), err_msg=name
    )
  want = f[f"{case}/grad/memory_cell.memory"]
  np.testing.assert_allclose(
      grads["armt_mem_tokens"], want, rtol=0, atol=1e-5 * max(1, np.abs(want).max())
  )
