"""The memory variants' outputs, for the check that a rewrite changed no bit.

Runs the model (``models.TransformerXL``) on fixed tokens for a set of memory
settings (the XL memory with each attention type, documents, front padding
and the decoding cache; the compressive memory with each compression
function; the memory tokens with and without the XL cache, ``mem_at_end``,
``read_mem_from_cache``, ``same_length`` and backpropagation through
segments) and saves, per case, the initial parameters, the per-segment
NLLs, the memory after each segment, the auxiliary losses and the gradient
of the summed loss: ``tests/fixtures/memory_bitwise.npz``, with the machine
that computed it (``machine()``: the CPU model and XLA's backend
optimisation level; float32 results differ in the last bits between CPU
models and between levels).
``tests/test_memory_bitwise.py`` recomputes every array and compares.

Written against the API that both the code that made the committed
fixture and today's code have (``ModelConfig.from_dict`` with the flat
field names of saved files; leaves named by their pytree paths), so that
running it on an older commit writes the fixture of that commit:

    XLA_FLAGS=--xla_backend_optimization_level=0 \
      python scripts/make_memory_fixtures.py --out tests/fixtures/memory_bitwise.npz

(the level the test suite compiles at, ``tests/conftest.py``).
"""

from __future__ import annotations

import argparse
import os
import platform

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from transformer_xl.model import memory as memory_lib  # noqa: E402
from transformer_xl.model import models  # noqa: E402

SIZES = dict(n_token=23, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32)
B, SEGMENTS = 3, 4

# name -> (model fields, what the run does): "grad" (sum of the NLLs of every
# segment; the memory between segments as the model returns it: stop-gradient
# XL states, memory tokens with their gradient), "docs" (document offsets),
# "pad" (front padding), "decode" (the decoding cache), "reset" (rows reset
# at the third segment).
CASES: dict[str, tuple[dict, tuple[str, ...]]] = {
    "xl_type0": (dict(tgt_len=4, mem_len=6, dropout=0.1, dropatt=0.1), ("grad", "reset")),
    "xl_type1": (dict(tgt_len=4, mem_len=6, attn_type=1), ("grad",)),
    "xl_type2": (dict(tgt_len=4, mem_len=6, attn_type=2), ("grad",)),
    "xl_type3": (dict(tgt_len=4, mem_len=6, attn_type=3), ("grad",)),
    "xl_prelnorm_same_length": (
        dict(tgt_len=4, mem_len=6, pre_lnorm=True, same_length=True, untie_r=True, clamp_len=5),
        ("grad",),
    ),
    "xl_docs": (dict(tgt_len=4, mem_len=6), ("docs",)),
    "xl_pad": (dict(tgt_len=4, mem_len=0), ("pad",)),
    "xl_decode": (dict(tgt_len=4, mem_len=6), ("decode",)),
    **{
        f"compressive_{fn}": (
            dict(tgt_len=4, mem_len=4, memory="compressive", cmem_len=4, cmem_ratio=2, cmem_fn=fn),
            ("grad", "reset"),
        )
        for fn in ("max_pool", "mean_pool", "conv", "dilated_conv", "most_used")
    },
    "compressive_zero": (
        dict(tgt_len=4, mem_len=4, memory="compressive", cmem_len=0, cmem_ratio=2),
        ("grad",),
    ),
    "tokens_cache": (
        dict(tgt_len=4, mem_len=6, num_mem_tokens=2, dropout=0.1),
        ("grad", "reset"),
    ),
    "tokens_no_cache": (dict(tgt_len=4, mem_len=0, num_mem_tokens=2), ("grad",)),
    "tokens_not_at_end": (
        dict(tgt_len=4, mem_len=6, num_mem_tokens=2, mem_at_end=False),
        ("grad",),
    ),
    "tokens_read_cache": (
        dict(tgt_len=4, mem_len=6, num_mem_tokens=2, read_mem_from_cache=True),
        ("grad",),
    ),
    "tokens_same_length": (
        dict(tgt_len=4, mem_len=6, num_mem_tokens=3, same_length=True),
        ("grad",),
    ),
}


def _named(tree, prefix: str) -> dict[str, np.ndarray]:
  """{prefix/path: array} of a pytree's leaves."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {
      f"{prefix}/{jax.tree_util.keystr(path)}": np.asarray(leaf)
      for path, leaf in leaves
      if leaf is not None
  }


def run_case(fields: dict, kinds: tuple[str, ...]) -> dict[str, np.ndarray]:
  """The arrays of one case (names: "params/...", "nll_s", "memory_s/...",
  "losses_s/...", "grad/...")."""
  cfg = models.ModelConfig.from_dict({**SIZES, **fields})
  model = models.TransformerXL(cfg)
  params = jax.device_get(models.init_params(model, jax.random.PRNGKey(0)))
  rng = np.random.default_rng(1)
  tokens_SxBxT = jnp.asarray(rng.integers(0, cfg.n_token, (SEGMENTS, B, cfg.tgt_len)), jnp.int32)
  targets_SxBxT = jnp.asarray(rng.integers(0, cfg.n_token, (SEGMENTS, B, cfg.tgt_len)), jnp.int32)
  train = cfg.dropout > 0
  out = _named(params, "params")

  # The segments run in a lax.scan (one compiled body, the forward and the
  # gradient in one program): seconds a case, not tens.
  reset_SxB = np.zeros((SEGMENTS, B), bool)
  if "reset" in kinds:
    reset_SxB[2] = [False, True, False]
  doc_pos_SxBxT = None
  if "docs" in kinds:  # a document starts at position s % T of each row, offsets from it
    t = np.arange(cfg.tgt_len)
    doc_pos_SxBxT = jnp.asarray(
        np.stack(
            [
                np.broadcast_to(
                    np.where(t >= s % cfg.tgt_len, t - s % cfg.tgt_len, t + 9), (B, cfg.tgt_len)
                )
                for s in range(SEGMENTS)
            ]
        ),
        jnp.int32,
    )
  keys_S = jnp.stack([jax.random.PRNGKey(10 + s) for s in range(SEGMENTS)]) if train else None
  xs = (tokens_SxBxT, targets_SxBxT, jnp.asarray(reset_SxB), doc_pos_SxBxT, keys_S)

  def segment(p, memory, x):
    tokens_BxT, targets_BxT, reset_B, doc_pos_BxT, key = x
    (nll_BxT, memory), state = model.apply(
        {"params": p},
        tokens_BxT,
        memory,
        targets_BxT,
        deterministic=not train,
        reset_B=reset_B,
        doc_pos_BxT=doc_pos_BxT,
        rngs={"dropout": key} if train else None,
        mutable=["losses"],
    )
    return memory, (nll_BxT, memory, state.get("losses", {}))

  memory = memory_lib.init_memory(cfg, B)
  if "pad" in kinds:
    memory = memory.with_front_padding(jnp.asarray([0, 2, 5], jnp.int32))

  if "decode" in kinds:

    def decode(p):  # as generation: the prompt without the cache, then one token a pass
      hidden, mem = model.apply({"params": p}, tokens_SxBxT[0], memory, method=model.hidden)
      outs, cache = [hidden], None
      for i in range(3):
        hidden, mem, cache = model.apply(
            {"params": p}, tokens_SxBxT[1][:, i : i + 1], mem, cache, method=model.decode
        )
        outs.append(hidden)
      return outs, mem

    outs, mem = jax.jit(decode)(params)
    for i, h in enumerate(outs):
      out[f"hidden_{i}"] = np.asarray(h)
    out.update(_named(mem, "memory_decode"))
    return out

  def run(p):  # the summed loss; the segments' NLLs, memories and auxiliary losses
    _, per_segment = jax.lax.scan(lambda m, x: segment(p, m, x), memory, xs)
    aux = sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(per_segment[2]))
    return jnp.sum(per_segment[0]) + aux, per_segment

  if "grad" in kinds:
    grad, (nlls, memories, losses) = jax.jit(jax.grad(run, has_aux=True))(params)
    out.update(_named(grad, "grad"))
  else:
    _, (nlls, memories, losses) = jax.jit(run)(params)
  for s in range(SEGMENTS):
    out[f"nll_{s}"] = np.asarray(nlls[s])
    out.update(_named(jax.tree_util.tree_map(lambda a: a[s], memories), f"memory_{s}"))
    out.update(_named(jax.tree_util.tree_map(lambda a: a[s], losses), f"losses_{s}"))
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="tests/fixtures/memory_bitwise.npz")
  args = parser.parse_args()
  arrays = {"machine": np.asarray(machine())}
  for name, (fields, kinds) in CASES.items():
    for key, value in run_case(fields, kinds).items():
      arrays[f"{name}:{key}"] = value
    print(name, "done", flush=True)
  np.savez_compressed(args.out, **arrays)
  print(f"wrote {args.out}: {len(arrays)} arrays")


def machine() -> str:
  """What decides the last bits of float32 results here: the CPU model
  (``/proc/cpuinfo``'s "model name", else ``platform.processor()``) and the
  ``--xla_backend_optimization_level`` of ``XLA_FLAGS`` (XLA's default if
  unset), e.g. ``"AMD EPYC 7B13; --xla_backend_optimization_level=0"``."""
  cpu = platform.processor() or "unknown"
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
  except OSError:
    pass
  flags = os.environ.get("XLA_FLAGS", "").split()
  level = [f for f in flags if f.startswith("--xla_backend_optimization_level")]
  return "; ".join([cpu, *(level[-1:] or ["default optimisation"])])


if __name__ == "__main__":
  main()
