"""A naive numpy Transformer-XL for all four attention types, written from the
description of the reference implementation (not from our code).

Float64, explicit loops over (query i, key j) for every position term, and the
reference's memory semantics: the memory starts EMPTY (length 0) and holds
n_layer + 1 tensors (layer inputs, plus the final output, never read);
update ``end = mlen + qlen``, ``beg = max(0, end - mem_len)``,
``new = concat(mem, hid)[beg:end]``.  The in-place additions of types 2 and 3
are done in place on the very arrays the memory is cut from, as the
reference's ``mems_i += ...`` and ``core_out += ...`` do.

Only what the tests need: no dropout, no adaptive softmax (one embedding
table tied to the softmax, with a bias), no extended context.
"""

from __future__ import annotations

import numpy as np


def _ln(x, scale, bias):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + 1e-5) * scale + bias


def _sinusoid(pos, d_model):
  inv_freq = 1.0 / (10000.0 ** (np.arange(0, d_model, 2.0) / d_model))
  return np.concatenate([np.sin(pos * inv_freq), np.cos(pos * inv_freq)])


def _table_row(table, dist, clamp_len=0):
  """Row of a learned table (last row = distance 0) for ``dist``: the table
  is cut to its last clamp_len rows first; beyond its length, its row 0."""
  if clamp_len > 0:
    table = table[-clamp_len:]
  n = table.shape[0]
  return table[n - 1 - dist] if dist < n else table[0]


class NaiveTransformerXL:
  """The reference model in numpy; ``p`` is our parameter tree (numpy)."""

  def __init__(
      self,
      p,
      *,
      n_layer,
      n_head,
      d_head,
      d_model,
      mem_len,
      attn_type,
      clamp_len=0,
      same_length=False,
      pre_lnorm=False,
      untie_r=False,
  ):
    self.p = {k: v for k, v in p.items()}
    self.n_layer, self.n_head, self.d_head, self.d_model = n_layer, n_head, d_head, d_model
    self.mem_len, self.attn_type, self.clamp_len = mem_len, attn_type, clamp_len
    self.same_length, self.pre_lnorm, self.untie_r = same_length, pre_lnorm, untie_r
    self.mems = None  # list of n_layer + 1 arrays [B, mlen, D]; starts empty

  def _layer_params(self, i):
    return {k: v[i] for k, v in _flat(self.p["layers"]).items()}

  def _allowed(self, i, j, mlen):
    if j > i + mlen:
      return False
    if self.same_length and j <= i + mlen - self.mem_len:
      return False
    return True

  def _attention(self, lp, i_layer, h, mem):
    """One layer's attention output for a batch row: h [T, D], mem [m, D]."""
    H, Dh = self.n_head, self.d_head
    qlen, mlen = h.shape[0], mem.shape[0]
    klen = qlen + mlen
    cat = np.concatenate([mem, h], 0)
    ln = lambda x: _ln(x, lp["attn_layer_norm/scale"], lp["attn_layer_norm/bias"])
    if self.attn_type in (0, 1):
      c = ln(cat) if self.pre_lnorm else cat
      w = lp["attn/qkv_net/kernel"]  # [D, 3, H, Dh]
      q = np.einsum("kd,dhe->khe", c, w[:, 0])[mlen:]
      k = np.einsum("kd,dhe->khe", c, w[:, 1])
      v = np.einsum("kd,dhe->khe", c, w[:, 2])
    else:
      c = ln(cat) if self.pre_lnorm else cat
      q = np.einsum("td,dhe->the", h, lp["attn/q_net/kernel"])
      kv = lp["attn/kv_net/kernel"]
      k = np.einsum("kd,dhe->khe", c, kv[:, 0])
      v = np.einsum("kd,dhe->khe", c, kv[:, 1])
    out = np.zeros((qlen, self.d_model))
    for i in range(qlen):
      score = np.full((H, klen), -np.inf)
      for j in range(klen):
        if not self._allowed(i, j, mlen):
          continue
        dist = i + mlen - j
        for hh in range(H):
          if self.attn_type == 0:
            u = lp["r_w_bias"][hh] if self.untie_r else self.p["r_w_bias"][hh]
            vb = lp["r_r_bias"][hh] if self.untie_r else self.p["r_r_bias"][hh]
            dd = min(dist, self.clamp_len) if self.clamp_len > 0 else dist
            r = np.einsum("d,de->e", _sinusoid(dd, self.d_model), lp["attn/r_net/kernel"][:, hh])
            s = (q[i, hh] + u) @ k[j, hh] + (q[i, hh] + vb) @ r
          elif self.attn_type == 1:
            r_emb = _table_row(lp["attn/r_emb"], dist, self.clamp_len)
            r_bias = _table_row(lp["attn/r_bias"], dist, self.clamp_len)
            s = (q[i, hh] + lp["attn/r_w_bias"][hh]) @ k[j, hh] + q[i, hh] @ r_emb[hh] + r_bias[hh]
          else:
            s = q[i, hh] @ k[j, hh]
          score[hh, j] = s / np.sqrt(Dh)
      prob = np.exp(score - score.max(-1, keepdims=True))
      prob /= prob.sum(-1, keepdims=True)
      vec = np.einsum("hk,khe->he", prob, v)
      out[i] = np.einsum("he,hed->d", vec, lp["attn/o_net/kernel"])
    return out

  def _layer(self, lp, i_layer, h, mem):
    ln1 = lambda x: _ln(x, lp["attn_layer_norm/scale"], lp["attn_layer_norm/bias"])
    ln2 = lambda x: _ln(x, lp["ff_layer_norm/scale"], lp["ff_layer_norm/bias"])

    def ff(x):
      hid = np.maximum(x @ lp["pos_ff/ff_1/kernel"] + lp["pos_ff/ff_1/bias"], 0.0)
      return hid @ lp["pos_ff/ff_2/kernel"] + lp["pos_ff/ff_2/bias"]

    attn = self._attention(lp, i_layer, h, mem)
    if self.pre_lnorm:
      x = h + attn
      return x + ff(ln2(x))
    x = ln1(h + attn)
    return ln2(x + ff(x))

  def segment(self, tokens_BxT):
    """Runs one segment; returns log-probs [B, T, V] and updates the memory."""
    b, qlen = tokens_BxT.shape
    table = self.p["word_emb/emb_layers_0"]
    if self.mems is None:
      self.mems = [np.zeros((b, 0, self.d_model)) for _ in range(self.n_layer + 1)]
    mlen = self.mems[0].shape[1]
    klen = mlen + qlen
    word_emb = table[tokens_BxT] * np.sqrt(self.d_model)
    if self.attn_type == 2:
      pos = np.arange(klen - 1, -1, -1.0)
      if self.clamp_len > 0:
        pos = np.minimum(pos, self.clamp_len)
      pos_emb = np.stack([_sinusoid(x, self.d_model) for x in pos])  # [klen, D]
      core_out = word_emb + pos_emb[-qlen:]
    else:
      core_out = word_emb.copy()
    hids = [core_out]
    for i in range(self.n_layer):
      lp = self._layer_params(i)
      mems_i = self.mems[i]
      if self.attn_type == 2 and i == 0:
        mems_i += pos_emb[:mlen]  # in place, as the reference
      if self.attn_type == 3:
        r_emb = lp["r_emb"].reshape(lp["r_emb"].shape[0], -1)  # [max_klen, D]
        if mlen > 0:
          cur = r_emb[:-qlen]
          if cur.shape[0] < mlen:
            cur = np.concatenate([np.repeat(cur[:1], mlen - cur.shape[0], 0), cur], 0)
          else:
            cur = cur[-mlen:]
          mems_i += cur  # in place
        core_out += r_emb[-qlen:]  # in place: hids[i] sees it
      core_out = np.stack([self._layer(lp, i, core_out[bb], mems_i[bb]) for bb in range(b)])
      hids.append(core_out)
    end = mlen + qlen
    beg = max(0, end - self.mem_len)
    self.mems = [np.concatenate([m, hh], 1)[:, beg:end].copy() for m, hh in zip(self.mems, hids)]
    logits = core_out @ table.T + self.p["crit/out_bias_0"]
    logits = logits - logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _flat(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = np.asarray(v, np.float64)
  return out


def flat_params(params):
  """Our parameter tree -> {"word_emb/emb_layers_0": ..., "layers": {...}, ...} in float64,
  with the stacked layer parameters kept as a nested dict under "layers"."""
  out = {}
  for k, v in params.items():
    if k == "layers":
      out["layers"] = v
    elif isinstance(v, dict):
      out.update(_flat(v, f"{k}/"))
    else:
      out[k] = np.asarray(v, np.float64)
  return out
