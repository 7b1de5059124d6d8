"""The associative memory of ARMT (Rodkin, Kuratov, Bulatov, Burtsev 2024,
"Associative Recurrent Memory Transformer", arXiv 2407.04841), as pure
functions: one layer's read and write, exact to the authors' code
(RodkinIvan/associative-recurrent-memory-transformer,
``modeling_amt/language_modeling.py``: ``DPFP``,
``AssociativeLayerWrapper.associate`` and ``update_mem``), checked against
fixtures made by running it (``scripts/make_armt_fixtures.py``,
``tests/test_armt_memory.py``).

Per layer and row, the memory is a matrix ``A`` [d_key, d_model] and a
normaliser ``z`` [d_key], both zeros at a row's start, with
``d_key = 2 nu d_mem`` (nu = 3, the DPFP features of a d_mem projection).

* **Read** (before the layer, every row of the segment, memory-token rows
  included): ``q = phi(h W_q)``, ``read = q A / (q . z + 1e-5)``, added to
  the layer's input ``h``.  The authors skip it in a row's first segment,
  where ``A = 0`` makes it exactly 0 anyway: here it always runs.
* **Write** (after the layer, from its outputs ``m`` at the N memory-token
  rows, all from the segment's pre-write state): ``k = phi(m W_k)``, ``v =
  m W_v`` (``W_v`` starts at zeros: an untrained model reads 0), the value
  already stored under ``k``, ``v_old = k A / (k . z + 1e-5)`` (0 in a row's
  first segment), the write gate ``b = sigmoid(m w_b + b_b)``; then ``A +=
  sum_n b_n k_n (v_n - v_old_n)^T`` and ``z += sum_n g_n k_n``, where the
  correction ``g_n = clip(1 - (k_n . z + 1e-5) / (|k_n|^2 + 1e-5), 0, 1)``,
  held constant for the gradient (``detach``), is 1 in a row's first
  segment and without ``correction``.

Traits of their code kept (each said in the docs): the write gate enters
the matrix's update and not the normaliser's; the correction enters the
normaliser's and not the matrix's; denominators add a plain 1e-5 (a read
where ``q . z`` is near -1e-5 is large: the tests compare such rows with a
relative tolerance).  ``phi`` is their DPFP with nu = 3 (Schlag et al.
2021): ``x' = [relu(x), relu(-x)]``, then ``concat_j (x' * roll(x', j))``
for j = 1..nu.

Shapes: B rows, T positions of the segment (memory-token rows last), N
memory tokens, D = d_model, M = d_mem, K = d_key.  Weights are stored as
``[in, out]`` (a flax Dense kernel; the authors' torch ``Linear.weight``
transposed).

The memory variant ``model.memory="armt"`` (``AssociativeMemory``) carries
them through a model, as the authors' ``AssociativeMemoryCell`` wraps a
HuggingFace model: N learned memory tokens appended at the end of every
segment (the same tokens each segment: only the matrices recur), each
layer reading before it and writing after it, the memory-token positions
dropped from the output.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_xl.model.memory.state import Leaf
from transformer_xl.model.memory.variant import MemoryVariant, register

Array = jax.Array

NU = 3  # their DPFP(nu=3)
EPS = 1e-5  # their denominators' constant


def d_key(d_mem: int, nu: int = NU) -> int:
  """K = 2 nu d_mem: the width of the DPFP features."""
  return 2 * nu * d_mem


def dpfp(x: Array, nu: int = NU) -> Array:
  """Deterministic parameter-free projection (their ``DPFP``): [..., M] ->
  [..., 2 nu M], non-negative."""
  x = jnp.concatenate([jax.nn.relu(x), jax.nn.relu(-x)], axis=-1)
  rolled = jnp.concatenate([jnp.roll(x, j, axis=-1) for j in range(1, nu + 1)], axis=-1)
  return jnp.concatenate([x] * nu, axis=-1) * rolled


def read(A_BxKxD: Array, z_BxK: Array, h_BxTxD: Array, w_q_DxM: Array) -> Array:
  """What each row reads (their ``associate``): ``phi(h W_q) A / (phi(h W_q)
  . z + 1e-5)``, [B, T, D] in ``h``'s dtype; the layer's input is ``h`` plus
  this."""
  q_BxTxK = dpfp(h_BxTxD @ w_q_DxM)
  num_BxTxD = jnp.einsum("btk,bkd->btd", q_BxTxK, A_BxKxD)
  denom_BxTx1 = jnp.einsum("bk,btk->bt", z_BxK, q_BxTxK)[..., None] + EPS
  return (num_BxTxD / denom_BxTx1).astype(h_BxTxD.dtype)


def write(
    A_BxKxD: Array,
    z_BxK: Array,
    m_BxNxD: Array,
    w_k_DxM: Array,
    w_v_DxD: Array,
    w_b_Dx1: Array,
    b_b_1: Array,
    first_B: Array,
    correction: bool = True,
) -> tuple[Array, Array]:
  """The matrix and normaliser after one segment's write (their
  ``update_mem``), from the layer's outputs at the memory-token rows.

  Args:
    A_BxKxD: the matrix before the write.
    z_BxK: the normaliser before the write.
    m_BxNxD: the layer's outputs at the N memory-token rows.
    w_k_DxM: the key projection.
    w_v_DxD: the value projection.
    w_b_Dx1: the write gate's weights.
    b_b_1: the write gate's bias.
    first_B: bool [B], rows writing for the first time since their start
      (no stored value to subtract, correction 1).
    correction: their ``correction`` (the normaliser's update scaled by the
      share of the key not yet stored).

  Returns:
    (A_BxKxD, z_BxK), float32.
  """
  k_BxNxK = dpfp(m_BxNxD @ w_k_DxM)
  v_BxNxD = m_BxNxD @ w_v_DxD
  num_BxNxD = jnp.einsum("bnk,bkd->bnd", k_BxNxK, A_BxKxD)
  denom_BxNx1 = jnp.einsum("bk,bnk->bn", z_BxK, k_BxNxK)[..., None] + EPS
  first_Bx1x1 = first_B[:, None, None]
  old_BxNxD = jnp.where(first_Bx1x1, 0.0, num_BxNxD / denom_BxNx1)
  if correction:
    share = 1 - denom_BxNx1 / (jnp.sum(k_BxNxK**2, axis=-1, keepdims=True) + EPS)
    coef_BxNx1 = jax.lax.stop_gradient(jnp.clip(share, 0, 1))
    coef_BxNx1 = jnp.where(first_Bx1x1, 1.0, coef_BxNx1)
  else:
    coef_BxNx1 = jnp.ones_like(denom_BxNx1)
  gate_BxN = jax.nn.sigmoid(m_BxNxD @ w_b_Dx1 + b_b_1)[..., 0]
  A_BxKxD = A_BxKxD + jnp.einsum("bnk,bnd,bn->bkd", k_BxNxK, v_BxNxD - old_BxNxD, gate_BxN)
  z_BxK = z_BxK + jnp.sum(coef_BxNx1 * k_BxNxK, axis=1)
  return A_BxKxD, z_BxK


# ---- The memory variant: model.memory = "armt" -------------------------------------


@dataclasses.dataclass(frozen=True)
class ARMTSettings:
  """``model.armt``: the associative memory's settings (the authors' names;
  defaults as their BABILong run script, ``scripts/babilong/finetune_babilong_amt.sh``).

  Attributes:
    num_mem_tokens: N, memory tokens appended to every segment (their
      ``MEMORY_SIZE``: 10); their outputs write the memory.
    d_mem: M, the width of the query and key projections (their
      ``D_MEM``: 64); the matrix has d_key = 6 M rows.
    correction: their ``correction`` (True unless ``--no_correction``).
  """

  num_mem_tokens: int = 10
  d_mem: int = 64
  correction: bool = True


TOKENS_PARAM = "armt_mem_tokens"  # the learned memory tokens, [N, d_model]
_PER_LAYER = Leaf(("layers", "batch", None, None))


def _torch_linear_init(fan_in: int):
  """torch.nn.Linear's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / fan_in**0.5
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


@register
class AssociativeMemory(MemoryVariant):
  """ARMT's associative memory (module docstring), ``model.memory="armt"``:
  the XL cache (any ``mem_len``, 0 as the authors) and, per layer, the
  matrix and normaliser that the memory tokens write and every position
  reads.

  State (per layer): ``armt_A_LxBxKxD`` and ``armt_z_LxBxK`` (float32,
  zeros at a row's start; the gradient flows through them from segment to
  segment within ``train.mem_backprop_depth``, as the authors train through
  every segment of an example), ``armt_first_LxB`` (bool: no write yet
  since the row's start).  Parameters: the tokens ``armt_mem_tokens`` [N,
  d_model] (N(0, init_std): theirs are N(0, 1) times the embedding's
  standard deviation) and per layer ``armt_w_q``, ``armt_w_k`` [D, M],
  ``armt_w_v`` [D, D] (zeros), ``armt_w_b`` [D, 1], ``armt_b_b`` [1]
  (torch's ``Linear`` initialisation).

  Beyond the authors' code (their Transformer-XL use needs ``mem_len`` 0):
  with ``mem_len`` > 0 the XL cache holds the layers' inputs after the
  read, memory-token positions included (as ``model.tokens``' do).
  """

  name = "armt"
  Settings = ARMTSettings
  STATE = {
      "armt_A_LxBxKxD": _PER_LAYER,
      "armt_z_LxBxK": Leaf(("layers", "batch", None)),
      "armt_first_LxB": Leaf(("layers", "batch")),
  }
  DECODE_CACHE = False  # each pass writes the matrices
  DOCUMENTS = False  # the matrices are per row: documents inside a segment are not kept apart
  WHOLE_SEGMENTS = True  # every segment ends with its memory tokens
  GRADIENT_THROUGH_SEGMENTS = True
  ENABLE_HINT = "the associative memory: model.memory='armt'"

  @classmethod
  def settings_problems(cls, section):
    problems = []
    for key in ("num_mem_tokens", "d_mem"):
      n = section[key]
      if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        problems.append(f"model.armt.{key}={n!r} must be an integer >= 1.")
    if not isinstance(section["correction"], bool):
      problems.append(f"model.armt.correction={section['correction']!r} must be True or False.")
    return problems

  @classmethod
  def config_problems(cls, fields):
    tokens = (fields.get("tokens") or {}).get("num_mem_tokens", 0)
    if tokens:
      return [
          f"model.tokens.num_mem_tokens={tokens} with model.memory='armt': ARMT has its own "
          "memory tokens (model.armt.num_mem_tokens); set model.tokens.num_mem_tokens=0."
      ]
    return []

  @classmethod
  def run_problems(cls, fields, config):
    """Neither the sliding-window evaluation (each window from an empty
    memory) nor documents masked apart inside a segment carry the matrices."""
    e, d = config.get("eval") or {}, config.get("data") or {}
    problems = []
    if e.get("method") == "sliding":
      problems.append(
          "eval.method='sliding' does not carry the associative memory (model.memory='armt'): "
          "set eval.method='segments'."
      )
    if d.get("documents") == "reset":
      problems.append(
          "data.documents='reset' (documents masked apart) does not carry the associative "
          "memory (model.memory='armt'): set data.documents='stream'."
      )
    if e.get("documents") == "whole":
      problems.append(
          "eval.documents='whole' (documents masked apart) does not carry the associative "
          "memory (model.memory='armt'): set eval.documents='split'."
      )
    return problems

  @classmethod
  def extra_positions(cls, settings):
    return settings.num_mem_tokens

  @classmethod
  def example(cls):
    return {"memory": cls.name, cls.name: {"num_mem_tokens": 2, "d_mem": 4}}

  @classmethod
  def init_state(cls, cfg, batch_size):
    k = d_key(cls.settings(cfg).d_mem)
    n = cfg.n_layer
    return {
        "armt_A_LxBxKxD": jnp.zeros((n, batch_size, k, cfg.d_model), jnp.float32),
        "armt_z_LxBxK": jnp.zeros((n, batch_size, k), jnp.float32),
        "armt_first_LxB": jnp.ones((n, batch_size), jnp.bool_),
    }

  @classmethod
  def reset(cls, state, reset_B):
    keep = ~reset_B
    return {
        "armt_A_LxBxKxD": state["armt_A_LxBxKxD"] * keep[None, :, None, None],
        "armt_z_LxBxK": state["armt_z_LxBxK"] * keep[None, :, None],
        "armt_first_LxB": state["armt_first_LxB"] | reset_B[None, :],
    }

  @classmethod
  def model_params(cls, module, cfg):
    n = cls.settings(cfg).num_mem_tokens
    init = nn.initializers.normal(stddev=cfg.init_std)
    return module.param(
        TOKENS_PARAM, nn.with_logical_partitioning(init, (None, "embed")), (n, cfg.d_model)
    )

  @classmethod
  def extend(cls, cfg, params, memory, emb_BxTxD):
    tokens_BxNxD = jnp.broadcast_to(
        params.astype(emb_BxTxD.dtype)[None], (emb_BxTxD.shape[0], *params.shape)
    )
    return jnp.concatenate([emb_BxTxD, tokens_BxNxD], axis=1)

  @classmethod
  def _params(cls, layer, cfg):
    """The layer's projections (parameters in ``layer``'s scope), [in, out]."""
    d, m = cfg.d_model, cls.settings(cfg).d_mem

    def p(name, init, shape):  # created by the first hook of the layer, read by the second
      if layer.has_variable("params", name):
        return nn.unbox(layer.get_variable("params", name))
      return layer.param(
          name, nn.with_logical_partitioning(init, (None,) * len(shape)), shape, jnp.float32
      )

    return {
        "w_q": p("armt_w_q", _torch_linear_init(d), (d, m)),
        "w_k": p("armt_w_k", _torch_linear_init(d), (d, m)),
        "w_v": p("armt_w_v", nn.initializers.zeros, (d, d)),
        "w_b": p("armt_w_b", _torch_linear_init(d), (d, 1)),
        "b_b": p("armt_b_b", _torch_linear_init(d), (1,)),
    }

  @classmethod
  def before_layer(cls, layer, cfg, h_BxExD, state, key_count_B):
    w = cls._params(layer, cfg)
    r = read(state["armt_A_LxBxKxD"], state["armt_z_LxBxK"], h_BxExD.astype(jnp.float32), w["w_q"])
    return (h_BxExD + r.astype(h_BxExD.dtype)), state

  @classmethod
  def after_layer(cls, layer, cfg, out_BxExD, state, key_count_B):
    s = cls.settings(cfg)
    w = cls._params(layer, cfg)
    m_BxNxD = out_BxExD[:, -s.num_mem_tokens :].astype(jnp.float32)
    A, z = write(
        state["armt_A_LxBxKxD"],
        state["armt_z_LxBxK"],
        m_BxNxD,
        w["w_k"],
        w["w_v"],
        w["w_b"],
        w["b_b"],
        state["armt_first_LxB"],
        s.correction,
    )
    first = jnp.zeros_like(state["armt_first_LxB"])
    return out_BxExD, {"armt_A_LxBxKxD": A, "armt_z_LxBxK": z, "armt_first_LxB": first}

  @classmethod
  def finish(cls, cfg, h_BxExD, memory, seg_len):
    return h_BxExD[:, :seg_len], memory
