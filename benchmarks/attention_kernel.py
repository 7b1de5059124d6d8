"""The fused Pallas attention kernel against the XLA path: time and memory.

Run from the repository root, on an accelerator::

  python benchmarks/attention_kernel.py [--lengths=512,1024,2048,4096] [--json=FILE]
  python benchmarks/attention_kernel.py --smoke   # CPU, interpret mode, tiny: checks the tool

Two parts, each measured for ``model.attention_impl`` "xla" and "pallas" in
the same run, on the same device, with the same inputs:

* **attention alone** (``pallas_attention.rel_attention`` against
  ``pallas_attention.xla_reference``, the computation attention.py does for
  attn_type 0 between the projections and ``o_net``): for each T in
  ``--lengths`` with K = 2T keys (mem_len = T), ``--batch`` rows,
  ``--n_head`` x ``--d_head``, ``--dtype``: the forward pass, and forward +
  backward (the gradients of q, k, v, r, u and v), median milliseconds of
  ``--repeats`` timed calls after a compile and ``--warmup`` calls; and the
  compiled program's temporary memory (``memory_analysis()``: what XLA
  allocates beyond the arguments and outputs), MiB.
* **the training step** of ``--train_configs`` (configs/*.py, bf16,
  ``train.global_batch`` of the config unless ``--train_batch``): tokens/s
  (median of the timed steps) and MFU = model FLOPs per token
  (``accelerator.model_flops_per_token``) x tokens/s / the device's peak
  bf16 FLOP/s (``common.PEAK_BF16_FLOPS``; none where the device is not in
  the table).

The ratios printed are xla / pallas (time) and pallas / xla (memory).  On
CPU the kernel runs in Pallas interpret mode, orders of magnitude slower
than compiled: ``--smoke`` checks that the tool works, its numbers mean
nothing.  Writes a JSON (default ``benchmarks/results/attention_kernel_<date>_<host>.json``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import accelerator  # noqa: E402  pylint: disable=wrong-import-position
import common  # noqa: E402  pylint: disable=wrong-import-position


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--lengths", default="512,1024,2048,4096", help="T values; K = 2T")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--n_head", type=int, default=8)
  p.add_argument("--d_head", type=int, default=64)
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--steps", type=int, default=10, help="timed training steps")
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument(
      "--train_configs", default="enwik8_12l,enwik8_24l", help="configs/*.py names ('' = none)"
  )
  p.add_argument("--train_batch", type=int, default=0, help="0 = the config's global_batch")
  p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (interpret mode)")
  p.add_argument("--json", default="", help="output file (default under benchmarks/results/)")
  args = p.parse_args(argv)
  if args.smoke:
    args.lengths, args.batch, args.n_head, args.d_head = "8,16", 2, 2, 8
    args.repeats, args.warmup, args.train_batch, args.steps = 2, 1, 2, 2
  return args


def _median_ms(fn, args, repeats: int, warmup: int) -> float:
  import jax  # noqa: PLC0415

  jax.block_until_ready(fn(*args))  # compile
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


def _temp_mib(fn, args) -> float | None:
  analysis = fn.lower(*args).compile().memory_analysis()
  return None if analysis is None else analysis.temp_size_in_bytes / 2**20


def attention_part(args) -> list[dict]:
  """Forward and forward+backward of the attention alone, both paths."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  from transformer_xl.model import pallas_attention  # noqa: PLC0415

  dtype = jnp.dtype(args.dtype)
  rows = []
  for t in (int(x) for x in args.lengths.split(",")):
    m, b, h, dh = t, args.batch, args.n_head, args.d_head
    keys = jax.random.split(jax.random.PRNGKey(t), 6)
    shapes = [(b, t, h, dh), (b, t + m, h, dh), (b, t + m, h, dh), (t + m, h, dh), (h, dh), (h, dh)]
    inputs = tuple(jax.random.normal(k, s).astype(dtype) for k, s in zip(keys, shapes))
    mlen = jnp.full((b,), m, jnp.int32)
    impls = {
        "xla": lambda *a: pallas_attention.xla_reference(
            *a, mlen, None, mem_len=m, same_length=False
        ),
        "pallas": lambda *a: pallas_attention.rel_attention(
            *a, mlen, None, mem_len=m, same_length=False
        ),
    }
    row = {"T": t, "K": t + m, "batch": b, "n_head": h, "d_head": dh, "dtype": args.dtype}
    for name, fn in impls.items():
      fwd = jax.jit(fn)
      loss = lambda *a, fn=fn: jnp.sum(fn(*a).astype(jnp.float32))
      fwd_bwd = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(6))))
      row[name] = {
          "fwd_ms": _median_ms(fwd, inputs, args.repeats, args.warmup),
          "fwd_bwd_ms": _median_ms(fwd_bwd, inputs, args.repeats, args.warmup),
          "fwd_temp_mib": _temp_mib(fwd, inputs),
          "fwd_bwd_temp_mib": _temp_mib(fwd_bwd, inputs),
      }
    rows.append(row)
    print(
        f"T={t} K={t + m}: "
        + "; ".join(
            f"{k} {row['xla'][k]:.2f} / {row['pallas'][k]:.2f}" for k in ("fwd_ms", "fwd_bwd_ms")
        ),
        flush=True,
    )
  return rows


def train_part(args) -> list[dict]:
  """Tokens/s and MFU of the configs' training step, both paths
  (``accelerator.train_timing``: the same step, batch and FLOP count)."""
  rows = []
  for name in [n for n in args.train_configs.split(",") if n]:
    config = accelerator.load_config(name)
    if args.smoke:
      config.model.update(
          n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=8, mem_len=8
      )
    config.model.update(dtype="bfloat16", dropatt=0.0)
    if args.train_batch:
      config.train.global_batch = args.train_batch
    from transformer_xl.training import lowering  # noqa: PLC0415

    vocab = lowering.vocab_sizes()[config.data.dataset]
    row = {"config": name}
    for impl in ("xla", "pallas"):
      config.model.attention_impl = impl
      timing = accelerator.train_timing(args, config, vocab)[0]
      row[impl] = {k: timing[k] for k in ("global_batch", "tokens_per_sec", "mfu", "step_ms")}
      print(
          f"{name} {impl}: {timing['tokens_per_sec']:,.0f} tokens/s"
          + (f", MFU {100 * timing['mfu']:.1f}%" if timing["mfu"] else ""),
          flush=True,
      )
    rows.append(row)
  return rows


def main(argv=None) -> int:
  args = parse_args(argv)
  import jax  # noqa: PLC0415

  device = jax.devices()[0]
  result = {
      "args": vars(args),
      "machine": common.machine_info(("jax", "jaxlib", "flax")),
      "device": {
          "platform": device.platform,
          "kind": device.device_kind,
          "count": jax.device_count(),
      },
      "complete": False,
      "attention": attention_part(args),
  }
  out = args.json or common.default_json_path(result["machine"]["host"], prefix="attention_kernel_")
  # Written once the attention part is measured, again at the end: a run stopped during the
  # (slower) training part keeps the attention rows.
  common.write_json(out, result, quiet=True)
  result.update(train=train_part(args), complete=True)
  print(
      "| T | K | fwd ms xla | fwd ms pallas | fwd+bwd ms xla | fwd+bwd ms pallas "
      "| fwd+bwd temp MiB xla | pallas |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for r in result["attention"]:
    x, p = r["xla"], r["pallas"]
    print(
        f"| {r['T']} | {r['K']} | {x['fwd_ms']:.2f} | {p['fwd_ms']:.2f} | "
        f"{x['fwd_bwd_ms']:.2f} | {p['fwd_bwd_ms']:.2f} | {x['fwd_bwd_temp_mib'] or 0:.1f} | "
        f"{p['fwd_bwd_temp_mib'] or 0:.1f} |"
    )
  common.write_json(out, result)
  return 0


if __name__ == "__main__":
  sys.exit(main())
