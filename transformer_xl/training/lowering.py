"""A config's jitted steps with abstract arguments: lowered, compiled or exported without data.

The train step (``train_step.make_train_step``), the eval step
(``eval_steps.make_eval_step``, or ``make_window_step`` with
``eval.method="sliding"``) and the generation steps
(``generate.Generator``'s segment and token steps, and its on-device
decoding loop with the cache, ``chunk_step``) of a config on a mesh,
each with ``jax.ShapeDtypeStruct`` arguments carrying their shardings: no
parameters are initialised and no data are read, so a 24-layer model on a
512-device slice is traced in seconds on simulated CPU devices.

Used by ``benchmarks/fit.py`` (compile and read the memory analysis) and by
the lowering test (``jax.export`` for ``tpu`` and ``cuda``: a step that
would not lower on the hardware a config targets fails the suite on CPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from transformer_xl import default_config, sharding
from transformer_xl.inference import eval_steps, generate
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models
from transformer_xl.training import train_state, train_step

STEPS = ("train", "eval", "generate_segment", "generate_token", "generate_chunk")


def vocab_sizes() -> dict[str, int]:
  """Vocabulary size of each corpus (``data.CORPUS_NAMES``) whose size is
  fixed: enwik8 (all 256 byte values), text8 (27 characters), and the
  documented sizes of PTB (10,000), WikiText-2 (33,278), WikiText-103
  (267,735) and One Billion Word (793,471; the reference's vocabulary
  file), taken from ``transformer_xl.data``."""
  from transformer_xl.data import lm1b, ptb_wikitext  # noqa: PLC0415 (tfds builders)

  return {
      "enwik8": 256,
      "text8": 27,
      "ptb": ptb_wikitext.PTB.expected.vocab_size,
      "wikitext2": ptb_wikitext.WIKITEXT2.expected.vocab_size,
      "wikitext103": ptb_wikitext.WIKITEXT103.expected.vocab_size,
      "lm1b": lm1b.LM1B_VOCAB_SIZE,
  }


def resolved_model_config(config: Any, vocab: int) -> models.ModelConfig:
  """The training ModelConfig with the "per backend" settings (-1) resolved
  as on an accelerator (no attention blocks, one layer per scan iteration),
  not as on this machine's CPU."""
  cfg = default_config.model_config(config, vocab)
  if cfg.attn_block < 0:
    cfg = dataclasses.replace(cfg, attn_block=0)
  if cfg.scan_unroll < 0:
    cfg = dataclasses.replace(cfg, scan_unroll=1)
  return cfg


def abstract_step(
    config: Any, model_cfg: models.ModelConfig, mesh: Mesh, step: str
) -> tuple[Callable, tuple]:
  """(jitted step function, abstract arguments) of one of ``STEPS``.

  Args:
    config: the whole ConfigDict (train, eval and generation settings).
    model_cfg: the training ModelConfig (e.g. ``resolved_model_config``);
      the eval and generation steps derive theirs from it and ``config.eval``
      as the command line does.
    mesh: the devices; arrays are sharded as in a real run.
    step: one of ``STEPS`` ("generate_chunk": ``chunk_step``, or the
      token step for an attention type without a decoding cache).

  Returns:
    ``fn`` and ``args`` such that ``fn.lower(*args)`` or
    ``jax.export.export(fn, ...)(*args)`` works; batch sizes are the
    config's (the eval batch padded to the data-parallel devices as the
    Evaluator pads it; one row for generation).

  Raises:
    ValueError: an unknown step.
  """
  if step not in STEPS:
    raise ValueError(f"unknown step {step!r}; one of {STEPS}")
  model = models.TransformerXL(model_cfg)
  tx = train_state.make_optimizer(config.train, model_cfg)
  abstract, shardings = train_state.abstract_train_state(model, tx, config.train.global_batch, mesh)
  rows, row_sh = sharding.batch_sharding(mesh), sharding.rows_sharding(mesh)
  spec = lambda shape, dtype, sh: jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

  def memory_of(cfg, batch, sh):
    shapes = memory_lib.abstract_memory(cfg, batch)
    return jax.tree_util.tree_map(lambda x, s: spec(x.shape, x.dtype, s), shapes, sh)

  if step == "train":
    fn = train_step.make_train_step(
        model,
        tx,
        mesh,
        shardings,
        config.train.batch_chunk,
        config.train.seed,
        config.train.loss_span,
        config.train.aux_loss_weight,
        config.train.get("mem_backprop_depth", 0),
        config.train.get("bptt_bp", False),
    )
    n_seg = config.train.get("mem_backprop_depth", 0) + 1  # a window of segments
    b, t = config.train.global_batch, model_cfg.tgt_len * n_seg
    batch = {
        "inputs": spec((b, t), jnp.int32, rows),
        "targets": spec((b, t), jnp.int32, rows),
        "weights": spec((b, t), jnp.float32, rows),
        "reset": spec((b,) if n_seg == 1 else (b, n_seg), jnp.bool_, row_sh),
    }
    return fn, (abstract, batch)
  ecfg = eval_steps.eval_model_config(config, model_cfg)
  if step == "eval":
    n_data = sharding.data_parallel_size(mesh)
    b = -(-config.eval.global_batch // n_data) * n_data  # the Evaluator's padding
    if config.eval.method == "sliding":
      wcfg = eval_steps.window_model_config(config, model_cfg)
      fn = eval_steps.make_window_step(models.TransformerXL(wcfg), mesh, config.eval.stride)
      t = wcfg.tgt_len
      batch = {
          "inputs": spec((b, t), jnp.int32, rows),
          "targets": spec((b, t), jnp.int32, rows),
          "front_pad": spec((b,), jnp.int32, row_sh),
      }
      return fn, (abstract.params, batch)
    fn = eval_steps.make_eval_step(models.TransformerXL(ecfg), mesh)
    t = ecfg.tgt_len
    batch = {
        "inputs": spec((b, t), jnp.int32, rows),
        "targets": spec((b, t), jnp.int32, rows),
        "reset": spec((b,), jnp.bool_, row_sh),
    }
    return fn, (abstract.params, memory_of(ecfg, b, memory_lib.shardings(ecfg, mesh)), batch)
  gen = generate.Generator(ecfg, mesh)
  rep = sharding.replicated(mesh)
  memory = memory_of(ecfg, 1, memory_lib.replicated_shardings(ecfg, mesh))
  tokens = spec((1, ecfg.tgt_len) if step == "generate_segment" else (1,), jnp.int32, rep)
  knobs = (
      spec((1, 2), jnp.uint32, rep),
      spec((), jnp.int32, rep),
      spec((), jnp.int32, rep),
      spec((), jnp.float32, rep),
      spec((), jnp.float32, rep),
  )  # row keys, index, k, p, temp.
  if step == "generate_chunk" and gen.use_cache:  # the decoding loop with the cache
    cache_shapes = jax.eval_shape(
        lambda p, m, x: gen.model.apply(
            {"params": p}, x[:, None], m, None, method=models.TransformerXL.decode
        )[2],
        abstract.params,
        memory,
        tokens,
    )
    cache = jax.tree_util.tree_map(lambda x: spec(x.shape, x.dtype, rep), cache_shapes)
    n = spec((), jnp.int32, rep)  # tokens in this chunk (traced)
    done, stop_ids = spec((1,), jnp.bool_, rep), spec((1,), jnp.int32, rep)  # rows done; stops
    return gen.chunk_step, (
        abstract.params,
        memory,
        cache,
        tokens,
        *knobs[:2],
        n,
        done,
        stop_ids,
        *knobs[2:],
        False,
    )
  fn = gen.segment_step if step == "generate_segment" else gen.token_step
  return fn, (abstract.params, memory, tokens, *knobs)
