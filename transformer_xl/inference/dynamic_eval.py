"""Dynamic evaluation (Krause, Kahembwe, Murray, Renals 2019, arXiv 1904.08378).

The parameters adapt to the text as it is scored: each evaluation segment
is first scored with the current parameters, then the gradient of its mean
NLL updates them, so that the next segment is scored by a model that has
seen everything before it.  Every token is scored before any update that
uses it; the memory is carried as in static evaluation (``evaluate.py``).
With ``lr = 0`` it is static evaluation.

Two rules (``eval.dynamic.rule``), as the authors' fork of the reference
TensorFlow code (``benkrause/dynamiceval-transformer``: ``dynamic_eval_opt.py``
``DynamicEvalOptimizer`` and ``dynamiceval_tf.py``):

* ``"rms"`` (their ``--rms=True``, used for every published number): a
  statistics pass over some training text first sums the squared gradient
  of each segment's mean NLL, ``ss = sum g^2`` (no update; the memory
  carried as in evaluation).  Then, per evaluation segment with gradient
  ``g``::

      update = lr / (sqrt(ss) + eps) * g + decay * sqrt(ss) * m
      m      = m - update          # = params - loaded params
      params = params - update

  so ``decay`` pulls the parameters back toward the loaded ones, each in
  proportion to how strongly training text moves it.
* ``"sgd"`` (their ``--rms=False``): ``params = params - lr * g``; no
  statistics, ``decay`` and ``eps`` unused.

Their TensorFlow optimizer applies the plain SGD step to parameters whose
gradient TensorFlow makes sparse (an embedding used only through a lookup);
in the released models every embedding is tied to the softmax (dense
gradient), so the rule above applies to all parameters there, and it does
here always (JAX gradients are dense).

Rows: ``B`` rows are independent streams (their own memory) that share
one parameter update per segment, computed from the mean NLL over all
``B x tgt_len`` tokens; the authors' settings use one row
(``eval.dynamic.global_batch = 1``).  Padding (the rows added for the
mesh, a split's tail) has weight 0 in that mean.

Cost: one jitted step per segment (score, gradient, update fused;
parameters, optimizer state and memory donated), i.e. a training step's
forward and backward per segment instead of a forward: about 3x static
evaluation's FLOPs, and sequential over segments.  Memory: four copies of
the parameters (the loaded ones, the adapted ones, ``ss`` and ``m``, all
float32) plus a training step's activations for one segment of
``eval.dynamic.global_batch`` rows (``model.remat`` applies).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_xl import errors, sharding
from transformer_xl.inference import config_checks, eval_steps, evaluate
from transformer_xl.model import memory as memory_lib
from transformer_xl.util import report

RULES = config_checks.DYNAMIC_RULES
# eval.dynamic.stats_tokens = -1: the reference's share of the training split (its
# statistics pass reads num_batch // 5000 segments of batch 1).
REFERENCE_STATS_FRACTION = 5000


@dataclasses.dataclass(frozen=True)
class DynamicSettings:
  """The settings of dynamic evaluation (``config.eval.dynamic``).

  Attributes:
    rule: "rms" or "sgd" (see the module docstring).
    lr: learning rate, >= 0 (0: static evaluation); the parameters' units per
      unit of mean NLL gradient (nats).
    decay: "rms": the pull back toward the loaded parameters, >= 0.
    eps: "rms": added to sqrt(ss), > 0.
    stats_tokens: "rms", ``--mode=eval``: tokens of the training split in the
      statistics pass (-1: the reference's 1/5000 of the split).
    global_batch: ``--mode=eval``: rows, each a contiguous part of the split,
      sharing one update per segment (the authors': 1).
  """

  rule: str = "rms"
  lr: float = 0.0
  decay: float = 0.001
  eps: float = 1e-4
  stats_tokens: int = -1
  global_batch: int = 1

  def __post_init__(self):
    problems = config_checks.dynamic_problems(
        dataclasses.asdict(self), section="", default_decay=DynamicSettings.decay
    )
    if problems:
      raise errors.ConfigError("; ".join(problems))

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> DynamicSettings:
    """``config.eval.dynamic`` as settings (they are checked by ``validate``)."""
    return cls(**config.eval.dynamic.to_dict())

  @property
  def enabled(self) -> bool:
    """Whether dynamic evaluation runs (``lr > 0``)."""
    return self.lr > 0

  @property
  def needs_statistics(self) -> bool:
    """Whether a statistics pass runs first (rule "rms")."""
    return self.rule == "rms"

  def stats_steps(self, train_tokens: int, tgt_len: int) -> int:
    """Segments of the statistics pass over a training split of ``train_tokens``
    tokens, ``global_batch`` rows of ``tgt_len`` each (at least 1)."""
    tokens = (
        train_tokens // REFERENCE_STATS_FRACTION if self.stats_tokens < 0 else self.stats_tokens
    )
    return max(1, tokens // (self.global_batch * tgt_len))

  def to_json(self) -> dict:
    """The settings as recorded in results (eval_results.json, score's report)."""
    return dataclasses.asdict(self)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DynamicState:
  """What dynamic evaluation carries from segment to segment.

  Attributes:
    params: the adapted parameters (the model's pytree, float32).
    m: "rms": params - loaded params, accumulated as the reference's ``dw``
      slot (the same tree; zeros at the start).
    ss: "rms": the gradient statistics, sum of squared gradients of the
      statistics pass (the same tree); fixed during evaluation.
  """

  params: Any
  m: Any
  ss: Any


def _weighted_mean(nll_BxT: jax.Array, weights_BxT: jax.Array) -> jax.Array:
  """Mean NLL over the tokens of weight 1 (0 when there are none)."""
  w = weights_BxT.astype(jnp.float32)
  return jnp.sum(nll_BxT * w) / jnp.maximum(jnp.sum(w), 1.0)


def rms_update(settings: DynamicSettings, state: DynamicState, grads: Any) -> DynamicState:
  """One update of the "rms" rule (module docstring): the reference's
  ``DynamicEvalOptimizer._apply_dense`` outside the statistics pass."""
  lr, decay, eps = settings.lr, settings.decay, settings.eps

  def leaf(p, m, ss, g):
    root = jnp.sqrt(ss)
    update = lr / (root + eps) * g + decay * root * m
    return p - update, m - update

  pairs = jax.tree.map(leaf, state.params, state.m, state.ss, grads)
  is_pair = lambda x: isinstance(x, tuple)
  params = jax.tree.map(lambda x: x[0], pairs, is_leaf=is_pair)
  m = jax.tree.map(lambda x: x[1], pairs, is_leaf=is_pair)
  return DynamicState(params=params, m=m, ss=state.ss)


def sgd_update(settings: DynamicSettings, state: DynamicState, grads: Any) -> DynamicState:
  """One update of the "sgd" rule: params - lr * g (the reference's ``--rms=False``)."""
  params = jax.tree.map(lambda p, g: p - settings.lr * g, state.params, grads)
  return DynamicState(params=params, m=state.m, ss=state.ss)


class DynamicEvaluator:
  """Dynamic evaluation over an ``evaluate.Evaluator``'s segments and memory.

  The evaluator's model (eval tgt_len, mem_len, clamp_len, same_length, no
  dropout), rows, padding, documents and sharding are used as they are;
  only the step differs: ``make_step``'s fused score-gradient-update
  instead of the eval step's forward.

      dyn = DynamicEvaluator(evaluator, DynamicSettings(lr=2e-6, decay=0, eps=1e-5))
      ss = dyn.statistics_of_split(params, "train")
      result = dyn.evaluate(params, "test", ss)

  Args:
    evaluator: the static evaluator ("segments" method).
    settings: the dynamic-evaluation settings.

  Raises:
    errors.ConfigError: the evaluator's method is "sliding" (a fresh pass
      per window has no order of segments to adapt along).
  """

  def __init__(self, evaluator: evaluate.Evaluator, settings: DynamicSettings):
    if evaluator.method != "segments":
      raise errors.ConfigError(
          f"dynamic evaluation needs eval.method='segments' (got {evaluator.method!r}): "
          "set --config.eval.method=segments."
      )
    self.evaluator, self.settings = evaluator, settings
    self.model = evaluator.model
    self._steps: dict[str, Callable] = {}

  def _loss(self, params, memory, batch, weights_BxT):
    nll_BxT, memory = eval_steps.segment_nll(self.model, params, memory, batch)
    return _weighted_mean(nll_BxT, weights_BxT), (nll_BxT, memory)

  def make_step(self, kind: str, params: Any) -> Callable:
    """The jitted step of one pass, compiled once per kind and batch shape.

    Args:
      kind: "stats" (ss += g^2, parameters unchanged) or "update" (score,
        then the rule's update).
      params: parameters with their shardings (the state takes the same).

    Returns:
      ``step(state, memory, batch, weights_BxT) -> (nll_BxT, state, memory)``:
      ``nll_BxT`` float32 nats of the parameters before the update,
      replicated; ``state`` (a ``DynamicState``) and ``memory`` donated.
    """
    if kind in self._steps:
      return self._steps[kind]
    mesh = self.evaluator.mesh
    update = rms_update if self.settings.rule == "rms" else sgd_update
    settings = self.settings

    def step(state: DynamicState, memory, batch, weights_BxT):
      grad_fn = jax.value_and_grad(self._loss, has_aux=True)
      (_, (nll_BxT, memory)), grads = grad_fn(state.params, memory, batch, weights_BxT)
      if kind == "stats":
        ss = jax.tree.map(lambda s, g: s + jnp.square(g.astype(jnp.float32)), state.ss, grads)
        state = DynamicState(params=state.params, m=state.m, ss=ss)
      else:
        state = update(settings, state, grads)
      return nll_BxT, state, memory

    state_shardings = self._state_shardings(params)
    mem_sharding = memory_lib.shardings(self.model.config, mesh)
    rows = sharding.rows_sharding(mesh)
    self._steps[kind] = jax.jit(
        sharding.traced_with_mesh(step, mesh),
        in_shardings=(state_shardings, mem_sharding, rows, sharding.batch_sharding(mesh)),
        out_shardings=(sharding.replicated(mesh), state_shardings, mem_sharding),
        donate_argnums=(0, 1),
    )
    return self._steps[kind]

  def _state_shardings(self, params: Any) -> DynamicState:
    """The state's shardings: each parameter's own where it is laid out on the
    mesh (restored checkpoints), else replicated."""
    mesh = self.evaluator.mesh

    def of(x):
      s = getattr(x, "sharding", None)
      if isinstance(s, jax.sharding.NamedSharding) and s.mesh == mesh:
        return s
      return sharding.replicated(mesh)

    shardings = jax.tree.map(of, params)
    return DynamicState(params=shardings, m=shardings, ss=shardings)

  def initial_state(self, params: Any, ss: Any | None) -> DynamicState:
    """The state at the start of a pass, on the mesh: a copy of ``params``
    (the loaded ones are left as they are), ``m`` zeros, ``ss`` (a copy;
    zeros when None), float32."""
    shardings = self._state_shardings(params)

    def make(params, ss):
      f32 = lambda x: jnp.array(x, jnp.float32, copy=True)
      zeros = lambda x: jnp.zeros(x.shape, jnp.float32)
      return DynamicState(
          params=jax.tree.map(f32, params),
          m=jax.tree.map(zeros, params),
          ss=jax.tree.map(zeros, params) if ss is None else jax.tree.map(f32, ss),
      )

    return jax.jit(make, out_shardings=shardings)(params, ss)

  def _run(self, kind: str, params: Any, ss: Any | None, batches) -> tuple[Any, Any]:
    """Runs one pass over ``batches`` (``evaluate.Evaluator`` hands the step
    each batch); returns (the pass's result from ``batches``, final state)."""
    state = [self.initial_state(params, ss)]
    step = self.make_step(kind, params)

    def run_step(memory, batch, weights_BxT):
      nll_BxT, state[0], memory = step(state[0], memory, batch, weights_BxT)
      return nll_BxT, memory

    result = batches(run_step)
    return result, state[0]

  def statistics_of_split(self, params: Any, split: str = "train") -> tuple[Any, int]:
    """The "rms" statistics over the start of a corpus split.

    ``settings.global_batch`` rows, each a contiguous part of the split (one
    row: its first tokens, as the reference), ``settings.stats_steps``
    segments of them.

    Returns:
      (ss, tokens): the sum of squared gradients (the parameters' tree,
      float32), and the number of tokens the pass scored.
    """
    e = self.evaluator
    n = self.settings.stats_steps(e.corpus.splits[split].num_tokens, e.cfg.tgt_len)
    result, state = self._run(
        "stats",
        params,
        None,
        lambda step: e.evaluate(
            params, split, max_steps=n, step=step, num_rows=self.settings.global_batch
        ),
    )
    return state.ss, result["tokens"]

  def statistics_of_tokens(self, params: Any, tokens_BxT1: np.ndarray) -> tuple[Any, int]:
    """The "rms" statistics over token streams (``--dynamic_stats``): each row
    of ``tokens_BxT1`` a stream, the rows one batch, every token scored.

    Returns:
      (ss, tokens) as ``statistics_of_split``.

    Raises:
      evaluate.ScoreInputError: not a token array of the model's vocabulary.
    """
    _, state = self._run(
        "stats", params, None, lambda step: self.evaluator.score(params, tokens_BxT1, step=step)
    )
    b, t1 = np.shape(tokens_BxT1)
    return state.ss, b * (t1 - 1)

  def evaluate(self, params: Any, split: str, ss: Any | None, max_steps: int = 0) -> dict:
    """A corpus split scored with dynamic evaluation from ``params``
    (``evaluate.Evaluator.evaluate``'s result; ``settings.global_batch``
    rows).  ``ss``: the statistics ("rms"; None for "sgd")."""
    e = self.evaluator
    result, _ = self._run(
        "update",
        params,
        ss,
        lambda step: e.evaluate(
            params, split, max_steps=max_steps, step=step, num_rows=self.settings.global_batch
        ),
    )
    return result

  def score(self, params: Any, tokens_BxT1: np.ndarray, ss: Any | None) -> np.ndarray:
    """Per-token NLL of token streams with dynamic evaluation
    (``evaluate.Evaluator.score``'s result: float32 [B, T], nats); the B rows
    share one update per segment."""
    return self.score_and_state(params, tokens_BxT1, ss)[0]

  def score_and_state(
      self, params: Any, tokens_BxT1: np.ndarray, ss: Any | None
  ) -> tuple[np.ndarray, DynamicState]:
    """``score``, and the state after the last segment's update (the adapted
    parameters, ``m``, ``ss``)."""
    return self._run(
        "update", params, ss, lambda step: self.evaluator.score(params, tokens_BxT1, step=step)
    )


def pull_back_factor(settings: DynamicSettings, ss: Any) -> float:
  """The largest ``decay * sqrt(ss)`` over the parameters: the share of its
  distance from the loaded value that one update takes back from a
  parameter.  Above 2 the pull back overshoots by more than it corrects, so
  the parameter oscillates with growing amplitude: the evaluation diverges
  (NaN) whatever the lr.  0 for the "sgd" rule or without statistics."""
  if settings.rule != "rms" or ss is None or settings.decay == 0:
    return 0.0
  leaves = jax.tree.leaves(ss)
  mesh_sharding = getattr(leaves[0], "sharding", None)
  out = (  # a scalar every process can read, however ss is laid out
      sharding.replicated(mesh_sharding.mesh)
      if isinstance(mesh_sharding, jax.sharding.NamedSharding)
      else None
  )
  peak = jax.jit(lambda t: jnp.max(jnp.stack([jnp.max(x) for x in t])), out_shardings=out)(leaves)
  return settings.decay * math.sqrt(float(peak))


def check_pull_back(settings: DynamicSettings, ss: Any) -> None:
  """Logs a warning when ``pull_back_factor`` exceeds 2 (see there), with the
  largest stable decay."""
  factor = pull_back_factor(settings, ss)
  if factor > 2:
    report.log(
        f"Warning: eval.dynamic.decay={settings.decay} times sqrt(ss) reaches {factor:.3g} for "
        "some parameters (above 2 the pull back toward the loaded parameters overshoots and "
        f"diverges); with these statistics decay must be below "
        f"{2 * settings.decay / factor:.3g}."
    )


def log_settings(settings: DynamicSettings, stats: str) -> None:
  """One line saying what dynamic evaluation does (the settings and where its
  statistics come from)."""
  extra = (
      f", decay {settings.decay}, eps {settings.eps}; statistics: {stats}"
      if settings.needs_statistics
      else ""
  )
  report.log(
      f"Dynamic evaluation (Krause et al. 2019): rule {settings.rule}, lr {settings.lr}"
      f"{extra}; every segment scored, then the parameters updated."
  )


__all__ = [
    "DynamicEvaluator",
    "DynamicSettings",
    "DynamicState",
    "RULES",
    "check_pull_back",
    "log_settings",
    "pull_back_factor",
    "rms_update",
    "sgd_update",
]
