"""Attention maps of a trained model (Dai et al. 2019, Appendix D, Figs. 5-7).

    python -m transformer_xl.analysis.attention --workdir=W --split=valid --out=DIR \
        [--max_tokens=N] [--heads=LAYER:HEAD,...] [--segment=S]

Streams over the split with the workdir's evaluation settings (segments of
eval tgt_len, a memory of eval mem_len: the config's attention length) and
writes into DIR:

  average_attention.png/.npy  Fig. 5: for every head of every layer, the
      attention averaged over all scored tokens, against the relative
      distance d = 0 .. mem_len + tgt_len - 1 (query i, key j: d = i + M - j;
      heads as rows, layer boundaries marked).  float32 [n_layer, n_head, K];
      each row sums to 1.
  context_attention.png, context_attention.json  Fig. 6: for the chosen
      heads, the attention of one query (the last position of segment
      ``--segment`` of row 0) over its context, the top 20% keys highlighted
      and listed with their tokens.
  decomposition.png/.npy  Fig. 7 (attn_type 0): the softmax of term (a)
      (content only), (b) (content-dependent positional bias) and (d)
      (global positional bias) of Sec. 3.3 alone, averaged like Fig. 5:
      float32 [3, n_layer, n_head, K], each row summing to 1.
  summary.json  the settings, the tokens averaged over, the checkpoint step.

Only per-segment tensors are ever held: each step's probabilities are reduced
to per-distance sums on the device.  The model sows them when built with
``record_attention=True`` (``attention._Attention.record``).

One role per module: this package's ``__init__`` computes the maps
(``attention_maps``) and writes them (``run``); ``plots.py`` draws the
figures with matplotlib; ``__main__.py`` is the command line (absl flags),
whose bad input (a bad flag, a missing workdir or corpus, a head outside
the model) is one ``error: ...`` line and exit status 1.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer_xl import data, default_config, sharding
from transformer_xl.analysis.attention import plots
from transformer_xl.inference import eval_steps
from transformer_xl.model import attention, models
from transformer_xl.model import memory as memory_lib
from transformer_xl.run import run_dir
from transformer_xl.run import workdir as wd
from transformer_xl.util import report

Array = jax.Array
TERMS = ("a", "b", "d")  # Sec. 3.3 terms of the Fig. 7 decomposition


def align_by_distance(prob_XxTxK: Array, mem_len: int) -> Array:
  """Re-indexes attention over keys as attention over relative distances.

  Args:
    prob_XxTxK: [..., T, K] attention of the T queries over the K = M + T
      keys (memory slots, then the segment).
    mem_len: M.

  Returns:
    [..., T, K]: entry (i, d) is the attention of query i to the key at
    distance d = i + M - j, 0 for distances it cannot have (d > i + M).
  """
  t, k = prob_XxTxK.shape[-2:]
  j_TxK = jnp.arange(t)[:, None] + mem_len - jnp.arange(k)[None, :]  # key of (i, d)
  valid_TxK = j_TxK >= 0
  index = jnp.broadcast_to(jnp.where(valid_TxK, j_TxK, 0), prob_XxTxK.shape)
  return jnp.where(valid_TxK, jnp.take_along_axis(prob_XxTxK, index, axis=-1), 0.0)


def make_map_step(model: models.TransformerXL, mesh) -> Callable:
  """The jitted analysis step of a model built with ``record_attention=True``.

  (params, memory, batch) -> (memory, sums, count, last_LxHxK): ``sums``
  maps "prob" (and "prob_a", "prob_b", "prob_d" for attn_type 0) to float32
  [n_layer, n_head, K], the per-distance attention summed over the scored
  tokens of the batch (weighted by ``batch["weights"]``); ``count`` their
  number; ``last_LxHxK`` the attention of row 0's last query over the keys
  (for the context plot).  All outputs replicated.
  """
  mem_sharding = memory_lib.shardings(model.config, mesh)
  batch_shardings = {
      "inputs": sharding.batch_sharding(mesh),
      "targets": sharding.batch_sharding(mesh),
      "weights": sharding.batch_sharding(mesh),
      "reset": sharding.rows_sharding(mesh),
  }

  def step(params, memory, batch):
    (_, memory), inter = model.apply(
        {"params": params},
        batch["inputs"],
        memory,
        batch["targets"],
        deterministic=True,
        reset_B=batch["reset"],
        mutable=["intermediates"],
    )
    recorded = inter["intermediates"]["layers"]["attn"]
    mem_len = memory.mem_len
    sums = {}
    for name, (prob_LxBxHxTxK,) in recorded.items():
      aligned = align_by_distance(prob_LxBxHxTxK, mem_len)
      sums[name] = jnp.einsum("lbhtk,bt->lhk", aligned, batch["weights"])
    return memory, sums, jnp.sum(batch["weights"]), recorded["prob"][0][:, 0, :, -1, :]

  replicated = sharding.replicated(mesh)
  return jax.jit(
      step,
      in_shardings=(None, mem_sharding, batch_shardings),
      out_shardings=(mem_sharding, replicated, replicated, replicated),
      donate_argnums=(1,),
  )


def attention_maps(
    params: Any,
    model_cfg: models.ModelConfig,
    corpus: data.Corpus,
    split: str,
    mesh,
    global_batch: int,
    max_tokens: int = 0,
    segment: int = -1,
) -> dict[str, Any]:
  """Streams over ``split`` and averages the attention by relative distance.

  Args:
    params: trained parameters.
    model_cfg: the evaluation ModelConfig (eval tgt_len, mem_len, ...).
    corpus: the corpus; ``split`` one of its splits.
    mesh: device mesh (rows over the data-parallel axes).
    global_batch: rows per step (a multiple of the data-parallel size).
    max_tokens: stop once at least this many tokens are scored (0 = all).
    segment: the step whose row-0 attention is kept for the context plot
      (-1: the first step whose memory is full, ceil(M / T)).

  Returns:
    {"average": {name: float32 [n_layer, n_head, K]} (each row sums to 1),
      "tokens": scored tokens averaged over, "segment": the step kept,
      "context": float32 [n_layer, n_head, K] (row 0's last query at that
      step), "context_pairs": int64 [K] the stream index of each key's input
      (-1: an empty memory slot)}.

  Raises:
    ValueError: the split is too short for the requested segment.
  """
  t, m = model_cfg.tgt_len, model_cfg.mem_len
  if segment < 0:
    segment = -(-m // t)
  model = models.TransformerXL(model_cfg, record_attention=True)
  step = make_map_step(model, mesh)
  rows = data.process_row_ids(sharding.batch_sharding(mesh), global_batch, t)
  it = data.EvalIterator(corpus.splits[split], global_batch, t, corpus.boundary_id, row_ids=rows)
  if segment >= len(it):
    raise ValueError(
        f"segment {segment} is past the {len(it)} segments of {split} with "
        f"{global_batch} rows; choose a smaller --segment (its default is the first "
        "segment with a full memory)."
    )
  memory = jax.jit(
      lambda: memory_lib.init_memory(model_cfg, global_batch),
      out_shardings=memory_lib.shardings(model_cfg, mesh),
  )()
  totals, n_tok, context = None, 0.0, None
  for i, local in enumerate(it):
    batch = data.to_global_batch(local, sharding.batch_sharding(mesh), global_batch)
    memory, sums, count, last_LxHxK = step(params, memory, batch)
    sums = jax.device_get(sums)
    totals = sums if totals is None else {k: totals[k] + v for k, v in sums.items()}
    n_tok += float(count)
    if i == segment:
      context = np.asarray(jax.device_get(last_LxHxK))
    if max_tokens and n_tok >= max_tokens and context is not None:
      break
  row_len = it.row_len
  first_key = segment * t - m  # stream pair of key 0 in row 0 at that step
  pairs = np.arange(first_key, first_key + m + t)
  pairs = np.where(
      (pairs >= 0) & (pairs < min(row_len, corpus.splits[split].num_tokens)), pairs, -1
  )
  return {
      "average": {k: (v / max(n_tok, 1.0)).astype(np.float32) for k, v in totals.items()},
      "tokens": int(round(n_tok)),
      "segment": segment,
      "context": context,
      "context_pairs": pairs,
  }


def top_fraction(weights_K: np.ndarray, fraction: float = 0.2) -> np.ndarray:
  """Indices of the keys holding the largest weights, ceil(fraction * #keys
  with weight > 0) of them, by decreasing weight (Fig. 6 highlights 20%)."""
  nonzero = np.flatnonzero(weights_K > 0)
  k = max(1, int(np.ceil(fraction * len(nonzero))))
  return nonzero[np.argsort(-weights_K[nonzero], kind="stable")[:k]]


def _parse_heads(spec: str, n_layer: int, n_head: int) -> list[tuple[int, int]]:
  """ "L:H,L:H" -> [(L, H), ...]; "" -> head 0 of every layer."""
  if not spec:
    return [(layer, 0) for layer in range(n_layer)]
  heads = []
  for part in spec.split(","):
    try:
      layer, head = (int(x) for x in part.split(":"))
    except ValueError:
      raise default_config.ConfigError(
          f"--heads={spec!r}: use LAYER:HEAD,... (e.g. 0:0,3:1)."
      ) from None
    if not (0 <= layer < n_layer and 0 <= head < n_head):
      raise default_config.ConfigError(
          f"--heads: {layer}:{head} is outside {n_layer} layers x {n_head} heads."
      )
    heads.append((layer, head))
  return heads


def run(
    workdir: str, split: str, out: str, max_tokens: int = 0, heads: str = "", segment: int = -1
) -> dict:
  """Computes and writes the attention maps of ``workdir`` (see the module docstring).

  Returns:
    summary.json's contents.

  Raises:
    default_config.ConfigError / data.DataError / FileNotFoundError: a bad
      flag, the corpus or the checkpoint cannot be found.
  """
  import os

  config = wd.load_config(workdir)
  default_config.validate(config, jax.device_count())
  if split not in ("train", "valid", "test"):
    raise default_config.ConfigError(f"--split={split!r}: use train, valid or test.")
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  data_cfg = config.data.to_dict()
  corpus = data.load_configured(data_cfg)
  train_cfg = default_config.model_config(config, corpus.vocab_size)
  step, params = run_dir.restore_params(workdir, train_cfg, mesh)
  eval_cfg = eval_steps.eval_model_config(config, train_cfg)
  eval_cfg = dataclasses.replace(eval_cfg, remat="none")
  chosen = _parse_heads(heads, eval_cfg.n_layer, eval_cfg.n_head)
  n_data = sharding.data_parallel_size(mesh)
  global_batch = -(-config.eval.global_batch // n_data) * n_data
  try:
    maps = attention_maps(params, eval_cfg, corpus, split, mesh, global_batch, max_tokens, segment)
  except ValueError as err:
    raise default_config.ConfigError(str(err)) from None
  os.makedirs(out, exist_ok=True)
  avg = maps["average"]["prob"]
  np.save(os.path.join(out, "average_attention.npy"), avg)
  plots.plot_average(
      avg,
      os.path.join(out, "average_attention.png"),
      f"average attention by distance ({os.path.basename(os.path.normpath(workdir))}, "
      f"{split}, {maps['tokens']:,} tokens; colour ~ sqrt)",
  )
  ctx = maps["context"]
  np.save(os.path.join(out, "context_attention.npy"), ctx)
  plots.plot_context(
      ctx,
      chosen,
      [top_fraction(ctx[layer, head]) for layer, head in chosen],
      eval_cfg.mem_len,
      os.path.join(out, "context_attention.png"),
  )
  tokens = corpus.splits[split].read(0, corpus.splits[split].num_tokens)
  symbol = (
      lambda p: (corpus.vocab[corpus.boundary_id] if p == 0 else corpus.vocab[int(tokens[p - 1])])
      if p >= 0
      else None
  )
  listing = {
      f"{layer}:{head}": [
          {
              "key": int(j),
              "distance": int(eval_cfg.mem_len + eval_cfg.tgt_len - 1 - j),
              "weight": float(ctx[layer, head, j]),
              "token": symbol(int(maps["context_pairs"][j])),
          }
          for j in top_fraction(ctx[layer, head])
      ]
      for layer, head in chosen
  }
  with open(os.path.join(out, "context_attention.json"), "w") as f:
    json.dump(
        {
            "segment": maps["segment"],
            "row": 0,
            "query": "last position of the segment",
            "top_20_percent": listing,
        },
        f,
        indent=2,
    )
  if all(f"prob_{t}" in maps["average"] for t in TERMS):  # recorded by attn_type 0
    terms = np.stack([maps["average"][f"prob_{t}"] for t in TERMS])
    np.save(os.path.join(out, "decomposition.npy"), terms)
    plots.plot_decomposition(terms, TERMS, os.path.join(out, "decomposition.png"))
  summary = {
      "workdir": workdir,
      "split": split,
      "step": int(step),
      "tokens": maps["tokens"],
      "tgt_len": eval_cfg.tgt_len,
      "mem_len": eval_cfg.mem_len,
      "same_length": eval_cfg.same_length,
      "clamp_len": eval_cfg.clamp_len,
      **attention.describe(eval_cfg),
      "heads": [list(h) for h in chosen],
  }
  with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  report.log(f"Attention maps of {maps['tokens']:,} {split} tokens (step {step}) written to {out}.")
  return summary
