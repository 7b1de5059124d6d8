"""Adaptive input embedding and projected adaptive log-softmax.

Sources: Grave et al. 2016, "Efficient softmax approximation for GPUs"
(adaptive softmax: a head over a shortlist of frequent tokens plus one
entry per tail cluster, each tail cluster with its own smaller softmax);
Baevski & Auli 2018, "Adaptive input representations for neural language
modeling" (the same clustering on the input side, with embedding size
``d_embed // div_val**i`` for cluster i); Dai et al. 2019, reference
``mem_transformer.py`` (``AdaptiveEmbedding``) and
``utils/proj_adaptive_softmax.py`` (``ProjectedAdaptiveLogSoftmax``), whose
semantics are followed here, including the order of the cluster columns
and which projections are tied.

Clusters.  With ``cutoffs = (c_0, ..., c_{C-1})`` the vocabulary is split
into C + 1 clusters of contiguous ids: cluster 0 (the head's shortlist) is
[0, c_0), tail cluster i (i = 1..C) is [c_{i-1}, c_i) with c_C = n_token.
Cluster i has embedding size ``d_i = d_embed // div_val**i`` (all ``d_embed``
when div_val == 1).

Parameters (name, shape, logical axis names, the reference's name):

```text
AdaptiveEmbedding (word_emb in the model):
  emb_layers_{i}  [n_i, d_i]    ("vocab", "embed")  emb_layers[i].weight
  emb_projs_{i}   [d_i, d_proj] (None, "embed")     emb_projs[i].T
ProjectedAdaptiveLogSoftmax (crit in the model):
  out_weight_{i}  [n_i, d_i]    ("vocab", "embed")  out_layers[i].weight
  out_bias_{i}    [n_i]         ("vocab",)          out_layers[i].bias
  out_projs_{i}   [d_i, d_proj] (None, "embed")     out_projs[i].T
  cluster_weight  [C, d_embed]  (None, "embed")     cluster_weight
  cluster_bias    [C]           (None,)             cluster_bias
```

With div_val == 1 there is a single table / output layer (i = 0 only, over
the whole vocabulary, sliced per cluster as in the reference); embedding
projections exist only when d_proj != d_embed, and then the softmax has one
projection per cluster.  With div_val > 1 every cluster has its own table,
output layer and projections (even where d_i == d_proj, as in the
reference): ``has_projections``.  ``tie_weight`` removes ``out_weight_*`` (the embedding tables
are used), ``tie_projs[i]`` removes ``out_projs_{i}`` (the embedding's
projection i, or its single projection when div_val == 1, is used).
Projections are stored transposed with respect to the reference
([d_i, d_proj] instead of [d_proj, d_i]); the map is the same: the embedding
computes ``e @ P`` and the softmax ``h @ P.T``.

Everything has static shapes (no boolean masks, no per-cluster token lists),
so it compiles once for XLA on TPU/GPU/CPU.  The price is that every token
pays for every cluster; the costs are given in the class docstrings.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_xl.model import attention_ops

Array = jax.Array


def config_problems(
    n_token: int | None,
    d_embed: int,
    d_proj: int,
    cutoffs: Sequence[int],
    div_val: int,
    tie_projs: Sequence[bool] = (),
) -> list[str]:
  """Every problem of the adaptive embedding / softmax hyperparameters.

  Args:
    n_token: vocabulary size V; None when it is not known yet (before the
      corpus is loaded): the checks against it are skipped.
    d_embed: embedding size of cluster 0 (already resolved: > 0).
    d_proj: model width (d_model).
    cutoffs: cluster boundaries c_0 < c_1 < ... < c_{C-1} < n_token, all > 0.
    div_val: embedding size divisor per cluster (>= 1).
    tie_projs: () or one bool per cluster (len(cutoffs) + 1).

  Returns:
    One message per problem, naming the ``model.*`` field and the fix; []
    if none.
  """
  cutoffs, problems = tuple(cutoffs), []
  if n_token is not None and n_token < 1:
    problems.append(f"model.n_token={n_token} must be >= 1.")
  if d_embed < 1 or d_proj < 1:
    problems.append(
        f"model.d_embed={d_embed} and d_model={d_proj} must be >= 1 "
        "(set --config.model.d_embed=0 to use d_model)."
    )
  if div_val < 1:
    problems.append(
        f"model.div_val={div_val} must be >= 1 (1 = one embedding size for "
        "all clusters); set --config.model.div_val=1 or larger."
    )
  if any(c <= 0 for c in cutoffs):
    problems.append(
        f"model.cutoffs={cutoffs} must be positive token ids; drop the "
        "non-positive ones from --config.model.cutoffs."
    )
  if any(b <= a for a, b in zip(cutoffs, cutoffs[1:])):
    problems.append(
        f"model.cutoffs={cutoffs} must be strictly increasing; sort them and "
        "remove duplicates in --config.model.cutoffs."
    )
  if n_token is not None and cutoffs and cutoffs[-1] >= n_token:
    problems.append(
        f"model.cutoffs={cutoffs} must all be < n_token={n_token} (the last "
        "cluster ends at n_token implicitly); drop the cutoffs >= n_token."
    )
  if div_val > 1 and d_embed // div_val ** len(cutoffs) < 1:
    problems.append(
        f"model.div_val={div_val} with d_embed={d_embed} and {len(cutoffs)} "
        f"cutoffs gives the last cluster an embedding size of 0; lower div_val "
        "or raise d_embed."
    )
  if len(tie_projs) not in (0, len(cutoffs) + 1):
    problems.append(
        f"model.tie_projs={tuple(tie_projs)} must be empty (nothing tied) or "
        f"hold one bool per cluster, len(cutoffs) + 1 = {len(cutoffs) + 1}."
    )
  return problems


def check_adaptive_config(
    n_token: int,
    d_embed: int,
    d_proj: int,
    cutoffs: Sequence[int],
    div_val: int,
    tie_projs: Sequence[bool] = (),
) -> None:
  """Raises the problems of ``config_problems`` (the modules' own guard).

  Raises:
    ValueError: naming the offending ``model.*`` fields and how to fix them.
  """
  problems = config_problems(n_token, d_embed, d_proj, cutoffs, div_val, tie_projs)
  if problems:
    raise ValueError(" ".join(problems))


def cluster_bounds(n_token: int, cutoffs: Sequence[int]) -> tuple[int, ...]:
  """(0, c_0, ..., c_{C-1}, n_token): cluster i is [bounds[i], bounds[i+1])."""
  return (0,) + tuple(cutoffs) + (n_token,)


def cluster_dims(d_embed: int, n_clusters_total: int, div_val: int) -> tuple[int, ...]:
  """Embedding size of each cluster, ``d_embed // div_val**i`` (reference)."""
  return tuple(d_embed // div_val**i for i in range(n_clusters_total))


def _tied_proj_index(i: int, div_val: int) -> int:
  """Which embedding projection softmax cluster i uses when tie_projs[i]."""
  return 0 if div_val == 1 else i


def _acc_dtype(dtype) -> jnp.dtype:
  """float32 for float32/bfloat16/float16 compute, float64 for float64 (tests)."""
  return jnp.promote_types(dtype, jnp.float32)


def has_projections(d_embed: int, d_proj: int, div_val: int) -> bool:
  """Whether the clusters have projections at all (``emb_projs_*``, ``out_projs_*``).

  The reference's rule (``mem_transformer.py``, ``AdaptiveEmbedding``;
  ``utils/proj_adaptive_softmax.py``): with div_val > 1 every cluster has a
  projection (even where its width equals d_proj); with div_val == 1 there
  are projections only when d_proj != d_embed.  Without them, the embedding
  is a plain scaled lookup and the softmax a plain output layer.

  Args:
    d_embed: the embedding size of cluster 0 (``ModelConfig.embed_dim``).
    d_proj: the size projected to, the model's d_model.
    div_val: the factor by which each cluster's width shrinks.

  Returns:
    True when the adaptive embedding and softmax hold projections.
  """
  return div_val > 1 or d_proj != d_embed


class AdaptiveEmbedding(nn.Module):
  """Adaptive input embedding (Baevski & Auli 2018; reference ``AdaptiveEmbedding``).

  Token t in cluster i (``bounds[i] <= t < bounds[i+1]``) is embedded as
  ``emb_layers_i[t - bounds[i]] @ emb_projs_i * sqrt(d_proj)`` (the projection
  is left out with div_val == 1 and d_embed == d_proj: then this is a plain
  scaled embedding, the non-adaptive model).  With div_val == 1 there is one
  table over the whole vocabulary whatever the cutoffs.

  Batch computation (static shapes): for each cluster, the ids are clipped
  into the cluster's range, looked up, projected and the result kept only
  where the token belongs to the cluster (``jnp.where``); with div_val == 1
  it is a single lookup (and projection).  Cost per token with div_val > 1:
  a gather of sum_i d_i values and sum_i 2 d_i d_proj FLOPs of projection
  (every token is projected in every cluster; with div_val = 4 and C = 3
  that is 1.33x the work of one d_embed x d_proj projection); memory is C + 1
  [B, T, d_proj] temporaries.  No one-hot matrix is built.

  Attributes:
    n_token: vocabulary size V.
    d_embed: embedding size of cluster 0.
    d_proj: output width (d_model).
    cutoffs: cluster boundaries (see the module docstring).
    div_val: embedding size divisor per cluster.
    init_std: std of the N(0, init_std) table init (reference 0.02).
    proj_init_std: std of the N(0, proj_init_std) projection init (0.01).
    dtype: compute dtype of the output; parameters are float32.

  Raises:
    ValueError: invalid cutoffs / div_val / sizes (``check_adaptive_config``),
      when the module is bound.
  """

  n_token: int
  d_embed: int
  d_proj: int
  cutoffs: tuple[int, ...] = ()
  div_val: int = 1
  init_std: float = 0.02
  proj_init_std: float = 0.01
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    check_adaptive_config(self.n_token, self.d_embed, self.d_proj, self.cutoffs, self.div_val)
    bounds = cluster_bounds(self.n_token, self.cutoffs)
    table_init = attention_ops.normal_init(self.init_std, "vocab", "embed")
    proj_init = attention_ops.normal_init(self.proj_init_std, None, "embed")
    if self.div_val == 1:
      self.emb_layers = [self.param("emb_layers_0", table_init, (self.n_token, self.d_embed))]
      self.emb_projs = [
          self.param("emb_projs_0", proj_init, (self.d_embed, self.d_proj))
          if self.d_proj != self.d_embed
          else None
      ]
    else:
      dims = cluster_dims(self.d_embed, len(bounds) - 1, self.div_val)
      self.emb_layers = [
          self.param(f"emb_layers_{i}", table_init, (bounds[i + 1] - bounds[i], d_i))
          for i, d_i in enumerate(dims)
      ]
      self.emb_projs = [
          self.param(f"emb_projs_{i}", proj_init, (d_i, self.d_proj)) for i, d_i in enumerate(dims)
      ]

  def shared(self) -> tuple[list[Array], list[Array | None]]:
    """(tables, projections) for tying with ``ProjectedAdaptiveLogSoftmax``.

    Returns:
      tables: float32 [n_i, d_i] per cluster (one [V, d_embed] table with
        div_val == 1); projections: float32 [d_i, d_proj] or None, same
        indexing.
    """
    return list(self.emb_layers), list(self.emb_projs)

  def _project(self, emb: Array, proj: Array | None) -> Array:
    """[..., d_i] -> [..., d_proj] in the compute dtype (float32 accumulation)."""
    emb = emb.astype(self.dtype)
    if proj is None:
      return emb
    return jnp.einsum(
        "bte,ed->btd", emb, proj.astype(self.dtype), preferred_element_type=_acc_dtype(self.dtype)
    ).astype(self.dtype)

  def __call__(self, tokens_BxT: Array) -> Array:
    """Embeds token ids.

    Args:
      tokens_BxT: int token ids in [0, n_token).  Out-of-range ids are
        clipped into the vocabulary, not an error.

    Returns:
      emb_BxTxD: [B, T, d_proj] in ``dtype``, already multiplied by
      sqrt(d_proj) (reference ``emb_scale``).
    """
    scale = jnp.asarray(self.d_proj**0.5, self.dtype)
    if self.div_val == 1:
      emb_BxTxE = jnp.take(self.emb_layers[0], tokens_BxT, axis=0, mode="clip")
      return self._project(emb_BxTxE, self.emb_projs[0]) * scale
    bounds = cluster_bounds(self.n_token, self.cutoffs)
    # Cluster of each token (ids < 0 fall in cluster 0, ids >= n_token in the last).
    cluster_BxT = sum((tokens_BxT >= c).astype(jnp.int32) for c in self.cutoffs)
    out_BxTxD = jnp.zeros(tokens_BxT.shape + (self.d_proj,), self.dtype)
    for i, (table, proj) in enumerate(zip(self.emb_layers, self.emb_projs)):
      lo, hi = bounds[i], bounds[i + 1]
      local_BxT = jnp.clip(tokens_BxT - lo, 0, hi - lo - 1)
      emb_BxTxDi = jnp.take(table, local_BxT, axis=0)
      out_BxTxD = jnp.where(
          (cluster_BxT == i)[..., None], self._project(emb_BxTxDi, proj), out_BxTxD
      )
    return out_BxTxD * scale


class ProjectedAdaptiveLogSoftmax(nn.Module):
  """Projected adaptive log-softmax (Grave et al. 2016; reference ``ProjectedAdaptiveLogSoftmax``).

  log p(t | h) for t in the shortlist (cluster 0) is the head log-softmax at
  column t; for t in tail cluster i it is

      head_logp[-i] + log_softmax(tail_logits_i)[t - bounds[i]]

  where the head has ``c_0 + C`` columns: the shortlist, then one column per
  tail cluster in REVERSE order (head column -i, i.e. ``c_0 + C - i``,
  belongs to tail cluster i, so ``cluster_weight[C - i]`` scores cluster i;
  reference semantics, unlike the TF port's forward order).  Cluster i's
  logits are ``(h @ P_i.T) @ W_i.T + b_i`` (no projection where the
  reference has none).  With no cutoffs and div_val == 1 (and d_embed ==
  d_proj) this is exactly a dense softmax ``log_softmax(h @ W.T + b)``.

  Batch computation and cost (static shapes; per token, per cluster; d_i
  the cluster's size, n_i its number of tokens, n_0 = c_0 + C for the head):
  every cluster is evaluated densely for every token -- projection
  ``2 d_proj d_i`` FLOPs (when it has one), logits ``2 d_i n_i`` FLOPs, a
  float32 [n_i] logits buffer (kept for the backward pass) -- and the
  per-token result is then selected by the token's cluster (``nll``) or
  assembled into the full distribution (``log_prob``).  So the FLOPs are
  sum_i 2 d_i (d_proj + n_i) per token, against 2 d_embed V for a dense
  softmax (wt103 with div_val 4: ~7x fewer), and the memory is ~V float32
  per token, as for a dense softmax.  The reference instead evaluates tail
  cluster i only for the tokens in it, which needs dynamic shapes.
  ``log_prob`` additionally builds the [B, T, V] float32 output.  With
  div_val == 1 and cutoffs, the single [V, d_embed] table is sliced at the
  cutoffs; under a vocabulary-sharded layout XLA reshards those slices
  (cutoffs need not fall on shard boundaries).

  Softmaxes are computed in float32 (float64 if the hidden states are
  float64, as in the gradient tests); matmuls run in the dtype of the hidden
  states with float32 accumulation.

  Attributes:
    n_token: vocabulary size V.
    d_embed: embedding size of cluster 0.
    d_proj: width of the hidden states (d_model).
    cutoffs: cluster boundaries (see the module docstring).
    div_val: embedding size divisor per cluster.
    tie_weight: use the embedding tables as output weights.
    tie_projs: () or one bool per cluster: use the embedding's projection.
    init_std: std of the output weight and cluster weight init (0.02);
      biases start at 0.
    proj_init_std: std of the projection init (0.01).

  Raises:
    ValueError: invalid cutoffs / div_val / tie_projs
      (``check_adaptive_config``), when the module is bound.
  """

  n_token: int
  d_embed: int
  d_proj: int
  cutoffs: tuple[int, ...] = ()
  div_val: int = 1
  tie_weight: bool = False
  tie_projs: tuple[bool, ...] = ()
  init_std: float = 0.02
  proj_init_std: float = 0.01

  def setup(self):
    check_adaptive_config(
        self.n_token, self.d_embed, self.d_proj, self.cutoffs, self.div_val, self.tie_projs
    )
    bounds = cluster_bounds(self.n_token, self.cutoffs)
    n_total = len(bounds) - 1
    dims = cluster_dims(self.d_embed, n_total, self.div_val)
    weight_init = attention_ops.normal_init(self.init_std, "vocab", "embed")
    bias_init = nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",))
    proj_init = attention_ops.normal_init(self.proj_init_std, None, "embed")
    # Output layers: one over the whole vocabulary with div_val == 1 (the
    # reference slices it per cluster), else one per cluster.
    layer_shapes = (
        [(self.n_token, self.d_embed)]
        if self.div_val == 1
        else [(bounds[i + 1] - bounds[i], dims[i]) for i in range(n_total)]
    )
    self.out_weights = [
        None if self.tie_weight else self.param(f"out_weight_{i}", weight_init, shape)
        for i, shape in enumerate(layer_shapes)
    ]
    self.out_biases = [
        self.param(f"out_bias_{i}", bias_init, (shape[0],)) for i, shape in enumerate(layer_shapes)
    ]
    has_proj = has_projections(self.d_embed, self.d_proj, self.div_val)
    self.out_projs = [
        self.param(f"out_projs_{i}", proj_init, (dims[i], self.d_proj))
        if has_proj and not self._tied_proj(i)
        else None
        for i in range(n_total)
    ]
    if n_total > 1:
      self.cluster_weight = self.param(
          "cluster_weight",
          attention_ops.normal_init(self.init_std, None, "embed"),
          (n_total - 1, self.d_embed),
      )
      self.cluster_bias = self.param(
          "cluster_bias",
          nn.with_logical_partitioning(nn.initializers.zeros, (None,)),
          (n_total - 1,),
      )

  def _tied_proj(self, i: int) -> bool:
    """Whether tie_projs asks cluster i to use the embedding's projection."""
    return bool(self.tie_projs) and bool(self.tie_projs[i])

  def _cluster_params(self, emb_tables, emb_projs):
    """Per cluster (weight [n_i(+C), d_i], bias [n_i(+C)], proj [d_i, d_proj] or None).

    Cluster 0's weight and bias have the C cluster rows appended (the head).
    """
    bounds = cluster_bounds(self.n_token, self.cutoffs)
    n_total = len(bounds) - 1
    if self.tie_weight:
      if emb_tables is None or len(emb_tables) != len(self.out_biases):
        raise ValueError(
            "tie_weight=True needs emb_tables: the AdaptiveEmbedding tables "
            "(AdaptiveEmbedding.shared()[0])."
        )
      weights = list(emb_tables)
    else:
      weights = list(self.out_weights)
    has_proj = has_projections(self.d_embed, self.d_proj, self.div_val)
    out = []
    for i in range(n_total):
      if self.div_val == 1:
        lo, hi = bounds[i], bounds[i + 1]
        weight, bias = weights[0][lo:hi], self.out_biases[0][lo:hi]
      else:
        weight, bias = weights[i], self.out_biases[i]
      proj = self.out_projs[i]
      if has_proj and self._tied_proj(i):
        j = _tied_proj_index(i, self.div_val)
        if emb_projs is None or len(emb_projs) <= j or emb_projs[j] is None:
          raise ValueError(
              f"tie_projs[{i}]=True needs emb_projs: the AdaptiveEmbedding "
              "projections (AdaptiveEmbedding.shared()[1])."
          )
        proj = emb_projs[j]
      if i == 0 and n_total > 1:
        weight = jnp.concatenate([weight, self.cluster_weight], axis=0)
        bias = jnp.concatenate([bias, self.cluster_bias], axis=0)
      out.append((weight, bias, proj))
    return out

  @staticmethod
  def _logits(
      hidden_BxTxD: Array, weight_NxE: Array, bias_N: Array, proj_ExD: Array | None
  ) -> Array:
    """(h @ P.T) @ W.T + b as float32 [B, T, N] (float64 for float64 inputs).

    Matmuls run in hidden's dtype with float32 (or wider) accumulation.
    """
    dtype, acc = hidden_BxTxD.dtype, _acc_dtype(hidden_BxTxD.dtype)
    h_BxTxE = hidden_BxTxD
    if proj_ExD is not None:
      h_BxTxE = jnp.einsum(
          "btd,ed->bte", hidden_BxTxD, proj_ExD.astype(dtype), preferred_element_type=acc
      ).astype(dtype)
    logits_BxTxN = jnp.einsum(
        "bte,ne->btn", h_BxTxE, weight_NxE.astype(dtype), preferred_element_type=acc
    )
    return logits_BxTxN + bias_N.astype(acc)

  def log_prob(
      self,
      hidden_BxTxD: Array,
      emb_tables: Sequence[Array] | None = None,
      emb_projs: Sequence[Array | None] | None = None,
  ) -> Array:
    """Log-probabilities of every token of the vocabulary.

    Args:
      hidden_BxTxD: final hidden states [B, T, d_proj], any float dtype.
      emb_tables: the embedding's tables (``AdaptiveEmbedding.shared``);
        needed with tie_weight / tie_projs, ignored otherwise.
      emb_projs: the embedding's projections, likewise.

    Returns:
      logp_BxTxV: float32 [B, T, n_token] natural-log probabilities (nats;
      float64 for float64 hidden states); exp sums to 1 over the last axis.

    Raises:
      ValueError: tying requested but the embedding parameters not given.
    """
    params = self._cluster_params(emb_tables, emb_projs)
    head_logp_BxTxH = jax.nn.log_softmax(self._logits(hidden_BxTxD, *params[0]), axis=-1)
    n_clusters = len(params) - 1
    if n_clusters == 0:
      return head_logp_BxTxH
    shortlist = self.cutoffs[0]
    parts = [head_logp_BxTxH[..., :shortlist]]
    for i in range(1, n_clusters + 1):
      tail_logp_BxTxNi = jax.nn.log_softmax(self._logits(hidden_BxTxD, *params[i]), axis=-1)
      parts.append(head_logp_BxTxH[..., -i, None] + tail_logp_BxTxNi)  # column -i: reversed
    return jnp.concatenate(parts, axis=-1)

  def nll(
      self,
      hidden_BxTxD: Array,
      targets_BxT: Array,
      emb_tables: Sequence[Array] | None = None,
      emb_projs: Sequence[Array | None] | None = None,
  ) -> Array:
    """Negative log-likelihood of the targets, in token order.

    Equals ``-take_along_axis(log_prob(h), targets)`` without building the
    [B, T, V] output: each cluster's log-softmax is gathered at the
    target's position within the cluster (ids clipped into the cluster) and
    kept only for the targets in that cluster.

    Args:
      hidden_BxTxD: final hidden states [B, T, d_proj], any float dtype.
      targets_BxT: int token ids in [0, n_token).
      emb_tables: as for ``log_prob``.
      emb_projs: as for ``log_prob``.

    Returns:
      nll_BxT: float32 [B, T], nats (float64 for float64 hidden states).

    Raises:
      ValueError: tying requested but the embedding parameters not given.
    """
    params = self._cluster_params(emb_tables, emb_projs)
    head_logp_BxTxH = jax.nn.log_softmax(self._logits(hidden_BxTxD, *params[0]), axis=-1)
    n_clusters = len(params) - 1
    if n_clusters == 0:
      return -jnp.take_along_axis(head_logp_BxTxH, targets_BxT[..., None], axis=-1)[..., 0]
    bounds = cluster_bounds(self.n_token, self.cutoffs)
    shortlist = self.cutoffs[0]
    # Cluster of each target (0 = shortlist) and its column in the head.
    cluster_BxT = sum((targets_BxT >= c).astype(jnp.int32) for c in self.cutoffs)
    head_col_BxT = jnp.where(cluster_BxT == 0, targets_BxT, shortlist + n_clusters - cluster_BxT)
    logp_BxT = jnp.take_along_axis(head_logp_BxTxH, head_col_BxT[..., None], axis=-1)[..., 0]
    for i in range(1, n_clusters + 1):
      lo, hi = bounds[i], bounds[i + 1]
      tail_logp_BxTxNi = jax.nn.log_softmax(self._logits(hidden_BxTxD, *params[i]), axis=-1)
      local_BxT = jnp.clip(targets_BxT - lo, 0, hi - lo - 1)
      tail_BxT = jnp.take_along_axis(tail_logp_BxTxNi, local_BxT[..., None], axis=-1)[..., 0]
      logp_BxT = logp_BxT + jnp.where(cluster_BxT == i, tail_BxT, 0.0)
    return -logp_BxT

  def __call__(
      self,
      hidden_BxTxD: Array,
      targets_BxT: Array | None = None,
      emb_tables: Sequence[Array] | None = None,
      emb_projs: Sequence[Array | None] | None = None,
  ) -> Array:
    """``nll`` (float32 [B, T], nats) with targets, else ``log_prob`` ([B, T, V])."""
    if targets_BxT is None:
      return self.log_prob(hidden_BxTxD, emb_tables, emb_projs)
    return self.nll(hidden_BxTxD, targets_BxT, emb_tables, emb_projs)
