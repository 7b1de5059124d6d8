"""The compressive memory (Rae et al. 2020, arXiv 1911.05507) against a naive implementation.

``NaiveCompressive`` (tests/naive_compressive.py) is written from the
paper's Algorithms 1 and 2, not from the model's code (its docstring).
Here: conv without documents, and with them max_pool, dilated_conv and most_used (scores,
memories, reconstruction losses and both gradients), the disjoint
gradients of the two losses, ``cmem_len`` 0 as the XL memory exactly, the
fused kernel, generation, evaluation with more compressed slots, the
compression network's own clipping, the config checks and the command
line.  Sharded training with exact resume is the conformance suite's
(test_memory_conformance.py).
"""

from __future__ import annotations

import copy
import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import data as train_data
from transformer_xl import default_config, sharding
from transformer_xl.cli import modes
from transformer_xl.inference import eval_steps, generate, sampling
from transformer_xl.model import config as model_config
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models
from transformer_xl.training import train_step

from helpers import (
    score_and_generate,
    tiny_config,
    tiny_model_config,
    tiny_text_config,
    toy_corpus,
    write_corpus,
)
from naive_compressive import NaiveCompressive

VOCAB = 24
SIZES = dict(n_token=VOCAB, n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=16, dropout=0.0)
SETTINGS = ("cmem_len", "cmem_ratio", "cmem_fn")


def _config(fn, **kw):
  """A compressive model (T 4, M 6, Nc 3, c 2) with compression ``fn``; ``kw``
  overrides model fields or the compressive memory's settings."""
  section = {"cmem_len": 3, "cmem_ratio": 2, "cmem_fn": fn}
  section.update({k: kw.pop(k) for k in SETTINGS if k in kw})
  base = dict(**SIZES, tgt_len=4, mem_len=6, memory="compressive", compressive=section)
  return tiny_model_config(**{**base, **kw})


def _settings(cfg):
  return memory_lib.compressive.CompressiveMemory.settings(cfg)


def _params(cfg, seed=0):
  """The model's init, moved well away from it (N(0, 0.3) added to every leaf)."""
  params = nn.unbox(models.init_params(models.TransformerXL(cfg), jax.random.PRNGKey(seed)))
  leaves, tree = jax.tree_util.tree_flatten(params)
  rng = np.random.default_rng(seed)
  leaves = [x + jnp.asarray(0.3 * rng.normal(size=x.shape), x.dtype) for x in leaves]
  return jax.tree_util.tree_unflatten(tree, leaves)


N_SEG = 4


def _stream(documents, b=2, t=4):
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, VOCAB, size=(b, N_SEG * t + 1)).astype(np.int32)
  if not documents:
    return tokens, [None] * N_SEG, [None] * N_SEG
  # Row 0: a document starts at position 6 (inside segment 1); row 1 is reset at segment 2.
  starts = [[0, 6], [0]]
  resets = [np.array([s == 2 and r == 1 for r in range(b)]) for s in range(N_SEG)]
  docs = []
  for s in range(N_SEG):
    pos = np.zeros((b, t), np.int32)
    for r in range(b):
      for i in range(t):
        a = s * t + i
        begin = max(x for x in starts[r] + ([8] if r == 1 else []) if x <= a)
        pos[r, i] = a - begin
    docs.append(pos)
  return tokens, resets, docs


def _run_model(cfg, params, tokens, resets, docs, t=4):
  model = models.TransformerXL(cfg)
  memory = memory_lib.init_memory(cfg, tokens.shape[0])
  nlls, recons = [], []
  for s in range(N_SEG):
    x, y = tokens[:, s * t : (s + 1) * t], tokens[:, s * t + 1 : (s + 1) * t + 1]
    (nll, memory), sown = model.apply(
        {"params": params},
        x,
        memory,
        y,
        reset_B=None if resets[s] is None else jnp.asarray(resets[s]),
        doc_pos_BxT=None if docs[s] is None else jnp.asarray(docs[s]),
        mutable=["losses"],
    )
    nlls.append(nll)
    recons.append(sown["losses"]["layers"][memory_lib.compressive.RECON_LOSS][0])
  return jnp.stack(nlls), jnp.stack(recons), memory


def _run_naive(cfg, params, tokens, resets, docs, t=4):
  naive = NaiveCompressive(
      params,
      n_layer=cfg.n_layer,
      n_head=cfg.n_head,
      d_head=cfg.d_head,
      d_model=cfg.d_model,
      mem_len=cfg.mem_len,
      cmem_len=_settings(cfg).cmem_len,
      ratio=_settings(cfg).cmem_ratio,
      fn=_settings(cfg).cmem_fn,
      batch=tokens.shape[0],
  )
  nlls, recons = [], []
  for s in range(N_SEG):
    x, y = tokens[:, s * t : (s + 1) * t], tokens[:, s * t + 1 : (s + 1) * t + 1]
    logp, recon = naive.segment(x, resets[s], docs[s])
    nlls.append(-jnp.take_along_axis(logp, jnp.asarray(y)[..., None], -1)[..., 0])
    recons.append(recon)
  return jnp.stack(nlls), jnp.stack(recons), (naive.xl, naive.cm)


def _values_and_grads(run, cfg, params, tokens, resets, docs):
  """Jitted: (nll [S, B, T], reconstruction losses [S, L], the run's state) and the
  gradients of (total LM loss, total reconstruction loss) w.r.t. the parameters
  (leading axis 2)."""

  def both(p):
    nll, recon, state = run(cfg, p, tokens, resets, docs)
    return jnp.stack([nll.sum(), recon.sum()]), (nll, recon, state)

  grads, (nll, recon, state) = jax.jit(jax.jacrev(both, has_aux=True))(params)
  return nll, recon, state, grads


@pytest.mark.parametrize(
    "fn,documents",
    # The fast tier: conv (the learned compression). Slow, with documents (a reset,
    # a start inside a segment, and whole segments of one document): the other
    # kinds, max_pool (pooling; mean_pool differs by the reduction alone),
    # dilated_conv and most_used (which reads the attention).
    [("conv", False)]
    + [
        pytest.param(fn, True, marks=pytest.mark.slow)
        for fn in ("max_pool", "dilated_conv", "most_used")
    ],
)
def test_the_model_equals_the_naive_compressive_transformer(fn, documents):
  """Scores, memories, reconstruction losses and both gradients, over 4 segments
  (T 4, M 6, Nc 3, c 2: the first eviction is 2 states, one slot; the compressed
  memory then overflows and is truncated); with documents, a reset and a
  document start inside a segment."""
  cfg = _config(fn)
  params = _params(cfg)
  tokens, resets, docs = _stream(documents)
  nll, recon, memory, grads = _values_and_grads(_run_model, cfg, params, tokens, resets, docs)
  nll_n, recon_n, (xl_n, cm_n), grads_n = _values_and_grads(
      _run_naive, cfg, params, tokens, resets, docs
  )
  np.testing.assert_allclose(nll, nll_n, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(recon, recon_n, rtol=1e-5, atol=1e-6)
  assert float(recon[-1].sum()) > 1e-4  # compressed slots were made and differ from the states
  # The memory: [compressed; XL], the valid slots right-aligned, as the naive lists.
  nc, m = _settings(cfg).cmem_len, cfg.mem_len
  for r in range(tokens.shape[0]):
    n_cm, n_xl = cm_n[r][0].shape[0], xl_n[r][0].shape[0]
    assert int(memory.mlen_B[r]) == n_cm + n_xl
    for l in range(cfg.n_layer):
      got = np.asarray(memory.mems_LxBxMxD[l, r])
      np.testing.assert_allclose(got[nc + m - n_xl :], xl_n[r][l], rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(got[nc - n_cm : nc], cm_n[r][l], rtol=1e-5, atol=1e-5)
  leaves = jax.tree_util.tree_leaves_with_path(grads)
  for (path, a), b in zip(leaves, jax.tree_util.tree_leaves(grads_n)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("fn", memory_lib.compressive.CMEM_FNS)
def test_each_compression_function_equals_the_naive_slot_by_slot(fn):
  """``compress`` on 3 slots of c = 3 states (D 8, 2 rows) against the naive
  transformer's loop over slots and taps (the fast tier's check of every
  function: which states each slot pools, convolves or keeps)."""
  cfg = _config(fn, cmem_ratio=3, cmem_len=3, tgt_len=6)
  b, g, c, d = 2, 3, 3, cfg.d_model
  rng = np.random.default_rng(7)
  win_BxNxD = jnp.asarray(rng.normal(size=(b, g * c, d)), jnp.float32)
  usage_BxN = jnp.asarray(rng.permutation(b * g * c).reshape(b, g * c), jnp.float32)
  new_B = jnp.full((b,), g, jnp.int32)

  class Compress(nn.Module):

    @nn.compact
    def __call__(self, x, usage, new):
      return memory_lib.compressive.compress(self, cfg, x, usage, new)

  module = Compress()
  variables = module.init(jax.random.PRNGKey(0), win_BxNxD, usage_BxN, new_B)
  params = jax.tree_util.tree_map(
      lambda x: x + 0.3 * jnp.asarray(rng.normal(size=x.shape), x.dtype),
      nn.unbox(variables.get("params", {})),
  )
  got = module.apply({"params": params}, win_BxNxD, usage_BxN, new_B)
  naive = NaiveCompressive.__new__(NaiveCompressive)
  naive.c, naive.fn = c, fn
  for r in range(b):
    if fn == "most_used":  # the g most used states, in their order
      keep = np.sort(np.argsort(-np.asarray(usage_BxN[r]), kind="stable")[:g])
      want = np.asarray(win_BxNxD[r])[keep]
    else:
      want = naive.compress(params, None, win_BxNxD[r], g)
    np.testing.assert_allclose(got[r], want, rtol=1e-5, atol=1e-6, err_msg=f"row {r}")


def _is_compression(path):
  return any("cmem_" in str(getattr(k, "key", "")) for k in path)


@pytest.mark.parametrize("fn", ["conv", "dilated_conv"])
def test_the_losses_train_disjoint_parameters(fn):
  """The LM loss gives the compression parameters exactly zero gradient; the
  reconstruction loss gives every other parameter exactly zero, and its own
  a non-zero one."""
  cfg = _config(fn)
  params = _params(cfg)
  tokens, resets, docs = _stream(True)
  grads = _values_and_grads(_run_model, cfg, params, tokens, resets, docs)[3]
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    a, b = np.asarray(g[0]), np.asarray(g[1])  # of the LM loss, of the reconstruction loss
    if _is_compression(path):
      assert np.all(a == 0), jax.tree_util.keystr(path)
      assert np.abs(b).max() > 0, jax.tree_util.keystr(path)
    else:
      assert np.all(b == 0), jax.tree_util.keystr(path)


@pytest.mark.smoke
def test_no_compressed_slot_is_the_xl_memory_exactly():
  """memory='compressive' with cmem_len=0: the same parameters, scores,
  memories and gradients as memory='xl', and no loss sown."""
  xl_cfg = tiny_model_config(**SIZES, tgt_len=4, mem_len=6)
  c_cfg = _config("conv", cmem_len=0)
  params = _params(xl_cfg)
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
      nn.unbox(models.init_params(models.TransformerXL(c_cfg), jax.random.PRNGKey(0)))
  )
  tokens, resets, docs = _stream(True)

  def run(cfg, p):
    model, memory, total = models.TransformerXL(cfg), memory_lib.init_memory(cfg, 2), 0.0
    for s in range(N_SEG):
      x, y = tokens[:, 4 * s : 4 * s + 4], tokens[:, 4 * s + 1 : 4 * s + 5]
      (nll, memory), sown = model.apply(
          {"params": p},
          x,
          memory,
          y,
          reset_B=jnp.asarray(resets[s]),
          doc_pos_BxT=jnp.asarray(docs[s]),
          mutable=["losses"],
      )
      assert not sown
      total = total + nll.sum()
    return total, memory

  (lx, mx), gx = jax.value_and_grad(run, argnums=1, has_aux=True)(xl_cfg, params)
  (lc, mc), gc = jax.value_and_grad(run, argnums=1, has_aux=True)(c_cfg, params)
  assert float(lx) == float(lc)
  np.testing.assert_array_equal(mx.mems_LxBxMxD, mc.mems_LxBxMxD)
  np.testing.assert_array_equal(mx.mlen_B, mc.mlen_B)
  for a, b in zip(jax.tree_util.tree_leaves(gx), jax.tree_util.tree_leaves(gc)):
    np.testing.assert_array_equal(a, b)


def test_the_config_is_checked_in_one_place():
  def problems(compressive=None, **kw):
    fields = {**SIZES, "tgt_len": 4, **kw}
    if compressive is not None:
      fields["compressive"] = compressive
    return model_config.config_problems(fields)

  assert problems({"cmem_len": 4, "cmem_ratio": 2}, memory="compressive") == []
  assert problems({"cmem_len": 4}) == [
      "model.compressive.cmem_len=4 is a setting of model.memory='compressive' (the model has "
      "'xl'): set model.memory='compressive', or leave model.compressive at its defaults."
  ]
  assert problems({"cmem_len": 4, "cmem_ratio": 3}, memory="compressive") == [
      "model.tgt_len=4 must be a multiple of model.compressive.cmem_ratio=3 (each segment's 4 "
      "evicted states are compressed 3 at a time)."
  ]
  # With memory tokens the layers run on more positions: those count too.
  assert problems(
      {"cmem_len": 4, "cmem_ratio": 4}, memory="compressive", tokens={"num_mem_tokens": 1}
  ) == [
      "model.tgt_len=4 must be a multiple of model.compressive.cmem_ratio=4 (each segment's 6 "
      "evicted states are compressed 4 at a time; 2 of them are other memories' positions)."
  ]
  assert problems({"cmem_ratio": 0}, memory="compressive")[0].startswith(
      "model.compressive.cmem_ratio=0 must be"
  )
  assert problems({"cmem_fn": "avg"}, memory="compressive")[0].startswith(
      "model.compressive.cmem_fn='avg': use"
  )
  assert problems(memory="compressive", attn_type=2) == [
      "model.memory='compressive' needs a relative attention: model.attn_type 0 or 1 (got 2)."
  ]
  assert problems(memory="compressive", pre_lnorm=True) == [
      "model.memory='compressive' is post-LayerNorm (the paper's): set model.pre_lnorm=False."
  ]
  assert problems({"cmem_len": -1}, memory="compressive")[0].startswith(
      "model.compressive.cmem_len=-1 must be"
  )
  assert problems({"cmem_size": 4}, memory="compressive") == [
      "model.compressive has no setting cmem_size: its settings are cmem_fn, cmem_len, "
      "cmem_ratio."
  ]


# ---------------------------------------------------------------------------
# The command line: train, eval, score and generate with --config.model.memory=compressive.


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(root, workdir, config): a compressive model (conv, Nc 4, c 2) trained for 4
  steps through ``modes.run`` on one's own text (word tokenizer)."""
  root = tmp_path_factory.mktemp("compressive")
  config = tiny_text_config(write_corpus(root / "corpus"), root / "tfds")
  config.model.memory = "compressive"
  config.model.compressive.update(cmem_len=4, cmem_ratio=2, cmem_fn="conv")
  config.train.update(num_steps=4)
  config.checkpoint.update(every_steps=4)
  workdir = root / "wd"
  modes.run(modes.Request(mode="train", workdir=str(workdir), config=config))
  return root, workdir, config


@pytest.mark.slow
def test_train_logs_the_reconstruction_loss_and_saves_the_variant(trained):
  _, workdir, _ = trained
  saved = json.loads((workdir / "model_config.json").read_text())["model"]
  section = saved["compressive"]
  assert (saved["memory"], section["cmem_len"], section["cmem_ratio"]) == ("compressive", 4, 2)
  rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  recon = [r["train/aux_loss/attn_recon"] for r in rows if "train/aux_loss/attn_recon" in r]
  # Step 1 starts from an empty memory: nothing is evicted, nothing compressed.
  assert len(recon) == 4 and recon[0] == 0 and all(np.isfinite(x) and x > 0 for x in recon[1:])


@pytest.mark.slow
def test_eval_score_and_generate_run_from_the_workdir(trained, tmp_path):
  _, workdir, config = trained
  modes.run(modes.Request(mode="eval", workdir=str(workdir), config=config))
  results = json.loads((workdir / "eval_results.json").read_text())
  assert all(np.isfinite(results[s]["loss_nats"]) for s in ("valid", "test"))
  score_and_generate(workdir, config, tmp_path, num_tokens=20)


@pytest.mark.slow
def test_another_compression_rate_is_refused_in_one_line(trained):
  """memory and its fields are the architecture: another value is refused, naming it."""
  _, workdir, config = trained
  other = copy.deepcopy(config)
  other.model.compressive.cmem_ratio = 4
  with pytest.raises(SystemExit) as err:
    modes.run(modes.Request(mode="eval", workdir=str(workdir), config=other))
  message = str(err.value.code)
  assert message.startswith("error: --config sets") and "\n" not in message
  assert "model.compressive.cmem_ratio=4 (trained: 2)" in message, message


@pytest.mark.slow
def test_the_fused_kernel_reads_the_compressed_slots_as_the_xla_attention():
  """The layout is XL's with Nc + M slots: attention_impl='pallas' (interpret mode
  on CPU) gives the XLA attention's scores and memories."""
  cfg = _config("mean_pool")
  params = _params(cfg)
  tokens, resets, docs = _stream(True)
  nll, recon, memory = _run_model(cfg, params, tokens, resets, docs)
  fused = dataclasses.replace(cfg, attention_impl="pallas")
  nll_p, recon_p, memory_p = _run_model(fused, params, tokens, resets, docs)
  np.testing.assert_allclose(nll_p, nll, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(recon_p, recon, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(memory_p.mems_LxBxMxD, memory.mems_LxBxMxD, rtol=1e-5, atol=1e-5)


def test_generation_has_no_decoding_cache_and_reads_the_compressed_memory():
  """The Generator drops the decoding cache (``DECODE_CACHE`` False: it would roll
  the compressed slots as a FIFO of inputs); each sampled token's distribution is
  the model's after the prompt (3 segments of 4, M 4: the second and third each
  compress 4 evicted states into 2 slots, 3 kept) and the tokens before it,
  passed one at a time (each evicts one state, fewer than c: none compressed)."""
  cfg = _config("conv", mem_len=4)
  params = _params(cfg)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  gen = generate.Generator(cfg, mesh, use_cache=True)
  assert not gen.use_cache
  rng = np.random.default_rng(3)
  prompt = rng.integers(0, VOCAB, size=(1, 12)).astype(np.int32)  # 3 segments of 4
  steps = list(
      gen.stream(params, list(prompt), 6, sampling.SamplingSettings(top_k=0), log_probs=True)
  )
  model, memory = models.TransformerXL(cfg), memory_lib.init_memory(cfg, 1)
  for s in range(3):
    hidden, memory = model.apply(
        {"params": params}, prompt[:, 4 * s : 4 * s + 4], memory, method=model.hidden
    )
  assert int(memory.mlen_B[0]) == 4 + 3  # a full XL memory and 3 compressed slots
  for token_B, logp_BxV in steps:
    want = model.apply({"params": params}, hidden[:, -1:], method=model.log_probs)[:, 0]
    np.testing.assert_allclose(logp_BxV, want, atol=2e-5)
    hidden, memory = model.apply(
        {"params": params}, jnp.asarray(token_B)[:, None], memory, method=model.hidden
    )


def test_the_evaluation_segments_are_checked_with_the_run_config():
  c = default_config.get_config()
  c.model.update(memory="compressive", tgt_len=8, mem_len=8)
  c.model.compressive.update(cmem_len=8, cmem_ratio=4)
  c.eval.update(tgt_len=6)
  with pytest.raises(default_config.ConfigError, match=r"eval\.tgt_len=6 must be a multiple"):
    default_config.validate(c, jax.device_count(), training=False)
  c.eval.update(tgt_len=8)
  c.eval.compressive.cmem_len = -2
  with pytest.raises(
      default_config.ConfigError, match=r"eval\.compressive\.cmem_len=-2 must be unset"
  ):
    default_config.validate(c, jax.device_count(), training=False)
  # A sliding window has no memory: any window length (nothing is compressed).
  c.eval.compressive.cmem_len = None
  c.eval.update(method="sliding", window=10)
  default_config.validate(c, jax.device_count(), training=False)
  c.model.memory = "xl"
  c.model.compressive.cmem_len = 0
  c.eval.update(method="segments")
  c.eval.compressive.cmem_len = 4
  with pytest.raises(
      default_config.ConfigError,
      match=r"eval\.compressive\.cmem_len=4 needs the model's memory 'compressive'",
  ):
    default_config.validate(c, jax.device_count(), training=False)


def test_evaluation_with_more_compressed_slots_and_the_sliding_window():
  """eval.compressive.cmem_len sets the compressed slots of evaluation (Rae et
  al. evaluate with more than they train with) and is what the model then
  carries, recorded in the results; the sliding window (no memory) of a
  compressive model is the XL model's window with the same weights, the
  compression parameters unused."""
  c = default_config.get_config()
  cfg = _config("conv")
  c.model.update({k: v for k, v in cfg.to_dict().items() if k != "n_token"})
  c.eval.update(tgt_len=4, mem_len=6, same_length=False, clamp_len=0)
  c.eval.compressive.cmem_len = 9
  train_cfg = default_config.model_config(c, VOCAB)
  ecfg = eval_steps.eval_model_config(c, train_cfg)
  assert (_settings(ecfg).cmem_len, ecfg.mem_len) == (9, 6)
  assert memory_lib.init_memory(ecfg, 2).mems_LxBxMxD.shape[2] == 6 + 9
  assert memory_lib.describe_eval(ecfg) == {"compressive": {"cmem_len": 9}}
  c.eval.compressive.cmem_len = None
  assert _settings(eval_steps.eval_model_config(c, train_cfg)).cmem_len == 3
  assert _settings(train_cfg).cmem_len == 3
  c.eval.update(method="sliding", window=5)  # not a multiple of cmem_ratio 2
  wcfg = eval_steps.window_model_config(c, train_cfg)
  assert (wcfg.tgt_len, wcfg.mem_len, _settings(wcfg).cmem_len) == (5, 0, 0)
  params = _params(train_cfg)
  xl = dataclasses.replace(wcfg, memory="xl", memory_settings={})  # every setting its default
  x = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, size=(2, 5)), jnp.int32)
  got, _ = models.TransformerXL(wcfg).apply(
      {"params": params}, x, memory_lib.init_memory(wcfg, 2), method=models.TransformerXL.hidden
  )
  want, _ = models.TransformerXL(xl).apply(
      {"params": params}, x, memory_lib.init_memory(xl, 2), method=models.TransformerXL.hidden
  )
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_compression_network_has_its_own_optimiser():
  """A learned compression function's parameters are optimised apart from the
  language model (the paper's separate objective; train_state.make_optimizer):
  however large the reconstruction loss's weight, the language model's
  parameters take the same steps (their clipping sees only their gradient),
  while the compression network's change; without a learned function the
  optimiser state is the plain chain's (old checkpoints keep their layout)."""
  from transformer_xl.training import train_state

  config = tiny_config(num_steps=3, warmup_steps=0, log_every=1, eval_every=0)
  config.model.update(memory="compressive", dropout=0.0, dropatt=0.0)
  config.model.compressive.update(cmem_len=3, cmem_ratio=2, cmem_fn="conv")
  config.train.update(clip=0.05)  # every step clipped
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  corpus = toy_corpus()
  tokens = np.asarray(corpus.splits["train"].read(0, 8 * 6 * 3 + 8))

  def run(weight):
    config.train.aux_loss_weight = weight
    mcfg = default_config.model_config(config, 64)
    model = models.TransformerXL(mcfg)
    tx = train_state.make_optimizer(config.train, mcfg)
    _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
    state = train_state.create_train_state(model, tx, 8, mesh, jax.random.PRNGKey(0), shardings)
    step = train_step.make_train_step(model, tx, mesh, shardings, 1, 7, aux_loss_weight=weight)
    it = train_data.TrainIterator(train_data.ArraySource(tokens), 8, 6)
    for _ in range(3):
      state, metrics = step(state, next(it))
    assert float(metrics["aux_loss/attn_recon"]) > 0
    return jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0]

  cmem_params = memory_lib.compressive.CMEM_PARAMS
  own = lambda path: any(getattr(k, "key", None) in cmem_params for k in path)
  a, b = run(1.0), run(1000.0)
  assert any(own(p) for p, _ in a)
  for (path, x), (_, y) in zip(a, b):
    if own(path):
      assert not np.allclose(x, y), jax.tree_util.keystr(path)
    else:
      np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))
  # The optimiser state keeps the plain chain's layout (checkpoints unchanged).
  params = {"w": jnp.zeros(2), "cmem_kernel": jnp.zeros(3)}
  mcfg = default_config.model_config(config, 64)
  assert memory_lib.plan(mcfg).param_groups() == (cmem_params,)
  plain = mcfg.with_memory("compressive", cmem_fn="max_pool")
  assert memory_lib.plan(plain).param_groups() == ()
  layout = lambda cfg: jax.tree_util.tree_structure(
      train_state.make_optimizer(config.train, cfg).init(params)
  )
  assert layout(mcfg) == layout(plain) == layout(None)
