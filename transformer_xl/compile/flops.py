"""Model FLOPs of a Transformer-XL step: the numerator of MFU.

Counted from the config, not from a compiled program: the matrix products
that the model does per predicted token (no rematerialisation, no
element-wise work).  ``benchmarks/`` divide it by measured time,
``transformer_xl.compile`` by the roofline bound of a compiled step.
"""

from __future__ import annotations


def layer_flops_per_token(
    n_layer: int,
    d_model: int,
    n_head: int,
    d_head: int,
    d_inner: int,
    vocab: int,
    batch: int,
    tgt_len: int,
    mem_len: int,
    train: bool,
) -> float:
  """Matrix-multiply FLOPs per predicted token of a Transformer-XL step.

  2 FLOPs per multiply-add; T = tgt_len, M = mem_len, K = T + M keys,
  H x Dh heads.  Per layer and token: the q projection (2 d H Dh), the k and
  v projections of all K rows (the memory is re-projected every segment:
  4 d H Dh K / T), ``r_net`` over the K sinusoid rows, shared by the batch
  (2 d H Dh K / (B T)), the (a)+(c) scores over K keys (2 H Dh K), the
  (b)+(d) scores against all K distances before the shift (2 H Dh K), the
  probabilities times the values (2 H Dh K), ``o_net`` (2 H Dh d) and the
  feed-forward (4 d d_inner); then the dense softmax layer (2 d vocab).
  Masked keys count (the dense computation does them).  Not counted:
  element-wise work (softmax, LayerNorm, dropout, the optimizer) and the
  q rows of the memory that a fused qkv projection computes and drops.
  Training counts 3x the forward (the backward pass is twice its matmuls;
  Kaplan et al. 2020, Sec. 2.1).

  Returns:
    FLOPs per token (batch * tgt_len tokens a step).
  """
  hd, k = n_head * d_head, tgt_len + mem_len
  per_layer = (
      2 * d_model * hd
      + 4 * d_model * hd * k / tgt_len
      + 2 * d_model * hd * k / (batch * tgt_len)
      + 3 * 2 * hd * k
      + 2 * hd * d_model
      + 4 * d_model * d_inner
  )
  forward = n_layer * per_layer + 2 * d_model * vocab
  return 3 * forward if train else forward


def softmax_flops_per_token(model_cfg) -> float:
  """Forward FLOPs per token of the (adaptive) softmax as ``adaptive.py``
  computes it: for every cluster, the projection to its width (where there
  is one) and its logits, for every token."""
  from transformer_xl.model import adaptive  # noqa: PLC0415

  cutoffs, d = tuple(model_cfg.cutoffs), model_cfg.d_model
  bounds = adaptive.cluster_bounds(model_cfg.n_token, cutoffs)
  dims = adaptive.cluster_dims(model_cfg.embed_dim, len(bounds) - 1, model_cfg.div_val)
  projected = adaptive.has_projections(model_cfg.embed_dim, d, model_cfg.div_val)
  flops = 0.0
  for i, e in enumerate(dims):
    width = (cutoffs[0] + len(cutoffs)) if (i == 0 and cutoffs) else bounds[i + 1] - bounds[i]
    flops += (2 * d * e if projected else 0) + 2 * e * width
  return flops


def step_flops_per_token(model_cfg, batch: int, train: bool) -> float:
  """Model FLOPs per token of a ModelConfig's step: ``layer_flops_per_token``
  plus ``softmax_flops_per_token``, 3x the forward for training."""
  c = model_cfg
  layers = layer_flops_per_token(
      c.n_layer, c.d_model, c.n_head, c.d_head, c.d_inner, 0, batch, c.tgt_len, c.mem_len, train
  )
  return layers + (3 if train else 1) * softmax_flops_per_token(c)
