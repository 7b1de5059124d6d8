"""A naive Compressive Transformer (Rae et al. 2020, arXiv 1911.05507).

``NaiveCompressive`` is written from the paper's Algorithms 1 and 2 and the
decisions of ``memory.compressive.CompressiveMemory``'s docstring, not from
the model's code: per batch row, the memory and the compressed memory are
plain variable-length arrays (no slots, no masks, no counts), the attention
of each layer runs over [compressed memory; memory; segment] with an
explicit loop over queries and keys and the relative distance ``i +
len(mem) - j`` of each pair, and every compression function is a loop over
its output slots.  It is written with ``jax.numpy`` and run unjitted so that
its gradients (``jax.grad``) can be compared with the model's too; the
memories are stop-gradiented as the paper's (``SG``).  Used by
test_compressive_memory.py and the conformance suite (``naive_scores``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from transformer_xl.model import memory

from naive_reference import _sinusoid

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


def naive_scores(cfg, params, tokens_BxT1: np.ndarray) -> np.ndarray:
  """NLL [B, T] of streams (row b of ``tokens_BxT1`` [B, T + 1]), segment by
  segment of ``cfg.tgt_len``, for a compressive model ``cfg`` (attn_type 0,
  post-LayerNorm, a dense tied softmax; with memory tokens it does not apply)."""
  s = memory.compressive.CompressiveMemory.settings(cfg)
  naive = NaiveCompressive(
      jax.device_get(params),
      n_layer=cfg.n_layer,
      n_head=cfg.n_head,
      d_head=cfg.d_head,
      d_model=cfg.d_model,
      mem_len=cfg.mem_len,
      cmem_len=s.cmem_len,
      ratio=s.cmem_ratio,
      fn=s.cmem_fn,
      batch=tokens_BxT1.shape[0],
  )
  t, out = cfg.tgt_len, []
  for i in range((tokens_BxT1.shape[1] - 1) // t):
    logp, _ = naive.segment(tokens_BxT1[:, i * t : (i + 1) * t])
    y = tokens_BxT1[:, i * t + 1 : (i + 1) * t + 1]
    out.append(-np.take_along_axis(np.asarray(logp), y[..., None], -1)[..., 0])
  return np.concatenate(out, axis=1)
