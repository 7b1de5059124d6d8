"""The model's memory: one package, the only place that knows it.

Transformer-XL's recurrence memory (Dai et al. 2019, Sec. 3.2) and its
successors, as explicit state: a ``Memory`` goes into every call of the
model and the next ``Memory`` comes out.  Everything else of the package
imports this package (``from transformer_xl.model import memory``) and
goes through the names below; a new memory variant is a module here,
registered with ``register`` and imported below.

* ``state.py``: the ``Memory`` pytree (its fields, row axes and
  shardings), ``init_memory``, ``reset``, the layer's read and update, the
  key layout, and ``MemoryVariant``, the interface of the ways to fill the
  slots (its base class is the XL memory; ``model.memory`` names one);
* ``compressive.py``: the compressive memory (Rae et al. 2020),
  ``model.memory="compressive"``;
* ``tokens.py``: the memory tokens of the Recurrent Memory Transformer
  (Bulatov et al. 2022), ``model.num_mem_tokens`` > 0, beside any of them.

``config_problems`` and ``eval_problems`` validate the settings of all of
them (``model/config.py``, ``default_config.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformer_xl.model.memory import compressive as compressive
from transformer_xl.model.memory import state as state
from transformer_xl.model.memory import tokens as tokens
from transformer_xl.model.memory.compressive import CMEM_FNS as CMEM_FNS
from transformer_xl.model.memory.compressive import CMEM_LEARNED as CMEM_LEARNED
from transformer_xl.model.memory.compressive import CMEM_PARAMS as CMEM_PARAMS
from transformer_xl.model.memory.compressive import RECON_LOSS as RECON_LOSS
from transformer_xl.model.memory.compressive import CompressiveMemory as CompressiveMemory
from transformer_xl.model.memory.compressive import compress as compress
from transformer_xl.model.memory.compressive import compressive_count as compressive_count
from transformer_xl.model.memory.compressive import content_attention as content_attention
from transformer_xl.model.memory.compressive import eval_problems as eval_problems
from transformer_xl.model.memory.compressive import own_optimiser as own_optimiser
from transformer_xl.model.memory.state import VARIANTS as VARIANTS
from transformer_xl.model.memory.state import Memory as Memory
from transformer_xl.model.memory.state import MemoryVariant as MemoryVariant
from transformer_xl.model.memory.state import advance_mlen as advance_mlen
from transformer_xl.model.memory.state import has_tokens as has_tokens
from transformer_xl.model.memory.state import init_memory as init_memory
from transformer_xl.model.memory.state import layer_read as layer_read
from transformer_xl.model.memory.state import layer_update as layer_update
from transformer_xl.model.memory.state import register as register
from transformer_xl.model.memory.state import reset_memory as reset_memory
from transformer_xl.model.memory.state import variant as variant
from transformer_xl.model.memory.tokens import MEM_TOKENS_PARAM as MEM_TOKENS_PARAM
from transformer_xl.model.memory.tokens import TokenMask as TokenMask
from transformer_xl.model.memory.tokens import extend_segment as extend_segment
from transformer_xl.model.memory.tokens import future_position_scores as future_position_scores
from transformer_xl.model.memory.tokens import read_tokens as read_tokens
from transformer_xl.model.memory.tokens import split_segment as split_segment
from transformer_xl.model.memory.tokens import token_config_problems as token_config_problems
from transformer_xl.model.memory.tokens import token_init as token_init
from transformer_xl.model.memory.tokens import token_mask as token_mask
from transformer_xl.model.memory.tokens import token_param as token_param
from transformer_xl.model.memory.tokens import token_run_problems as token_run_problems
from transformer_xl.model.memory.tokens import write_tokens as write_tokens


def config_problems(fields: Mapping[str, Any]) -> list[str]:
  """Problems of ``model.memory``, of the compressive memory's fields
  (``compressive.field_problems``), of what the variant needs
  (``MemoryVariant.config_problems``) and of the memory tokens
  (``tokens.token_config_problems``); [] if none.

  Args:
    fields: the model fields (``model.<key>`` -> value).
  """
  name = fields.get("memory", "xl")
  problems = compressive.field_problems(fields)
  if name not in VARIANTS:
    return problems + [f"model.memory={name!r}: use one of {tuple(sorted(VARIANTS))}."]
  return problems + VARIANTS[name].config_problems(fields) + token_config_problems(fields)
