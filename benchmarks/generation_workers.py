"""The two workers of ``generation.py``: each times the sampling of one
implementation for one grid cell (batch, mem_len) in its own subprocess and
returns a result dict that the parent saves in its JSON.

* ``run_ours``: ``transformer_xl.inference.generate.Generator`` (JAX / Flax);
* ``run_pytorch``: HuggingFace's ``TransfoXLLMHeadModel.generate`` (torch).

``generation.py --worker=ours|pytorch --batch=B --mem_len=M`` runs one of
them.  Nothing heavy is imported at import time: the parent imports this
module, and the PyTorch worker never imports JAX.
"""

from __future__ import annotations

import statistics
import sys
import time

import common
from vs_pytorch_workers import hf_config, rss_mib

REPO = common.REPO


# ---------------------------------------------------------------------------
# Shared by both workers (no jax / torch imports here).
# ---------------------------------------------------------------------------


def prompt_tokens(args, batch: int):
  """The prompt: int32 numpy [batch, prompt_len] random token ids in
  [0, vocab), the same for both implementations (one generator seeded with
  ``--seed``, so the rows of batch 8 begin with those of batch 1)."""
  import numpy as np

  rng = np.random.default_rng(args.seed)
  return rng.integers(0, args.vocab, size=(batch, args.prompt_len)).astype(np.int32)


def _timed(fn) -> tuple[float, float, object]:
  """(wall seconds, process CPU seconds, result) of ``fn()``."""
  c0, t0 = time.process_time(), time.perf_counter()
  out = fn()
  return time.perf_counter() - t0, time.process_time() - c0, out


def measure(args, batch: int, generate_all, first_token) -> dict:
  """The timing protocol of both workers.

  Untimed warm-ups first: one ``generate_all()`` (its wall seconds are
  ``warmup_seconds``: for ours, compilation + one call) and one
  ``first_token()``.  Then ``--repeats`` rounds of one timed
  ``generate_all()`` and one timed ``first_token()``.

  Args:
    generate_all: ``f(seed)`` -> int [batch, num_tokens] new tokens: the
      whole sampling call for ``--num_tokens`` tokens.
    first_token: ``f(seed)`` -> seconds from the call to the first new
      token (the implementation's own clock around its own call).

  Returns:
    tokens/s (= batch * num_tokens / seconds of one call) per repeat, their
    median, min and max; first-token latencies (s) likewise; warm-up
    seconds; CPU seconds per wall second of each timed call.
  """
  n = args.num_tokens
  warm_s, _, out = _timed(lambda: generate_all(args.seed))
  shape = tuple(out.shape)
  if shape != (batch, n):
    raise SystemExit(f"error: the call returned {shape} new tokens, not {(batch, n)}")
  first_warm_s = first_token(args.seed)
  seconds, cpu, latencies = [], [], []
  for r in range(args.repeats):
    wall, c, _ = _timed(lambda: generate_all(args.seed + 1 + r))
    seconds.append(wall)
    cpu.append(c / wall)
    latencies.append(first_token(args.seed + 1 + r))
  tps = [batch * n / s for s in seconds]
  return {
      "batch": batch,
      "num_tokens": n,
      "prompt_len": args.prompt_len,
      "seconds": seconds,
      "tokens_per_sec": tps,
      "median_tokens_per_sec": statistics.median(tps),
      "min_tokens_per_sec": min(tps),
      "max_tokens_per_sec": max(tps),
      "first_token_latency_s": latencies,
      "median_first_token_latency_s": statistics.median(latencies),
      "min_first_token_latency_s": min(latencies),
      "max_first_token_latency_s": max(latencies),
      "warmup_seconds": warm_s,
      "first_token_warmup_seconds": first_warm_s,
      "cpu_per_wall": cpu,
  }


# ---------------------------------------------------------------------------
# Ours (JAX / Flax).
# ---------------------------------------------------------------------------


def model_config(args, mem_len: int):
  """Our evaluation ModelConfig of the benchmark model: the sizes of the
  flags, a plain dense softmax tied to the embedding, shared u/v, no
  dropout, fp32, tgt_len = ``--tgt_len`` (the prompt's segment), the cell's
  mem_len, no clamp, same_length off."""
  from transformer_xl.model import models

  return models.ModelConfig(
      n_token=args.vocab,
      n_layer=args.n_layer,
      d_model=args.d_model,
      n_head=args.n_head,
      d_head=args.d_head,
      d_inner=args.d_inner,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=args.tgt_len,
      mem_len=mem_len,
      clamp_len=0,
      same_length=False,
      untie_r=False,
      tie_weight=True,
      dtype="float32",
      remat="none",
      cutoffs=(),
      div_val=1,
  )


def run_ours(args, batch: int, mem_len: int) -> dict:
  """Times ``Generator.generate`` (tokens/s) and the first item of
  ``Generator.stream`` (first-token latency) for one cell."""
  sys.path.insert(0, REPO)
  import flax.linen as nn
  import jax
  import numpy as np

  from transformer_xl import sharding
  from transformer_xl.cli import process_settings
  from transformer_xl.inference import generate, sampling
  from transformer_xl.model import models

  rss_imports = rss_mib("VmRSS")
  process_settings.release_after_compiles()  # as our command line does

  cfg = model_config(args, mem_len)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  model = models.TransformerXL(cfg)
  params = jax.jit(lambda r: nn.unbox(models.init_params(model, r)))(jax.random.PRNGKey(args.seed))
  jax.block_until_ready(params)
  gen = generate.Generator(cfg, mesh)
  settings = sampling.SamplingSettings(top_k=args.top_k, temperature=args.temperature)
  prompt = prompt_tokens(args, batch)

  def generate_all(seed):
    return gen.generate(params, prompt, args.num_tokens, settings, seed)  # numpy: on the host

  def first_token(seed):
    t0 = time.perf_counter()
    stream = gen.stream(params, prompt, 1, settings, seed)
    next(stream)  # numpy [B]: on the host
    seconds = time.perf_counter() - t0
    for _ in stream:  # num_tokens=1: nothing is left; ends the generator
      pass
    return seconds

  out = measure(args, batch, generate_all, first_token)
  out.update(
      {
          "mem_len": mem_len,
          "tgt_len": args.tgt_len,
          "device": str(jax.devices()[0]),
          "n_params": sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)),
          "rss_after_imports_mib": rss_imports,
          "peak_rss_mib": rss_mib("VmHWM"),
      }
  )
  out["compile_seconds"] = out["warmup_seconds"]  # the warm-up call: compilation + one call
  return out


# ---------------------------------------------------------------------------
# PyTorch (HuggingFace transformers).
# ---------------------------------------------------------------------------


def run_pytorch(args, batch: int, mem_len: int) -> dict:
  """Times ``TransfoXLLMHeadModel.generate`` for one cell: tokens/s of
  ``max_new_tokens=num_tokens``, first-token latency = the whole call with
  ``max_new_tokens=1``."""
  import warnings

  warnings.filterwarnings("ignore")
  import torch
  from transformers import TransfoXLLMHeadModel
  from transformers.utils import logging as hf_logging

  hf_logging.set_verbosity_error()
  sys.path.insert(0, REPO)
  from transformer_xl.cli import process_settings  # stdlib only: no jax in this process

  rss_imports = rss_mib("VmRSS")

  torch.set_num_threads(args.threads)
  torch.manual_seed(args.seed)
  args.dropout, args.dropatt = 0.0, 0.0  # hf_config reads them
  model = TransfoXLLMHeadModel(hf_config(args, mem_len, same_length=False)).eval()
  prompt = torch.from_numpy(prompt_tokens(args, batch)).long()
  process_settings.release_free_memory()  # once its setup is done (as vs_pytorch_workers)

  def call(n, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
      # eos = pad = 0 and min_new_tokens = n: never stops before n new tokens.
      out = model.generate(
          prompt,
          do_sample=True,
          top_k=args.top_k,
          temperature=args.temperature,
          max_new_tokens=n,
          min_new_tokens=n,
          pad_token_id=0,
          eos_token_id=0,
      )
    return out[:, prompt.shape[1] :]

  def first_token(seed):
    t0 = time.perf_counter()
    call(1, seed)
    return time.perf_counter() - t0

  out = measure(args, batch, lambda seed: call(args.num_tokens, seed), first_token)
  out.update(
      {
          "mem_len": mem_len,
          "n_params": sum(p.numel() for p in model.parameters()),
          "torch_threads": torch.get_num_threads(),
          "hf_mem_len": model.transformer.mem_len,
          "hf_same_length": model.transformer.same_length,
          "hf_clamp_len": model.transformer.clamp_len,
          "rss_after_imports_mib": rss_imports,
          "peak_rss_mib": rss_mib("VmHWM"),
      }
  )
  return out
