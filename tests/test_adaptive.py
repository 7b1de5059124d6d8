"""Adaptive embedding and projected adaptive log-softmax (reference semantics).

Grave et al. 2016; Baevski & Auli 2018; Dai et al. 2019 reference
``mem_transformer.py`` / ``proj_adaptive_softmax.py``.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_xl import sharding
from transformer_xl.model import adaptive, models
from transformer_xl.model import memory as memory_lib

from helpers import REPO, load_module, tiny_model_config

jax.config.update("jax_enable_x64", False)


def build(
    n_token=23,
    d_embed=8,
    d_proj=6,
    cutoffs=(5, 11),
    div_val=1,
    tie_weight=False,
    tie_projs=(),
    seed=0,
    dtype=jnp.float32,
):
  """Embedding + softmax with random (not init-like) parameters.

  Returns (emb, crit, p_emb, p_crit, logp_fn, nll_fn); the fns take
  (p_emb, p_crit, hidden[, targets]) and tie as TransformerXL does.
  """
  emb = adaptive.AdaptiveEmbedding(n_token, d_embed, d_proj, cutoffs, div_val, dtype=dtype)
  crit = adaptive.ProjectedAdaptiveLogSoftmax(
      n_token, d_embed, d_proj, cutoffs, div_val, tie_weight=tie_weight, tie_projs=tie_projs
  )
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  tok = jnp.zeros((1, 2), jnp.int32)
  p_emb = nn.unbox(jax.jit(emb.init)(k1, tok))
  shared = emb.apply(p_emb, method=emb.shared)
  p_crit = nn.unbox(jax.jit(crit.init)(k2, jnp.zeros((1, 2, d_proj)), tok, *shared))
  rng = np.random.default_rng(seed)
  randomise = lambda tree: jax.tree_util.tree_map(
      lambda x: jnp.asarray(0.7 * rng.normal(size=x.shape), x.dtype), tree
  )
  p_emb, p_crit = randomise(p_emb), randomise(p_crit)

  def logp_fn(pe, pc, hidden):
    return crit.apply(pc, hidden, *emb.apply(pe, method=emb.shared), method=crit.log_prob)

  def nll_fn(pe, pc, hidden, targets):
    return crit.apply(pc, hidden, targets, *emb.apply(pe, method=emb.shared), method=crit.nll)

  return emb, crit, p_emb, p_crit, logp_fn, nll_fn


# (div_val, d_embed, d_proj, tie_weight, tie_projs)
CASES = [
    (1, 8, 6, False, ()),
    (1, 8, 6, True, (True, False, True)),
    (1, 6, 6, True, ()),
    (4, 16, 6, False, ()),
    (4, 16, 6, True, (True, False, True)),
    (4, 16, 6, True, (True, True, True)),
]


@pytest.mark.parametrize("div_val,d_embed,d_proj,tie_weight,tie_projs", CASES)
def test_log_probs_normalised_and_nll_equals_gather(
    div_val, d_embed, d_proj, tie_weight, tie_projs
):
  n_token, cutoffs = 23, (5, 11)
  _, _, pe, pc, logp_fn, nll_fn = build(
      n_token, d_embed, d_proj, cutoffs, div_val, tie_weight, tie_projs
  )
  hidden = 2.0 * jax.random.normal(jax.random.PRNGKey(1), (3, 8, d_proj))
  logp = np.asarray(logp_fn(pe, pc, hidden))
  assert logp.shape == (3, 8, n_token) and logp.dtype == np.float32
  np.testing.assert_allclose(np.exp(logp.astype(np.float64)).sum(-1), 1.0, atol=1e-5)
  # Every cluster carries real mass somewhere (the tails are not degenerate).
  probs = np.exp(logp)
  for lo, hi in zip((0,) + cutoffs, cutoffs + (n_token,)):
    assert probs[..., lo:hi].sum(-1).max() > 0.01
  # NLL entry point == gather from the full distribution, targets in every cluster.
  targets = jnp.asarray(np.arange(3 * 8).reshape(3, 8) % n_token, jnp.int32)
  nll = np.asarray(nll_fn(pe, pc, hidden, targets))
  assert nll.shape == (3, 8) and nll.dtype == np.float32
  want = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
  np.testing.assert_allclose(nll, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tie_weight", [False, True])
def test_no_cutoffs_is_a_dense_softmax(tie_weight):
  n_token, d = 13, 6
  _, _, pe, pc, logp_fn, nll_fn = build(n_token, d, d, (), 1, tie_weight)
  # Exactly the non-adaptive parameters: a [V, d] table and a [V] bias, no projections.
  assert set(pe["params"]) == {"emb_layers_0"}
  assert set(pc["params"]) == ({"out_bias_0"} if tie_weight else {"out_weight_0", "out_bias_0"})
  hidden = jax.random.normal(jax.random.PRNGKey(2), (2, 4, d))
  weight = pe["params"]["emb_layers_0"] if tie_weight else pc["params"]["out_weight_0"]
  logits = np.einsum("btd,vd->btv", np.asarray(hidden, np.float64), np.asarray(weight, np.float64))
  logits += np.asarray(pc["params"]["out_bias_0"], np.float64)
  want = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(np.asarray(logp_fn(pe, pc, hidden)), want, rtol=1e-5, atol=1e-5)
  targets = jax.random.randint(jax.random.PRNGKey(3), (2, 4), 0, n_token)
  np.testing.assert_allclose(
      np.asarray(nll_fn(pe, pc, hidden, targets)),
      -np.take_along_axis(want, np.asarray(targets)[..., None], -1)[..., 0],
      rtol=1e-5,
      atol=1e-5,
  )


def test_tail_clusters_use_head_columns_in_reverse_order():
  """Head column -1 belongs to the FIRST tail cluster (reference, not the TF port)."""
  n_token, d, cutoffs = 10, 4, (4, 7)  # shortlist 0..3, tail 1 = 4..6, tail 2 = 7..9
  _, crit, _, pc, _, _ = build(n_token, d, d, cutoffs, 1, False)
  p = jax.tree_util.tree_map(jnp.zeros_like, pc)
  # Only the last head column (cluster_weight / cluster_bias row C - 1 = 1) is large.
  p["params"]["cluster_bias"] = jnp.array([0.0, 10.0])
  hidden = jax.random.normal(jax.random.PRNGKey(0), (1, 2, d))
  logp = np.asarray(crit.apply(p, hidden, method=crit.log_prob))[0, 0]
  head = np.array([0, 0, 0, 0, 0, 10.0])
  head_logp = head - np.log(np.exp(head).sum())
  want = np.concatenate(
      [
          head_logp[:4],
          head_logp[-1] + np.log(np.full(3, 1 / 3)),
          head_logp[-2] + np.log(np.full(3, 1 / 3)),
      ]
  )
  np.testing.assert_allclose(logp, want, rtol=1e-5, atol=1e-5)
  assert np.exp(logp[4:7]).sum() > 0.99  # the first tail cluster gets the mass
  nll = crit.apply(p, hidden, jnp.array([[5, 8]]), method=crit.nll)
  np.testing.assert_allclose(np.asarray(nll)[0], -want[[5, 8]], rtol=1e-5)


@pytest.mark.parametrize(
    "div_val,d_embed,d_proj,tie_projs",
    [(1, 6, 6, ()), (1, 6, 8, (True, False, True)), (3, 9, 6, (True, False, True))],
)
def test_adaptive_embedding_equals_naive_loop(div_val, d_embed, d_proj, tie_projs):
  n_token, cutoffs = 23, (5, 11)
  emb, _, pe, _, _, _ = build(n_token, d_embed, d_proj, cutoffs, div_val, True, tie_projs)
  tokens = np.array([[0, 4, 5, 10, 11, 22], [7, 3, 15, 21, 9, 1]], np.int32)
  got = np.asarray(emb.apply(pe, jnp.asarray(tokens)))
  params = {k: np.asarray(v, np.float64) for k, v in pe["params"].items()}
  bounds = (0,) + cutoffs + (n_token,)
  want = np.zeros(tokens.shape + (d_proj,))
  for b in range(tokens.shape[0]):
    for t in range(tokens.shape[1]):
      tok = int(tokens[b, t])
      if div_val == 1:
        vec = params["emb_layers_0"][tok]
        if d_proj != d_embed:
          vec = vec @ params["emb_projs_0"]
      else:
        i = next(i for i in range(len(bounds) - 1) if bounds[i] <= tok < bounds[i + 1])
        table = params[f"emb_layers_{i}"]
        assert table.shape == (bounds[i + 1] - bounds[i], d_embed // div_val**i)
        vec = table[tok - bounds[i]] @ params[f"emb_projs_{i}"]
      want[b, t] = vec * np.sqrt(d_proj)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "div_val,d_embed,tie_weight,tie_projs",
    [
        pytest.param(2, 6, True, (False, True, True), marks=pytest.mark.slow),
        (1, 5, False, (True, False, False)),
    ],
)
def test_gradients_match_finite_differences(div_val, d_embed, tie_weight, tie_projs):
  """Embedding -> tanh mixing -> adaptive NLL, every parameter leaf, in float64."""
  n_token, d_proj, cutoffs = 13, 4, (3, 7)
  with jax.enable_x64(True):
    _, _, pe, pc, _, nll_fn = build(
        n_token, d_embed, d_proj, cutoffs, div_val, tie_weight, tie_projs, dtype=jnp.float64
    )
    to64 = lambda tree: jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), tree)
    rng = np.random.default_rng(0)
    mix = jnp.asarray(rng.normal(size=(d_proj, d_proj)), jnp.float64)
    tokens = jnp.asarray(rng.integers(0, n_token, size=(2, 7)), jnp.int32)
    targets = jnp.asarray(np.arange(14).reshape(2, 7) % n_token, jnp.int32)
    emb = adaptive.AdaptiveEmbedding(n_token, d_embed, d_proj, cutoffs, div_val, dtype=jnp.float64)
    params = to64({"emb": pe, "crit": pc})

    @jax.jit
    def loss(p):
      h = jnp.tanh(emb.apply(p["emb"], tokens) @ mix)
      return jnp.sum(nll_fn(p["emb"], p["crit"], h, targets))

    grads = jax.grad(loss)(params)
    flat_p, treedef = jax.tree_util.tree_flatten(params)
    flat_g = jax.tree_util.tree_leaves(grads)
    eps = 1e-6
    for k, (x, g) in enumerate(zip(flat_p, flat_g)):
      direction = jnp.asarray(rng.normal(size=x.shape), jnp.float64)
      shift = lambda s: jax.tree_util.tree_unflatten(
          treedef, [y + s * direction if j == k else y for j, y in enumerate(flat_p)]
      )
      fd = (loss(shift(eps)) - loss(shift(-eps))) / (2 * eps)
      analytic = jnp.sum(g * direction)
      assert abs(float(analytic)) > 1e-8, f"leaf {k} has no gradient"
      np.testing.assert_allclose(float(analytic), float(fd), rtol=1e-6, atol=1e-8)


def adaptive_model_config(**kw):
  base = dict(
      n_token=40,
      n_layer=1,
      d_model=8,
      d_head=4,
      d_inner=12,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=3,
      mem_len=2,
      d_embed=8,
      div_val=2,
      cutoffs=(8, 20),
      tie_weight=True,
      tie_projs=(False, True, False),
  )
  base.update(kw)
  return tiny_model_config(**base)


def test_sharded_nll_and_gradient_match_single_device():
  cfg = adaptive_model_config()
  model = models.TransformerXL(cfg)
  batch = 4
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, cfg.n_token, size=(batch, cfg.tgt_len)), jnp.int32)
  targets = jnp.asarray(
      np.arange(batch * cfg.tgt_len).reshape(batch, -1) * 3 % cfg.n_token, jnp.int32
  )
  memory = memory_lib.init_memory(cfg, batch)

  def init(key):
    return model.init(key, tokens, memory, targets)["params"]

  boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
  # Random parameters straight from the shapes (no init compile); larger
  # than init-sized so that every cluster matters.  LayerNorm scales near 1.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.asarray(
          ("scale" in jax.tree_util.keystr(path)) + 0.3 * rng.normal(size=x.shape), jnp.float32
      ),
      nn.unbox(boxed),
  )

  def loss(p, tok, mem, tgt):
    nll, _ = model.apply({"params": p}, tok, mem, tgt)
    return jnp.mean(nll), nll

  step = jax.value_and_grad(loss, has_aux=True)
  (l1, nll1), g1 = jax.jit(step)(params, tokens, memory, targets)

  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
  shardings = sharding.logical_shardings(boxed, mesh)
  # The vocabulary dimension of embedding and output tables is really split.
  assert shardings["word_emb"]["emb_layers_0"].spec == P("model", None)
  assert shardings["word_emb"]["emb_layers_1"].spec == P("model", None)
  assert shardings["word_emb"]["emb_layers_2"].spec == P("model", None)
  for i in range(3):
    assert shardings["crit"][f"out_bias_{i}"].spec == P("model")
  p_sh = jax.device_put(params, shardings)
  rows = NamedSharding(mesh, P("data", None))
  mem_sh = jax.device_put(memory, memory_lib.shardings(cfg, mesh))
  (l8, nll8), g8 = jax.jit(step)(
      p_sh, jax.device_put(tokens, rows), mem_sh, jax.device_put(targets, rows)
  )
  np.testing.assert_allclose(np.asarray(nll8), np.asarray(nll1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(l8), float(l1), rtol=1e-6)
  leaves1, leaves8 = jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g8)
  assert len(leaves1) == len(leaves8)
  for a, b in zip(leaves8, leaves1):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  # The model-level log-probs are normalised and agree with the NLL path.
  logp, _ = jax.jit(model.apply)({"params": params}, tokens, memory)
  np.testing.assert_allclose(np.exp(np.asarray(logp, np.float64)).sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(
      np.asarray(nll1),
      -np.take_along_axis(np.asarray(logp), np.asarray(targets)[..., None], -1)[..., 0],
      rtol=1e-5,
      atol=1e-6,
  )


def _count(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("tie_weight", [True, False])
def test_parameter_count_of_small_adaptive_model(tie_weight):
  cfg = adaptive_model_config(
      n_token=50,
      d_embed=16,
      cutoffs=(10, 30),
      div_val=2,
      tie_weight=tie_weight,
      tie_projs=(False, True, False),
  )
  model = models.TransformerXL(cfg)
  tok = jnp.zeros((1, cfg.tgt_len), jnp.int32)
  params = nn.unbox(
      jax.eval_shape(
          lambda: model.init(jax.random.PRNGKey(0), tok, memory_lib.init_memory(cfg, 1), tok)
      )
  )["params"]
  d, h, dh, f = cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner
  # Clusters: [0,10) d=16, [10,30) d=8, [30,50) d=4.
  tables = 10 * 16 + 20 * 8 + 20 * 4
  emb_projs = 16 * d + 8 * d + 4 * d
  out_biases = 10 + 20 + 20
  out_projs = 16 * d + 4 * d  # clusters 0 and 2 untied, cluster 1 tied
  cluster = 2 * 16 + 2  # cluster_weight [C, d_embed] + cluster_bias [C]
  out_weights = 0 if tie_weight else tables
  r_biases = 2 * h * dh
  layer = (
      3 * d * h * dh
      + d * h * dh
      + h * dh * d  # qkv_net, r_net, o_net (no biases)
      + 2 * 2 * d  # two LayerNorms
      + d * f
      + f
      + f * d
      + d
  )  # ff_1, ff_2
  want = tables + emb_projs + out_biases + out_projs + cluster + out_weights + r_biases + layer
  assert _count(params) == want
  assert _count(params["word_emb"]) == tables + emb_projs
  assert _count(params["crit"]) == out_biases + out_projs + cluster + out_weights


def test_enwik8_parameter_count_unchanged():
  cfg = models.ModelConfig(n_token=256)  # the enwik8_12l model: no cutoffs, tied
  model = models.TransformerXL(cfg)
  tok = jnp.zeros((1, 4), jnp.int32)
  params = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), tok, memory_lib.init_memory(cfg, 1, mem_len=4), tok)
  )
  assert _count(nn.unbox(params)) == 41_082_112


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(cutoffs=(20, 10)), "model.cutoffs"),
        (dict(cutoffs=(10, 10)), "model.cutoffs"),
        (dict(cutoffs=(10, 40)), "model.cutoffs"),
        (dict(div_val=0), "model.div_val"),
        (dict(tie_projs=(True, False)), "model.tie_projs"),
        (dict(div_val=64, d_embed=8), "model.div_val"),
    ],
)
def test_config_validation_names_the_field(kw, field):
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    adaptive_model_config(**kw)
  adaptive_model_config()  # the base case is valid


def test_the_initial_loss_on_uniform_tokens_is_the_adaptive_softmaxs_structure():
  """With all logits ~0 (a tiny init), a head token costs log(head) and a
  tail token log(head) + log(its cluster's size): far above log(vocab) for
  wt103_large's clusters (20.6 nats against 12.5), the loss the accelerator
  benchmark saw on random tokens.  ``benchmarks/adaptive_init_loss.py``'s
  ``expected_initial_nll`` is the mean of those costs over the vocabulary."""
  bench = load_module(REPO / "benchmarks" / "adaptive_init_loss.py", "adaptive_init_loss")
  vocab, cutoffs = 180, (20, 60)
  cfg = tiny_model_config(
      n_token=vocab, cutoffs=cutoffs, div_val=2, init_std=1e-7, proj_init_std=1e-7, mem_len=0
  )
  model = models.TransformerXL(cfg)
  params = nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))
  t = cfg.tgt_len  # every token once, as rows of one batch (no memory)
  assert vocab % t == 0
  targets_BxT = jnp.arange(vocab, dtype=jnp.int32).reshape(-1, t)
  nll_BxT, _ = model.apply(
      {"params": params},
      jnp.roll(targets_BxT, 1, axis=1),
      memory_lib.init_memory(cfg, vocab // t),
      targets_BxT,
  )
  nll = np.asarray(nll_BxT).reshape(-1)
  head = cutoffs[0] + len(cutoffs)
  want = np.log(head) + np.select(
      [np.arange(vocab) < 20, np.arange(vocab) < 60], [0.0, np.log(40)], np.log(120)
  )
  np.testing.assert_allclose(nll, want, atol=1e-4)
  assert bench.expected_initial_nll(vocab, cutoffs) == pytest.approx(nll.mean(), abs=1e-4)
  assert bench.expected_initial_nll(267_735, (20000, 40000, 200000)) == pytest.approx(
      20.619, abs=1e-3
  )
