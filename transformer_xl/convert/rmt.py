"""The Recurrent Memory Transformer's models (the authors' fork) -> ours.

Bulatov et al. 2022 (arXiv 2207.06881) implemented memory tokens in a fork of
the reference PyTorch code (booydar/LM-RMT, ``pytorch/mem_transformer.py``).
Its ``MemTransformerLM`` takes the reference constructor's arguments plus
``num_mem_tokens``, ``read_mem_from_cache`` and ``mem_at_end`` (``RMT_HPARAMS``),
and its state dict holds the reference's names plus ``mem_tokens``
[num_mem_tokens, 1, d_model] (the learned initial tokens).  The reference
part goes through ``hparams.load_hparams`` and
``pytorch.params_from_state_dict``; this module adds the fork's part
(``model.tokens.num_mem_tokens``, ``mem_at_end``, ``read_mem_from_cache``
and the parameter ``mem_tokens`` [N, d_model]).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_xl.convert.errors import ConvertError
from transformer_xl.convert.hparams import check_hparams, model_config_from_hparams, read_hparams
from transformer_xl.convert.pytorch import finite, params_from_state_dict
from transformer_xl.model.memory.tokens import MemoryTokens

# The fork's constructor arguments beyond the reference's, with its defaults
# (``MemTransformerLM.__init__``: num_mem_tokens=None, which it uses as 0).
RMT_HPARAMS = {"num_mem_tokens": 0, "read_mem_from_cache": False, "mem_at_end": True}
MEM_TOKENS = "mem_tokens"  # the fork's state-dict name of the initial tokens
# The fork keeps the adaptive projections as module attributes
# (``word_emb.emb_projs_0``, ``crit.out_projs_0``: "parameter list is not
# supported by DataParallel") where the reference has ParameterLists
# (``word_emb.emb_projs.0``, ``crit.out_projs.0``).
_FORK_LISTS = ("word_emb.emb_projs_", "crit.out_projs_")


def reference_names(state: Mapping[str, Any]) -> dict:
  """The fork's state dict under the reference's names (``_FORK_LISTS``
  renamed; the other names are the reference's already)."""
  out = {}
  for name, value in state.items():
    for prefix in _FORK_LISTS:
      if name.startswith(prefix) and name[len(prefix) :].isdigit():
        name = f"{prefix[:-1]}.{name[len(prefix):]}"
    out[name] = value
  return out


def is_rmt_hparams(raw: Mapping[str, Any]) -> bool:
  """Whether constructor arguments are the fork's (they name one of ``RMT_HPARAMS``)."""
  return any(k in raw for k in RMT_HPARAMS)


def load_rmt_hparams(source: str | Mapping[str, Any]) -> dict:
  """The fork's constructor arguments, checked: ``load_hparams`` of the
  reference's, plus ``RMT_HPARAMS`` (defaults filled in).

  Args:
    source: path of a JSON file, or the dict itself (``read_hparams``).

  Raises:
    ConvertError: the reference's problems (``load_hparams``), a fork
      argument of the wrong type, or memory tokens with what ours does not
      carry them with (``MemoryTokens.config_problems``: attn_type != 0).
  """
  raw, where = read_hparams(source)
  fork = {k: raw.pop(k, v) for k, v in RMT_HPARAMS.items()}
  if fork["num_mem_tokens"] is None:  # their default
    fork["num_mem_tokens"] = 0
  n = fork["num_mem_tokens"]
  if isinstance(n, bool) or not isinstance(n, int) or n < 0:
    raise ConvertError(f"{where}: num_mem_tokens={n!r} must be an integer >= 0.")
  for k in ("read_mem_from_cache", "mem_at_end"):
    if not isinstance(fork[k], bool):
      raise ConvertError(f"{where}: {k}={fork[k]!r} must be true or false.")
  hp = {**check_hparams(raw, where), **fork}
  try:
    model_config_from_rmt_hparams(hp)
  except ValueError as err:
    raise ConvertError(f"{where}: {err}") from None
  return hp


def model_config_from_rmt_hparams(hp: Mapping[str, Any], n_token: int | None = None):
  """Our ``ModelConfig`` of the fork's checked hparams (``load_rmt_hparams``):
  ``hparams.model_config_from_hparams`` with the memory-token fields.

  Raises:
    ValueError: what the model refuses (``ModelConfig``).
  """
  base = {k: v for k, v in hp.items() if k not in RMT_HPARAMS}
  cfg = model_config_from_hparams(base, n_token)
  return cfg.with_memory(MemoryTokens.name, **{k: hp[k] for k in RMT_HPARAMS})


def params_from_rmt_state_dict(state: Mapping[str, Any], cfg, cluster_order: str = "auto") -> dict:
  """Our parameter tree from the fork's state dict.

  Args:
    state: name -> array, the fork's names: the reference's
      (``params_from_state_dict``; the projections as ``reference_names``
      reads them) plus ``mem_tokens`` [N, 1, d_model] when
      the model has memory tokens (``model.tokens.num_mem_tokens`` > 0).
    cfg: the ModelConfig (``model_config_from_rmt_hparams``).
    cluster_order: as ``params_from_state_dict``'s.

  Returns:
    Nested dict of float32 numpy arrays, with ``mem_tokens`` [N, d_model].

  Raises:
    ConvertError: the reference part's problems, or ``mem_tokens`` missing,
      unexpected or of the wrong shape.
  """
  rest = reference_names(state)
  tokens = rest.pop(MEM_TOKENS, None)
  n = MemoryTokens.settings(cfg).num_mem_tokens
  if n == 0:
    if tokens is not None:
      raise ConvertError(
          f"state dict has {MEM_TOKENS!r} but num_mem_tokens=0 in the hparams; set "
          f"num_mem_tokens={np.shape(tokens)[0]}."
      )
    return params_from_state_dict(rest, cfg, cluster_order)
  if tokens is None:
    raise ConvertError(
        f"state dict lacks {MEM_TOKENS!r} (expected shape ({n}, 1, {cfg.d_model})); check "
        "num_mem_tokens in the hparams."
    )
  tokens = finite(MEM_TOKENS, tokens)
  if tokens.shape != (n, 1, cfg.d_model):
    raise ConvertError(
        f"{MEM_TOKENS}: expected shape ({n}, 1, {cfg.d_model}) from the hparams, got "
        f"{tokens.shape}; check num_mem_tokens and d_model."
    )
  params = params_from_state_dict(
      rest, cfg.with_memory(MemoryTokens.name, num_mem_tokens=0), cluster_order
  )
  params[MEM_TOKENS] = tokens[:, 0, :].copy()
  return params
