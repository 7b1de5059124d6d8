"""Training and evaluation speed on the devices present: tokens/s, MFU, memory, compile time.

Run from the repository root, on a GPU host or a TPU VM::

  python benchmarks/accelerator.py [--configs=enwik8_12l,enwik8_24l,wt103_base,wt103_large]
                                   [--steps=20] [--json=FILE] [--no_pytorch]
  python benchmarks/accelerator.py --compare=OLD.json --new=NEW.json   # compare, run nothing
  python benchmarks/accelerator.py --smoke    # CPU, tiny sizes: checks the tool, numbers meaningless

For each config (configs/NAME.py, in bfloat16 with its training settings,
every local device on the ``fsdp`` axis as the slice presets place them):

* **training**: the jitted train step (``train_step.make_train_step``) on random
  token ids placed on the devices first; the global batch is the config's
  (rounded down to a multiple of the device count), halved until the step fits (a compile or run that runs out of device
  memory); compile seconds, median step milliseconds over ``--steps``
  timed steps after ``--warmup``, tokens/s, peak device memory (the
  device's own ``peak_bytes_in_use`` where it reports one, else XLA's
  compile-time estimate, labelled so), and MFU; and the last step's loss
  (``final_loss``): on random tokens with an adaptive softmax it starts at
  the softmax's expected loss at initialisation, above log(vocab)
  (wt103_large: 20.6 nats against 12.5; ``adaptive_init_loss.py``), and the
  config's warm-up keeps it there over a benchmark's few steps;
* **evaluation** at the config's eval settings (e.g. enwik8 24L: tgt_len
  128, mem_len 3,800, clamp_len 1,000), the memory carried from step to
  step: tokens/s;
* **the PyTorch reference port** (HuggingFace ``TransfoXLLMHeadModel``, the
  same sizes, cutoffs and div_val) trained with ``torch.autocast`` in
  bfloat16 on the same device, when torch sees a CUDA GPU (on CPU only with
  ``--smoke``): tokens/s, the baseline of the same run.  HF 4.35's adaptive
  embedding and adaptive softmax cannot run under autocast (with div_val > 1
  the embedding's ``index_copy_`` of bf16 rows into its float32 buffer
  raises "self and source expected to have the same dtype"; the softmax's
  index-put likewise), so both run outside it in float32, HF's own modules
  unchanged: the embedding is computed first and handed to
  ``model.transformer`` as ``inputs_embeds``, the layers run under autocast,
  the softmax gets their output cast to float32.  (With div_val 1 and
  d_embed = d_model, as in every default config but wt103_large, the
  embedding is a plain lookup, the same in either dtype.)

A measurement that raises does not end the run: the config's row in the
JSON and in the summary table says why (``"error"``: the exception's type
and the first line of its message) in place of the numbers (the whole row
where our train step failed, the ``eval`` or ``pytorch`` part where only
that failed), and the run goes on to the next config.  The exit status is 0
when anything was measured, 1 when nothing was (every config's train step
failed); an unknown config name is refused before anything runs.

MFU = model FLOPs per token x tokens/s / the device's peak dense bf16
FLOP/s (``common.PEAK_BF16_FLOPS``; none for a device not in the table).
Model FLOPs per token count the matrix products as this model does them:
``transformer_xl.compile.flops.layer_flops_per_token`` for the layers (q, k, v of the K =
tgt_len + mem_len rows, W_kR over the K position rows, (a)+(c) over K keys,
(b)+(d) over K position rows, the weighted values, o_net, the feed-forward)
plus the adaptive softmax of ``softmax_flops_per_token`` (every
cluster's logits for every token, as ``adaptive.py`` computes them); 3x
the forward for training.

On a GPU with the baseline, JAX is given half of the device's memory
(``XLA_PYTHON_CLIENT_MEM_FRACTION=0.5`` unless set), PyTorch the rest.  The
JSON is rewritten after every config (``"complete"`` says whether all ran).
Measured so far: one NVIDIA H200 (``benchmarks/results/REPORT.md``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_xl.compile.flops import (  # noqa: E402
    softmax_flops_per_token,  # noqa: F401 (the tests read it here)
)
from transformer_xl.compile.flops import (  # noqa: E402
    step_flops_per_token as model_flops_per_token,
)

import common  # noqa: E402  pylint: disable=wrong-import-position
import vs_pytorch  # noqa: E402,F401  pylint: disable=wrong-import-position

OOM = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--configs", default="enwik8_12l,enwik8_24l,wt103_base,wt103_large")
  p.add_argument("--steps", type=int, default=20, help="timed steps")
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--no_pytorch", action="store_true", help="skip the PyTorch baseline")
  p.add_argument("--smoke", action="store_true", help="tiny sizes (CPU): checks the tool")
  p.add_argument("--json", default="", help="output file (default under benchmarks/results/)")
  p.add_argument("--compare", default="", metavar="OLD.json")
  p.add_argument("--new", default="", metavar="NEW.json")
  args = p.parse_args(argv)
  if bool(args.new) != bool(args.compare):
    p.error("--compare=OLD.json and --new=NEW.json go together")
  if args.smoke:
    args.steps, args.warmup = 2, 1
  return args


def load_config(name: str):
  path = os.path.join(common.REPO, "configs", f"{name}.py")
  if not os.path.isfile(path):
    raise SystemExit(
        f"error: no config configs/{name}.py (--configs takes names such as enwik8_24l)"
    )
  spec = importlib.util.spec_from_file_location(f"config_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _is_oom(err: Exception) -> bool:
  return any(s in str(err) for s in OOM)


def failure(err: BaseException) -> str:
  """One line for a result row: the exception's type and the first line of
  its message (at most 300 characters)."""
  lines = str(err).strip().splitlines()
  text = f"{type(err).__name__}: {lines[0].strip()}" if lines else type(err).__name__
  return text if len(text) <= 300 else text[:297] + "..."


def _peak_memory(device, compiled) -> dict:
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and "peak_bytes_in_use" in stats:
    return {"peak_device_mib": stats["peak_bytes_in_use"] / 2**20, "source": "device"}
  ma = compiled.memory_analysis()
  total = (
      (
          ma.argument_size_in_bytes
          + ma.output_size_in_bytes
          - ma.alias_size_in_bytes
          + ma.temp_size_in_bytes
      )
      if ma is not None
      else 0
  )
  return {"peak_device_mib": total / 2**20, "source": "xla_estimate"}


def train_timing(args, config, vocab: int):
  """Times the config's train step on the local devices (the batch halved
  while it runs out of memory): (result dict, the trained state, mesh,
  ModelConfig)."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from transformer_xl import default_config, sharding
  from transformer_xl.model import models
  from transformer_xl.training import (
      lowering,
      train_state,  # noqa: PLC0415
      train_step,
  )

  devices = jax.local_devices()
  device, n = devices[0], len(devices)
  peak = common.PEAK_BF16_FLOPS.get(device.device_kind)
  batch = max(n, config.train.global_batch // n * n)  # a multiple of the devices
  while True:
    config.train.update(global_batch=batch, batch_chunk=1)
    config.mesh.axis_names, config.mesh.shape = ("data", "fsdp", "model"), (1, n, 1)
    default_config.validate(config, n)
    mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names, devices=devices)
    mcfg = lowering.resolved_model_config(config, vocab)
    model = models.TransformerXL(mcfg)
    tx = train_state.make_optimizer(config.train)
    try:
      _, shardings = train_state.abstract_train_state(model, tx, batch, mesh)
      state = train_state.create_train_state(
          model, tx, batch, mesh, jax.random.PRNGKey(0), shardings
      )
      step = train_step.make_train_step(model, tx, mesh, shardings, 1, 0)
      rng = np.random.default_rng(0)
      data = {
          "inputs": rng.integers(0, vocab, (batch, mcfg.tgt_len), dtype=np.int32),
          "targets": rng.integers(0, vocab, (batch, mcfg.tgt_len), dtype=np.int32),
          "weights": np.ones((batch, mcfg.tgt_len), np.float32),
          "reset": np.zeros(batch, bool),
      }
      data = jax.device_put(data, sharding.rows_sharding(mesh))
      t0 = time.perf_counter()
      compiled = step.lower(state, data).compile()
      compile_s = time.perf_counter() - t0
      times = []
      for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        state, metrics = compiled(state, data)
        jax.block_until_ready(metrics)
        if i >= args.warmup:
          times.append(time.perf_counter() - t0)
      break
    except Exception as err:  # out of device memory: half the batch, as the doc says
      if not _is_oom(err) or batch // 2 < n:
        raise
      batch = batch // 2 // n * n
  step_s = statistics.median(times)
  tps = batch * mcfg.tgt_len / step_s
  flops = model_flops_per_token(mcfg, batch, train=True)
  result = {
      "global_batch": batch,
      "tgt_len": mcfg.tgt_len,
      "mem_len": mcfg.mem_len,
      "compile_s": compile_s,
      "step_ms": 1e3 * step_s,
      "tokens_per_sec": tps,
      "flops_per_token": flops,
      "mfu": flops * tps / peak if peak else None,
      "final_loss": float(metrics["loss"]),
      **_peak_memory(device, compiled),
  }
  return result, state, mesh, mcfg


def ours(args, name: str, config, vocab: int) -> dict:
  """Train and eval timings of our model for one config (an eval that raises
  leaves ``{"error": ...}`` as the row's eval part)."""
  import jax  # noqa: PLC0415

  devices = jax.local_devices()
  out = {"config": name, "device_kind": devices[0].device_kind, "devices": len(devices)}
  out["train"], state, mesh, mcfg = train_timing(args, config, vocab)
  tr = out["train"]
  train_line = (
      f"{name}: train {tr['tokens_per_sec']:,.0f} tokens/s ({tr['step_ms']:.1f} ms/step, "
      f"batch {tr['global_batch']}" + (f", MFU {100 * tr['mfu']:.1f}%" if tr["mfu"] else "") + ")"
  )
  try:
    out["eval"] = eval_timing(args, config, vocab, state, mesh, mcfg)
  except Exception as err:  # the train numbers stay; the row says why
    out["eval"] = {"error": failure(err)}
    print(f"{train_line}; eval FAILED: {out['eval']['error']}", flush=True)
  else:
    print(f"{train_line}; eval {out['eval']['tokens_per_sec']:,.0f} tokens/s", flush=True)
  return out


def eval_timing(args, config, vocab: int, state, mesh, mcfg) -> dict:
  """Eval tokens/s of our model at the config's eval settings, the
  parameters of ``state``, the memory carried from step to step."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from transformer_xl import sharding
  from transformer_xl.inference import eval_steps
  from transformer_xl.model import memory as memory_lib
  from transformer_xl.model import models

  devices = jax.local_devices()
  # Evaluation at the config's eval settings, parameters as trained above.
  ecfg = eval_steps.eval_model_config(config, mcfg)
  eval_step = eval_steps.make_eval_step(models.TransformerXL(ecfg), mesh)
  eb = -(-config.eval.global_batch // len(devices)) * len(devices)
  rng = np.random.default_rng(1)
  batches = [
      jax.device_put(
          {
              "inputs": rng.integers(0, vocab, (eb, ecfg.tgt_len), dtype=np.int32),
              "targets": rng.integers(0, vocab, (eb, ecfg.tgt_len), dtype=np.int32),
              "reset": np.zeros(eb, bool),
          },
          sharding.rows_sharding(mesh),
      )
      for _ in range(2)
  ]
  memory = jax.jit(
      lambda: memory_lib.init_memory(ecfg, eb), out_shardings=memory_lib.shardings(ecfg, mesh)
  )()
  run = common.eval_loop(eval_step, state.params, memory, batches)
  run(args.warmup)
  t0 = time.perf_counter()
  run(args.steps)
  eval_tps = args.steps * eb * ecfg.tgt_len / (time.perf_counter() - t0)
  return {
      "global_batch": eb,
      "tgt_len": ecfg.tgt_len,
      "mem_len": ecfg.mem_len,
      "clamp_len": ecfg.clamp_len,
      "tokens_per_sec": eval_tps,
  }


def pytorch(args, config, vocab: int, batch: int) -> dict:
  """The HF port of the reference trained with bf16 autocast: tokens/s.

  HF's adaptive embedding and adaptive softmax run outside autocast, in
  float32 (HF 4.35's cannot run under it: see the module docstring); the
  layers in between under it."""
  import torch  # noqa: PLC0415
  from transformers import TransfoXLConfig, TransfoXLLMHeadModel  # noqa: PLC0415

  m = config.model
  device = "cuda" if torch.cuda.is_available() else "cpu"
  hf = TransfoXLConfig(
      vocab_size=vocab,
      cutoffs=list(m.cutoffs),
      div_val=m.div_val,
      d_model=m.d_model,
      d_embed=m.d_embed or m.d_model,
      n_head=m.n_head,
      d_head=m.d_head,
      d_inner=m.d_inner,
      n_layer=m.n_layer,
      mem_len=m.mem_len,
      clamp_len=m.clamp_len,
      same_length=m.same_length,
      untie_r=m.untie_r,
      pre_lnorm=m.pre_lnorm,
      dropout=m.dropout,
      dropatt=m.dropatt,
      tie_word_embeddings=m.tie_weight,
  )
  model = TransfoXLLMHeadModel(hf).to(device).train()
  opt = torch.optim.Adam(model.parameters(), lr=1e-4)
  x = torch.randint(0, vocab, (batch, m.tgt_len), device=device)
  mems, times = None, []
  for i in range(args.warmup + args.steps):
    t0 = time.perf_counter()
    # The adaptive embedding in float32, outside autocast (with div_val > 1
    # HF 4.35's index_copy_ of bf16 rows into its float32 buffer raises);
    # the layers under bf16 autocast; the adaptive softmax in float32 (its
    # index-put into a float32 output refuses bf16 likewise).
    emb = model.transformer.word_emb(x)  # scaled by sqrt(d_model), as HF's forward does
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
      res = model.transformer(inputs_embeds=emb, mems=mems)
    loss = model.crit(res.last_hidden_state.float(), x).mean()  # shifts the labels itself
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    opt.step()
    opt.zero_grad(set_to_none=True)
    mems = res.mems
    if device == "cuda":
      torch.cuda.synchronize()
    if i >= args.warmup:
      times.append(time.perf_counter() - t0)
  tps = batch * m.tgt_len / statistics.median(times)
  del model, opt, res, mems, loss
  if device == "cuda":
    torch.cuda.empty_cache()  # hand its memory back before the next config
  print(f"  pytorch ({device}, bf16 autocast): {tps:,.0f} tokens/s", flush=True)
  return {
      "device": device,
      "global_batch": batch,
      "tokens_per_sec": tps,
      "torch": torch.__version__,
  }


def _cell(part: dict | None) -> str:
  """A table cell: the part's tokens/s, or "failed" where it has an error,
  or "-" where it is missing."""
  if not part:
    return "-"
  return "failed" if "error" in part else f"{part['tokens_per_sec']:,.0f}"


def summary(results: list[dict], baseline_note: str = "") -> str:
  """The markdown table of a run's rows: tokens/s of our train and eval
  steps and of the PyTorch baseline, and why a part failed."""
  lines = [
      "| config | train tokens/s | eval tokens/s | pytorch tokens/s | notes |",
      "|---|---|---|---|---|",
  ]
  for r in results:
    notes = [f"{k}: {r[k]['error']}" for k in ("eval", "pytorch") if "error" in r.get(k, {})]
    if "error" in r:
      notes = [f"ours: {r['error']}"]
    elif "pytorch" not in r and baseline_note:
      notes.append(baseline_note)
    cells = [_cell(r.get(k)) for k in ("train", "eval", "pytorch")]
    if "error" in r:
      cells[0] = "failed"
    lines.append(f"| {r['config']} | {' | '.join(cells)} | {'; '.join(notes)} |")
  return "\n".join(lines)


def compare(old_path: str, new_path: str) -> int:
  """Prints the tokens/s of two saved runs side by side, per config (a part
  that failed in either run shows as "failed")."""
  runs = []
  for path in (old_path, new_path):
    try:
      with open(path) as f:
        runs.append({r["config"]: r for r in json.load(f)["results"]})
    except (OSError, ValueError, KeyError) as err:
      print(f"error: cannot read {path}: {err}", file=sys.stderr)
      return 1
  print("| config | phase | old tokens/s | new tokens/s | new / old |")
  print("|---|---|---|---|---|")
  for name in [n for n in runs[0] if n in runs[1]]:
    for phase in ("train", "eval"):
      a, b = ("failed" if "error" in run[name] else _cell(run[name].get(phase)) for run in runs)
      if a[0].isdigit() and b[0].isdigit():
        ratio = runs[1][name][phase]["tokens_per_sec"] / runs[0][name][phase]["tokens_per_sec"]
        print(f"| {name} | {phase} | {a} | {b} | {ratio:.2f} |")
      else:
        print(f"| {name} | {phase} | {a} | {b} | - |")
  return 0


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.compare:
    return compare(args.compare, args.new)
  # Every name is checked before anything runs (an unknown one exits here).
  configs = [(name, load_config(name)) for name in args.configs.split(",") if name]
  baseline, baseline_note = not args.no_pytorch, ""
  if baseline and importlib.util.find_spec("torch") is None:
    baseline, baseline_note = False, "pytorch: not run (no torch)"
  elif baseline:
    import torch  # noqa: PLC0415

    if not (torch.cuda.is_available() or args.smoke):
      baseline, baseline_note = False, "pytorch: not run (no CUDA GPU)"
    elif torch.cuda.is_available():
      # JAX takes 75% of a GPU's memory at its first use by default, which would leave the
      # PyTorch baseline in this process a quarter: each gets half (set before JAX starts its
      # backend; an explicit setting in the environment wins).  Our train step's batch is halved
      # until it fits in that half, and the baseline runs at the same batch.
      os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
  import jax  # noqa: PLC0415

  from transformer_xl.training import lowering  # noqa: PLC0415

  machine = common.machine_info(("jax", "jaxlib", "flax", "torch", "transformers"))
  out = args.json or common.default_json_path(machine["host"], prefix="accelerator_")
  results = []

  def write(complete: bool) -> None:
    # Rewritten after every config, so a run stopped part-way (a time limit, a lost
    # machine) keeps the rows it measured; "complete" says whether every config ran.
    data = {
        "args": vars(args),
        "machine": machine,
        "devices": [str(d) for d in jax.local_devices()],
        "complete": complete,
        "results": results,
    }
    common.write_json(out, data, quiet=not complete)

  for name, config in configs:
    config.model.update(dtype="bfloat16")
    if args.smoke:
      config.model.update(
          n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, tgt_len=8, mem_len=8
      )
      config.eval.update(tgt_len=8, mem_len=16, global_batch=2)
      config.train.global_batch = 2
    vocab = lowering.vocab_sizes()[config.data.dataset]
    if args.smoke:
      vocab = min(vocab, 300)
      cutoffs = [c for c in config.model.cutoffs if c < vocab // 2][:2] or (
          [vocab // 4, vocab // 2] if config.model.cutoffs else []
      )
      config.model.update(
          cutoffs=cutoffs, d_embed=32, tie_projs=list(config.model.tie_projs)[: len(cutoffs) + 1]
      )
    try:
      res = ours(args, name, config, vocab)
    except Exception as err:  # the row says why; the next config runs
      results.append({"config": name, "error": failure(err)})
      print(f"{name}: FAILED: {results[-1]['error']}", flush=True)
      write(complete=False)
      continue  # the baseline takes its batch from our train step
    if baseline:
      try:
        res["pytorch"] = pytorch(args, config, vocab, res["train"]["global_batch"])
      except Exception as err:  # the row says why; the next config runs
        res["pytorch"] = {"error": failure(err)}
        print(f"  pytorch FAILED: {res['pytorch']['error']}", flush=True)
    results.append(res)
    write(complete=False)
  print(summary(results, baseline_note), flush=True)
  write(complete=True)
  if not any("train" in r for r in results):
    print("error: nothing could be measured", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
