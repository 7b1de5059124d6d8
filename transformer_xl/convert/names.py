"""Parameter names: ours, the reference PyTorch / HuggingFace state dicts', TF's.

``NAME_TABLE`` lists every parameter of the model under the three naming
schemes (ours under ``params/``; the reference PyTorch ``MemTransformerLM``
state dict, which HuggingFace's ``TransfoXLLMHeadModel`` repeats under a
``transformer.`` prefix; the reference TF variables under ``transformer/``)
with the kind of layout change between ours and PyTorch's.  Also here: the
per-kind layout changes, the names under which tied tensors are repeated,
the adaptive-softmax cluster order of a state dict, and flattening of
parameter trees into "/"-joined paths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from transformer_xl.convert.errors import ConvertError


@dataclasses.dataclass(frozen=True)
class Row:
  """One parameter in the three naming schemes.

  Attributes:
    ours: path under ``params/`` ("/"-separated; ``{i}`` = cluster index).
      Rows whose path starts with ``layers/`` have a leading [n_layer] axis
      (the nn.scan over layers); the other names then hold ``{l}``.
    pytorch: the reference PyTorch state-dict name (HuggingFace: the same,
      with a ``transformer.`` prefix except for ``crit.*``).
    tf: the reference TF variable under ``transformer/`` (notes below).
    kind: how a PyTorch tensor becomes ours (per layer): "copy"; "T"
      (transpose: nn.Linear weights [out, in] -> kernels [in, out], and the
      projections [d_proj, d_i] -> [d_i, d_proj]); "qkv" (T, then [D, n * H *
      Dh] -> [D, n, H, Dh], n = 3 for qkv_net, 2 for kv_net); "to_heads" (T,
      then [D, H * Dh] -> [D, H, Dh]); "stacked" (copy of one reference
      tensor that holds every layer, [n_layer, ...]: not per layer);
      "from_heads" (T, then [H * Dh, D] -> [H, Dh, D]); "clusters" (copy, rows
      reversed for forward-order sources).  TF kernels and projections are
      the PyTorch tensors transposed, so TF -> PyTorch is a transpose for
      every kind except "copy" and "clusters".
  """

  ours: str
  pytorch: str
  tf: str
  kind: str


# pylint: disable=line-too-long
NAME_TABLE: tuple[Row, ...] = (
    #   ours (params/...)               reference PyTorch                        reference TF (transformer/...)              kind
    # Adaptive embedding: one table [V, d_embed] (+ projection when d_embed != d_model) with div_val == 1, one per cluster i otherwise.
    Row(
        "word_emb/emb_layers_{i}",
        "word_emb.emb_layers.{i}.weight",
        "adaptive_embed/cutoff_{i}/lookup_table",
        "copy",
    ),  # [1]
    Row(
        "word_emb/emb_projs_{i}", "word_emb.emb_projs.{i}", "adaptive_embed/cutoff_{i}/proj_W", "T"
    ),  # [1]
    # u, v: shared [H, Dh] ...
    Row("r_w_bias", "r_w_bias", "r_w_bias", "copy"),
    Row("r_r_bias", "r_r_bias", "r_r_bias", "copy"),
    # ... or per layer with untie_r (TF: one [L, H, Dh] variable).
    Row("layers/r_w_bias", "layers.{l}.dec_attn.r_w_bias", "r_w_bias[{l}]", "copy"),
    Row("layers/r_r_bias", "layers.{l}.dec_attn.r_r_bias", "r_r_bias[{l}]", "copy"),
    # attn_type 1 (Shaw et al.): per-layer tables, stacked in one reference tensor each.
    Row("layers/attn/r_emb", "r_emb", "(attn_type 0 only)", "stacked"),
    Row("layers/attn/r_w_bias", "r_w_bias", "(attn_type 0 only)", "stacked"),
    Row("layers/attn/r_bias", "r_bias", "(attn_type 0 only)", "stacked"),
    # attn_type 3 (Al-Rfou et al.): learned absolute positions per layer.
    Row("layers/r_emb", "r_emb", "(attn_type 0 only)", "stacked"),
    # Layers.
    Row(
        "layers/attn/qkv_net/kernel",
        "layers.{l}.dec_attn.qkv_net.weight",
        "layer_{l}/rel_attn/qkv/kernel",
        "qkv",
    ),
    Row(
        "layers/attn/q_net/kernel",
        "layers.{l}.dec_attn.q_net.weight",
        "(attn_type 0 only)",
        "to_heads",
    ),  # types 2, 3
    Row(
        "layers/attn/kv_net/kernel",
        "layers.{l}.dec_attn.kv_net.weight",
        "(attn_type 0 only)",
        "qkv",
    ),  # types 2, 3
    Row(
        "layers/attn/r_net/kernel",
        "layers.{l}.dec_attn.r_net.weight",
        "layer_{l}/rel_attn/r/kernel",
        "to_heads",
    ),
    Row(
        "layers/attn/o_net/kernel",
        "layers.{l}.dec_attn.o_net.weight",
        "layer_{l}/rel_attn/o/kernel",
        "from_heads",
    ),
    Row(
        "layers/attn_layer_norm/scale",
        "layers.{l}.dec_attn.layer_norm.weight",
        "layer_{l}/rel_attn/LayerNorm/gamma",
        "copy",
    ),
    Row(
        "layers/attn_layer_norm/bias",
        "layers.{l}.dec_attn.layer_norm.bias",
        "layer_{l}/rel_attn/LayerNorm/beta",
        "copy",
    ),
    Row(
        "layers/pos_ff/ff_1/kernel",
        "layers.{l}.pos_ff.CoreNet.0.weight",
        "layer_{l}/ff/layer_1/kernel",
        "T",
    ),
    Row(
        "layers/pos_ff/ff_1/bias",
        "layers.{l}.pos_ff.CoreNet.0.bias",
        "layer_{l}/ff/layer_1/bias",
        "copy",
    ),
    Row(
        "layers/pos_ff/ff_2/kernel",
        "layers.{l}.pos_ff.CoreNet.3.weight",
        "layer_{l}/ff/layer_2/kernel",
        "T",
    ),
    Row(
        "layers/pos_ff/ff_2/bias",
        "layers.{l}.pos_ff.CoreNet.3.bias",
        "layer_{l}/ff/layer_2/bias",
        "copy",
    ),
    Row(
        "layers/ff_layer_norm/scale",
        "layers.{l}.pos_ff.layer_norm.weight",
        "layer_{l}/ff/LayerNorm/gamma",
        "copy",
    ),
    Row(
        "layers/ff_layer_norm/bias",
        "layers.{l}.pos_ff.layer_norm.bias",
        "layer_{l}/ff/LayerNorm/beta",
        "copy",
    ),
    # Projected adaptive softmax: one output layer over V with div_val == 1 (sliced per cluster), one per cluster i otherwise.
    Row(
        "crit/out_weight_{i}",
        "crit.out_layers.{i}.weight",
        "(tied: adaptive_embed lookup_table)",
        "copy",
    ),  # [2]
    Row(
        "crit/out_bias_{i}", "crit.out_layers.{i}.bias", "adaptive_softmax/cutoff_{i}/b", "copy"
    ),  # [3]
    Row("crit/out_projs_{i}", "crit.out_projs.{i}", "adaptive_softmax/cutoff_{i}/proj", "T"),  # [4]
    Row(
        "crit/cluster_weight",
        "crit.cluster_weight",
        "adaptive_softmax/cutoff_0/cluster_W",
        "clusters",
    ),  # [5]
    Row(
        "crit/cluster_bias", "crit.cluster_bias", "adaptive_softmax/cutoff_0/cluster_b", "clusters"
    ),  # [5]
)
# pylint: enable=line-too-long
# Notes on the TF column (tf/model.py, mask_adaptive_embedding_lookup and
# mask_adaptive_logsoftmax):
# [1] With div_val == 1 the TF variables have no cutoff scope:
#     adaptive_embed/lookup_table and adaptive_embed/proj_W (HuggingFace's TF
#     map writes cutoff_0/; both are accepted).  A cluster without proj_W
#     (proj_same_dim=False and d_i == d_model) gets an identity projection.
# [2] TF always ties the softmax weights to the embedding tables; with
#     tie_weight=false the tables are copied into crit/out_weight_{i}.
# [3] With div_val == 1 the per-cluster biases cutoff_{i}/b are concatenated
#     into out_bias_0; without cutoffs the bias is adaptive_softmax/bias.
# [4] Absent for tied projections (tie_projs[i], or no cutoffs: TF then
#     always uses the embedding's proj_W) and for d_i == d_model when TF has
#     no projection there (then identity).
# [5] TF (and HuggingFace 4.35) put tail cluster i in head column
#     cutoffs[0] + i - 1, the PyTorch reference in column -i: rows reversed.

# Names that are read but carry no parameter: the sinusoid's inverse
# frequencies (a buffer in the reference and HuggingFace).
INV_FREQ = "pos_emb.inv_freq"
# HuggingFace's TransfoXLLMHeadModel names: the reference's, with this prefix
# on every name except the softmax's (crit.*).
HF_PREFIX = "transformer."
_TRANSPOSED_KINDS = ("T", "qkv", "to_heads", "from_heads")


def row_for(path: str) -> tuple[Row, int | None]:
  """The table row of one of our parameter paths and its cluster index."""
  for row in NAME_TABLE:
    if "{i}" in row.ours:
      prefix = row.ours.split("{i}")[0]
      rest = path[len(prefix) :]
      if path.startswith(prefix) and rest.isdigit():
        return row, int(rest)
    elif row.ours == path:
      return row, None
  raise ConvertError(f"params/{path} has no entry in convert.NAME_TABLE.")


def pytorch_name(row: Row, i: int | None, layer: int | None = None) -> str:
  """The reference PyTorch name of a row for cluster ``i`` and layer ``layer``."""
  return row.pytorch.format(i=i, l=layer)


def pytorch_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """PyTorch tensor shape for one (per-layer) parameter of ours."""
  if kind == "T":
    return tuple(reversed(shape))
  if kind == "qkv":  # [D, 3, H, Dh]
    return (shape[1] * shape[2] * shape[3], shape[0])
  if kind == "to_heads":  # [D, H, Dh]
    return (shape[1] * shape[2], shape[0])
  if kind == "from_heads":  # [H, Dh, D]
    return (shape[2], shape[0] * shape[1])
  return tuple(shape)


def to_ours(kind: str, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """PyTorch tensor -> our (per-layer) layout of ``shape``."""
  if kind in _TRANSPOSED_KINDS:
    return np.ascontiguousarray(a.T).reshape(shape)
  return np.array(a, copy=True)


def to_pytorch(kind: str, a: np.ndarray) -> np.ndarray:
  """Our (per-layer) parameter -> the PyTorch tensor."""
  a = np.asarray(a)
  if kind in _TRANSPOSED_KINDS:
    return np.ascontiguousarray(
        a.reshape(-1, a.shape[-1]).T if kind == "from_heads" else a.reshape(a.shape[0], -1).T
    )
  return np.array(a, copy=True)


def aliases(cfg, layout: str) -> list[tuple[str, str]]:
  """(copy name, source name): names of PyTorch state dicts that repeat a tensor.

  Tied softmax weights and projections appear in the reference's and
  HuggingFace's state dicts under the softmax's names as well; HuggingFace
  also lists the shared u, v under every layer.
  """
  from transformer_xl.model import adaptive

  out = []
  n_tables = 1 if cfg.div_val == 1 else len(cfg.cutoffs) + 1
  if cfg.tie_weight:
    out += [
        (f"crit.out_layers.{i}.weight", f"word_emb.emb_layers.{i}.weight") for i in range(n_tables)
    ]
  if adaptive.has_projections(cfg.embed_dim, cfg.d_model, cfg.div_val):
    for i, tied in enumerate(cfg.tie_projs):
      if tied:
        out.append((f"crit.out_projs.{i}", f"word_emb.emb_projs.{0 if cfg.div_val == 1 else i}"))
  if layout == "hf" and not cfg.untie_r:
    for l in range(cfg.n_layer):
      out += [
          (f"layers.{l}.dec_attn.r_w_bias", "r_w_bias"),
          (f"layers.{l}.dec_attn.r_r_bias", "r_r_bias"),
      ]
  return out


def strip_hf_prefix(state: Mapping[str, np.ndarray]) -> tuple[dict, bool]:
  """Removes HuggingFace's ``transformer.`` prefix; returns (state, had_prefix)."""
  has = any(k.startswith(HF_PREFIX) for k in state)
  if not has:
    return dict(state), False
  out = {}
  for k, v in state.items():
    name = k[len(HF_PREFIX) :] if k.startswith(HF_PREFIX) else k
    if name in out:
      raise ConvertError(f"state dict has both {name!r} and {HF_PREFIX + name!r}.")
    out[name] = v
  return out, True


def resolve_cluster_order(cluster_order: str, names: Sequence[str]) -> str:
  """ "reference" or "forward" for a state dict's names.

  ``auto`` means forward (HuggingFace 4.35's column cutoffs[0] + i - 1) when
  the names carry HuggingFace's ``transformer.`` prefix, reference (column
  -i) otherwise.

  Raises:
    ConvertError: an unknown value.
  """
  if cluster_order not in ("auto", "reference", "forward"):
    raise ConvertError(f"cluster_order={cluster_order!r}: use auto, reference or forward.")
  if cluster_order != "auto":
    return cluster_order
  return "forward" if any(n.startswith(HF_PREFIX) for n in names) else "reference"


def flatten_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """A parameter tree (nested mappings) as {"/"-joined path: leaf}.

  Args:
    tree: nested mappings of arrays, e.g. our ``params``.
    prefix: prepended to every path.

  Returns:
    A flat dict, e.g. ``{"crit/out_bias_0": ...}``; the leaves are not copied.
  """
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(flatten_params(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = v
  return out


def unflatten_params(flat: Mapping[str, Any]) -> dict:
  """Inverse of ``flatten_params``: {"a/b": x} -> {"a": {"b": x}} (nested dicts)."""
  out: dict = {}
  for path, v in flat.items():
    node = out
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out
