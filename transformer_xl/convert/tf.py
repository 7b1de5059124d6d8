"""Reference TensorFlow checkpoints -> state dicts with the reference PyTorch names.

The released Transformer-XL models are TF checkpoints written by the
reference ``tf/model.py``; their variable names are the TF column of
``transformer_xl.convert.names.NAME_TABLE`` (and its notes).  Reading
them needs TensorFlow (``pip install ".[convert]"``), imported only here and
only when a checkpoint is read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_xl.convert.errors import ConvertError, describe
from transformer_xl.convert.names import NAME_TABLE
from transformer_xl.util.report import log


def read_tf_checkpoint(path: str) -> dict[str, np.ndarray]:
  """The model variables of a TF checkpoint (a prefix like ``model.ckpt-0`` or a directory).

  Needs TensorFlow (``pip install ".[convert]"``).  Optimizer slots
  (``.../Adam``, ``.../Adam_1``), ``global_step`` and other variables
  outside ``transformer/`` are not read.

  Returns:
    TF variable name -> numpy array.

  Raises:
    ConvertError: no checkpoint at ``path`` (checked before TensorFlow is
      imported), TensorFlow missing, the checkpoint unreadable or damaged,
      or a model variable that is not of a real number type.
  """
  reader = _tf_reader(path)
  try:
    variables = {
        name: np.asarray(reader.get_tensor(name))
        for name in sorted(reader.get_variable_to_shape_map())
        if not _is_tf_slot(name)
    }
  except Exception as err:  # TF raises NotFoundError, DataLossError, ValueError
    raise ConvertError(
        f"cannot read the TF checkpoint {path} ({describe(err)}); pass the "
        "prefix of a complete checkpoint (its .index and .data-* files), or copy "
        "it again."
    ) from None
  for name, a in variables.items():
    if a.dtype.kind not in "fiu":
      raise ConvertError(
          f"TF checkpoint {path}: {name} has dtype {a.dtype}, not a real number "
          "type; pass a checkpoint of the reference tf/model.py."
      )
  return variables


def check_tf_checkpoint(path: str) -> int:
  """Reads every variable of a TF checkpoint once and keeps none (peak memory:
  the largest tensor), so that TF verifies each tensor's CRC32C checksum
  that its ``.index`` records.  Returns the number of variables.

  Raises:
    ConvertError: as ``read_tf_checkpoint``, for a file that is
      truncated or damaged too (the message names the checkpoint).
  """
  reader = _tf_reader(path)
  try:
    names = sorted(reader.get_variable_to_shape_map())
    for name in names:
      reader.get_tensor(name)
  except Exception as err:  # TF raises NotFoundError, DataLossError, ValueError
    raise ConvertError(
        f"the TF checkpoint {path} does not read cleanly ({describe(err)})."
    ) from None
  return len(names)


def _tf_reader(path: str):
  """TensorFlow's checkpoint reader of ``path``; ConvertError when there is no
  checkpoint (checked before TensorFlow is imported), no TensorFlow, or an
  index TF cannot open."""
  if "://" not in path and not (os.path.isdir(path) or os.path.exists(path + ".index")):
    prefix = re.sub(r"\.(index|meta|data-\d+-of-\d+)$", "", path)
    hint = (
        f"pass the prefix without the extension: --checkpoint={prefix}"
        if prefix != path
        else "pass the prefix of its files (e.g. .../model.ckpt-0, without .index) or its "
        "directory"
    )
    raise ConvertError(
        f"no TF checkpoint at {path} (neither a directory nor {path}.index exists); {hint}."
    )
  try:
    import tensorflow as tf
  except ImportError:
    raise ConvertError(
        "reading TF checkpoints needs TensorFlow: pip install -e '.[convert]'"
    ) from None
  try:
    return tf.train.load_checkpoint(path)
  except Exception as err:  # TF raises NotFoundError, DataLossError, ValueError
    raise ConvertError(
        f"cannot read the TF checkpoint {path} ({describe(err)}); pass the "
        "prefix of a complete checkpoint (its .index and .data-* files), or copy "
        "it again."
    ) from None


def _is_tf_slot(name: str) -> bool:
  """Optimizer slots and bookkeeping of the reference's TF training."""
  last = name.rsplit("/", 1)[-1]
  return last in ("Adam", "Adam_1", "ExponentialMovingAverage") or not name.startswith(
      "transformer/"
  )


def state_dict_from_tf(
    variables: Mapping[str, np.ndarray], hp: Mapping[str, Any], cfg
) -> dict[str, np.ndarray]:
  """The reference PyTorch state dict of a reference TF checkpoint.

  Variable names: the TF column of ``NAME_TABLE`` and its notes.
  Optimizer slots (``.../Adam``, ``.../Adam_1``), ``global_step`` and
  everything outside ``transformer/`` are ignored.  The result keeps TF's
  forward cluster order (convert it with ``cluster_order="forward"``).

  Args:
    variables: TF name -> array (``read_tf_checkpoint``).
    hp: validated hparams (``load_hparams``; ``proj_same_dim`` is used).
    cfg: the ModelConfig of ``hp``.

  Returns:
    Reference PyTorch name -> float32 array.

  Raises:
    ConvertError: missing or unused ``transformer/`` variables, wrong
      shapes, hparams that contradict the checkpoint (untie_r, tie_projs),
      an attn_type other than 0.
  """
  from transformer_xl.model import adaptive

  if cfg.attn_type != 0:
    raise ConvertError(
        f"attn_type={cfg.attn_type}: the reference TF code (and its checkpoints) "
        "has the relative attention of attn_type 0 only."
    )
  v = {
      k[len("transformer/") :]: np.asarray(a, np.float32)
      for k, a in variables.items()
      if not _is_tf_slot(k)
  }
  used = set()
  out: dict[str, np.ndarray] = {}

  def take(name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    if name not in v:
      raise ConvertError(
          f"TF checkpoint lacks transformer/{name}"
          + (f" (expected shape {shape})" if shape else "")
          + "."
      )
    if shape is not None and tuple(v[name].shape) != tuple(shape):
      raise ConvertError(
          f"transformer/{name}: expected shape {tuple(shape)} from the hparams, "
          f"got {tuple(v[name].shape)}."
      )
    used.add(name)
    return v[name]

  n_layer, n_head, d_head, d_model = cfg.n_layer, cfg.n_head, cfg.d_head, cfg.d_model
  # u and v.
  for b in ("r_w_bias", "r_r_bias"):
    if b not in v:
      take(b)
    if v[b].ndim == 3:
      if not cfg.untie_r:
        raise ConvertError(
            f"transformer/{b} has shape {v[b].shape} (one per layer) but the "
            "hparams have untie_r=false; set untie_r=true."
        )
      a = take(b, (n_layer, n_head, d_head))
      for l in range(n_layer):
        out[f"layers.{l}.dec_attn.{b}"] = a[l]
    else:
      if cfg.untie_r:
        raise ConvertError(
            f"transformer/{b} has shape {v[b].shape} (shared) but the hparams "
            "have untie_r=true; set untie_r=false."
        )
      out[b] = take(b, (n_head, d_head))
  # Embedding (note [1]).
  bounds = adaptive.cluster_bounds(cfg.n_token, cfg.cutoffs)
  dims = adaptive.cluster_dims(cfg.embed_dim, len(bounds) - 1, cfg.div_val)
  n_tables = 1 if cfg.div_val == 1 else len(bounds) - 1
  has_proj = adaptive.has_projections(cfg.embed_dim, d_model, cfg.div_val)
  emb_projs_pt = []
  for i in range(n_tables):
    scope = (
        "adaptive_embed/"
        if cfg.div_val == 1 and "adaptive_embed/lookup_table" in v
        else f"adaptive_embed/cutoff_{i}/"
    )
    n_i = cfg.n_token if cfg.div_val == 1 else bounds[i + 1] - bounds[i]
    d_i = cfg.embed_dim if cfg.div_val == 1 else dims[i]
    out[f"word_emb.emb_layers.{i}.weight"] = take(scope + "lookup_table", (n_i, d_i))
    if not has_proj:
      emb_projs_pt.append(None)
      continue
    if scope + "proj_W" in v:
      proj = take(scope + "proj_W", (d_i, d_model)).T
    elif d_i == d_model and not hp["proj_same_dim"]:
      log(
          f"  transformer/{scope}proj_W is absent (proj_same_dim=false, d={d_i} = d_model): "
          "identity projection."
      )
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
    log(
        "  TF ties the softmax weights to the embedding; tie_weight=false: copying the "
        "embedding tables into the softmax weights."
    )
    for i, t in enumerate(tables):
      out[f"crit.out_layers.{i}.weight"] = t.copy()
  if not cfg.cutoffs:
    out["crit.out_layers.0.bias"] = take("adaptive_softmax/bias", (cfg.n_token,))
    if has_proj and not (cfg.tie_projs and cfg.tie_projs[0]):
      log("  TF uses the embedding projection in the softmax; tie_projs=[false]: copying it.")
      out["crit.out_projs.0"] = emb_projs_pt[0].copy()
  else:
    biases = [
        take(f"adaptive_softmax/cutoff_{i}/b", (bounds[i + 1] - bounds[i],))
        for i in range(len(bounds) - 1)
    ]
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
          raise ConvertError(
              f"transformer/{name} exists, so cluster {i}'s projection is not "
              f"tied, but the hparams have tie_projs[{i}]=true; set it to false."
          )
        if has_proj:
          out[f"crit.out_projs.{i}"] = take(name, (d_i, d_model)).T
        else:
          take(name)
          raise ConvertError(
              f"transformer/{name} exists but the hparams (div_val=1, d_embed = "
              "d_model) give the softmax no projection."
          )
      elif has_proj and not tie_projs[i]:
        source = emb_projs_pt[0 if cfg.div_val == 1 else i]
        if d_i != d_model:
          log(
              f"  no transformer/{name}: the TF model tied cluster {i}'s projection; "
              f"tie_projs[{i}]=false: copying the embedding projection."
          )
          out[f"crit.out_projs.{i}"] = source.copy()
        else:
          log(f"  no transformer/{name} and d={d_i} = d_model: identity projection.")
          out[f"crit.out_projs.{i}"] = np.eye(d_model, dtype=np.float32)
  unused = sorted(set(v) - used)
  if unused:
    raise ConvertError(
        f"TF checkpoint has variables the hparams do not account for: "
        f"{['transformer/' + u for u in unused[:20]]} (check untie_r, cutoffs, "
        "div_val, d_embed, tie_projs, n_layer)."
    )
  return out
