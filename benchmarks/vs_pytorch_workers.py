"""The two workers of ``vs_pytorch.py``: each times one phase (train, eval or
eval_long) of one implementation in its own subprocess, then measures the
machine's float32 matmul limit there, and returns a result dict that the
parent saves in its JSON.

* ``run_ours``: our jitted train step or eval step (JAX / Flax);
* ``run_pytorch``: HuggingFace's ``TransfoXLLMHeadModel`` (torch).

``vs_pytorch.py --worker=ours|pytorch --phase=PHASE`` runs one of them.
Nothing heavy is imported at import time: the parent imports this module,
and the PyTorch worker never imports JAX.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

import common

REPO = common.REPO


# ---------------------------------------------------------------------------
# Shared by both workers (no jax / torch imports here).
# ---------------------------------------------------------------------------


def _token_batches(args, batch: int, tgt_len: int, n: int = 4):
  """n distinct (inputs, targets) int32 numpy pairs [batch, tgt_len], from one
  random stream per row (targets = inputs shifted by one)."""
  import numpy as np

  rng = np.random.default_rng(args.seed)
  stream = rng.integers(0, args.vocab, size=(batch, n * tgt_len + 1), dtype=np.int64)
  return [
      (
          stream[:, i * tgt_len : (i + 1) * tgt_len].astype(np.int32),
          stream[:, i * tgt_len + 1 : (i + 1) * tgt_len + 1].astype(np.int32),
      )
      for i in range(n)
  ]


def _time_repeats(run_steps, args) -> dict:
  """Times ``args.repeats`` calls of ``run_steps(args.steps)``, after one
  untimed ``run_steps(args.warmup)``.

  Returns {"seconds": wall seconds per repeat, "cpu_seconds": process CPU
  seconds (all threads, user + system) per repeat, "sys_seconds": system
  time over all repeats, "minor_faults": page faults over all repeats}.
  """
  if args.warmup:
    run_steps(args.warmup)
  times, cpu = [], []
  ru0 = resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(args.repeats):
    c0, t0 = time.process_time(), time.perf_counter()
    run_steps(args.steps)
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  ru1 = resource.getrusage(resource.RUSAGE_SELF)
  return {
      "seconds": times,
      "cpu_seconds": cpu,
      "sys_seconds": ru1.ru_stime - ru0.ru_stime,
      "minor_faults": ru1.ru_minflt - ru0.ru_minflt,
  }


def _summary(timing: dict, tokens_per_step: int, steps: int) -> dict:
  """tokens/s per repeat and their median, plus diagnostics per step.

  ``cpu_per_wall`` (process CPU seconds per wall second, all threads) shows
  how many cores the run got: well below --threads means other processes
  took CPU time (or the run could not use all threads).  ``sys_ms_per_step``
  and ``minor_faults_per_step`` show time in the kernel, mostly first
  touches of freshly mapped buffers.
  """
  times, n = timing["seconds"], steps * len(timing["seconds"])
  tps = [tokens_per_step * steps / t for t in times]
  return {
      "tokens_per_step": tokens_per_step,
      "steps": steps,
      "seconds": times,
      "tokens_per_sec": tps,
      "median_tokens_per_sec": statistics.median(tps),
      "min_tokens_per_sec": min(tps),
      "max_tokens_per_sec": max(tps),
      "median_ms_per_step": 1e3 * statistics.median(times) / steps,
      "cpu_per_wall": [c / t for c, t in zip(timing["cpu_seconds"], times)],
      "sys_ms_per_step": 1e3 * timing["sys_seconds"] / n,
      "minor_faults_per_step": timing["minor_faults"] / n,
  }


def rss_mib(field: str = "VmHWM") -> float:
  """This process's resident set in MiB: ``field`` of /proc/self/status
  ("VmHWM" = the peak so far, "VmRSS" = now).  Where /proc is missing, the
  peak from ``getrusage`` (ru_maxrss: KiB on Linux, bytes on macOS)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) / 1024  # kB
  except OSError:
    pass
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def measure_matmul(args, products: dict) -> dict:
  """float32 GFLOP/s of an N x N by N x N product (2 N^3 FLOPs), N =
  ``--matmul_n``, by each library: the fastest of ``--matmul_repeats``
  timed calls after one untimed call.

  Args:
    products: {library name: make(a, b) -> a function computing a @ b to
      completion}, for numpy float32 arrays a, b.

  Returns:
    {"n": N, "<name>_gflops": GFLOP/s for each library}.
  """
  import numpy as np

  n = args.matmul_n
  rng = np.random.default_rng(args.seed)
  a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
  out = {"n": n}
  for name, make in products.items():
    fn = make(a, b)
    fn()
    times = []
    for _ in range(args.matmul_repeats):
      t0 = time.perf_counter()
      fn()
      times.append(time.perf_counter() - t0)
    out[f"{name}_gflops"] = 2 * n**3 / min(times) / 1e9
  return out


def _numpy_dot(a, b):
  import numpy as np

  return lambda: np.dot(a, b)


# ---------------------------------------------------------------------------
# Ours (JAX / Flax).
# ---------------------------------------------------------------------------


def run_ours(args, phase: str, batch: int, tgt_len: int, mem_len: int) -> dict:
  """Times our jitted train step or eval step for one phase, of ``batch`` rows
  of ``tgt_len`` tokens with a memory of ``mem_len``; returns its result dict
  (tokens/s, ms per step, peak RSS in MiB, matmul GFLOP/s, ...)."""
  sys.path.insert(0, REPO)
  import flax.linen as nn
  import jax
  import numpy as np

  from transformer_xl import default_config, sharding
  from transformer_xl.cli import process_settings
  from transformer_xl.inference import eval_steps
  from transformer_xl.model import memory as memory_lib
  from transformer_xl.model import models, tuning
  from transformer_xl.training import train_state, train_step

  rss_imports = rss_mib("VmRSS")
  process_settings.release_after_compiles()  # as our command line and training loop do

  config = default_config.get_config()
  config.model.update(
      n_layer=args.n_layer,
      d_model=args.d_model,
      n_head=args.n_head,
      d_head=args.d_head,
      d_inner=args.d_inner,
      dropout=args.dropout,
      dropatt=args.dropatt,
      tgt_len=args.tgt_len,
      mem_len=args.mem_len,
      clamp_len=0,
      same_length=False,
      untie_r=False,
      tie_weight=True,
      dtype="float32",
      remat="none",
      cutoffs=(),
      div_val=1,
  )
  if args.block is not None:
    config.model.attn_block = args.block
  if args.scan_unroll is not None:
    config.model.scan_unroll = args.scan_unroll
  config.train.update(
      global_batch=args.batch,
      batch_chunk=1,
      warmup_steps=0,
      learning_rate=args.lr,
      min_lr=args.lr,
      clip=args.clip,
      num_steps=10**9,
      seed=args.seed,
  )
  config.eval.update(
      tgt_len=tgt_len,
      mem_len=mem_len,
      clamp_len=0,
      same_length=bool(args.eval_same_length),
      global_batch=args.eval_batch,
  )
  mcfg = default_config.model_config(config, args.vocab)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  rng = jax.random.PRNGKey(args.seed)
  _, state_shardings = train_state.abstract_train_state(model, tx, args.batch, mesh)
  out = {
      "device": str(jax.devices()[0]),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "attn_block": tuning.attn_block_size(mcfg.attn_block, deterministic=phase != "train"),
      "scan_unroll": tuning.scan_unroll_layers(mcfg.scan_unroll, mcfg.n_layer),
      "rss_after_imports_mib": rss_imports,
  }

  if phase == "train":
    state = train_state.create_train_state(model, tx, args.batch, mesh, rng, state_shardings)
    out["n_params"] = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
    batches = [
        jax.device_put(
            {
                "inputs": x,
                "targets": y,
                "weights": np.ones(x.shape, np.float32),
                "reset": np.zeros((batch,), bool),
            },
            {
                "inputs": sharding.batch_sharding(mesh),
                "targets": sharding.batch_sharding(mesh),
                "weights": sharding.batch_sharding(mesh),
                "reset": sharding.rows_sharding(mesh),
            },
        )
        for x, y in _token_batches(args, batch, tgt_len)
    ]
    step_fn = train_step.make_train_step(model, tx, mesh, state_shardings, 1, args.seed)
    holder = {"state": state, "i": 0}
    del state  # donated by the first step

    def run_train(n):
      s, m = holder["state"], None
      for _ in range(n):
        s, m = step_fn(s, batches[holder["i"] % len(batches)])
        holder["i"] += 1
      jax.block_until_ready((s, m))
      holder["state"] = s
      holder["loss"] = float(m["loss"])

    out.update(_summary(_time_repeats(run_train, args), batch * tgt_len, args.steps))
    out["last_loss"] = holder["loss"]
  else:
    # Parameters only (no optimizer state): what an evaluation holds.
    params = jax.jit(
        lambda r: nn.unbox(models.init_params(model, r)), out_shardings=state_shardings.params
    )(rng)
    out["n_params"] = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    ecfg = eval_steps.eval_model_config(config, mcfg)
    eval_step = eval_steps.make_eval_step(models.TransformerXL(ecfg), mesh)  # the Evaluator's
    batch_sharding = sharding.batch_sharding(mesh)
    batches = [
        jax.device_put(
            {"inputs": x, "targets": y, "reset": np.zeros((batch,), bool)},
            {
                "inputs": batch_sharding,
                "targets": batch_sharding,
                "reset": sharding.rows_sharding(mesh),
            },
        )
        for x, y in _token_batches(args, batch, tgt_len)
    ]
    init_memory = jax.jit(
        lambda: memory_lib.init_memory(ecfg, batch), out_shardings=memory_lib.shardings(ecfg, mesh)
    )
    run_eval = common.eval_loop(eval_step, params, init_memory(), batches)
    out.update(_summary(_time_repeats(run_eval, args), batch * tgt_len, args.steps))
  out["peak_rss_mib"] = rss_mib("VmHWM")

  def jax_dot(a, b):
    import jax.numpy as jnp

    dot, xa, xb = jax.jit(jnp.dot), jax.device_put(a), jax.device_put(b)
    return lambda: dot(xa, xb).block_until_ready()

  out["matmul"] = measure_matmul(args, {"numpy": _numpy_dot, "jax": jax_dot})
  return out


# ---------------------------------------------------------------------------
# PyTorch (HuggingFace transformers).
# ---------------------------------------------------------------------------


def hf_config(args, mem_len: int, same_length: bool):
  """The TransfoXLConfig equal to our model: dense softmax (no cutoffs,
  div_val 1, d_embed = d_model), tied output weights with a bias, shared
  u/v (untie_r=False), no clamp."""
  from transformers import TransfoXLConfig

  return TransfoXLConfig(
      vocab_size=args.vocab,
      cutoffs=[],
      div_val=1,
      adaptive=True,
      d_model=args.d_model,
      d_embed=args.d_model,
      n_head=args.n_head,
      d_head=args.d_head,
      d_inner=args.d_inner,
      n_layer=args.n_layer,
      mem_len=mem_len,
      clamp_len=0,
      same_length=same_length,
      untie_r=False,
      pre_lnorm=False,
      attn_type=0,
      dropout=args.dropout,
      dropatt=args.dropatt,
      tie_word_embeddings=True,
      proj_share_all_but_first=False,
      sample_softmax=-1,
  )


def run_pytorch(args, phase: str, batch: int, tgt_len: int, mem_len: int) -> dict:
  """Times HF TransfoXLLMHeadModel training or evaluation for one phase, of
  ``batch`` rows of ``tgt_len`` tokens with a memory of ``mem_len``; returns
  its result dict (tokens/s, ms per step, peak RSS in MiB, matmul GFLOP/s, ...)."""
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
  model = TransfoXLLMHeadModel(hf_config(args, args.mem_len, same_length=False))
  out = {
      "n_params": sum(p.numel() for p in model.parameters()),  # tied weights counted once
      "torch_threads": torch.get_num_threads(),
      "torch_config": torch.__config__.parallel_info(),
      "rss_after_imports_mib": rss_imports,
  }
  # HF shifts labels inside (hidden t predicts labels t+1): pass the inputs.
  batches = [torch.from_numpy(x).long() for x, _ in _token_batches(args, batch, tgt_len)]
  holder = {"mems": None, "i": 0}
  process_settings.release_free_memory()  # once its setup is done (ours: after each compilation)

  if phase == "train":
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8)

    def run_train(n):
      mems = holder["mems"]
      for _ in range(n):
        x = batches[holder["i"] % len(batches)]
        holder["i"] += 1
        res = model(input_ids=x, mems=mems, labels=x)
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mems = res.mems  # detached by HF (_update_mems runs under no_grad)
      holder["mems"] = mems
      holder["loss"] = float(res.loss)

    out.update(_summary(_time_repeats(run_train, args), batch * tgt_len, args.steps))
    out["last_loss"] = holder["loss"]
  else:
    model.eval()
    model.reset_memory_length(mem_len)
    model.transformer.same_length = bool(args.eval_same_length)

    def run_eval(n):
      mems = holder["mems"]
      with torch.no_grad():
        for _ in range(n):
          x = batches[holder["i"] % len(batches)]
          holder["i"] += 1
          mems = model(input_ids=x, mems=mems, labels=x).mems
      holder["mems"] = mems

    out.update(_summary(_time_repeats(run_eval, args), batch * tgt_len, args.steps))
  out["peak_rss_mib"] = rss_mib("VmHWM")

  def torch_mm(a, b):
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return lambda: torch.mm(ta, tb)

  out["matmul"] = measure_matmul(args, {"numpy": _numpy_dot, "torch": torch_mm})
  return out
