"""Hyperparameters: the reference constructor's arguments <-> our ModelConfig.

``HPARAMS.json`` holds the reference constructor's arguments
(``MemTransformerLM(n_token, n_layer, n_head, d_model, d_head, d_inner,
dropout, dropatt, tie_weight, d_embed, div_val, tie_projs, pre_lnorm,
tgt_len, ext_len, mem_len, cutoffs, adapt_inp, same_length, attn_type,
clamp_len, sample_softmax)``, reference ``mem_transformer.py``) plus the TF
flags ``untie_r``, ``proj_share_all_but_first`` and ``proj_same_dim``; see
``load_hparams``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from transformer_xl.convert.errors import ConvertError, describe

# The reference constructor's arguments without a default (tgt_len and
# mem_len have one there, None, but every reference script passes them and
# the conversion needs them for the evaluation settings).
REQUIRED_HPARAMS = (
    "n_token",
    "n_layer",
    "n_head",
    "d_model",
    "d_head",
    "d_inner",
    "dropout",
    "dropatt",
    "tgt_len",
    "mem_len",
)
# The optional ones with the reference defaults (MemTransformerLM, and the TF
# flags untie_r, proj_share_all_but_first and proj_same_dim).
OPTIONAL_HPARAMS = {
    "tie_weight": True,
    "d_embed": None,
    "div_val": 1,
    "tie_projs": [False],
    "pre_lnorm": False,
    "ext_len": 0,
    "cutoffs": [],
    "adapt_inp": False,
    "same_length": False,
    "attn_type": 0,
    "clamp_len": -1,
    "sample_softmax": -1,
    "untie_r": False,
    "proj_share_all_but_first": None,
    "proj_same_dim": True,
}
_INT_HPARAMS = (
    "n_token",
    "n_layer",
    "n_head",
    "d_model",
    "d_head",
    "d_inner",
    "div_val",
    "tgt_len",
    "ext_len",
    "mem_len",
    "attn_type",
    "clamp_len",
    "sample_softmax",
)
_BOOL_HPARAMS = ("tie_weight", "pre_lnorm", "adapt_inp", "same_length", "untie_r", "proj_same_dim")


def load_hparams(source: str | Mapping[str, Any]) -> dict:
  """Reads and validates the reference constructor's hyperparameters.

  Args:
    source: path of a JSON file, or the dict itself.  Keys: the reference
      ``MemTransformerLM`` arguments (``REQUIRED_HPARAMS`` and
      ``OPTIONAL_HPARAMS``), plus the TF flags ``untie_r``,
      ``proj_share_all_but_first`` (sets ``tie_projs`` to ``[False] + [True]
      * len(cutoffs)`` when ``tie_projs`` is absent) and ``proj_same_dim``.
      ``adapt_inp`` is accepted and ignored, as in the reference.

  Returns:
    A new dict with every key: defaults filled in, ``d_embed`` resolved
    (None or 0 -> d_model), ``cutoffs`` a list of ints, ``tie_projs`` a list
    of len(cutoffs) + 1 bools (the reference's shorter lists mean "not
    tied" for the missing clusters), ints and bools checked.

  Raises:
    ConvertError: a missing or unreadable file, not UTF-8 or not a JSON
      object, unknown keys, missing required keys,
      wrong types, or values this package cannot represent (sample_softmax >
      0, ext_len > 0, tie_projs longer than the clusters, an attn_type other
      than 0-3, attn_type 3 with n_head * d_head != d_model).
  """
  return check_hparams(*read_hparams(source))


_FIX = (
    "pass with --hparams a JSON object of the reference constructor's arguments, e.g. "
    '{"n_token": 267735, "n_layer": 16, ...}'
)


def read_hparams(source: str | Mapping[str, Any]) -> tuple[dict, str]:
  """(the JSON object of ``source``, a path or a dict, unchecked; what to
  call it in messages: the path, or "hparams").

  Raises:
    ConvertError: a missing or unreadable file, not UTF-8, not JSON, not an object.
  """
  fix = _FIX
  if isinstance(source, (str, os.PathLike)):
    if not os.path.exists(source):
      raise ConvertError(f"hparams file {source} does not exist; {fix}.")
    try:
      with open(source, "rb") as f:
        raw = json.loads(f.read().decode("utf-8"))
    except OSError as err:
      raise ConvertError(
          f"cannot read the hparams file {source} ({describe(err)}); {fix}."
      ) from None
    except UnicodeDecodeError as err:
      raise ConvertError(
          f"hparams file {source} is not UTF-8 text (byte {err.start}); {fix}."
      ) from None
    except json.JSONDecodeError as err:
      raise ConvertError(
          f"hparams file {source} is not valid JSON ({err.msg} at line "
          f"{err.lineno}, column {err.colno}); {fix}."
      ) from None
    except RecursionError:
      raise ConvertError(f"hparams file {source} is nested too deeply; {fix}.") from None
    where = str(source)
  else:
    raw, where = dict(source), "hparams"
  if not isinstance(raw, dict):
    raise ConvertError(
        f"{where}: expected a JSON object of constructor arguments, got "
        f"{type(raw).__name__}; {fix}."
    )
  return raw, where


def check_hparams(raw: Mapping[str, Any], where: str = "hparams") -> dict:
  """``load_hparams`` of a JSON object already read (``read_hparams``);
  ``where`` names it in messages."""
  raw = dict(raw)
  known = set(REQUIRED_HPARAMS) | set(OPTIONAL_HPARAMS)
  unknown = sorted(set(raw) - known)
  if unknown:
    raise ConvertError(
        f"{where}: unknown hparams {unknown}; the accepted keys are the "
        f"reference constructor's arguments: {sorted(known)}."
    )
  missing = [k for k in REQUIRED_HPARAMS if raw.get(k) is None]
  if missing:
    raise ConvertError(
        f"{where}: missing required hparams {missing}; add them (the values "
        "the model was trained with)."
    )
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
      isinstance(c, int) and not isinstance(c, bool) for c in cutoffs
  ):
    raise ConvertError(f"{where}: cutoffs={cutoffs!r} must be a list of integers.")
  hp["cutoffs"] = [int(c) for c in cutoffs]
  n_clusters = len(hp["cutoffs"]) + 1
  if hp["proj_share_all_but_first"] not in (None, True, False):
    raise ConvertError(
        f"{where}: proj_share_all_but_first="
        f"{hp['proj_share_all_but_first']!r} must be true, false or null."
    )
  if "tie_projs" not in raw and hp["proj_share_all_but_first"] is not None:
    hp["tie_projs"] = [False] + [bool(hp["proj_share_all_but_first"])] * (n_clusters - 1)
  tie_projs = hp["tie_projs"] if hp["tie_projs"] is not None else []
  if not isinstance(tie_projs, (list, tuple)) or not all(isinstance(t, bool) for t in tie_projs):
    raise ConvertError(f"{where}: tie_projs={tie_projs!r} must be a list of booleans.")
  if len(tie_projs) > n_clusters:
    raise ConvertError(
        f"{where}: tie_projs={list(tie_projs)} has more entries than the "
        f"{n_clusters} clusters of cutoffs={hp['cutoffs']}."
    )
  hp["tie_projs"] = list(tie_projs) + [False] * (n_clusters - len(tie_projs))
  if hp["sample_softmax"] > 0:
    raise ConvertError(
        f"{where}: sample_softmax={hp['sample_softmax']}: the sampled softmax "
        "is not implemented; use a checkpoint trained with sample_softmax=-1."
    )
  if hp["ext_len"] > 0:
    raise ConvertError(
        f"{where}: ext_len={hp['ext_len']}: extended context is not supported "
        "(every reference script uses ext_len=0)."
    )
  if hp["tgt_len"] < 1 or hp["mem_len"] < 0:
    raise ConvertError(
        f"{where}: tgt_len={hp['tgt_len']} must be >= 1 and mem_len={hp['mem_len']} >= 0."
    )
  if hp["same_length"] and hp["mem_len"] < 1:
    raise ConvertError(f"{where}: same_length=true needs mem_len >= 1.")
  try:
    model_config_from_hparams(hp)
  except ValueError as err:
    raise ConvertError(f"{where}: {err}") from None
  return hp


def model_config_from_hparams(hp: Mapping[str, Any], n_token: int | None = None):
  """The ``models.ModelConfig`` of validated hparams (``load_hparams``).

  ``clamp_len`` <= 0 (the reference's -1) becomes 0 (no clamp); ``d_embed``
  equal to d_model becomes None; ``tie_projs`` that tie nothing become ().

  Args:
    hp: hparams as returned by ``load_hparams``.
    n_token: vocabulary size; defaults to ``hp["n_token"]``.

  Raises:
    ValueError: sizes the model rejects (see ModelConfig).
  """
  from transformer_xl.model import models

  tie_projs = tuple(bool(t) for t in hp["tie_projs"])
  return models.ModelConfig(
      n_token=int(hp["n_token"] if n_token is None else n_token),
      n_layer=hp["n_layer"],
      d_model=hp["d_model"],
      n_head=hp["n_head"],
      d_head=hp["d_head"],
      d_inner=hp["d_inner"],
      dropout=float(hp["dropout"]),
      dropatt=float(hp["dropatt"]),
      tgt_len=hp["tgt_len"],
      mem_len=hp["mem_len"],
      clamp_len=max(0, int(hp["clamp_len"])),
      same_length=bool(hp["same_length"]),
      pre_lnorm=bool(hp["pre_lnorm"]),
      untie_r=bool(hp["untie_r"]),
      tie_weight=bool(hp["tie_weight"]),
      attn_type=int(hp["attn_type"]),
      d_embed=None if hp["d_embed"] in (None, 0, hp["d_model"]) else int(hp["d_embed"]),
      div_val=hp["div_val"],
      cutoffs=tuple(hp["cutoffs"]),
      tie_projs=tie_projs if any(tie_projs) else (),
  )


def hparams_from_model_config(cfg) -> dict:
  """The reference constructor's arguments (plus ``untie_r``) for a ModelConfig.

  Inverse of ``model_config_from_hparams`` (``clamp_len`` 0 is written
  as -1, the reference's "no clamp"; ``tie_projs`` always has one entry per
  cluster).

  Raises:
    ConvertError: a memory other than the reference's (the XL memory alone:
      no other ``model.memory``, no add-on such as the memory tokens, which
      the authors' fork reads: ``convert.rmt`` converts from it, not to it).
  """
  from transformer_xl.model import memory

  others = [v.name for v in memory.plan(cfg).variants if v is not memory.VARIANTS["xl"]]
  if others:
    raise ConvertError(
        f"model.memory={cfg.memory!r} with {', '.join(repr(o) for o in others)}: the reference "
        "implementation has only the XL memory; only a model with model.memory='xl' and no "
        "memory add-on (model.tokens.num_mem_tokens=0) converts to it."
    )
  n_clusters = len(cfg.cutoffs) + 1
  return {
      "n_token": cfg.n_token,
      "n_layer": cfg.n_layer,
      "n_head": cfg.n_head,
      "d_model": cfg.d_model,
      "d_head": cfg.d_head,
      "d_inner": cfg.d_inner,
      "dropout": cfg.dropout,
      "dropatt": cfg.dropatt,
      "tie_weight": cfg.tie_weight,
      "d_embed": cfg.embed_dim,
      "div_val": cfg.div_val,
      "tie_projs": list(cfg.tie_projs) if cfg.tie_projs else [False] * n_clusters,
      "pre_lnorm": cfg.pre_lnorm,
      "tgt_len": cfg.tgt_len,
      "ext_len": 0,  # the reference's extended context: not supported, always 0
      "mem_len": cfg.mem_len,
      "cutoffs": list(cfg.cutoffs),
      "same_length": cfg.same_length,
      "attn_type": cfg.attn_type,
      "clamp_len": cfg.clamp_len if cfg.clamp_len > 0 else -1,
      "untie_r": cfg.untie_r,
  }


def expected_param_shapes(cfg) -> dict[str, tuple[int, ...]]:
  """Path under ``params/`` ("/"-joined) -> shape, for a ModelConfig (no compute)."""
  import functools

  import flax.linen as nn
  import jax

  from transformer_xl.model import models

  init = functools.partial(models.init_params, models.TransformerXL(cfg))
  boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
  flat = jax.tree_util.tree_flatten_with_path(nn.unbox(boxed))[0]
  return {"/".join(str(k.key) for k in path): tuple(x.shape) for path, x in flat}
