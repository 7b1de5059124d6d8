r"""Appendix C's definitions of RECL as pure numpy functions (Dai et al. 2019).

The model group's per-token losses l_i(c, t) (float [N models, C context
lengths, n tokens], nats) go in; the baseline b(c, t) (C.2), the top-r hard
positions (C.3), the relative loss f_i(c, c') (C.4), the relative gain
g_i(c, c') (C.5) and the RECL walk with its 0.01 threshold (C.6) come out.
The definitions, and the details Appendix C leaves open (|T| = ceil(r n),
ties, the walk's steps, the lower bound), are written out in
``transformer_xl.analysis.recl``, the command line that measures the
losses; this module holds only the arithmetic, so that it can be read and
tested on hand-made arrays.

The paper gives no code for RECL; the reference implementation
(kimiyoung/transformer-xl) has none either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_THRESHOLD = 0.01  # Appendix C, step 2 of the algorithm

# --------------------------------------------------------------------------- #
# The definitions of Appendix C: pure functions of numpy arrays.


def _losses(losses_NxCxT: Any) -> np.ndarray:
  """``losses_NxCxT`` as float64, checked: 3-D, non-empty, finite."""
  x = np.asarray(losses_NxCxT, dtype=np.float64)
  if x.ndim != 3 or 0 in x.shape:
    raise ValueError(
        f"losses must be a non-empty array [N models, C context lengths, n "
        f"tokens]; got shape {x.shape}."
    )
  if not np.all(np.isfinite(x)):
    raise ValueError("losses must be finite (every token scored at every context length).")
  return x


def baseline(losses_NxCxT: Any) -> np.ndarray:
  """b(c, t) = min_i l_i(c, t) (Appendix C, C.2).

  Args:
    losses_NxCxT: l_i(c, t), float [N, C, n], nats: model i, the c-th
      context length, token t.

  Returns:
    float64 [C, n], nats.

  Raises:
    ValueError: not a non-empty 3-D array of finite values.
  """
  return _losses(losses_NxCxT).min(axis=0)


def top_r_count(num_tokens: int, r: float) -> int:
  """|T| of (C.3): ceil(r * num_tokens), at least 1 (this module's choice; the
  paper says "top-r positions").  r * n is rounded to 9 decimals first so
  that e.g. r = 0.3, n = 10 gives 3, not 4.

  Raises:
    ValueError: r outside (0, 1] or num_tokens < 1.
  """
  if not 0.0 < r <= 1.0:
    raise ValueError(f"r must be in (0, 1]; got {r}.")
  if num_tokens < 1:
    raise ValueError(f"num_tokens must be >= 1; got {num_tokens}.")
  return max(1, min(num_tokens, math.ceil(round(r * num_tokens, 9))))


def top_r_positions(b_T: Any, r: float) -> np.ndarray:
  """T of (C.3): the top-r positions t with the largest b(c, t).

  Args:
    b_T: b(c, t) for one c, float [n], nats.
    r: the ratio, in (0, 1].

  Returns:
    int64 [top_r_count(n, r)]: the positions, ascending.  Ties in b are
    broken by stream order (the earlier position is taken first).

  Raises:
    ValueError: r outside (0, 1]; b_T not a non-empty 1-D array.
  """
  b = np.asarray(b_T, dtype=np.float64)
  if b.ndim != 1 or b.size == 0:
    raise ValueError(f"b must be a non-empty 1-D array; got shape {b.shape}.")
  k = top_r_count(b.size, r)
  order = np.argsort(-b, kind="stable")  # descending b, earlier t first among ties
  return np.sort(order[:k]).astype(np.int64)


def relative_loss(losses_NxCxT: Any, c: int, c_prime: int, r: float) -> np.ndarray:
  """f_i(c, c') of (C.4) for every model i of the group.

  f_i(c, c') = 1/|T| sum_{t in T} min(b(c, t), l_i(c', t)), T the top-r
  positions of b(c, .).

  Args:
    losses_NxCxT: l_i(c, t), float [N, C, n], nats.
    c: index into the context-length axis (C) of the short length c.
    c_prime: index of the long length c' (Appendix C assumes c' >= c; not
      enforced, so that f_i(c, c) is the same call).
    r: the ratio of (C.3), in (0, 1].

  Returns:
    float64 [N], nats.

  Raises:
    ValueError: bad losses or r; IndexError: an index outside [0, C).
  """
  x = _losses(losses_NxCxT)
  b_T = x[:, c, :].min(axis=0)
  t = top_r_positions(b_T, r)
  return np.minimum(b_T[t][None, :], x[:, c_prime, t]).mean(axis=1)


def relative_gain(losses_NxCxT: Any, c: int, c_prime: int, r: float) -> np.ndarray:
  """g_i(c, c') of (C.5) for every model i of the group.

  g_i(c, c') = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c): the relative
  perplexity reduction of m_i from c to c' over the group's baseline.

  Args and errors: as ``relative_loss``.

  Returns:
    float64 [N], dimensionless (0.01 = 1% lower perplexity).
  """
  short = np.exp(relative_loss(losses_NxCxT, c, c, r))
  long = np.exp(relative_loss(losses_NxCxT, c, c_prime, r))
  return (short - long) / short


def walk_indices(context_lengths: Sequence[int], delta: int | None = None) -> list[int]:
  """The context lengths the RECL algorithm (C.6) visits, as indices.

  Args:
    context_lengths: the evaluated lengths c, strictly increasing ints >= 1.
    delta: the step Delta in tokens: the walk is c_0, c_0 + Delta, ...
      up to the largest length; None: every evaluated length in order.

  Returns:
    Indices into ``context_lengths``, increasing, at least 2.

  Raises:
    ValueError: fewer than 2 lengths, lengths not strictly increasing or
      < 1, delta < 1, or a length of the walk that was not evaluated.
  """
  lengths = [int(c) for c in context_lengths]
  if len(lengths) < 2:
    raise ValueError(
        f"RECL needs at least 2 context lengths (a short c and a long c'); got {lengths}."
    )
  if lengths[0] < 1 or any(b <= a for a, b in zip(lengths, lengths[1:])):
    raise ValueError(f"context lengths must be >= 1 and strictly increasing; got {lengths}.")
  if delta is None:
    return list(range(len(lengths)))
  if delta < 1:
    raise ValueError(f"delta (the step of Appendix C) must be >= 1; got {delta}.")
  walk = list(range(lengths[0], lengths[-1] + 1, delta))
  missing = [c for c in walk if c not in lengths]
  if missing or len(walk) < 2:
    raise ValueError(
        f"with delta={delta} the walk {walk} of Appendix C needs every one of its "
        f"lengths evaluated and at least two of them; not in --context_lengths: "
        f"{missing}."
    )
  return [lengths.index(c) for c in walk]


def recl(
    losses_NxCxT: Any,
    context_lengths: Sequence[int],
    r: float,
    threshold: float = DEFAULT_THRESHOLD,
    delta: int | None = None,
) -> dict:
  """RECL of every model of the group by the algorithm of Appendix C (C.6).

  From c = c_0, c' = the next length of the walk: if g_i(c, c') < threshold,
  RECL_i = c; otherwise c = c', c' = the next length, and again.  When the
  walk runs out of evaluated lengths RECL_i is the last length c_K, a lower
  bound.

  Args:
    losses_NxCxT: l_i(c, t), float [N, C, n], nats; axis 1 follows
      ``context_lengths``.
    context_lengths: the C lengths, strictly increasing.
    r: the ratio of (C.3), in (0, 1].
    threshold: the gain threshold of (C.6) (the paper's 0.01).
    delta: the step Delta (see ``walk_indices``); None = every length.

  Returns:
    dict of lists (JSON-ready), with S = len(walk) - 1 steps:
      "walk": the lengths visited [S + 1];
      "top_r_count": |T| at each short length of the walk [S];
      "f_self": f_i(c, c) ``[N][S]`` and "f_next": f_i(c, c') ``[N][S]``, nats;
      "baseline_ppl": exp f_i(c, c) [S] (the same for every i, since
        b(c, t) <= l_i(c, t));
      "gain": g_i(c, c') ``[N][S]``; "unnormalized_gain": exp f_i(c, c) -
        exp f_i(c, c') ``[N][S]`` (Figure 3);
      "recl": [N] ints; "lower_bound": [N] bools.

  Raises:
    ValueError: bad losses, r, lengths or delta, or axis 1 of the losses
      not as long as ``context_lengths``.
  """
  x = _losses(losses_NxCxT)
  if x.shape[1] != len(context_lengths):
    raise ValueError(
        f"losses have {x.shape[1]} context lengths, context_lengths {len(context_lengths)}."
    )
  walk = walk_indices(context_lengths, delta)
  n_models, n_steps = x.shape[0], len(walk) - 1
  f_self_NxS = np.zeros((n_models, n_steps))
  f_next_NxS = np.zeros((n_models, n_steps))
  counts = []
  for s in range(n_steps):
    f_self_NxS[:, s] = relative_loss(x, walk[s], walk[s], r)
    f_next_NxS[:, s] = relative_loss(x, walk[s], walk[s + 1], r)
    counts.append(top_r_count(x.shape[2], r))
  short_NxS, long_NxS = np.exp(f_self_NxS), np.exp(f_next_NxS)
  gain_NxS = (short_NxS - long_NxS) / short_NxS
  lengths = [int(context_lengths[i]) for i in walk]
  result_N, bound_N = [], []
  for i in range(n_models):
    below = np.flatnonzero(gain_NxS[i] < threshold)
    if below.size:
      result_N.append(lengths[int(below[0])])
      bound_N.append(False)
    else:
      result_N.append(lengths[-1])
      bound_N.append(True)
  return {
      "walk": lengths,
      "top_r_count": counts,
      "f_self": f_self_NxS.tolist(),
      "f_next": f_next_NxS.tolist(),
      "baseline_ppl": short_NxS[0].tolist(),
      "gain": gain_NxS.tolist(),
      "unnormalized_gain": (short_NxS - long_NxS).tolist(),
      "recl": result_N,
      "lower_bound": bound_N,
  }


def mean_losses(losses_NxCxT: Any) -> np.ndarray:
  """mean_t l_i(c, t): the ordinary loss of each model at each length.

  Args:
    losses_NxCxT: l_i(c, t), float [N, C, n], nats.

  Returns:
    float64 [N, C], nats per token (Figure 4 plots its exp, or bpc).

  Raises:
    ValueError: bad losses (see ``baseline``).
  """
  return _losses(losses_NxCxT).mean(axis=2)
