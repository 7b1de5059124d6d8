"""The compressive memory (Rae et al. 2020, arXiv 1911.05507) against a naive implementation.

``NaiveCompressive`` below is written from the paper's Algorithms 1 and 2
and the decisions of ``memory.CompressiveMemory``'s docstring, not from the
model's code: per batch row, the memory and the compressed memory are plain
variable-length arrays (no slots, no masks, no counts), the attention of
each layer runs over [compressed memory; memory; segment] with an explicit
loop over queries and keys and the relative distance ``i + len(mem) - j``
of each pair, and every compression function is a loop over its output
slots.  It is written with ``jax.numpy`` and run unjitted so that its
gradients (``jax.grad``) can be compared with the model's too; the
memories are stop-gradiented as the paper's (``SG``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

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
from transformer_xl.training import train, train_step

from helpers import (
    score_and_generate,
    tiny_config,
    tiny_model_config,
    tiny_text_config,
    toy_corpus,
    write_corpus,
)
from naive_reference import _sinusoid

VOCAB = 24
SIZES = dict(n_token=VOCAB, n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=16, dropout=0.0)
SG = jax.lax.stop_gradient


def _ln(x, p):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / jnp.sqrt(var + 1e-5) * p["scale"] + p["bias"]


class NaiveCompressive:
  """Compressive Transformer (attn_type 0, post-LayerNorm, tied softmax), per row.

  ``p`` is the model's parameter tree (layers stacked on axis 0).  State per
  row b and layer l: ``xl[b][l]`` [m, D] (at most M) and ``cm[b][l]`` [n, D]
  (at most Nc), empty at the start.
  """

  def __init__(self, p, *, n_layer, n_head, d_head, d_model, mem_len, cmem_len, ratio, fn, batch):
    self.p, self.L, self.H, self.Dh, self.D = p, n_layer, n_head, d_head, d_model
    self.M, self.Nc, self.c, self.fn = mem_len, cmem_len, ratio, fn
    empty = jnp.zeros((0, d_model), jnp.float32)
    self.xl = [[empty] * n_layer for _ in range(batch)]
    self.cm = [[empty] * n_layer for _ in range(batch)]

  def lp(self, layer):
    return jax.tree_util.tree_map(lambda x: x[layer], self.p["layers"])

  def attention(self, lp, h, mem, doc_pos):
    """The layer's attention of h [T, D] over [mem; h], mem [m, D]."""
    t, m = h.shape[0], mem.shape[0]
    cat = jnp.concatenate([mem, h], 0)
    w = lp["attn"]["qkv_net"]["kernel"]
    q = jnp.einsum("td,dhe->the", h, w[:, 0])
    k = jnp.einsum("kd,dhe->khe", cat, w[:, 1])
    v = jnp.einsum("kd,dhe->khe", cat, w[:, 2])
    u, vb = self.p["r_w_bias"], self.p["r_r_bias"]
    rows = []
    for i in range(t):  # query i sees keys j <= i + m (of its document), at distance i + m - j
      keys = [j for j in range(m + i + 1) if doc_pos is None or i + m - j <= doc_pos[i]]
      dist = [i + m - j for j in keys]
      sin = jnp.asarray(np.stack([_sinusoid(d, self.D) for d in dist]), jnp.float32)
      r = jnp.einsum("kd,dhe->khe", sin, lp["attn"]["r_net"]["kernel"])
      kk, vv = k[np.asarray(keys)], v[np.asarray(keys)]
      s = jnp.einsum("he,nhe->hn", q[i] + u, kk) + jnp.einsum("he,nhe->hn", q[i] + vb, r)
      prob = jax.nn.softmax(s / np.sqrt(self.Dh), axis=-1)
      vec = jnp.einsum("hn,nhe->he", prob, vv)
      rows.append(jnp.einsum("he,hed->d", vec, lp["attn"]["o_net"]["kernel"]))
    return jnp.stack(rows)

  def layer(self, lp, h, mem, doc_pos):
    x = _ln(h + self.attention(lp, h, mem, doc_pos), lp["attn_layer_norm"])
    ff = lp["pos_ff"]
    hid = jnp.maximum(x @ ff["ff_1"]["kernel"] + ff["ff_1"]["bias"], 0.0)
    return _ln(x + hid @ ff["ff_2"]["kernel"] + ff["ff_2"]["bias"], lp["ff_layer_norm"])

  def content_attn(self, lp, h, states):
    """Algorithm 2's attn(h, m): softmax((h Q)(m K)^T / sqrt(Dh)) (m V), per head,
    every parameter and input stop-gradiented but ``states`` (the compression)."""
    w = SG(lp["attn"]["qkv_net"]["kernel"])
    q = jnp.einsum("td,dhe->the", SG(h), w[:, 0])
    k = jnp.einsum("kd,dhe->khe", states, w[:, 1])
    v = jnp.einsum("kd,dhe->khe", states, w[:, 2])
    prob = jax.nn.softmax(jnp.einsum("the,nhe->htn", q, k) / np.sqrt(self.Dh), axis=-1)
    return jnp.einsum("htn,nhe->the", prob, v), prob

  def compress(self, lp, h, old, k):
    """k slots from ``old`` [k c, D] (the newest evicted states, all valid)."""
    c, fn = self.c, self.fn
    if fn in ("max_pool", "mean_pool"):
      pool = jnp.max if fn == "max_pool" else jnp.mean
      return jnp.stack([pool(old[g * c : (g + 1) * c], axis=0) for g in range(k)])
    if fn == "most_used":
      _, prob = self.content_attn(lp, h, old)
      order = jnp.argsort(-prob.mean(axis=(0, 1)), stable=True)  # most used first; ties: older
      return old[jnp.sort(order[:k])]
    w, b = lp["cmem_kernel"], lp["cmem_bias"]
    slots = []
    for g in range(k):
      acc = b
      for j in range(c):
        n = (
            g * c + j if fn == "conv" else g * c + 2 * j - (c - 1)
        )  # dilation 2, ends at g c + c - 1
        if 0 <= n < k * c:  # zeros outside the compressed states
          acc = acc + old[n] @ w[j]
      slots.append(acc)
    return jnp.stack(slots)

  def segment(self, tokens_BxT, reset_B=None, doc_pos_BxT=None):
    """(log-probs [B, T, V], reconstruction loss per layer [L]); updates the state."""
    b, t = tokens_BxT.shape
    table = self.p["word_emb"]["emb_layers_0"]
    g_max = t // self.c
    errs = [[] for _ in range(self.L)]
    outs = []
    for r in range(b):
      if reset_B is not None and reset_B[r]:
        self.xl[r] = [self.xl[r][0][:0]] * self.L
        self.cm[r] = [self.cm[r][0][:0]] * self.L
      h = table[tokens_BxT[r]] * np.sqrt(self.D)
      doc_pos = None if doc_pos_BxT is None else doc_pos_BxT[r]
      for l in range(self.L):
        lp = self.lp(l)
        xl, cm = self.xl[r][l], self.cm[r][l]
        out = self.layer(lp, h, jnp.concatenate([cm, xl], 0), doc_pos)
        cat = jnp.concatenate([xl, SG(h)], 0)
        keep = min(self.M, cat.shape[0])
        evicted = cat[: cat.shape[0] - keep]
        k = min(g_max, evicted.shape[0] // self.c)
        new_cm = cm
        if self.Nc and k:
          old = evicted[evicted.shape[0] - k * self.c :]
          comp = self.compress(lp, h, old, k)
          a_old, _ = self.content_attn(lp, h, old)
          a_new, _ = self.content_attn(lp, h, comp)
          errs[l].append(jnp.mean((a_old - a_new) ** 2))
          new_cm = jnp.concatenate([cm, SG(comp)], 0)[-self.Nc :]
        self.xl[r][l] = cat[cat.shape[0] - keep :]
        self.cm[r][l] = new_cm
        h = out
      outs.append(h @ table.T + self.p["crit"]["out_bias_0"])
    logits = jnp.stack(outs)
    recon = jnp.stack([jnp.mean(jnp.stack(e)) if e else jnp.float32(0) for e in errs])
    return jax.nn.log_softmax(logits, -1), recon


def _config(fn, **kw):
  base = dict(
      **SIZES, tgt_len=4, mem_len=6, memory="compressive", cmem_len=3, cmem_ratio=2, cmem_fn=fn
  )
  return tiny_model_config(**{**base, **kw})


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
  memory = models.init_memory(cfg, tokens.shape[0])
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
    recons.append(sown["losses"]["layers"][memory_lib.RECON_LOSS][0])
  return jnp.stack(nlls), jnp.stack(recons), memory


def _run_naive(cfg, params, tokens, resets, docs, t=4):
  naive = NaiveCompressive(
      params,
      n_layer=cfg.n_layer,
      n_head=cfg.n_head,
      d_head=cfg.d_head,
      d_model=cfg.d_model,
      mem_len=cfg.mem_len,
      cmem_len=cfg.cmem_len,
      ratio=cfg.cmem_ratio,
      fn=cfg.cmem_fn,
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
    [("conv", False)]  # the fast tier; the others are slow
    + [
        pytest.param(fn, documents, marks=pytest.mark.slow)
        for fn in memory_lib.CMEM_FNS
        for documents in (False, True)
        if (fn, documents) != ("conv", False)
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
  nc, m = cfg.cmem_len, cfg.mem_len
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
    model, memory, total = models.TransformerXL(cfg), models.init_memory(cfg, 2), 0.0
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
  problems = lambda **kw: model_config.config_problems({**SIZES, "tgt_len": 4, **kw})
  assert problems(memory="compressive", cmem_len=4, cmem_ratio=2) == []
  assert problems(cmem_len=4) == [
      "model.cmem_len=4 needs model.memory='compressive' (got 'xl'); or set model.cmem_len=0."
  ]
  assert problems(memory="compressive", cmem_len=4, cmem_ratio=3) == [
      "model.tgt_len=4 must be a multiple of model.cmem_ratio=3 (each segment's 4 evicted "
      "states are compressed 3 at a time)."
  ]
  assert problems(memory="compressive", cmem_ratio=0)[0].startswith("model.cmem_ratio=0 must be")
  assert problems(memory="compressive", cmem_fn="avg")[0].startswith("model.cmem_fn='avg': use")
  assert problems(memory="compressive", attn_type=2) == [
      "model.memory='compressive' needs a relative attention: model.attn_type 0 or 1 (got 2)."
  ]
  assert problems(memory="compressive", pre_lnorm=True) == [
      "model.memory='compressive' is post-LayerNorm (the paper's): set model.pre_lnorm=False."
  ]
  assert problems(memory="compressive", cmem_len=-1)[0].startswith("model.cmem_len=-1 must be")


# ---------------------------------------------------------------------------
# The command line: train, eval, score and generate with --config.model.memory=compressive.


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(root, workdir, config): a compressive model (conv, Nc 4, c 2) trained for 4
  steps through ``modes.run`` on one's own text (word tokenizer)."""
  root = tmp_path_factory.mktemp("compressive")
  config = tiny_text_config(write_corpus(root / "corpus"), root / "tfds")
  config.model.update(memory="compressive", cmem_len=4, cmem_ratio=2, cmem_fn="conv")
  config.train.update(num_steps=4)
  config.checkpoint.update(every_steps=4)
  workdir = root / "wd"
  modes.run(modes.Request(mode="train", workdir=str(workdir), config=config))
  return root, workdir, config


@pytest.mark.slow
def test_train_logs_the_reconstruction_loss_and_saves_the_variant(trained):
  _, workdir, _ = trained
  saved = json.loads((workdir / "model_config.json").read_text())["model"]
  assert (saved["memory"], saved["cmem_len"], saved["cmem_ratio"]) == ("compressive", 4, 2)
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
  other.model.update(cmem_ratio=4)
  with pytest.raises(SystemExit) as err:
    modes.run(modes.Request(mode="eval", workdir=str(workdir), config=other))
  message = str(err.value.code)
  assert message.startswith("error: --config sets") and "\n" not in message
  assert "model.cmem_ratio" in message, message


# ---------------------------------------------------------------------------
# Training: sharded with gradient accumulation, resumed mid-run exactly.


def _fingerprints(workdir, step):
  rec = json.loads(
      (Path(workdir) / "checkpoints" / str(step) / "integrity" / "metadata").read_text()
  )
  return {k: v["fingerprint"] for k, v in rec["leaves"].items()}


@pytest.mark.slow
def test_it_trains_sharded_with_accumulation_and_resumes_exactly(tmp_path):
  """8 simulated devices (data 4 x model 2), 2 micro-batches: a run resumed from
  its step-4 checkpoint ends with the straight run's parameters, optimizer state
  and memory (compressed slots included), bit for bit; the memory is sharded over
  the rows as XL's; one device gives the same losses."""
  config = tiny_config(num_steps=6, batch_chunk=2, log_every=1, eval_every=0)
  config.model.update(
      memory="compressive", cmem_len=3, cmem_ratio=2, cmem_fn="conv", dropout=0.0, dropatt=0.0
  )
  config.checkpoint.update(every_steps=2, max_to_keep=10)
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  straight = tmp_path / "straight"
  train.train_and_evaluate(config, str(straight), toy_corpus(), mesh)
  resumed = tmp_path / "resumed"
  shutil.copytree(straight, resumed)
  for path in (resumed / "checkpoints").iterdir():
    if path.name.isdigit() and int(path.name) > 4:
      shutil.rmtree(path)
  train.train_and_evaluate(config, str(resumed), toy_corpus(), mesh)
  assert _fingerprints(resumed, 6) == _fingerprints(straight, 6)
  assert any("memory" in k for k in _fingerprints(straight, 6))

  # The memory's rows over the data axis, [compressed; XL] slots whole on each device.
  mcfg = default_config.model_config(config, 64)
  placed = jax.device_put(models.init_memory(mcfg, 8), models.Memory.shardings(mesh))
  assert {s.data.shape for s in placed.mems_LxBxMxD.addressable_shards} == {(2, 2, 3 + 6, 16)}

  one = tmp_path / "one"
  single = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  train.train_and_evaluate(config, str(one), toy_corpus(), single)
  rows = lambda wd: [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
  key = "train/aux_loss/attn_recon"
  sharded = [(r["train/loss"], r[key]) for r in rows(straight) if key in r]
  single = [(r["train/loss"], r[key]) for r in rows(one) if key in r]
  assert len(sharded) == 6 and sharded[-1][1] > 0
  np.testing.assert_allclose(sharded, single, rtol=1e-4, atol=1e-6)


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
  """The Generator drops the decoding cache (``decode_cache`` False: it would roll
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
  model, memory = models.TransformerXL(cfg), models.init_memory(cfg, 1)
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
  c.model.update(memory="compressive", cmem_len=8, cmem_ratio=4, tgt_len=8, mem_len=8)
  c.eval.update(tgt_len=6)
  with pytest.raises(default_config.ConfigError, match=r"eval\.tgt_len=6 must be a multiple"):
    default_config.validate(c, jax.device_count(), training=False)
  c.eval.update(tgt_len=8, cmem_len=-2)
  with pytest.raises(default_config.ConfigError, match=r"eval\.cmem_len=-2 must be -1"):
    default_config.validate(c, jax.device_count(), training=False)
  # A sliding window has no memory: any window length (nothing is compressed).
  c.eval.update(cmem_len=-1, method="sliding", window=10)
  default_config.validate(c, jax.device_count(), training=False)
  c.model.update(memory="xl", cmem_len=0)
  c.eval.update(method="segments", cmem_len=4)
  with pytest.raises(default_config.ConfigError, match=r"eval\.cmem_len=4 needs model\.memory"):
    default_config.validate(c, jax.device_count(), training=False)


def test_evaluation_with_more_compressed_slots_and_the_sliding_window():
  """eval.cmem_len sets the compressed slots of evaluation (Rae et al. evaluate
  with more than they train with) and is what the model then carries; the
  sliding window (no memory) of a compressive model is the XL model's window
  with the same weights, the compression parameters unused."""
  c = default_config.get_config()
  c.model.update(**{k: v for k, v in _config("conv").__dict__.items() if k in c.model})
  c.eval.update(tgt_len=4, mem_len=6, cmem_len=9, same_length=False, clamp_len=0)
  train_cfg = default_config.model_config(c, VOCAB)
  ecfg = eval_steps.eval_model_config(c, train_cfg)
  assert (ecfg.cmem_len, ecfg.mem_len) == (9, 6)
  assert models.init_memory(ecfg, 2).mems_LxBxMxD.shape[2] == 6 + 9
  c.eval.cmem_len = -1
  assert eval_steps.eval_model_config(c, train_cfg).cmem_len == train_cfg.cmem_len == 3
  c.eval.update(method="sliding", window=5)  # not a multiple of cmem_ratio 2
  wcfg = eval_steps.window_model_config(c, train_cfg)
  assert (wcfg.tgt_len, wcfg.mem_len, wcfg.cmem_len) == (5, 0, 0)
  params = _params(train_cfg)
  xl = dataclasses.replace(wcfg, memory="xl")
  x = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, size=(2, 5)), jnp.int32)
  got, _ = models.TransformerXL(wcfg).apply(
      {"params": params}, x, models.init_memory(wcfg, 2), method=models.TransformerXL.hidden
  )
  want, _ = models.TransformerXL(xl).apply(
      {"params": params}, x, models.init_memory(xl, 2), method=models.TransformerXL.hidden
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
  config.model.update(
      memory="compressive", cmem_len=3, cmem_ratio=2, cmem_fn="conv", dropout=0.0, dropatt=0.0
  )
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

  own = lambda path: any(getattr(k, "key", None) in memory_lib.CMEM_PARAMS for k in path)
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
  plain = dataclasses.replace(mcfg, cmem_fn="max_pool")
  layout = lambda cfg: jax.tree_util.tree_structure(
      train_state.make_optimizer(config.train, cfg).init(params)
  )
  assert layout(mcfg) == layout(plain) == layout(None)
