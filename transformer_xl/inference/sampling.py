"""The sampling rule: how the next token is drawn from the model's distribution.

``SamplingSettings`` (top-k, top-p, temperature; Appendix E of Dai et al.
2019 samples the 40 most probable tokens at temperature 1), checked when
made; ``filter_logits`` (the tempered logits restricted to the top-k /
nucleus support) and ``sample_tokens`` (one token per row, each row with
its own key; greedy at top_k=1), which run under jit with traced settings.
``generate.Generator`` calls them for every token it draws.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from transformer_xl import default_config

Array = jax.Array


_F32_TINY, _F32_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """How the next token is drawn from the model's distribution.

  Attributes:
    top_k: keep only the k most probable tokens (0 = all; 1 = greedy, the
      argmax); Appendix E uses 40.
    top_p: keep the smallest set of most probable tokens whose probability
      (after top_k, renormalised) reaches top_p; in (0, 1], 1 = all.
    temperature: logits are divided by it before top_p and the draw; finite
      and > 0 (as a float32).

  Raises:
    default_config.ConfigError (on construction): a value out of range.
  """

  top_k: int = 40
  top_p: float = 1.0
  temperature: float = 1.0

  def __post_init__(self):
    problems = []
    if not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
      problems.append(f"top_k={self.top_k} must be an integer >= 0 (0 = no top-k cut, 1 = greedy).")
    if not 0.0 < self.top_p <= 1.0:  # also refuses nan
      problems.append(f"top_p={self.top_p} must be in (0, 1] (1 = no nucleus cut).")
    # inf (or a value whose float32 is inf or 0) would make every logit tie: top_k and
    # top_p would keep the whole vocabulary and the draw would be uniform.
    t = float(self.temperature) if isinstance(self.temperature, numbers.Real) else math.nan
    if not (math.isfinite(t) and _F32_TINY <= t <= _F32_MAX):
      problems.append(
          f"temperature={self.temperature} must be > 0 and finite (1 = the model's "
          "distribution, < 1 sharper, > 1 flatter; for greedy decoding use top_k=1)."
      )
    if problems:
      raise default_config.ConfigError("Invalid sampling settings: " + " ".join(problems))


# filter_logits finds a top-k cut of at most this many tokens with lax.top_k
# instead of sorting the whole vocabulary (a sort of V logits per row and
# token is most of a small model's sampling step on a CPU).
TOP_K_FAST = 128


def filter_logits(logits_BxV: Array, top_k: Array, top_p: Array, temperature: Array) -> Array:
  """Tempered logits restricted to the top-k / nucleus support.

  The logits are divided by ``temperature``; then only the ``top_k`` largest
  are kept (all when top_k is 0), then, of those, the smallest prefix (by
  decreasing probability, renormalised over the top-k set) whose
  probability reaches ``top_p`` (all when top_p is 1).  A token tied with
  the last one kept is kept too.  Works under jit with traced settings.

  The cut is found on the largest ``TOP_K_FAST`` logits (``lax.top_k``)
  when 0 < top_k <= TOP_K_FAST, on the whole sorted vocabulary when
  another top_k meets top_p < 1, and not at all when neither cuts
  (``lax.switch``: only that branch runs); the three give the same cut.

  Args:
    logits_BxV: float [B, V] logits or log-probabilities.
    top_k: int32 scalar >= 0.
    top_p: float32 scalar in (0, 1].
    temperature: float32 scalar > 0.

  Returns:
    float32 [B, V]: ``logits / temperature`` on the support, -inf elsewhere
    (at least one entry per row, the largest, is finite).
  """
  x_BxV = logits_BxV.astype(jnp.float32) / temperature
  v = x_BxV.shape[-1]
  fast = min(v, TOP_K_FAST)

  def threshold(sorted_BxC: Array, k: Array) -> Array:
    """The smallest kept value, from the C largest logits in decreasing order."""
    in_k_BxC = (jnp.arange(sorted_BxC.shape[-1]) < k)[None, :]
    p_BxC = jax.nn.softmax(jnp.where(in_k_BxC, sorted_BxC, -jnp.inf), axis=-1)
    mass_before_BxC = jnp.cumsum(p_BxC, axis=-1) - p_BxC
    keep_BxC = in_k_BxC & ((mass_before_BxC < top_p) | (top_p >= 1.0))  # a prefix
    n_keep_B = jnp.maximum(jnp.sum(keep_BxC, axis=-1), 1)
    return jnp.take_along_axis(sorted_BxC, (n_keep_B - 1)[:, None], axis=-1)

  branches = [
      lambda x: threshold(jax.lax.top_k(x, fast)[0], top_k),  # small top_k
      lambda x: threshold(
          jnp.flip(jnp.sort(x, axis=-1), axis=-1),  # the rest
          jnp.where(top_k > 0, jnp.minimum(top_k, v), v),
      ),
      lambda x: jnp.full(x.shape[:1] + (1,), -jnp.inf, x.dtype),  # no cut
  ]
  which = jnp.where((top_k > 0) & (top_k <= fast), 0, jnp.where((top_k > 0) | (top_p < 1.0), 1, 2))
  threshold_Bx1 = jax.lax.switch(which, branches, x_BxV)
  return jnp.where(x_BxV >= threshold_Bx1, x_BxV, -jnp.inf)


def sample_tokens(
    keys_B: Array, logits_BxV: Array, top_k: Array, top_p: Array, temperature: Array
) -> Array:
  """One token per row: the argmax when ``top_k == 1`` (greedy), otherwise a
  draw (``jax.random.categorical``) from ``filter_logits``, row b with
  its own key ``keys_B[b]`` (so a row's draw does not depend on the others).

  Args:
    keys_B: PRNG keys, one per row ([B, 2] uint32, or typed keys [B]).
    logits_BxV: float [B, V] logits or log-probabilities.
    top_k: as in ``SamplingSettings`` (a scalar, may be traced).
    top_p: likewise.
    temperature: likewise.

  Returns:
    int32 [B] token ids.
  """
  greedy_B = jnp.argmax(logits_BxV, axis=-1)
  drawn_B = jax.vmap(jax.random.categorical)(
      keys_B, filter_logits(logits_BxV, top_k, top_p, temperature)
  )
  return jnp.where(top_k == 1, greedy_B, drawn_B).astype(jnp.int32)
