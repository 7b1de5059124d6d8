"""Checkpoint conversion between the reference implementation and this package.

    # reference PyTorch / HuggingFace state dict (.npz or torch file) -> workdir
    python -m transformer_xl.convert --from=pytorch --checkpoint=model.pt \\
        --hparams=hparams.json --workdir=/tmp/txl
    # reference TensorFlow checkpoint (needs ``pip install ".[convert]"``) -> workdir
    python -m transformer_xl.convert --from=tf --checkpoint=tf_enwik8/model/model.ckpt-0 \\
        --hparams=hparams.json --workdir=/tmp/txl --vocab=vocab.txt --dataset=enwik8
    # workdir -> state dict with the reference names (and hparams.json)
    python -m transformer_xl.convert --to=pytorch --workdir=/tmp/txl --checkpoint=out.pt

A converted workdir holds ``config.json``, ``model_config.json`` and an orbax
checkpoint of a full :class:`train.TrainState` at step 0, so that
``python -m transformer_xl.main --workdir=DIR --mode=eval|score`` (and
``--mode=train`` with a ``--config`` of the same model, which fine-tunes
from step 0) load it like a trained run.

Sources of truth: the reference PyTorch code (Dai et al. 2019,
``pytorch/mem_transformer.py``, ``pytorch/utils/proj_adaptive_softmax.py``),
its TensorFlow code (``tf/model.py``, whose variable names the released
models use) and HuggingFace's port (``transformers`` 4.35,
``TransfoXLLMHeadModel``, the same names under a ``transformer.`` prefix).
Where HuggingFace and the reference differ, the reference is followed (module
docstring below and the README).

``HPARAMS.json`` holds the reference constructor's arguments
(``MemTransformerLM(n_token, n_layer, n_head, d_model, d_head, d_inner,
dropout, dropatt, tie_weight, d_embed, div_val, tie_projs, pre_lnorm,
tgt_len, ext_len, mem_len, cutoffs, adapt_inp, same_length, attn_type,
clamp_len, sample_softmax)``) plus the TF flags ``untie_r``,
``proj_share_all_but_first`` and ``proj_same_dim``; see :func:`load_hparams`.

Differences between the sources, and what is done about them:

* Adaptive-softmax cluster order.  The reference PyTorch code scores tail
  cluster i with head column -i (reversed); the TF code and HuggingFace
  4.35 use column ``cutoffs[0] + i - 1`` (forward).  This package follows
  the PyTorch reference, so rows of ``cluster_weight``/``cluster_bias`` are
  reversed when reading TF checkpoints and, with ``--cluster_order=forward``
  (the default for names with HuggingFace's ``transformer.`` prefix), HF
  state dicts; see :func:`params_from_state_dict`.
* Tied parameters appear under several names in PyTorch state dicts (the
  softmax weights and projections tied to the embedding; HuggingFace's shared
  u, v under every layer).  They are read once, the copies are checked to be
  equal, and they are written back on export.
* TF checkpoints always tie the softmax weights to the embedding, and store
  one softmax bias per cluster (see the table notes below).  The TF
  LayerNorm uses epsilon 1e-12 (``tf.contrib.layers.layer_norm``) where the
  PyTorch reference, HuggingFace and this package use 1e-5; TF's same_length
  mask lets each query see mem_len + 1 keys (PyTorch: mem_len); TF starts
  from zero-filled memory (PyTorch: empty).  These are reported on
  conversion; the converted model follows the PyTorch reference.
* Vocabularies.  ``--vocab`` (the released model's symbols, one per line)
  and ``--dataset`` map the model's rows onto our corpus's ids by symbol
  (enwik8: the reference's decimal byte values onto byte ids; text8: its
  "_" onto " "); ids the model never saw get a zero embedding and a softmax
  bias of :data:`UNSEEN_BIAS`, and model symbols we lack are dropped.  The
  reference's enwik8 vocabulary has no newline byte (its preprocessing
  removes them; ours keeps them): the converter says so and how to compare.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Mapping, Optional, Sequence

import numpy as np

# Softmax bias given to vocabulary entries the converted model never saw
# (--vocab mapping): exp(-1e4) underflows to 0 in float32, so such a token
# gets probability 0 without producing inf or NaN anywhere.
UNSEEN_BIAS = -1e4


class ConvertError(ValueError):
  """A conversion input that cannot work; the message names the file, the
  tensor or the hparam, what was expected and what was found."""


def _log(msg: str) -> None:
  """Conversion reports go to stdout (they are what the user reads)."""
  print(msg, flush=True)


# ---------------------------------------------------------------------------
# The name table
# ---------------------------------------------------------------------------


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
      projections [d_proj, d_i] -> [d_i, d_proj]); "qkv" (T, then [D, 3 * H *
      Dh] -> [D, 3, H, Dh]); "to_heads" (T, then [D, H * Dh] -> [D, H, Dh]);
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
    Row("word_emb/emb_layers_{i}",      "word_emb.emb_layers.{i}.weight",        "adaptive_embed/cutoff_{i}/lookup_table",   "copy"),     # [1]
    Row("word_emb/emb_projs_{i}",       "word_emb.emb_projs.{i}",                "adaptive_embed/cutoff_{i}/proj_W",         "T"),        # [1]
    # u, v: shared [H, Dh] ...
    Row("r_w_bias",                     "r_w_bias",                              "r_w_bias",                                 "copy"),
    Row("r_r_bias",                     "r_r_bias",                              "r_r_bias",                                 "copy"),
    # ... or per layer with untie_r (TF: one [L, H, Dh] variable).
    Row("layers/r_w_bias",              "layers.{l}.dec_attn.r_w_bias",          "r_w_bias[{l}]",                            "copy"),
    Row("layers/r_r_bias",              "layers.{l}.dec_attn.r_r_bias",          "r_r_bias[{l}]",                            "copy"),
    # Layers.
    Row("layers/attn/qkv_net/kernel",   "layers.{l}.dec_attn.qkv_net.weight",    "layer_{l}/rel_attn/qkv/kernel",            "qkv"),
    Row("layers/attn/r_net/kernel",     "layers.{l}.dec_attn.r_net.weight",      "layer_{l}/rel_attn/r/kernel",              "to_heads"),
    Row("layers/attn/o_net/kernel",     "layers.{l}.dec_attn.o_net.weight",      "layer_{l}/rel_attn/o/kernel",              "from_heads"),
    Row("layers/attn_layer_norm/scale", "layers.{l}.dec_attn.layer_norm.weight", "layer_{l}/rel_attn/LayerNorm/gamma",       "copy"),
    Row("layers/attn_layer_norm/bias",  "layers.{l}.dec_attn.layer_norm.bias",   "layer_{l}/rel_attn/LayerNorm/beta",        "copy"),
    Row("layers/pos_ff/ff_1/kernel",    "layers.{l}.pos_ff.CoreNet.0.weight",    "layer_{l}/ff/layer_1/kernel",              "T"),
    Row("layers/pos_ff/ff_1/bias",      "layers.{l}.pos_ff.CoreNet.0.bias",      "layer_{l}/ff/layer_1/bias",                "copy"),
    Row("layers/pos_ff/ff_2/kernel",    "layers.{l}.pos_ff.CoreNet.3.weight",    "layer_{l}/ff/layer_2/kernel",              "T"),
    Row("layers/pos_ff/ff_2/bias",      "layers.{l}.pos_ff.CoreNet.3.bias",      "layer_{l}/ff/layer_2/bias",                "copy"),
    Row("layers/ff_layer_norm/scale",   "layers.{l}.pos_ff.layer_norm.weight",   "layer_{l}/ff/LayerNorm/gamma",             "copy"),
    Row("layers/ff_layer_norm/bias",    "layers.{l}.pos_ff.layer_norm.bias",     "layer_{l}/ff/LayerNorm/beta",              "copy"),
    # Projected adaptive softmax: one output layer over V with div_val == 1 (sliced per cluster), one per cluster i otherwise.
    Row("crit/out_weight_{i}",          "crit.out_layers.{i}.weight",            "(tied: adaptive_embed lookup_table)",      "copy"),     # [2]
    Row("crit/out_bias_{i}",            "crit.out_layers.{i}.bias",              "adaptive_softmax/cutoff_{i}/b",            "copy"),     # [3]
    Row("crit/out_projs_{i}",           "crit.out_projs.{i}",                    "adaptive_softmax/cutoff_{i}/proj",         "T"),        # [4]
    Row("crit/cluster_weight",          "crit.cluster_weight",                   "adaptive_softmax/cutoff_0/cluster_W",      "clusters"), # [5]
    Row("crit/cluster_bias",            "crit.cluster_bias",                     "adaptive_softmax/cutoff_0/cluster_b",      "clusters"), # [5]
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
_INV_FREQ = "pos_emb.inv_freq"
_HF_PREFIX = "transformer."
_TRANSPOSED_KINDS = ("T", "qkv", "to_heads", "from_heads")


# ---------------------------------------------------------------------------
# Hyperparameters
# ---------------------------------------------------------------------------

# The reference constructor's arguments without a default (tgt_len and
# mem_len have one there, None, but every reference script passes them and
# the conversion needs them for the evaluation settings).
REQUIRED_HPARAMS = ("n_token", "n_layer", "n_head", "d_model", "d_head", "d_inner",
                    "dropout", "dropatt", "tgt_len", "mem_len")
# The optional ones with the reference defaults (MemTransformerLM, and the TF
# flags untie_r, proj_share_all_but_first and proj_same_dim).
OPTIONAL_HPARAMS = {
    "tie_weight": True, "d_embed": None, "div_val": 1, "tie_projs": [False],
    "pre_lnorm": False, "ext_len": 0, "cutoffs": [], "adapt_inp": False,
    "same_length": False, "attn_type": 0, "clamp_len": -1, "sample_softmax": -1,
    "untie_r": False, "proj_share_all_but_first": None, "proj_same_dim": True,
}
_INT_HPARAMS = ("n_token", "n_layer", "n_head", "d_model", "d_head", "d_inner", "div_val",
                "tgt_len", "ext_len", "mem_len", "attn_type", "clamp_len", "sample_softmax")
_BOOL_HPARAMS = ("tie_weight", "pre_lnorm", "adapt_inp", "same_length", "untie_r",
                 "proj_same_dim")


def load_hparams(source: str | Mapping[str, Any]) -> dict:
  """Reads and validates the reference constructor's hyperparameters.

  Args:
    source: path of a JSON file, or the dict itself.  Keys: the reference
      ``MemTransformerLM`` arguments (:data:`REQUIRED_HPARAMS` and
      :data:`OPTIONAL_HPARAMS`), plus the TF flags ``untie_r``,
      ``proj_share_all_but_first`` (sets ``tie_projs`` to ``[False] + [True]
      * len(cutoffs)`` when ``tie_projs`` is absent) and ``proj_same_dim``.
      ``adapt_inp`` is accepted and ignored, as in the reference.

  Returns:
    A new dict with every key: defaults filled in, ``d_embed`` resolved
    (None or 0 -> d_model), ``cutoffs`` a list of ints, ``tie_projs`` a list
    of len(cutoffs) + 1 bools (the reference's shorter lists mean "not
    tied" for the missing clusters), ints and bools checked.

  Raises:
    ConvertError: unreadable file, unknown keys, missing required keys,
      wrong types, or values this package cannot represent (attn_type != 0,
      sample_softmax > 0, ext_len > 0, tie_projs longer than the clusters).
  """
  if isinstance(source, (str, os.PathLike)):
    try:
      with open(source) as f:
        raw = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
      raise ConvertError(f"cannot read the hparams file {source}: {err}") from None
    where = str(source)
  else:
    raw, where = dict(source), "hparams"
  if not isinstance(raw, dict):
    raise ConvertError(f"{where}: expected a JSON object of constructor arguments.")
  known = set(REQUIRED_HPARAMS) | set(OPTIONAL_HPARAMS)
  unknown = sorted(set(raw) - known)
  if unknown:
    raise ConvertError(f"{where}: unknown hparams {unknown}; the accepted keys are the "
                       f"reference constructor's arguments: {sorted(known)}.")
  missing = [k for k in REQUIRED_HPARAMS if raw.get(k) is None]
  if missing:
    raise ConvertError(f"{where}: missing required hparams {missing}.")
  hp = dict(OPTIONAL_HPARAMS)
  hp.update(raw)
  for k in _INT_HPARAMS:
    if k in ("ext_len",) and hp[k] is None:
      hp[k] = 0
    if isinstance(hp[k], bool) or not isinstance(hp[k], int):
      raise ConvertError(f"{where}: {k}={hp[k]!r} must be an integer.")
  for k in _BOOL_HPARAMS:
    if not isinstance(hp[k], bool):
      raise ConvertError(f"{where}: {k}={hp[k]!r} must be true or false.")
  for k in ("dropout", "dropatt"):
    if isinstance(hp[k], bool) or not isinstance(hp[k], (int, float)) or not 0 <= hp[k] < 1:
      raise ConvertError(f"{where}: {k}={hp[k]!r} must be a number in [0, 1).")
    hp[k] = float(hp[k])
  if hp["d_embed"] in (None, 0):
    hp["d_embed"] = hp["d_model"]
  if isinstance(hp["d_embed"], bool) or not isinstance(hp["d_embed"], int):
    raise ConvertError(f"{where}: d_embed={hp['d_embed']!r} must be an integer or null.")
  cutoffs = hp["cutoffs"] or []
  if not isinstance(cutoffs, (list, tuple)) or not all(
      isinstance(c, int) and not isinstance(c, bool) for c in cutoffs):
    raise ConvertError(f"{where}: cutoffs={cutoffs!r} must be a list of integers.")
  hp["cutoffs"] = [int(c) for c in cutoffs]
  n_clusters = len(hp["cutoffs"]) + 1
  if hp["proj_share_all_but_first"] not in (None, True, False):
    raise ConvertError(f"{where}: proj_share_all_but_first="
                       f"{hp['proj_share_all_but_first']!r} must be true, false or null.")
  if "tie_projs" not in raw and hp["proj_share_all_but_first"] is not None:
    hp["tie_projs"] = [False] + [bool(hp["proj_share_all_but_first"])] * (n_clusters - 1)
  tie_projs = hp["tie_projs"] if hp["tie_projs"] is not None else []
  if not isinstance(tie_projs, (list, tuple)) or not all(isinstance(t, bool) for t in tie_projs):
    raise ConvertError(f"{where}: tie_projs={tie_projs!r} must be a list of booleans.")
  if len(tie_projs) > n_clusters:
    raise ConvertError(f"{where}: tie_projs={list(tie_projs)} has more entries than the "
                       f"{n_clusters} clusters of cutoffs={hp['cutoffs']}.")
  hp["tie_projs"] = list(tie_projs) + [False] * (n_clusters - len(tie_projs))
  if hp["attn_type"] != 0:
    raise ConvertError(f"{where}: attn_type={hp['attn_type']}: only 0 (the relative attention "
                       "of Dai et al. 2019) is implemented.")
  if hp["sample_softmax"] > 0:
    raise ConvertError(f"{where}: sample_softmax={hp['sample_softmax']}: the sampled softmax "
                       "is not implemented; use a checkpoint trained with sample_softmax=-1.")
  if hp["ext_len"] > 0:
    raise ConvertError(f"{where}: ext_len={hp['ext_len']}: extended context is not supported "
                       "(every reference script uses ext_len=0).")
  if hp["tgt_len"] < 1 or hp["mem_len"] < 0:
    raise ConvertError(f"{where}: tgt_len={hp['tgt_len']} must be >= 1 and "
                       f"mem_len={hp['mem_len']} >= 0.")
  if hp["same_length"] and hp["mem_len"] < 1:
    raise ConvertError(f"{where}: same_length=true needs mem_len >= 1.")
  try:
    model_config_from_hparams(hp)
  except ValueError as err:
    raise ConvertError(f"{where}: {err}") from None
  return hp


def model_config_from_hparams(hp: Mapping[str, Any], n_token: Optional[int] = None):
  """The :class:`models.ModelConfig` of validated hparams (:func:`load_hparams`).

  ``clamp_len`` <= 0 (the reference's -1) becomes 0 (no clamp); ``d_embed``
  equal to d_model becomes None; ``tie_projs`` that tie nothing become ().

  Args:
    hp: hparams as returned by :func:`load_hparams`.
    n_token: vocabulary size; defaults to ``hp["n_token"]``.

  Raises:
    ValueError: sizes the model rejects (see ModelConfig).
  """
  from transformer_xl import models
  tie_projs = tuple(bool(t) for t in hp["tie_projs"])
  return models.ModelConfig(
      n_token=int(hp["n_token"] if n_token is None else n_token),
      n_layer=hp["n_layer"], d_model=hp["d_model"], n_head=hp["n_head"], d_head=hp["d_head"],
      d_inner=hp["d_inner"], dropout=float(hp["dropout"]), dropatt=float(hp["dropatt"]),
      tgt_len=hp["tgt_len"], mem_len=hp["mem_len"], ext_len=0,
      clamp_len=max(0, int(hp["clamp_len"])), same_length=bool(hp["same_length"]),
      pre_lnorm=bool(hp["pre_lnorm"]), untie_r=bool(hp["untie_r"]),
      tie_weight=bool(hp["tie_weight"]), attn_type=0,
      d_embed=None if hp["d_embed"] in (None, 0, hp["d_model"]) else int(hp["d_embed"]),
      div_val=hp["div_val"], cutoffs=tuple(hp["cutoffs"]),
      tie_projs=tie_projs if any(tie_projs) else ())


def hparams_from_model_config(cfg) -> dict:
  """The reference constructor's arguments (plus ``untie_r``) for a ModelConfig.

  Inverse of :func:`model_config_from_hparams` (``clamp_len`` 0 is written
  as -1, the reference's "no clamp"; ``tie_projs`` always has one entry per
  cluster).
  """
  n_clusters = len(cfg.cutoffs) + 1
  return {
      "n_token": cfg.n_token, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
      "d_model": cfg.d_model, "d_head": cfg.d_head, "d_inner": cfg.d_inner,
      "dropout": cfg.dropout, "dropatt": cfg.dropatt, "tie_weight": cfg.tie_weight,
      "d_embed": cfg.embed_dim, "div_val": cfg.div_val,
      "tie_projs": list(cfg.tie_projs) if cfg.tie_projs else [False] * n_clusters,
      "pre_lnorm": cfg.pre_lnorm, "tgt_len": cfg.tgt_len, "ext_len": cfg.ext_len,
      "mem_len": cfg.mem_len, "cutoffs": list(cfg.cutoffs), "same_length": cfg.same_length,
      "attn_type": cfg.attn_type, "clamp_len": cfg.clamp_len if cfg.clamp_len > 0 else -1,
      "untie_r": cfg.untie_r,
  }


# ---------------------------------------------------------------------------
# Our parameters <-> reference PyTorch names
# ---------------------------------------------------------------------------


def expected_param_shapes(cfg) -> dict[str, tuple[int, ...]]:
  """Path under ``params/`` ("/"-joined) -> shape, for a ModelConfig (no compute)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from transformer_xl import models
  model = models.TransformerXL(cfg)
  tok = jnp.zeros((1, 1), jnp.int32)
  boxed = jax.eval_shape(lambda rng: model.init(rng, tok, models.init_memory(cfg, 1), tok),
                         jax.random.PRNGKey(0))["params"]
  flat = jax.tree_util.tree_flatten_with_path(nn.unbox(boxed))[0]
  return {"/".join(str(k.key) for k in path): tuple(x.shape) for path, x in flat}


def _row_for(path: str) -> tuple[Row, Optional[int]]:
  """The table row of one of our parameter paths and its cluster index."""
  for row in NAME_TABLE:
    if "{i}" in row.ours:
      prefix = row.ours.split("{i}")[0]
      rest = path[len(prefix):]
      if path.startswith(prefix) and rest.isdigit():
        return row, int(rest)
    elif row.ours == path:
      return row, None
  raise ConvertError(f"params/{path} has no entry in convert.NAME_TABLE.")


def _pt_name(row: Row, i: Optional[int], layer: Optional[int] = None) -> str:
  return row.pytorch.format(i=i, l=layer)


def _pt_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """PyTorch tensor shape for one (per-layer) parameter of ours."""
  if kind == "T":
    return tuple(reversed(shape))
  if kind == "qkv":                                     # [D, 3, H, Dh]
    return (shape[1] * shape[2] * shape[3], shape[0])
  if kind == "to_heads":                                # [D, H, Dh]
    return (shape[1] * shape[2], shape[0])
  if kind == "from_heads":                              # [H, Dh, D]
    return (shape[2], shape[0] * shape[1])
  return tuple(shape)


def _to_ours(kind: str, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """PyTorch tensor -> our (per-layer) layout of ``shape``."""
  if kind in _TRANSPOSED_KINDS:
    return np.ascontiguousarray(a.T).reshape(shape)
  return np.array(a, copy=True)


def _to_pytorch(kind: str, a: np.ndarray) -> np.ndarray:
  """Our (per-layer) parameter -> the PyTorch tensor."""
  a = np.asarray(a)
  if kind in _TRANSPOSED_KINDS:
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]).T if kind == "from_heads"
                                else a.reshape(a.shape[0], -1).T)
  return np.array(a, copy=True)


def _aliases(cfg, layout: str) -> list[tuple[str, str]]:
  """(copy name, source name): names of PyTorch state dicts that repeat a tensor.

  Tied softmax weights and projections appear in the reference's and
  HuggingFace's state dicts under the softmax's names as well; HuggingFace
  also lists the shared u, v under every layer.
  """
  from transformer_xl import adaptive
  out = []
  n_tables = 1 if cfg.div_val == 1 else len(cfg.cutoffs) + 1
  if cfg.tie_weight:
    out += [(f"crit.out_layers.{i}.weight", f"word_emb.emb_layers.{i}.weight")
            for i in range(n_tables)]
  if adaptive._has_proj(cfg.embed_dim, cfg.d_model, cfg.div_val):  # pylint: disable=protected-access
    for i, tied in enumerate(cfg.tie_projs):
      if tied:
        out.append((f"crit.out_projs.{i}", f"word_emb.emb_projs.{0 if cfg.div_val == 1 else i}"))
  if layout == "hf" and not cfg.untie_r:
    for l in range(cfg.n_layer):
      out += [(f"layers.{l}.dec_attn.r_w_bias", "r_w_bias"),
              (f"layers.{l}.dec_attn.r_r_bias", "r_r_bias")]
  return out


def inv_freq(d_model: int) -> np.ndarray:
  """The reference's ``pos_emb.inv_freq`` buffer, float32 [d_model // 2].

  ``1 / 10000 ** (arange(0, d_model, 2) / d_model)``, computed in float32
  as torch does.
  """
  try:
    import torch
    return (1 / (10000 ** (torch.arange(0.0, d_model, 2.0) / d_model))).numpy()
  except ImportError:
    x = np.arange(0.0, d_model, 2.0, dtype=np.float32) / np.float32(d_model)
    return (np.float32(1) / (np.float32(10000) ** x)).astype(np.float32)


def _strip_prefix(state: Mapping[str, np.ndarray]) -> tuple[dict, bool]:
  """Removes HuggingFace's ``transformer.`` prefix; returns (state, had_prefix)."""
  has = any(k.startswith(_HF_PREFIX) for k in state)
  if not has:
    return dict(state), False
  out = {}
  for k, v in state.items():
    name = k[len(_HF_PREFIX):] if k.startswith(_HF_PREFIX) else k
    if name in out:
      raise ConvertError(f"state dict has both {name!r} and {_HF_PREFIX + name!r}.")
    out[name] = v
  return out, True


def resolve_cluster_order(cluster_order: str, names: Sequence[str]) -> str:
  """"reference" or "forward" for a state dict's names.

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
  return "forward" if any(n.startswith(_HF_PREFIX) for n in names) else "reference"


def params_from_state_dict(state: Mapping[str, Any], cfg, cluster_order: str = "auto"
                           ) -> dict:
  """Our parameter tree from a state dict with the reference PyTorch names.

  Args:
    state: name -> array (numpy or anything ``np.asarray`` takes); the
      reference names of :data:`NAME_TABLE`, optionally with HuggingFace's
      ``transformer.`` prefix.  Copies of tied tensors (see module
      docstring) and ``pos_emb.inv_freq`` may be present and are checked.
    cfg: the :class:`models.ModelConfig` the tensors belong to.
    cluster_order: "reference" (tail cluster i in head column -i), "forward"
      (column cutoffs[0] + i - 1: TF, HuggingFace 4.35; the rows of
      cluster_weight/cluster_bias are reversed) or "auto"
      (:func:`resolve_cluster_order`).

  Returns:
    Nested dict of float32 numpy arrays, the structure of the model's
    ``params`` (layer parameters stacked on a leading [n_layer] axis).

  Raises:
    ConvertError: a missing tensor, an unknown name, a shape that does not
      match the hparams (naming the tensor, expected and actual shapes), or
      tied copies that differ.
  """
  order = resolve_cluster_order(cluster_order, list(state))
  state, _ = _strip_prefix({k: v for k, v in state.items()})
  used = set()

  def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in state:
      hint = "check the hparams (e.g. untie_r, cutoffs, div_val, d_embed, tie_weight)"
      bias = name.rsplit(".", 1)[-1]
      if bias in ("r_w_bias", "r_r_bias"):
        if not cfg.untie_r and f"layers.0.dec_attn.{bias}" in state:
          hint = "the state dict has per-layer u, v: set untie_r=true"
        elif cfg.untie_r and bias in state:
          hint = "the state dict has shared u, v: set untie_r=false"
      raise ConvertError(f"state dict lacks {name!r} (expected shape {shape}); {hint}.")
    a = np.asarray(state[name])
    if tuple(a.shape) != tuple(shape):
      raise ConvertError(f"{name}: expected shape {tuple(shape)} from the hparams, got "
                         f"{tuple(a.shape)}.")
    used.add(name)
    return a.astype(np.float32)

  flat = {}
  for path, shape in expected_param_shapes(cfg).items():
    row, i = _row_for(path)
    if path.startswith("layers/"):
      per_layer = tuple(shape[1:])
      flat[path] = np.stack([
          _to_ours(row.kind, take(_pt_name(row, i, l), _pt_shape(row.kind, per_layer)), per_layer)
          for l in range(shape[0])])
    else:
      flat[path] = _to_ours(row.kind, take(_pt_name(row, i), _pt_shape(row.kind, shape)), shape)
    if row.kind == "clusters" and order == "forward":
      flat[path] = flat[path][::-1].copy()
  for copy, source in _aliases(cfg, "hf"):
    if copy in state:
      if source not in state:
        raise ConvertError(f"state dict has {copy!r} but not {source!r}.")
      a, b = np.asarray(state[copy]), np.asarray(state[source])
      if a.shape != b.shape or not np.array_equal(a, b):
        raise ConvertError(
            f"{copy} should be tied to {source} (hparams: tie_weight={cfg.tie_weight}, "
            f"tie_projs={list(cfg.tie_projs)}, untie_r={cfg.untie_r}) but differs "
            f"(shapes {a.shape} and {b.shape}); fix the hparams.")
      used.add(copy)
  if _INV_FREQ in state:
    got = np.asarray(state[_INV_FREQ])
    if got.shape != (cfg.d_model // 2,):
      raise ConvertError(f"{_INV_FREQ}: expected shape ({cfg.d_model // 2},) for d_model="
                         f"{cfg.d_model}, got {got.shape}.")
    used.add(_INV_FREQ)
  unknown = sorted(set(state) - used)
  if unknown:
    raise ConvertError(f"state dict has tensors the hparams do not account for: {unknown[:20]}"
                       f"{' ...' if len(unknown) > 20 else ''} (check untie_r, tie_weight, "
                       "tie_projs, cutoffs, div_val, d_embed, n_layer).")
  return _unflatten(flat)


def state_dict_from_params(params: Mapping[str, Any], cfg, layout: str = "reference",
                           cluster_order: str = "auto") -> dict[str, np.ndarray]:
  """The state dict of our parameters with the reference PyTorch names.

  Args:
    params: our parameter tree (nested dicts of arrays).
    cfg: its :class:`models.ModelConfig`.
    layout: "reference" (the names of the reference's ``MemTransformerLM``:
      no prefix, shared u, v once) or "hf" (``TransfoXLLMHeadModel``:
      ``transformer.`` prefix except ``crit.*``, shared u, v repeated under
      every layer).  Both include the copies of tied tensors and
      ``pos_emb.inv_freq``, so ``load_state_dict`` (strict) accepts them.
    cluster_order: "reference", "forward" or "auto" (forward for "hf",
      which makes HuggingFace 4.35 compute what this model computes).

  Returns:
    name -> float32 numpy array, PyTorch layouts.

  Raises:
    ConvertError: unknown layout / cluster_order, or params that do not
      match cfg.
  """
  if layout not in ("reference", "hf"):
    raise ConvertError(f"layout={layout!r}: use reference or hf.")
  order = ("forward" if layout == "hf" else "reference") if cluster_order == "auto" else \
      resolve_cluster_order(cluster_order, [])
  flat = _flatten(params)
  expected = expected_param_shapes(cfg)
  if set(flat) != set(expected):
    raise ConvertError(f"params do not match the model config: missing "
                       f"{sorted(set(expected) - set(flat))}, unexpected "
                       f"{sorted(set(flat) - set(expected))}.")
  out = {}
  for path, shape in expected.items():
    a = np.asarray(flat[path], np.float32)
    if tuple(a.shape) != tuple(shape):
      raise ConvertError(f"params/{path}: expected shape {shape}, got {a.shape}.")
    row, i = _row_for(path)
    if row.kind == "clusters" and order == "forward":
      a = a[::-1]
    if path.startswith("layers/"):
      for l in range(shape[0]):
        out[_pt_name(row, i, l)] = _to_pytorch(row.kind, a[l])
    else:
      out[_pt_name(row, i)] = _to_pytorch(row.kind, a)
  for copy, source in _aliases(cfg, layout):
    out[copy] = out[source].copy()
  out[_INV_FREQ] = inv_freq(cfg.d_model)
  if layout == "hf":
    out = {(k if k.startswith("crit.") else _HF_PREFIX + k): v for k, v in out.items()}
  return out


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(_flatten(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _unflatten(flat: Mapping[str, Any]) -> dict:
  out: dict = {}
  for path, v in flat.items():
    node = out
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """Reads a state dict: a ``.npz`` of arrays, or a torch file.

  Torch files are loaded with ``torch.load(..., map_location="cpu",
  weights_only=True)``: a dict name -> tensor (a ``{"state_dict": {...}}``
  or ``{"model_state_dict": {...}}`` wrapper is unwrapped).  The reference
  ``train.py`` saves the whole module (``torch.save(model)``); save its
  ``model.state_dict()`` instead.

  Returns:
    name -> numpy array (floating tensors as float32).

  Raises:
    ConvertError: unreadable file, or not a flat dict of tensors.
  """
  if not os.path.exists(path):
    raise ConvertError(f"checkpoint {path} does not exist.")
  if path.endswith(".npz"):
    with np.load(path, allow_pickle=False) as z:
      return {k: _as_float32(z[k]) for k in z.files}
  try:
    import torch
  except ImportError:
    raise ConvertError(f"reading the torch file {path} needs torch installed (or pass a .npz "
                       "of the state dict).") from None
  try:
    obj = torch.load(path, map_location="cpu", weights_only=True)
  except Exception as err:  # torch raises several types for bad files
    raise ConvertError(f"cannot load {path} with torch.load(weights_only=True): {err}. It must "
                       "be a state dict (a dict of tensors), not a pickled module.") from None
  for key in ("state_dict", "model_state_dict"):
    if isinstance(obj, dict) and set(obj) == {key}:
      obj = obj[key]
  if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
    raise ConvertError(f"{path} is not a state dict (a flat dict name -> tensor).")
  return {k: _as_float32(v.detach().cpu().float().numpy() if v.is_floating_point()
                         else v.detach().cpu().numpy()) for k, v in obj.items()}


def _as_float32(a: np.ndarray) -> np.ndarray:
  a = np.asarray(a)
  return a.astype(np.float32) if np.issubdtype(a.dtype, np.floating) else a


def save_state_dict(state: Mapping[str, np.ndarray], path: str) -> None:
  """Writes a state dict: ``.npz`` by extension, otherwise a torch file of tensors.

  Raises:
    ConvertError: a torch file was asked for but torch is not installed.
  """
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  if path.endswith(".npz"):
    np.savez(path, **{k: np.asarray(v) for k, v in state.items()})
    return
  try:
    import torch
  except ImportError:
    raise ConvertError(f"writing the torch file {path} needs torch; use a .npz path.") from None
  torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}, path)


# ---------------------------------------------------------------------------
# TensorFlow checkpoints
# ---------------------------------------------------------------------------


def read_tf_checkpoint(path: str) -> dict[str, np.ndarray]:
  """The model variables of a TF checkpoint (a prefix like ``model.ckpt-0`` or a directory).

  Needs TensorFlow (``pip install ".[convert]"``).  Optimizer slots
  (``.../Adam``, ``.../Adam_1``), ``global_step`` and other variables
  outside ``transformer/`` are not read.

  Returns:
    TF variable name -> numpy array.

  Raises:
    ConvertError: TensorFlow missing or the checkpoint unreadable.
  """
  try:
    import tensorflow as tf
  except ImportError:
    raise ConvertError("reading TF checkpoints needs TensorFlow: pip install -e '.[convert]'"
                       ) from None
  try:
    reader = tf.train.load_checkpoint(path)
  except Exception as err:  # TF raises NotFoundError, DataLossError, ValueError
    raise ConvertError(f"cannot read the TF checkpoint {path}: {err}") from None
  return {name: np.asarray(reader.get_tensor(name))
          for name in sorted(reader.get_variable_to_shape_map()) if not _is_tf_slot(name)}


def _is_tf_slot(name: str) -> bool:
  """Optimizer slots and bookkeeping of the reference's TF training."""
  last = name.rsplit("/", 1)[-1]
  return last in ("Adam", "Adam_1", "ExponentialMovingAverage") or not name.startswith(
      "transformer/")


def state_dict_from_tf(variables: Mapping[str, np.ndarray], hp: Mapping[str, Any],
                       cfg) -> dict[str, np.ndarray]:
  """The reference PyTorch state dict of a reference TF checkpoint.

  Variable names: the TF column of :data:`NAME_TABLE` and its notes.
  Optimizer slots (``.../Adam``, ``.../Adam_1``), ``global_step`` and
  everything outside ``transformer/`` are ignored.  The result keeps TF's
  forward cluster order (convert it with ``cluster_order="forward"``).

  Args:
    variables: TF name -> array (:func:`read_tf_checkpoint`).
    hp: validated hparams (:func:`load_hparams`; ``proj_same_dim`` is used).
    cfg: the ModelConfig of ``hp``.

  Returns:
    Reference PyTorch name -> float32 array.

  Raises:
    ConvertError: missing or unused ``transformer/`` variables, wrong
      shapes, hparams that contradict the checkpoint (untie_r, tie_projs).
  """
  from transformer_xl import adaptive
  v = {k[len("transformer/"):]: np.asarray(a, np.float32)
       for k, a in variables.items() if not _is_tf_slot(k)}
  used = set()
  out: dict[str, np.ndarray] = {}

  def take(name: str, shape: Optional[tuple[int, ...]] = None) -> np.ndarray:
    if name not in v:
      raise ConvertError(f"TF checkpoint lacks transformer/{name}"
                         + (f" (expected shape {shape})" if shape else "") + ".")
    if shape is not None and tuple(v[name].shape) != tuple(shape):
      raise ConvertError(f"transformer/{name}: expected shape {tuple(shape)} from the hparams, "
                         f"got {tuple(v[name].shape)}.")
    used.add(name)
    return v[name]

  n_layer, n_head, d_head, d_model = cfg.n_layer, cfg.n_head, cfg.d_head, cfg.d_model
  # u and v.
  for b in ("r_w_bias", "r_r_bias"):
    if b not in v:
      take(b)
    if v[b].ndim == 3:
      if not cfg.untie_r:
        raise ConvertError(f"transformer/{b} has shape {v[b].shape} (one per layer) but the "
                           "hparams have untie_r=false; set untie_r=true.")
      a = take(b, (n_layer, n_head, d_head))
      for l in range(n_layer):
        out[f"layers.{l}.dec_attn.{b}"] = a[l]
    else:
      if cfg.untie_r:
        raise ConvertError(f"transformer/{b} has shape {v[b].shape} (shared) but the hparams "
                           "have untie_r=true; set untie_r=false.")
      out[b] = take(b, (n_head, d_head))
  # Embedding (note [1]).
  bounds = adaptive.cluster_bounds(cfg.n_token, cfg.cutoffs)
  dims = adaptive.cluster_dims(cfg.embed_dim, len(bounds) - 1, cfg.div_val)
  n_tables = 1 if cfg.div_val == 1 else len(bounds) - 1
  has_proj = adaptive._has_proj(cfg.embed_dim, d_model, cfg.div_val)  # pylint: disable=protected-access
  emb_projs_pt = []
  for i in range(n_tables):
    scope = ("adaptive_embed/" if cfg.div_val == 1 and "adaptive_embed/lookup_table" in v
             else f"adaptive_embed/cutoff_{i}/")
    n_i = cfg.n_token if cfg.div_val == 1 else bounds[i + 1] - bounds[i]
    d_i = cfg.embed_dim if cfg.div_val == 1 else dims[i]
    out[f"word_emb.emb_layers.{i}.weight"] = take(scope + "lookup_table", (n_i, d_i))
    if not has_proj:
      emb_projs_pt.append(None)
      continue
    if scope + "proj_W" in v:
      proj = take(scope + "proj_W", (d_i, d_model)).T
    elif d_i == d_model and not hp["proj_same_dim"]:
      _log(f"  transformer/{scope}proj_W is absent (proj_same_dim=false, d={d_i} = d_model): "
           "identity projection.")
      proj = np.eye(d_model, dtype=np.float32)
    else:
      proj = take(scope + "proj_W", (d_i, d_model))
    out[f"word_emb.emb_projs.{i}"] = proj
    emb_projs_pt.append(proj)
  # Layers: the 1:1 rows of the table.
  for row in NAME_TABLE:
    if not row.tf.startswith("layer_{l}/"):
      continue
    for l in range(n_layer):
      a = take(row.tf.format(l=l))
      out[row.pytorch.format(l=l)] = np.ascontiguousarray(a.T) if row.kind != "copy" else a
  # Softmax (notes [2]-[5]).
  tables = [out[f"word_emb.emb_layers.{i}.weight"] for i in range(n_tables)]
  if not cfg.tie_weight:
    _log("  TF ties the softmax weights to the embedding; tie_weight=false: copying the "
         "embedding tables into the softmax weights.")
    for i, t in enumerate(tables):
      out[f"crit.out_layers.{i}.weight"] = t.copy()
  if not cfg.cutoffs:
    out["crit.out_layers.0.bias"] = take("adaptive_softmax/bias", (cfg.n_token,))
    if has_proj and not (cfg.tie_projs and cfg.tie_projs[0]):
      _log("  TF uses the embedding projection in the softmax; tie_projs=[false]: copying it.")
      out["crit.out_projs.0"] = emb_projs_pt[0].copy()
  else:
    biases = [take(f"adaptive_softmax/cutoff_{i}/b", (bounds[i + 1] - bounds[i],))
              for i in range(len(bounds) - 1)]
    if cfg.div_val == 1:
      out["crit.out_layers.0.bias"] = np.concatenate(biases)
    else:
      for i, b in enumerate(biases):
        out[f"crit.out_layers.{i}.bias"] = b
    n_c = len(cfg.cutoffs)
    out["crit.cluster_weight"] = take("adaptive_softmax/cutoff_0/cluster_W", (n_c, cfg.embed_dim))
    out["crit.cluster_bias"] = take("adaptive_softmax/cutoff_0/cluster_b", (n_c,))
    tie_projs = list(cfg.tie_projs) or [False] * (n_c + 1)
    for i in range(n_c + 1):
      name = f"adaptive_softmax/cutoff_{i}/proj"
      d_i = dims[i]
      if name in v:
        if tie_projs[i]:
          raise ConvertError(f"transformer/{name} exists, so cluster {i}'s projection is not "
                             f"tied, but the hparams have tie_projs[{i}]=true; set it to false.")
        if has_proj:
          out[f"crit.out_projs.{i}"] = take(name, (d_i, d_model)).T
        else:
          take(name)
          raise ConvertError(f"transformer/{name} exists but the hparams (div_val=1, d_embed = "
                             "d_model) give the softmax no projection.")
      elif has_proj and not tie_projs[i]:
        source = emb_projs_pt[0 if cfg.div_val == 1 else i]
        if d_i != d_model:
          _log(f"  no transformer/{name}: the TF model tied cluster {i}'s projection; "
               f"tie_projs[{i}]=false: copying the embedding projection.")
          out[f"crit.out_projs.{i}"] = source.copy()
        else:
          _log(f"  no transformer/{name} and d={d_i} = d_model: identity projection.")
          out[f"crit.out_projs.{i}"] = np.eye(d_model, dtype=np.float32)
  unused = sorted(set(v) - used)
  if unused:
    raise ConvertError(f"TF checkpoint has variables the hparams do not account for: "
                       f"{['transformer/' + u for u in unused[:20]]} (check untie_r, cutoffs, "
                       "div_val, d_embed, tie_projs, n_layer).")
  return out


# ---------------------------------------------------------------------------
# Vocabularies
# ---------------------------------------------------------------------------


def read_vocab(path: str) -> list[str]:
  """A reference vocabulary file: one symbol per line, id = line number.

  Like the reference's ``Vocab._build_from_file``, the symbol is the first
  whitespace-separated field of the line (so ``"word count"`` lines work).
  The released TF models keep their vocabulary in ``data/<corpus>/cache.pkl``
  (a pickled reference ``Corpus``); write it out with the reference code,
  e.g. ``"\\n".join(corpus.vocab.idx2sym)``.

  Raises:
    ConvertError: unreadable file, an empty line, or a repeated symbol.
  """
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except (OSError, UnicodeDecodeError) as err:
    raise ConvertError(f"cannot read the vocabulary {path}: {err}") from None
  vocab, seen = [], {}
  for n, line in enumerate(lines, 1):
    fields = line.split()
    if not fields:
      raise ConvertError(f"{path}:{n}: empty line (one symbol per line expected).")
    if fields[0] in seen:
      raise ConvertError(f"{path}:{n}: symbol {fields[0]!r} repeats line {seen[fields[0]]}.")
    seen[fields[0]] = n
    vocab.append(fields[0])
  return vocab


def dataset_vocab(name: str, data_dir: Optional[str] = None, manual_dir: Optional[str] = None,
                  download: bool = True, verify_checksums: bool = True) -> tuple[list[str], str]:
  """(our vocabulary, unit) of a corpus of ``data.CORPUS_NAMES``.

  enwik8 (256 byte values, id = byte) and text8 (space + a..z) are fixed and
  need no data; the others come from the prepared dataset
  (``data.load_corpus`` with these arguments, which prepares it first if
  needed).

  Raises:
    ConvertError: unknown name; data.DataError: the corpus cannot be built.
  """
  from transformer_xl import data
  if name not in data.CORPUS_NAMES:
    raise ConvertError(f"dataset={name!r}: choose one of {list(data.CORPUS_NAMES)}.")
  if name == "enwik8":
    return [chr(i) for i in range(256)], "byte"
  if name == "text8":
    from transformer_xl.data import tokenizers
    return list(tokenizers.TEXT8_VOCAB), "char"
  corpus = data.load_corpus(name, data_dir=data_dir, manual_dir=manual_dir,
                                download=download, verify_checksums=verify_checksums)
  return list(corpus.vocab), corpus.unit


def _our_symbol(dataset: Optional[str], symbol: str) -> Optional[str]:
  """A reference vocabulary symbol in our corpus's spelling (None: no match).

  enwik8: the reference writes each byte as its decimal value
  (``prep_enwik8.py``); ours is ``chr(byte)``.  text8: the reference writes
  spaces as "_" (``prep_text8.py``); ours is " ".  Word corpora: the same.
  """
  if dataset == "enwik8":
    ok = symbol.isascii() and symbol.isdigit() and int(symbol) < 256
    return chr(int(symbol)) if ok else None
  if dataset == "text8":
    return " " if symbol == "_" else symbol
  return symbol


def map_vocab(ref_vocab: Sequence[str], our_vocab: Sequence[str], dataset: Optional[str] = None
              ) -> tuple[np.ndarray, dict]:
  """Which reference id each of our token ids takes its parameters from.

  Args:
    ref_vocab: the released model's symbols (id = index).
    our_vocab: our corpus's symbols (id = index).
    dataset: our corpus name, for the symbol spellings (:func:`_our_symbol`).

  Returns:
    (ref_of_ours, report): int64 [len(our_vocab)], the reference id or -1
    (unseen); report = {"matched", "ref_unmatched" (reference symbols with
    no id here), "ours_unseen" (our ids without a reference symbol)}, lists
    of symbols.

  Raises:
    ConvertError: two reference symbols map onto the same id.
  """
  index = {s: j for j, s in enumerate(our_vocab)}
  ref_of_ours = np.full(len(our_vocab), -1, np.int64)
  ref_unmatched = []
  for r, s in enumerate(ref_vocab):
    j = index.get(_our_symbol(dataset, s))
    if j is None:
      ref_unmatched.append(s)
    elif ref_of_ours[j] >= 0:
      raise ConvertError(f"reference symbols {ref_vocab[ref_of_ours[j]]!r} and {s!r} both map "
                         f"onto our id {j} ({our_vocab[j]!r}).")
    else:
      ref_of_ours[j] = r
  report = {"matched": int((ref_of_ours >= 0).sum()), "ref_unmatched": ref_unmatched,
            "ours_unseen": [our_vocab[j] for j in np.flatnonzero(ref_of_ours < 0)]}
  return ref_of_ours, report


def remap_vocab(params: Mapping[str, Any], cfg, ref_of_ours: np.ndarray,
                unseen_bias: float = UNSEEN_BIAS) -> tuple[dict, Any]:
  """Moves the vocabulary rows of a model onto another vocabulary.

  Row j of every embedding table, softmax weight and softmax bias becomes
  the reference model's row ``ref_of_ours[j]``.  Rows of unseen ids (-1)
  get an embedding (and softmax weight) of zeros and a softmax bias of
  ``unseen_bias``, so the model never predicts them.  Reference rows no id
  maps to are dropped, so the softmax renormalises over the others.  With
  cutoffs (adaptive input/softmax) every id must stay in its cluster.

  Args:
    params: our parameter tree for ``cfg`` (reference vocabulary).
    cfg: ModelConfig of the reference model.
    ref_of_ours: int [V_ours] (:func:`map_vocab`).
    unseen_bias: softmax bias of unseen ids.

  Returns:
    (params, cfg) for n_token = V_ours.

  Raises:
    ConvertError: cutoffs not below V_ours, or a symbol that would change
      cluster.
  """
  from transformer_xl import adaptive
  n_ours = len(ref_of_ours)
  if cfg.cutoffs and cfg.cutoffs[-1] >= n_ours:
    raise ConvertError(f"cutoffs={list(cfg.cutoffs)} do not fit our vocabulary of {n_ours}.")
  ref_bounds = adaptive.cluster_bounds(cfg.n_token, cfg.cutoffs)
  our_bounds = adaptive.cluster_bounds(n_ours, cfg.cutoffs)
  ref_cluster = np.searchsorted(np.asarray(cfg.cutoffs, np.int64), ref_of_ours, side="right")
  our_cluster = np.searchsorted(np.asarray(cfg.cutoffs, np.int64), np.arange(n_ours),
                                side="right")
  moved = np.flatnonzero((ref_of_ours >= 0) & (ref_cluster != our_cluster))
  if moved.size:
    raise ConvertError(f"{moved.size} symbols would change adaptive-softmax cluster (cutoffs "
                       f"{list(cfg.cutoffs)}), e.g. our ids {moved[:5].tolist()} from reference "
                       f"ids {ref_of_ours[moved[:5]].tolist()}; the vocabularies are ordered "
                       "too differently to map.")
  flat = dict(_flatten(params))

  def remap(a: np.ndarray, lo: int, hi: int, ref_lo: int, fill: float) -> np.ndarray:
    src = ref_of_ours[lo:hi]
    out = np.full((hi - lo,) + a.shape[1:], fill, np.float32)
    ok = src >= 0
    out[ok] = a[src[ok] - ref_lo]
    return out

  for path in list(flat):
    name = path.rsplit("/", 1)[-1]
    if not any(name.startswith(p) for p in ("emb_layers_", "out_weight_", "out_bias_")):
      continue
    i = int(name.rsplit("_", 1)[-1])
    fill = unseen_bias if name.startswith("out_bias_") else 0.0
    if cfg.div_val == 1:
      flat[path] = remap(np.asarray(flat[path]), 0, n_ours, 0, fill)
    else:
      flat[path] = remap(np.asarray(flat[path]), our_bounds[i], our_bounds[i + 1],
                         ref_bounds[i], fill)
  return _unflatten(flat), dataclasses.replace(cfg, n_token=n_ours)


# ---------------------------------------------------------------------------
# Workdirs
# ---------------------------------------------------------------------------


def _one_device_mesh():
  import jax
  from transformer_xl import sharding
  return sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])


def write_workdir(workdir: str, params: Mapping[str, Any], cfg, *, dataset: Optional[str] = None,
                  data_dir: Optional[str] = None, manual_dir: Optional[str] = None,
                  download: bool = True, verify_checksums: bool = True,
                  unit: str = "word", eval_tgt_len: Optional[int] = None,
                  eval_mem_len: Optional[int] = None, eval_clamp_len: Optional[int] = None,
                  eval_same_length: Optional[bool] = None, global_batch: int = 1,
                  eval_global_batch: int = 1):
  """Writes a workdir that ``transformer_xl.main`` loads like a trained run.

  Files: ``config.json`` (``default_config`` with ``model.*`` from cfg,
  ``eval.*`` from the arguments, defaulting to cfg's tgt_len, mem_len,
  clamp_len and same_length; ``data.*`` from the data arguments; train/eval
  global_batch), ``model_config.json`` (cfg with n_token, unit, dataset) and
  an orbax checkpoint at step 0 of a full :class:`train.TrainState`: the
  parameters, ``tx.init(params)`` for the config's optimizer, and an empty
  memory for ``global_batch`` rows, on a 1-device mesh.  The iterator state
  is ``{}`` (training starts the data from the beginning).

  Args:
    workdir: directory (created); must not hold checkpoints yet.
    params: parameter tree for cfg (nested dicts of arrays).
    cfg: :class:`models.ModelConfig`.
    dataset: our corpus name for ``data.dataset`` (None: keep the default).
    data_dir, manual_dir, download, verify_checksums: ``data.*`` (where
      ``--mode=eval`` finds the corpus).
    unit: "byte", "char" or "word" (decides bpc vs ppl in reports).
    eval_*: evaluation settings (None: from cfg).
    global_batch: ``train.global_batch`` (the saved memory has this many
      rows; keep it a multiple of the data-parallel devices that will load
      the workdir).
    eval_global_batch: ``eval.global_batch``.

  Returns:
    The written ``ml_collections.ConfigDict``.

  Raises:
    ConvertError: params that do not fit cfg, a workdir that already has
      checkpoints, or an invalid setting.
  """
  import jax
  import jax.numpy as jnp
  from transformer_xl import checkpointing, default_config, main as txl_main, models, train
  if unit not in ("byte", "char", "word"):
    raise ConvertError(f"unit={unit!r}: use byte, char or word.")
  config = default_config.get_config()
  m = config.model
  m.n_layer, m.d_model, m.n_head, m.d_head, m.d_inner = (
      cfg.n_layer, cfg.d_model, cfg.n_head, cfg.d_head, cfg.d_inner)
  m.dropout, m.dropatt = float(cfg.dropout), float(cfg.dropatt)
  m.tgt_len, m.mem_len, m.ext_len, m.clamp_len = cfg.tgt_len, cfg.mem_len, cfg.ext_len, cfg.clamp_len
  m.same_length, m.pre_lnorm, m.untie_r, m.tie_weight = (
      cfg.same_length, cfg.pre_lnorm, cfg.untie_r, cfg.tie_weight)
  m.attn_type, m.d_embed, m.div_val = cfg.attn_type, int(cfg.d_embed or 0), cfg.div_val
  m.cutoffs, m.tie_projs = tuple(cfg.cutoffs), tuple(cfg.tie_projs)
  e = config.eval
  e.tgt_len = cfg.tgt_len if eval_tgt_len is None else int(eval_tgt_len)
  e.mem_len = cfg.mem_len if eval_mem_len is None else int(eval_mem_len)
  e.clamp_len = cfg.clamp_len if eval_clamp_len is None else int(eval_clamp_len)
  e.same_length = cfg.same_length if eval_same_length is None else bool(eval_same_length)
  e.global_batch = int(eval_global_batch)
  config.train.global_batch = int(global_batch)
  if dataset is not None:
    config.data.dataset = dataset
  if data_dir is not None:
    config.data.data_dir = str(data_dir)
  if manual_dir is not None:
    config.data.manual_dir = str(manual_dir)
  config.data.download, config.data.verify_checksums = bool(download), bool(verify_checksums)
  try:
    txl_main.check_config(config, 1)
  except txl_main.ConfigError as err:
    raise ConvertError(str(err)) from None

  expected = expected_param_shapes(cfg)
  flat = _flatten(params)
  bad = {p: (tuple(np.shape(flat[p])) if p in flat else None, s) for p, s in expected.items()
         if p not in flat or tuple(np.shape(flat[p])) != s}
  extra = sorted(set(flat) - set(expected))
  if bad or extra:
    raise ConvertError(f"params do not fit the model config: (got, expected) {bad}; "
                       f"unexpected {extra}.")

  os.makedirs(workdir, exist_ok=True)
  model = models.TransformerXL(cfg)
  tx = train.make_optimizer(config.train)
  mesh = _one_device_mesh()
  _, shardings = train.abstract_train_state(model, tx, config.train.global_batch, mesh)
  manager = checkpointing.make_manager(workdir, config.checkpoint.max_to_keep)
  existing = manager.latest_step()
  if existing is not None:
    manager.close()
    raise ConvertError(f"{workdir} already holds checkpoints (step {existing}); convert into "
                       "an empty --workdir.")
  params_dev = jax.device_put(
      _unflatten({p: np.asarray(a, np.float32) for p, a in flat.items()}), shardings.params)
  opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params_dev)
  memory = jax.jit(lambda: models.init_memory(cfg, config.train.global_batch),
                   out_shardings=shardings.memory)()
  step = jax.device_put(jnp.zeros((), jnp.int32), shardings.step)
  state = train.TrainState(step=step, params=params_dev, opt_state=opt_state, memory=memory)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  txl_main.save_model_config(workdir, cfg, unit, dataset or "converted")
  checkpointing.save(manager, 0, state, {})
  manager.close()
  return config


def convert_to_workdir(source: str, checkpoint: str, hparams: str | Mapping[str, Any],
                       workdir: str, *, cluster_order: str = "auto", vocab: Optional[str] = None,
                       dataset: Optional[str] = None, data_dir: Optional[str] = None,
                       manual_dir: Optional[str] = None, download: bool = True,
                       verify_checksums: bool = True, unit: Optional[str] = None,
                       unseen_bias: float = UNSEEN_BIAS, **workdir_kwargs) -> dict:
  """``--from=pytorch|tf``: a reference checkpoint into a workdir.

  Args:
    source: "pytorch" (state dict file, :func:`read_state_dict`) or "tf"
      (:func:`read_tf_checkpoint`; always forward cluster order).
    checkpoint: the file / TF checkpoint prefix.
    hparams: JSON path or dict (:func:`load_hparams`).
    workdir: output directory (:func:`write_workdir`).
    cluster_order: for "pytorch" (:func:`params_from_state_dict`).
    vocab: the released model's vocabulary file (:func:`read_vocab`); its
      rows are mapped onto ``dataset``'s vocabulary (:func:`map_vocab`,
      :func:`remap_vocab`).  Without it, the ids are taken as they are (and
      must number our vocabulary's size when ``dataset`` is given).
    dataset, data_dir, manual_dir, download, verify_checksums: our corpus
      (:func:`dataset_vocab`), also written to the config's ``data.*``.
    unit: "byte", "char" or "word"; default: the dataset's, else "word".
    unseen_bias: softmax bias of our ids the model never saw.
    **workdir_kwargs: eval_tgt_len, eval_mem_len, eval_clamp_len,
      eval_same_length, global_batch, eval_global_batch (:func:`write_workdir`).

  Returns:
    A report: {"n_token", "params" (count), "vocab" (map_vocab report or None),
    "cluster_order"}.

  Raises:
    ConvertError: any invalid input (see the functions above).
  """
  hp = load_hparams(hparams)
  cfg = model_config_from_hparams(hp)
  if source == "pytorch":
    state = read_state_dict(checkpoint)
    order = resolve_cluster_order(cluster_order, list(state))
    _log(f"Read {len(state)} tensors from {checkpoint}"
         + (f"; adaptive-softmax cluster order: {order}." if cfg.cutoffs else "."))
  elif source == "tf":
    variables = read_tf_checkpoint(checkpoint)
    _log(f"Read {len(variables)} variables from the TF checkpoint {checkpoint}.")
    state, order = state_dict_from_tf(variables, hp, cfg), "forward"
    _log("  Note (TF): LayerNorm epsilon 1e-12 there, 1e-5 here; TF's same_length lets each "
         "query see mem_len + 1 keys (here mem_len, as in the PyTorch reference; with mem_len "
         ">= tgt_len, --eval_mem_len=<mem_len + 1> gives TF's attention span); TF starts from "
         "zero-filled memory, here from empty memory.")
  else:
    raise ConvertError(f"--from={source!r}: use pytorch or tf.")
  params = params_from_state_dict(state, cfg, order)
  report: dict[str, Any] = {"cluster_order": order, "vocab": None}
  our_unit = unit
  if dataset is not None:
    our_vocab, ds_unit = dataset_vocab(dataset, data_dir, manual_dir, download,
                                       verify_checksums)
    our_unit = unit or ds_unit
    if vocab is not None:
      ref_vocab = read_vocab(vocab)
      if len(ref_vocab) != cfg.n_token:
        raise ConvertError(f"{vocab} has {len(ref_vocab)} symbols but hparams n_token="
                           f"{cfg.n_token}.")
      ref_of_ours, vrep = map_vocab(ref_vocab, our_vocab, dataset)
      params, cfg = remap_vocab(params, cfg, ref_of_ours, unseen_bias)
      report["vocab"] = vrep
      _describe_vocab_map(vrep, len(ref_vocab), len(our_vocab), dataset, unseen_bias)
    elif len(our_vocab) != cfg.n_token:
      raise ConvertError(f"hparams n_token={cfg.n_token} but {dataset} has a vocabulary of "
                         f"{len(our_vocab)}: pass the model's vocabulary file with --vocab.")
    else:
      _log(f"No --vocab: taking the model's ids as {dataset}'s ids (same size, "
           f"{cfg.n_token}).")
  elif vocab is not None:
    raise ConvertError("--vocab needs --dataset (the vocabulary to map onto).")
  our_unit = our_unit or "word"
  write_workdir(workdir, params, cfg, dataset=dataset, data_dir=data_dir, manual_dir=manual_dir,
                download=download, verify_checksums=verify_checksums, unit=our_unit,
                **workdir_kwargs)
  n_params = sum(int(np.prod(np.shape(a))) for a in _flatten(params).values())
  _log(f"Wrote {workdir}: {n_params:,} parameters, vocabulary {cfg.n_token}, unit {our_unit}.")
  report.update(n_token=cfg.n_token, params=n_params)
  return report


def _describe_vocab_map(rep: dict, n_ref: int, n_ours: int, dataset: str, bias: float) -> None:
  _log(f"Vocabulary: matched {rep['matched']} of the model's {n_ref} symbols onto {dataset}'s "
       f"{n_ours} ids.")
  if rep["ref_unmatched"]:
    _log(f"  {len(rep['ref_unmatched'])} model symbols have no id in {dataset} and are dropped "
         "(the softmax renormalises over the rest): "
         f"{rep['ref_unmatched'][:10]}{' ...' if len(rep['ref_unmatched']) > 10 else ''}")
  if rep["ours_unseen"]:
    shown = [repr(s) for s in rep["ours_unseen"][:12]]
    _log(f"  {len(rep['ours_unseen'])} of our ids were never seen by the model: zero embedding, "
         f"softmax bias {bias:g} (probability ~0): {', '.join(shown)}"
         f"{' ...' if len(rep['ours_unseen']) > 12 else ''}")
  if dataset == "enwik8" and "\n" in rep["ours_unseen"]:
    _log("  enwik8: the reference drops newline bytes (prep_enwik8.py turns byte 10 into a line "
         "break and its vocabulary reader discards line breaks), so the model has no symbol for "
         "byte 10; our enwik8 keeps them (the boundary symbol).  Every newline of our stream "
         f"costs ~{-bias:g} nats here: to compare with the paper's bpc, score the bytes with "
         "newlines removed (--mode=score on such a stream), which is the reference's stream.")


def export_pytorch(workdir: str, checkpoint: str, hparams_path: Optional[str] = None,
                   layout: str = "reference", cluster_order: str = "auto") -> dict:
  """``--to=pytorch``: the latest checkpoint of a workdir as a reference state dict.

  Args:
    workdir: a training (or converted) workdir with config.json,
      model_config.json and checkpoints.
    checkpoint: output file (``.npz``, else a torch file).
    hparams_path: output JSON of the constructor arguments
      (:func:`hparams_from_model_config`); default ``<checkpoint without
      extension>.hparams.json``.
    layout, cluster_order: see :func:`state_dict_from_params`.

  Returns:
    {"step", "tensors", "hparams_path"}.

  Raises:
    ConvertError / FileNotFoundError: missing workdir files or checkpoint.
  """
  import jax
  from transformer_xl import main as txl_main
  config = txl_main.load_workdir_config(workdir)
  cfg, _ = txl_main.load_model_config(workdir)
  step, params = txl_main.restore_params(config, workdir, cfg, _one_device_mesh())
  params = jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), params)
  state = state_dict_from_params(params, cfg, layout, cluster_order)
  save_state_dict(state, checkpoint)
  hparams_path = hparams_path or os.path.splitext(checkpoint)[0] + ".hparams.json"
  with open(hparams_path, "w") as f:
    json.dump(hparams_from_model_config(cfg), f, indent=2)
  _log(f"Wrote {len(state)} tensors of step {step} to {checkpoint} ({layout} names) and the "
       f"hparams to {hparams_path}.")
  return {"step": int(step), "tensors": len(state), "hparams_path": hparams_path}


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _define_flags(fv):
  """Defines the command-line flags in the FlagValues ``fv``; returns name -> FlagHolder.

  A FlagValues of its own, because ``transformer_xl.main`` (imported to write
  and read workdirs) defines its flags, ``--workdir`` among them, globally.
  """
  from absl import flags
  f = {}
  f["from"] = flags.DEFINE_enum("from", None, ["pytorch", "tf"],
                                "Convert a reference checkpoint into --workdir.", flag_values=fv)
  f["to"] = flags.DEFINE_enum("to", None, ["pytorch"],
                              "Export --workdir's latest checkpoint to --checkpoint.",
                              flag_values=fv)
  f["checkpoint"] = flags.DEFINE_string(
      "checkpoint", None, "--from=pytorch: state dict (.npz or torch file); --from=tf: TF "
      "checkpoint prefix or directory; --to=pytorch: output file (.npz or torch).",
      flag_values=fv)
  f["hparams"] = flags.DEFINE_string(
      "hparams", None, "JSON of the reference constructor's arguments (input for --from; "
      "output for --to, default <checkpoint>.hparams.json).", flag_values=fv)
  f["workdir"] = flags.DEFINE_string("workdir", None, "Our workdir (output of --from, input of "
                                     "--to).", flag_values=fv)
  f["cluster_order"] = flags.DEFINE_enum(
      "cluster_order", "auto", ["auto", "reference", "forward"],
      "Adaptive-softmax head column of tail cluster i in the state dict: reference = -i "
      "(PyTorch reference), forward = cutoffs[0]+i-1 (HuggingFace 4.35, TF); auto = forward "
      "for names with HuggingFace's 'transformer.' prefix (--from) or --layout=hf (--to).",
      flag_values=fv)
  f["layout"] = flags.DEFINE_enum("layout", "reference", ["reference", "hf"],
                                  "--to: reference (MemTransformerLM) or hf "
                                  "(TransfoXLLMHeadModel) names.", flag_values=fv)
  f["vocab"] = flags.DEFINE_string("vocab", None, "The model's vocabulary file (one symbol per "
                                   "line); mapped onto --dataset's vocabulary.", flag_values=fv)
  f["dataset"] = flags.DEFINE_string("dataset", None, "Our corpus (data.dataset of the "
                                     "converted config).", flag_values=fv)
  f["data_dir"] = flags.DEFINE_string("data_dir", None, "tfds data dir of --dataset.",
                                      flag_values=fv)
  f["manual_dir"] = flags.DEFINE_string("manual_dir", None, "Source files of --dataset.",
                                        flag_values=fv)
  f["download"] = flags.DEFINE_boolean("download", True, "May download --dataset's sources.",
                                       flag_values=fv)
  f["verify_checksums"] = flags.DEFINE_boolean(
      "verify_checksums", True, "Check --dataset's source files (False for non-canonical "
      "files).", flag_values=fv)
  f["unit"] = flags.DEFINE_enum("unit", None, ["byte", "char", "word"],
                                "Token unit (default: --dataset's, else word).", flag_values=fv)
  f["unseen_bias"] = flags.DEFINE_float("unseen_bias", UNSEEN_BIAS,
                                        "Softmax bias of ids missing from --vocab.",
                                        flag_values=fv)
  f["eval_tgt_len"] = flags.DEFINE_integer("eval_tgt_len", None, "eval.tgt_len (default: "
                                           "hparams tgt_len).", flag_values=fv)
  f["eval_mem_len"] = flags.DEFINE_integer("eval_mem_len", None, "eval.mem_len (default: "
                                           "hparams mem_len).", flag_values=fv)
  f["eval_clamp_len"] = flags.DEFINE_integer("eval_clamp_len", None, "eval.clamp_len "
                                             "(default: hparams clamp_len).", flag_values=fv)
  f["eval_same_length"] = flags.DEFINE_boolean("eval_same_length", None, "eval.same_length "
                                               "(default: hparams same_length).",
                                               flag_values=fv)
  f["global_batch"] = flags.DEFINE_integer(
      "global_batch", 1, "train.global_batch of the converted config (the saved training "
      "memory has this many rows; use a multiple of the data-parallel devices).",
      flag_values=fv)
  f["eval_global_batch"] = flags.DEFINE_integer("eval_global_batch", 1, "eval.global_batch.",
                                                flag_values=fv)
  return f


def main(argv: Sequence[str]) -> None:
  """Command line: parses ``argv`` (program name first) and converts.

  ``--help`` prints the usage.  Errors (bad flags, ConvertError, missing
  files, data.DataError) exit with a one-line ``error: ...`` message.
  """
  from absl import flags, logging
  fv = flags.FlagValues()
  holders = _define_flags(fv)
  if any(a in ("--help", "-h", "--helpfull") for a in argv[1:]):
    print(__doc__)
    print(fv)
    return
  try:
    rest = fv(list(argv))
  except flags.Error as err:
    sys.exit(f"error: {err}")
  if len(rest) > 1:
    sys.exit(f"error: unexpected arguments {rest[1:]}")
  if not flags.FLAGS.is_parsed():  # absl logging in imported modules expects parsed flags
    flags.FLAGS(list(argv[:1]))
  logging.set_verbosity(logging.WARNING)  # orbax logs every file at INFO
  from transformer_xl import data
  f = {k: v.value for k, v in holders.items()}
  try:
    if (f["from"] is None) == (f["to"] is None):
      raise ConvertError("give exactly one of --from=pytorch|tf and --to=pytorch.")
    if not f["checkpoint"] or not f["workdir"]:
      raise ConvertError("--checkpoint and --workdir are required.")
    if f["to"]:
      export_pytorch(f["workdir"], f["checkpoint"], f["hparams"], f["layout"],
                     f["cluster_order"])
      return
    if not f["hparams"]:
      raise ConvertError("--hparams=HPARAMS.json is required with --from.")
    convert_to_workdir(
        f["from"], f["checkpoint"], f["hparams"], f["workdir"],
        cluster_order=f["cluster_order"], vocab=f["vocab"], dataset=f["dataset"],
        data_dir=f["data_dir"], manual_dir=f["manual_dir"], download=f["download"],
        verify_checksums=f["verify_checksums"], unit=f["unit"], unseen_bias=f["unseen_bias"], eval_tgt_len=f["eval_tgt_len"],
        eval_mem_len=f["eval_mem_len"], eval_clamp_len=f["eval_clamp_len"],
        eval_same_length=f["eval_same_length"], global_batch=f["global_batch"],
        eval_global_batch=f["eval_global_batch"])
  except (ConvertError, data.DataError, FileNotFoundError) as err:
    sys.exit(f"error: {err}")


if __name__ == "__main__":
  main(sys.argv)
