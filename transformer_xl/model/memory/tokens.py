"""Memory tokens: the Recurrent Memory Transformer (Bulatov, Kuratov, Burtsev
2022, "Recurrent Memory Transformer", arXiv 2207.06881), as the authors'
fork of the reference code implements it (booydar/LM-RMT,
``pytorch/mem_transformer.py``: ``MemTransformerLM`` with
``num_mem_tokens``, ``mem_at_end``, ``read_mem_from_cache``).

An add-on ``MemoryVariant`` (``variant.py``), on when
``model.tokens.num_mem_tokens`` > 0 (``TokenSettings``): the tokens go
beside the memory ``model.memory`` chooses (the XL cache with any mem_len,
0 included; the compressive memory).  N = num_mem_tokens tokens are read at
the start of each segment and, with ``mem_at_end``, written at its end: the
layers run on the extended segment of E = N + T (+ N) positions

    [read tokens; segment; write tokens]        (``extend_segment``)

and everything else follows from that, as in the authors' ``_forward``:

* the relative positions count every position of the extended segment
  (their ``pos_seq`` runs over klen = mlen + E): the model builds R for
  K = M + E keys;
* the XL cache is the last M of [cache; extended segment] per layer
  (their ``_update_mems`` over the extended hidden states): memory-token
  positions enter the cache like segment positions, and the count
  advances by E (``advance_mlen``);
* the mask (``token_mask``): read rows see each other (all N, in both
  directions) and the valid cache slots only with ``read_mem_from_cache``;
  write rows see everything causally before them (the segment and the read
  tokens), each other (all N) and the cache only with
  ``read_mem_from_cache``; segment rows see the cache, the read tokens and
  the segment causally, never the write tokens.  With ``same_length``
  their code builds the plain same_length mask over the extended segment
  and drops these rules: so does ``token_mask``;
* where a memory-token row sees a key after it (distance < 0), the
  reference's relative shift (Appendix B's trick, ``rel_shift``) leaves the
  position term of a neighbouring entry there; exact parity needs the same
  numbers (``future_position_scores``);
* the loss is on the T segment positions; the written tokens are the final
  hidden states (after the model's last dropout, as theirs) at the write
  positions, or at the read positions without ``mem_at_end``
  (``split_segment``), and the next segment reads them
  (``write_tokens``, ``read_tokens``).

The state is two arrays of ``Memory.variant_state`` (``mem_tokens_BxNxD``,
``mem_tokens_fresh_B``; absent when num_mem_tokens = 0, so the pytree and
the checkpoints of other models are unchanged); the learned initial tokens
are the model parameter ``mem_tokens`` [N, d_model] (``token_param``), read
by rows that start a stream or are reset (``MemoryTokens.reset``).  The
written tokens keep their gradient (``write_tokens``): a training step over
several segments (``train.mem_backprop_depth``, training/) backpropagates
through them; between steps the memory is data.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_xl.model.memory.state import Leaf, Memory
from transformer_xl.model.memory.variant import MemoryVariant, register

if TYPE_CHECKING:
  from transformer_xl.model.config import ModelConfig

Array = jax.Array

MEM_TOKENS_PARAM = "mem_tokens"  # the learned initial tokens, [N, d_model]


@dataclasses.dataclass(frozen=True)
class TokenSettings:
  """``model.tokens``: the memory tokens' settings (the authors' names).

  Attributes:
    num_mem_tokens: N, memory tokens per segment (the authors'
      ``num_mem_tokens``): 0 = none, the memory of ``model.memory`` exactly.
      The layers run on [N read tokens; segment; N write tokens];
      attn_type 0, attention_impl "xla" (``MemoryTokens.config_problems``).
    mem_at_end: write tokens at the end of the segment, whose outputs the
      next segment reads (the authors' default, True); False: the outputs at
      the read positions are carried.
    read_mem_from_cache: the memory tokens also attend to the XL cache (the
      authors' ``read_mem_from_cache``; default False: they do not).
  """

  num_mem_tokens: int = 0
  mem_at_end: bool = True
  read_mem_from_cache: bool = False


def token_init(key: Array, shape: tuple[int, int], dtype: Any = jnp.float32) -> Array:
  """The authors' initial tokens (``init_mem_tokens``): ONE vector drawn
  from N(0, 1) and repeated N times (``[torch.randn(1, d_model)] * N`` lists
  the same tensor N times): [N, d_model]."""
  n, d = shape
  return jnp.broadcast_to(jax.random.normal(key, (1, d), dtype), (n, d))


def token_param(module: nn.Module, cfg: ModelConfig) -> Array:
  """The learned initial tokens, param ``mem_tokens`` [N, d_model] float32
  in ``module``'s scope (``TransformerXL.setup``)."""
  return module.param(
      MEM_TOKENS_PARAM,
      nn.with_logical_partitioning(token_init, (None, "embed")),
      (MemoryTokens.settings(cfg).num_mem_tokens, cfg.d_model),
      jnp.float32,
  )


def read_tokens(cfg: ModelConfig, memory: Memory, init_NxD: Array) -> Array:
  """The tokens a segment reads: the learned ``init_NxD`` for the fresh rows
  (``mem_tokens_fresh_B``), the carried ones for the others; [B, N,
  d_model] in the compute dtype.  The gradient reaches ``init_NxD`` from
  the fresh rows only (the authors' ``model.mem_tokens.repeat`` on the
  first segment, the detached written tokens after it)."""
  fresh_Bx1x1 = memory.variant_state["mem_tokens_fresh_B"][:, None, None]
  init_1xNxD = init_NxD.astype(cfg.compute_dtype)[None]
  carried_BxNxD = memory.variant_state["mem_tokens_BxNxD"].astype(cfg.compute_dtype)
  return jnp.where(fresh_Bx1x1, init_1xNxD, carried_BxNxD)


def extend_segment(cfg: ModelConfig, read_BxNxD: Array, emb_BxTxD: Array) -> Array:
  """[read tokens; segment embeddings; write tokens if ``mem_at_end``]:
  [B, E, d_model], E = N + T (+ N); the write tokens enter as copies of the
  read tokens (their ``torch.cat((word_emb, mem_tokens))``).  The tokens are
  not scaled by sqrt(d_model) as the word embeddings are (as theirs)."""
  parts = [read_BxNxD.astype(emb_BxTxD.dtype), emb_BxTxD]
  if MemoryTokens.settings(cfg).mem_at_end:
    parts.append(parts[0])
  return jnp.concatenate(parts, axis=1)


def token_mask(cfg: ModelConfig, mask_Bx1xExK: Array) -> Array:
  """The authors' mask rules for the memory tokens on top of the XL mask of
  the extended segment (``attention_ops.attention_mask`` over E queries and
  K = M + E keys).

  Their ``_forward`` (1 = masked there): ``mask[:N, mlen:mlen+N] = 0``,
  ``mask[:N, :mlen] = 1 - read_mem_from_cache`` and with ``mem_at_end``
  ``mask[-N:, -N:] = 0``, ``mask[-N:, :mlen] = 1 - read_mem_from_cache``;
  nothing with ``same_length`` (the plain mask, kept here as it is).  The
  cache slots a token row may see are the valid ones only (ours are
  right-aligned with empty slots masked, theirs are all valid).

  Returns:
    The new bool [B, 1, E, K] mask.
  """
  if cfg.same_length:
    return mask_Bx1xExK
  s = MemoryTokens.settings(cfg)
  n = s.num_mem_tokens
  e, k = mask_Bx1xExK.shape[2], mask_Bx1xExK.shape[3]
  m = k - e
  i_Ex1 = jnp.arange(e)[:, None]
  j_1xK = jnp.arange(k)[None, :]
  read_q_Ex1, read_k_1xK = i_Ex1 < n, (j_1xK >= m) & (j_1xK < m + n)
  write_q_Ex1 = (i_Ex1 >= e - n) & s.mem_at_end
  write_k_1xK = (j_1xK >= k - n) & s.mem_at_end
  token_slot_ExK = (read_q_Ex1 | write_q_Ex1) & (j_1xK < m)
  out = jnp.where(token_slot_ExK, mask_Bx1xExK & s.read_mem_from_cache, mask_Bx1xExK)
  return out | (read_q_Ex1 & read_k_1xK) | (write_q_Ex1 & write_k_1xK)


def future_position_scores(
    raw_HxBxExK: Array, bd_HxBxExK: Array, key_count_B: Array, n: int, mem_at_end: bool
) -> Array:
  """The position terms of memory-token rows at keys after them, as the
  authors' code computes them (exact parity needs them).

  The (b)+(d) scores are formed against every distance and shifted
  (``attention_ops.rel_shift``); at an entry (i, j) whose key comes after
  the query (j > i + M, the memory tokens' blocks, ``token_mask``) the
  shift leaves ``raw[i + 1, c]``, an entry of the next query's row: with
  their layout (mlen valid cache rows, no empty ones) that is the score of
  query i + 1 against distance ``mlen + E + 1 + i - j'`` (j' the key's
  index in the extended segment), 0 for j' = i + 1.  Ours has M - mlen
  empty slots in front (static shapes), which would move that column by
  M - mlen: this reads theirs.  The entries that no mask allows are left
  as they are.

  Args:
    raw_HxBxExK: float32 (q + v) . W_kR R against distances K-1 .. 0,
      before the shift.
    bd_HxBxExK: ``rel_shift(raw_HxBxExK)``.
    key_count_B: int32 [B], the valid cache slots (their mlen).
    n: num_mem_tokens (N).
    mem_at_end: the write block at the end of the extended segment.

  Returns:
    ``bd_HxBxExK`` with the read block (and the write block) corrected.
  """
  h, b, e, k = raw_HxBxExK.shape
  m = k - e
  i_NxN = jnp.arange(n)[:, None]
  j_NxN = jnp.arange(n)[None, :]
  col_BxNxN = jnp.clip((m - key_count_B)[:, None, None] + j_NxN - i_NxN - 2, 0, k - 1)
  col_HxBxNxN = jnp.broadcast_to(col_BxNxN[None], (h, b, n, n))
  for s in [0] + ([e - n] if mem_at_end else []):
    rows_N = jnp.minimum(jnp.arange(s + 1, s + n + 1), e - 1)  # query i + 1 (the last: unused)
    src_HxBxNxK = raw_HxBxExK[:, :, rows_N, :]
    got_HxBxNxN = jnp.take_along_axis(src_HxBxNxK, col_HxBxNxN, axis=-1)
    got_HxBxNxN = jnp.where(j_NxN == i_NxN + 1, 0.0, got_HxBxNxN)
    block = bd_HxBxExK[:, :, s : s + n, m + s : m + s + n]
    block = jnp.where(j_NxN > i_NxN, got_HxBxNxN.astype(block.dtype), block)
    bd_HxBxExK = bd_HxBxExK.at[:, :, s : s + n, m + s : m + s + n].set(block)
  return bd_HxBxExK


def split_segment(cfg: ModelConfig, h_BxExD: Array, tgt_len: int) -> tuple[Array, Array]:
  """(the segment's hidden states [B, T, d_model], the written tokens [B, N,
  d_model]) from the extended segment's final hidden states: the authors'
  ``pred_hid`` and ``mem_tokens_write`` (the write positions, or the read
  positions without ``mem_at_end``)."""
  s = MemoryTokens.settings(cfg)
  n = s.num_mem_tokens
  written_BxNxD = h_BxExD[:, -n:] if s.mem_at_end else h_BxExD[:, :n]
  return h_BxExD[:, n : n + tgt_len], written_BxNxD


def write_tokens(memory: Memory, written_BxNxD: Array) -> Memory:
  """The memory with ``written_BxNxD`` as the tokens the next segment reads
  (no row fresh).  The tokens keep their gradient (unlike the XL memory,
  ``layer_read``): a training step over several segments
  (``train.mem_backprop_depth``) backpropagates through them; between steps
  the memory is data, so nothing flows further back."""
  state = memory.variant_state
  return memory.with_state(
      mem_tokens_BxNxD=written_BxNxD.astype(state["mem_tokens_BxNxD"].dtype),
      mem_tokens_fresh_B=jnp.zeros_like(state["mem_tokens_fresh_B"]),
  )


@register
class MemoryTokens(MemoryVariant):
  """The memory tokens of the Recurrent Memory Transformer (module
  docstring), an add-on: on when ``model.tokens.num_mem_tokens`` > 0."""

  name = "tokens"
  ADDON = True
  Settings = TokenSettings
  LEGACY_KEYS = ("num_mem_tokens", "mem_at_end", "read_mem_from_cache")
  STATE = {
      "mem_tokens_BxNxD": Leaf(("batch", None, None)),
      "mem_tokens_fresh_B": Leaf(("batch",)),
  }
  DECODE_CACHE = False  # each pass would write tokens
  DOCUMENTS = False  # the tokens carry one stream
  WHOLE_SEGMENTS = True  # each segment reads and writes the tokens
  ONE_BLOCK = True  # the tokens see keys after them (future_position_scores reads row i + 1)
  GRADIENT_THROUGH_SEGMENTS = True
  ENABLE_HINT = "memory tokens: model.tokens.num_mem_tokens > 0"

  @classmethod
  def enabled(cls, settings):
    return settings.num_mem_tokens > 0

  @classmethod
  def settings_problems(cls, section):
    n = section["num_mem_tokens"]
    problems = [
        f"model.tokens.{key}={section[key]!r} must be True or False."
        for key in ("mem_at_end", "read_mem_from_cache")
        if not isinstance(section[key], bool)
    ]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
      problems.append(
          f"model.tokens.num_mem_tokens={n!r} must be an integer >= 0 (0 = no memory tokens)."
      )
    return problems

  @classmethod
  def config_problems(cls, fields):
    n = fields[cls.name]["num_mem_tokens"]
    problems = []
    if fields.get("attn_type", 0) != 0:
      problems.append(
          f"model.tokens.num_mem_tokens={n} needs model.attn_type=0 (the authors' attention; "
          f"got {fields['attn_type']}): set model.attn_type=0 or model.tokens.num_mem_tokens=0."
      )
    if fields.get("attention_impl", "xla") != "xla":
      problems.append(
          f"model.tokens.num_mem_tokens={n}: the memory tokens' mask is not expressible in the "
          "fused kernel: set model.attention_impl='xla'."
      )
    if fields.get("attn_block", -1) > 0:
      problems.append(
          f"model.tokens.num_mem_tokens={n}: memory tokens attend to keys after them, which "
          "the blockwise attention does not give them: set model.attn_block=0 (or -1)."
      )
    return problems

  @classmethod
  def run_problems(cls, fields, config):
    """Neither the sliding-window evaluation (front padding) nor documents
    masked apart inside a segment (``data.documents='reset'``,
    ``eval.documents='whole'``) carry the tokens."""
    n = fields[cls.name]["num_mem_tokens"]
    e, d = config.get("eval") or {}, config.get("data") or {}
    problems = []
    if e.get("method") == "sliding":
      problems.append(
          f"eval.method='sliding' does not carry memory tokens (model.tokens.num_mem_tokens="
          f"{n}): set eval.method='segments'."
      )
    if d.get("documents") == "reset":
      problems.append(
          f"data.documents='reset' (documents masked apart) does not carry memory tokens "
          f"(model.tokens.num_mem_tokens={n}): set data.documents='stream'."
      )
    if e.get("documents") == "whole":
      problems.append(
          f"eval.documents='whole' (documents masked apart) does not carry memory tokens "
          f"(model.tokens.num_mem_tokens={n}): set eval.documents='split'."
      )
    return problems

  @classmethod
  def extra_positions(cls, settings):
    return settings.num_mem_tokens * (2 if settings.mem_at_end else 1)

  @classmethod
  def example(cls):
    return {cls.name: {"num_mem_tokens": 2}}

  @classmethod
  def init_state(cls, cfg, batch_size):
    """Zeros [B, N, d_model] in the compute dtype, every row fresh (it reads
    the learned initial tokens)."""
    n = cls.settings(cfg).num_mem_tokens
    return {
        "mem_tokens_BxNxD": jnp.zeros((batch_size, n, cfg.d_model), cfg.compute_dtype),
        "mem_tokens_fresh_B": jnp.ones((batch_size,), jnp.bool_),
    }

  @classmethod
  def reset(cls, state, reset_B):
    """Reset rows read the learned initial tokens (``mem_tokens_fresh_B``)."""
    return {**state, "mem_tokens_fresh_B": state["mem_tokens_fresh_B"] | reset_B}

  @classmethod
  def model_params(cls, module, cfg):
    return token_param(module, cfg)

  @classmethod
  def extend(cls, cfg, params, memory, emb_BxTxD):
    return extend_segment(cfg, read_tokens(cfg, memory, params), emb_BxTxD)

  @classmethod
  def mask(cls, cfg, mask_Bx1xExK):
    return token_mask(cfg, mask_Bx1xExK)

  @classmethod
  def position_scores(cls, cfg, raw_HxBxExK, bd_HxBxExK, key_count_B):
    s = cls.settings(cfg)
    return future_position_scores(
        raw_HxBxExK, bd_HxBxExK, key_count_B, s.num_mem_tokens, s.mem_at_end
    )

  @classmethod
  def finish(cls, cfg, h_BxExD, memory, seg_len):
    h_BxTxD, written_BxNxD = split_segment(cfg, h_BxExD, seg_len)
    return h_BxTxD, write_tokens(memory, written_BxNxD)
