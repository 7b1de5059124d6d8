"""ARMT's models (the authors' wrapper around HuggingFace's TransfoXL) -> ours.

Rodkin et al. 2024 (arXiv 2407.04841) wrap a HuggingFace model in an
``AssociativeMemoryCell`` inside an ``AssociativeRecurrentWrapper``
(RodkinIvan/associative-recurrent-memory-transformer,
``modeling_amt/language_modeling.py``).  With a ``TransfoXLLMHeadModel``
inside (``layers_attr="transformer.layers"``, ``wrap_pos=False``), the
wrapper's state dict holds:

* ``memory_cell.memory`` [N, d_model]: the learned memory tokens;
* ``memory_cell.model.transformer.layers.{i}.W_mq.weight`` [M, D],
  ``W_mk.weight`` [M, D], ``W_mv.weight`` [D, D], ``W_mb.weight`` [1, D],
  ``W_mb.bias`` [1]: layer i's memory projections (torch ``Linear``
  weights, [out, in]);
* ``memory_cell.model.transformer.layers.{i}.layer.<name>``: the
  TransfoXL layer it wraps, and the rest of HuggingFace's names under
  ``memory_cell.model.`` (``transformer.word_emb...``, ``crit...``);
* the same layers again under ``memory_cell.layers.{i}.`` (the cell keeps a
  reference to the layer list), accepted when equal to the model's.

``HPARAMS.json`` holds three sections: ``transfo_xl_config`` (the
``TransfoXLConfig`` fields, as its ``config.json``), ``memory_cell`` (the
cell's constructor arguments: ``num_mem_tokens``, ``d_mem``,
``correction``, ``layers_attr``, ``wrap_pos``) and ``recurrent_wrapper``
(the wrapper's: ``segment_size``, ``segment_alignment``, and the training
ones it keeps, ``max_n_segments``, ``k2``, ...).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_xl.convert.errors import ConvertError, describe
from transformer_xl.convert.hparams import OPTIONAL_HPARAMS, load_hparams, model_config_from_hparams
from transformer_xl.convert.pytorch import finite, params_from_state_dict
from transformer_xl.model.memory.armt import AssociativeMemory

SECTIONS = ("transfo_xl_config", "memory_cell", "recurrent_wrapper")
# The cell's constructor arguments (AssociativeMemoryCell.__init__), their defaults
# (None: required).
CELL_ARGS = {
    "num_mem_tokens": None,
    "d_mem": None,
    "correction": True,
    "layers_attr": "transformer.layers",
    "wrap_pos": False,
}
# The wrapper's arguments this conversion reads; the others (training settings such as
# max_n_segments, k2) are kept in its rmt_config and do not change the model.
WRAPPER_ARGS = {"segment_size": None, "segment_alignment": None}
PREFIX = "memory_cell.model."
CELL_LAYERS = "memory_cell.layers."
TOKENS = "memory_cell.memory"
# Our per-layer parameter -> (their name in layer i, transpose).
LAYER_PARAMS = {
    "armt_w_q": ("W_mq.weight", True),
    "armt_w_k": ("W_mk.weight", True),
    "armt_w_v": ("W_mv.weight", True),
    "armt_w_b": ("W_mb.weight", True),
    "armt_b_b": ("W_mb.bias", False),
}


def is_armt_hparams(raw: Mapping[str, Any]) -> bool:
  """Whether a parsed HPARAMS.json is ARMT's (it has the three sections' names)."""
  return any(k in raw for k in SECTIONS)


def load_armt_hparams(source: str | Mapping[str, Any]) -> dict:
  """The three sections, checked: {"hparams": the reference constructor's
  arguments (``load_hparams`` of the TransfoXL config, tgt_len = the
  wrapper's segment_size, dropout 0), "cell": ``CELL_ARGS``, "wrapper":
  ``WRAPPER_ARGS``}.

  Raises:
    ConvertError: an unreadable file, a missing or unknown section, a
      missing or unknown cell argument, values ours does not carry
      (``wrap_pos`` (GPT-2's positions), another ``layers_attr``, a
      ``segment_alignment`` other than left, a TransfoXL ``mem_len`` > 0:
      their wrapper runs each segment with a fresh zero-filled cache of
      that length, which ours has no equivalent for), naming the key.
  """
  where = source if isinstance(source, str) else "hparams"
  if isinstance(source, str):
    try:
      with open(source, encoding="utf-8") as f:
        raw = json.load(f)
    except (OSError, ValueError) as err:
      raise ConvertError(f"{source}: cannot read the hparams ({describe(err)}).") from None
  else:
    raw = dict(source)
  if not isinstance(raw, dict):
    raise ConvertError(f"{where}: expected a JSON object with the sections {list(SECTIONS)}.")
  missing = [s for s in SECTIONS if not isinstance(raw.get(s), dict)]
  unknown = sorted(set(raw) - set(SECTIONS))
  if missing or unknown:
    raise ConvertError(
        f"{where}: ARMT hparams need the sections {list(SECTIONS)} (objects)"
        + (f"; missing or not objects: {missing}" if missing else "")
        + (f"; unknown: {unknown}" if unknown else "")
        + "."
    )
  cell = _section(where, "memory_cell", raw["memory_cell"], CELL_ARGS, strict=True)
  wrapper = _section(where, "recurrent_wrapper", raw["recurrent_wrapper"], WRAPPER_ARGS)
  for key in ("num_mem_tokens", "d_mem"):
    n = cell[key]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise ConvertError(f"{where}: memory_cell.{key}={n!r} must be an integer >= 1.")
  if not isinstance(cell["correction"], bool):
    raise ConvertError(
        f"{where}: memory_cell.correction={cell['correction']!r} must be true or false."
    )
  if cell["wrap_pos"] is not False or cell["layers_attr"] != CELL_ARGS["layers_attr"]:
    raise ConvertError(
        f"{where}: memory_cell.wrap_pos={cell['wrap_pos']!r}, layers_attr="
        f"{cell['layers_attr']!r}: a TransfoXL model is wrapped with wrap_pos false and "
        "layers_attr 'transformer.layers' (wrap_pos is GPT-2's)."
    )
  seg = wrapper["segment_size"]
  if isinstance(seg, bool) or not isinstance(seg, int) or seg < 1:
    raise ConvertError(f"{where}: recurrent_wrapper.segment_size={seg!r} must be an integer >= 1.")
  if wrapper["segment_alignment"] not in (None, "left"):
    raise ConvertError(
        f"{where}: recurrent_wrapper.segment_alignment={wrapper['segment_alignment']!r}: only "
        "'left' (or null) segments a stream as ours does."
    )
  c = raw["transfo_xl_config"]
  if c.get("mem_len", 0):
    raise ConvertError(
        f"{where}: transfo_xl_config.mem_len={c['mem_len']!r}: their wrapper runs every "
        "segment with a fresh zero-filled TransfoXL cache of that length; convert a model "
        "trained with mem_len 0."
    )
  if c.get("vocab_size", c.get("n_token")) is None:
    raise ConvertError(
        f"{where}: transfo_xl_config has no vocab_size (HuggingFace's TransfoXLConfig name; "
        "n_token is accepted too): add the model's vocabulary size."
    )
  hp = {"n_token": c.get("n_token", c.get("vocab_size"))}
  for k in ("n_layer", "n_head", "d_model", "d_head", "d_inner", *OPTIONAL_HPARAMS):
    if k in c:
      hp[k] = c[k]
  hp.setdefault("tie_weight", c.get("tie_word_embeddings", True))
  hp.pop("adapt_inp", None)
  hp.update(dropout=0.0, dropatt=0.0, tgt_len=seg, mem_len=0, ext_len=0)
  try:
    hparams = load_hparams(hp)
  except ConvertError as err:
    raise ConvertError(f"{where}: transfo_xl_config: {err}") from None
  return {"hparams": hparams, "cell": cell, "wrapper": wrapper}


def _section(where, name, section, args, strict=False):
  """``args`` filled from ``section``; a missing required one (and, if
  ``strict``, an unknown one) refused."""
  missing = [k for k, v in args.items() if v is None and k not in section]
  if name == "recurrent_wrapper":
    missing = [k for k in missing if k != "segment_alignment"]
  unknown = sorted(set(section) - set(args)) if strict else []
  if missing or unknown:
    raise ConvertError(
        f"{where}: {name}"
        + (f" lacks {missing}" if missing else "")
        + (" and" if missing and unknown else "")
        + (f" has unknown arguments {unknown}" if unknown else "")
        + "."
    )
  return {k: section.get(k, v) for k, v in args.items()}


def model_config_from_armt_hparams(h: Mapping[str, Any]):
  """Our ``ModelConfig`` of ``load_armt_hparams``'s result: the TransfoXL
  model with ``model.memory="armt"`` and the cell's settings."""
  cfg = model_config_from_hparams(h["hparams"])
  cell = h["cell"]
  settings = {k: cell[k] for k in ("num_mem_tokens", "d_mem", "correction")}
  return dataclasses.replace(
      cfg, memory=AssociativeMemory.name, memory_settings={AssociativeMemory.name: settings}
  )


def params_from_armt_state_dict(state: Mapping[str, Any], cfg, cluster_order: str = "auto") -> dict:
  """Our parameter tree from their wrapper's state dict (module docstring).

  Args:
    state: name -> array, their names.
    cfg: the ModelConfig (``model_config_from_armt_hparams``).
    cluster_order: as ``params_from_state_dict``'s.

  Returns:
    Nested dict of float32 numpy arrays: the base model's
    (``params_from_state_dict``), ``armt_mem_tokens`` [N, d_model] and the
    per-layer ``armt_*`` stacked on a leading [n_layer] axis ([in, out]).

  Raises:
    ConvertError: a tensor missing, unknown or of the wrong shape, or a
      ``memory_cell.layers.*`` copy that differs from the model's, naming it.
  """
  base, memory, used = {}, {}, set()
  state = dict(state)
  for name in [n for n in state if n.startswith(CELL_LAYERS)]:  # the cell's copies
    twin = PREFIX + "transformer.layers." + name[len(CELL_LAYERS) :]
    copy = state.pop(name)
    if twin not in state:  # only the copy was saved: it is the layer's
      state[twin] = copy
    elif not np.array_equal(np.asarray(copy), np.asarray(state[twin])):
      raise ConvertError(f"{name} differs from {twin} (it is their cell's copy of it).")
  for name, value in state.items():
    if name == TOKENS:
      memory[name] = value
    elif name.startswith(PREFIX) and ".W_m" in name:
      memory[name] = value
    elif name.startswith(PREFIX):
      base[
          name[len(PREFIX) :].replace(".layer.", ".", 1)
          if ".layers." in name
          else name[len(PREFIX) :]
      ] = value
    else:
      raise ConvertError(
          f"unknown tensor {name!r} (their wrapper's names start with {PREFIX!r}, "
          f"{CELL_LAYERS!r} or are {TOKENS!r})."
      )
  base_cfg = dataclasses.replace(cfg, memory="xl", memory_settings=())
  params = params_from_state_dict(base, base_cfg, cluster_order)
  s = AssociativeMemory.settings(cfg)
  d, m = cfg.d_model, s.d_mem

  def take(name, shape):
    if name not in memory:
      raise ConvertError(f"missing tensor {name!r} (ARMT with {cfg.n_layer} layers).")
    x = np.asarray(memory[name])
    if x.shape != shape:
      raise ConvertError(f"{name} has shape {list(x.shape)}, expected {list(shape)}.")
    used.add(name)
    return finite(name, x)

  shapes: dict[str, tuple[int, ...]] = {
      "W_mq.weight": (m, d),
      "W_mk.weight": (m, d),
      "W_mv.weight": (d, d),
      "W_mb.weight": (1, d),
      "W_mb.bias": (1,),
  }
  for ours, (theirs, transpose) in LAYER_PARAMS.items():
    arrays = [
        take(f"{PREFIX}transformer.layers.{i}.{theirs}", shapes[theirs]) for i in range(cfg.n_layer)
    ]
    params["layers"][ours] = np.stack([a.T if transpose else a for a in arrays])
  params["armt_mem_tokens"] = take(TOKENS, (s.num_mem_tokens, d))
  extra = sorted(set(memory) - used)
  if extra:
    raise ConvertError(f"unknown tensors {extra[:4]} (the model has {cfg.n_layer} layers).")
  return params
