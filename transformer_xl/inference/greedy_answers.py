"""Greedy decoding of a synthetic task's answers: accuracy without teacher forcing.

The Recurrent Memory Transformer's copy and reverse results (Bulatov et al.
2022, Sec. 4; their ``pytorch/train_synthetic.py``, ``evaluate``, "no
teacher forcing") are the accuracy of the answer the model writes itself:
the question is read segment by segment with the memory, then each answer
token is the argmax of the model's distribution given the question and the
answer tokens it has already written (never the true ones).  For an
answer of one token (associative retrieval) it is the teacher-forced
accuracy; for copy and reverse, whose answers span segments, it is the
paper's measure.

How: an example is whole segments (``data.synthetic``); every segment runs
with the memory the previous one left, as in evaluation.  A segment that
holds answer targets runs once per answer position ``t`` (the authors'
loop over ``token_ind``): the prediction at ``t`` becomes the input at
``t + 1``, and the memory the segment leaves is the one of its last run,
over the predicted inputs.  The causal mask makes the repeated runs equal
to decoding one token at a time with a cache.  Cost: a segment with k
answer positions runs k + 1 times: copy in 6 segments of 12 (4 of them
answer) runs 4 x 13 + 2 = 54 segments an example, 9 times the
teacher-forced evaluation.

*Difference from the authors' code:* their answer segments after the first
start from the true token (``a_data`` is a copy of the data, and only
``data[token_ind + 1]`` within a segment is overwritten), so one answer
token per segment boundary is teacher-forced; here the prediction at a
segment's last position is also the next segment's first input, as
decoding without teacher forcing means.  With one answer segment (reverse
with ``tgt_len`` >= its answer, retrieval) the two agree.

Used through the evaluator: ``evaluate.Evaluator.greedy_answers`` (the
accuracies of a split) and ``Evaluator.decode_answers`` (the answers),
which hold the compiled greedy segment (``make_greedy_segment``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from transformer_xl import data, sharding
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models


class Evaluator(Protocol):
  """What decoding reads of an ``evaluate.Evaluator`` (named here, not
  imported: the evaluator imports this module)."""

  answers: bool
  corpus: Any
  cfg: models.ModelConfig
  global_batch: int
  batch_sharding: Any

  def rows(self, b: int) -> tuple[int, Any]:
    ...

  def empty_memory(self, batch_size: int) -> Any:
    ...


def make_greedy_segment(model: models.TransformerXL, mesh: jax.sharding.Mesh):
  """The jitted greedy segment: (params, memory, inputs_BxT, reset_B, first)
  -> (preds_BxT, next memory).

  ``first`` (int32 scalar, 0..T) is the first position of the segment whose
  target is an answer token; for ``t`` = first .. T-1 the segment runs from
  ``memory`` and its argmax prediction at ``t`` (int32) is written to
  ``preds_BxT[:, t]`` and, for ``t < T - 1``, to the input at ``t + 1``.
  One last run over the inputs so written gives the next memory (the
  memory is donated).  With ``first = T`` it is one ordinary segment.
  ``preds_BxT`` is replicated, 0 before ``first``.
  """
  mem_sharding = memory_lib.shardings(model.config, mesh)
  batch_sharding, rows_sharding = sharding.batch_sharding(mesh), sharding.rows_sharding(mesh)

  def greedy_segment(params, memory, inputs_BxT, reset_B, first):
    tgt_len = inputs_BxT.shape[1]

    def run(x_BxT):
      return model.apply(
          {"params": params}, x_BxT, memory, None, deterministic=True, reset_B=reset_B
      )

    def step_t(t, carry):
      x_BxT, preds_BxT = carry
      logp_BxTxV, _ = run(x_BxT)
      p_B = jnp.argmax(jax.lax.dynamic_index_in_dim(logp_BxTxV, t, 1, False), -1)
      p_B = p_B.astype(jnp.int32)
      preds_BxT = jax.lax.dynamic_update_index_in_dim(preds_BxT, p_B, t, 1)
      nxt = jnp.minimum(t + 1, tgt_len - 1)  # the last prediction has no input to fill
      keep_B = jax.lax.dynamic_index_in_dim(x_BxT, nxt, 1, False)
      x_BxT = jax.lax.dynamic_update_index_in_dim(
          x_BxT, jnp.where(t + 1 < tgt_len, p_B, keep_B), nxt, 1
      )
      return x_BxT, preds_BxT

    x_BxT, preds_BxT = jax.lax.fori_loop(
        first, tgt_len, step_t, (inputs_BxT, jnp.zeros_like(inputs_BxT))
    )
    _, new_memory = run(x_BxT)
    return preds_BxT, new_memory

  return jax.jit(
      sharding.traced_with_mesh(greedy_segment, mesh),
      in_shardings=(None, mem_sharding, batch_sharding, rows_sharding, None),
      out_shardings=(sharding.replicated(mesh), mem_sharding),
      donate_argnums=(1,),
  )


def _check(evaluator: Evaluator) -> None:
  """Raises ValueError unless the evaluator's corpus is a synthetic task."""
  if not evaluator.answers:
    name = getattr(evaluator.corpus, "name", None)
    raise ValueError(f"greedy decoding of answers needs a synthetic task, not {name!r}.")


def decode(
    evaluator: Evaluator,
    step: Callable,
    params: Any,
    examples_NxS: np.ndarray,
    num_rows: int = 0,
) -> np.ndarray:
  """The answers of ``examples_NxS`` decoded greedily: int32 [N, answer_len]
  (``Evaluator.decode_answers``).

  Args:
    evaluator: an ``Evaluator`` of a ``example_corpus.ExampleCorpus`` (its eval
      model and mesh; ``eval.tgt_len`` divides the example length).
    step: the evaluator's greedy segment (``make_greedy_segment`` of its
      model and mesh).
    params: model parameters.
    examples_NxS: int [N, S] examples of the corpus's task (only the
      question part is read: the answer is the model's own).
    num_rows: examples decoded side by side (0: ``eval.global_batch``).

  Returns:
    int32 [N, answer_len]: entry (n, a) is the token the model writes at
    answer position a of example n, given the question and its own earlier
    answer tokens.

  Raises:
    ValueError: the evaluator's corpus is not a synthetic task.
  """
  _check(evaluator)
  s = evaluator.corpus.settings
  n = int(examples_NxS.shape[0])
  e_len, tgt_len = s.example_len, evaluator.cfg.tgt_len
  answer_start = e_len - s.answer_len  # the first answer target of an example
  b = num_rows or evaluator.global_batch
  b_pad, rows = evaluator.rows(b)
  out_NxA = np.zeros((n, s.answer_len), np.int32)
  for lo_ex in range(0, n, b):
    ex_bxS = examples_NxS[lo_ex : lo_ex + b]
    inputs_BxE = np.zeros((b_pad, e_len), np.int32)
    inputs_BxE[: len(ex_bxS)] = ex_bxS[:, :-1]
    preds_BxE = np.zeros((b_pad, e_len), np.int32)
    memory = evaluator.empty_memory(b_pad)
    for lo in range(0, e_len, tgt_len):
      local = {
          "inputs": inputs_BxE[rows, lo : lo + tgt_len],
          "reset": np.full((len(rows),), lo == 0),
      }
      batch = data.to_global_batch(local, evaluator.batch_sharding, b_pad)
      first = int(np.clip(answer_start - lo, 0, tgt_len))
      preds_BxT, memory = step(
          params, memory, batch["inputs"], batch["reset"], jnp.asarray(first, jnp.int32)
      )
      preds_BxE[:, lo : lo + tgt_len] = np.asarray(jax.device_get(preds_BxT))
      if first < tgt_len and lo + tgt_len < e_len:  # the next segment reads the last prediction
        inputs_BxE[:, lo + tgt_len] = preds_BxE[:, lo + tgt_len - 1]
    out_NxA[lo_ex : lo_ex + len(ex_bxS)] = preds_BxE[: len(ex_bxS), answer_start:]
  return out_NxA


def greedy_answers(
    evaluator: Evaluator,
    step: Callable,
    params: Any,
    split: str,
    max_examples: int = 0,
    num_rows: int = 0,
) -> dict:
  """Greedy-decoding accuracies of a synthetic task's ``split`` (``decode``;
  ``Evaluator.greedy_answers``).

  Args:
    evaluator: an ``Evaluator`` of a ``example_corpus.ExampleCorpus``.
    step: the evaluator's greedy segment (``make_greedy_segment``).
    params: model parameters.
    split: "train", "valid" or "test".
    max_examples: examples decoded at most, from the split's start (0: all).
    num_rows: examples decoded side by side (0: ``eval.global_batch``).

  Returns:
    The corpus's ``greedy_scores``: for the synthetic tasks
    {"greedy_token_accuracy", "greedy_accuracy", "greedy_examples"}
    (``example_corpus.ExampleCorpus.greedy_scores``); for BABILong also
    "babilong_accuracy", the answer found in the decoded text's first
    sentence (``babilong.BabilongCorpus.greedy_scores``).

  Raises:
    ValueError: the evaluator's corpus is not a synthetic task.
  """
  _check(evaluator)
  examples_NxS = evaluator.corpus.examples[split]
  if max_examples:
    examples_NxS = examples_NxS[:max_examples]
  preds_NxA = decode(evaluator, step, params, examples_NxS, num_rows)
  return evaluator.corpus.greedy_scores(split, examples_NxS, preds_NxA)
