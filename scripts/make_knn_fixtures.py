"""Writes tests/fixtures/knn_meliad.npz by running the authors' kNN memory code.

Memorizing Transformers (Wu et al. 2022, arXiv 2203.08913) is implemented in
google-research/meliad (JAX, Apache-2.0): the store and its retrieval in
``transformer/memory/memory_layer.py`` (``MemoryOnTpu`` wrapped in
``BatchedMemory``, as ``memory_factory.MemoryManager`` builds it with
``cross_batch_memory=False``: one store per row and head), the memory
attention in ``transformer/attention.py`` (``external_attention``) and the
gate in ``transformer/memory/transformer_layer.py`` (``TransformerLayer``,
"TRAINABLE_WEIGHTED_MEAN").  This script exports that code from a checkout
or a bare git mirror (``git archive HEAD``) to a temporary directory,
imports it (modules the memory path never calls, which need TensorFlow,
seqio or TensorBoard, are stubbed) and runs:

* ``store``: ``BatchedMemory(MemoryOnTpu)`` over SEGMENTS segments, as
  ``TransformerLayer._query_external_memory`` runs it (reset at a row's
  start of sequence, top-k retrieval, then the update), with B = 2 rows,
  H = 2 heads, S = 16 slots, k = 4, T = 4: the store wraps around after 4
  segments, and row 1 restarts at segment RESET_AT.  A few keys repeat an
  earlier one (ties in a group), one is all zeros (an empty slot).
* ``layer``: their ``TransformerLayer`` with that memory over the same
  segments, its keys, values and queries replaced by the store case's
  (``MemTransformerBase.kvq`` patched; the queries are their
  ``normalize_kq`` of the layer input, so that the gradient of the queries
  is that of the input), ``external_memory_bias`` and ``attention_scale``
  set to non-trivial values; recorded: the local attention's output, the
  retrieved keys and values, the memory attention's output and the gated
  output (the input of ``post_attn_ffn``), and, with the local output fixed
  and ``post_attn_ffn`` returning the gated output, the gradient of
  ``sum(gated * cotangent)`` with respect to the gate bias, the attention
  scale and the layer input (the raw queries).

Arrays (float32 unless said; s = segment):

  q_SxBxTxHxD, k_SxBxTxHxD, v_SxBxTxHxD  the (normalised) queries and keys,
                                        and the values, per segment;
  sos_SxB                       bool, start of sequence (reset) per segment;
  rkeys_SxBxTxHxKxD, rvals_...  the retrieved neighbours (their order);
  scores_SxBxHxTxK, slots_SxBxHxTxK  their top-k scores and slot indices
                                (int32; datasets b H + h as [B, H, ...]);
  key_db_SxBxHxSxD, value_db_..., index_SxB  the store after each update;
  bias_H, scale_H               the gate bias and attention scale;
  local_SxBxTxHxD, ext_SxBxTxHxD, gated_SxBxTxHxD  the layer's local and
                                memory attention and their combination;
  cot_SxBxTxHxD                 the gradient pass's cotangent;
  grad_bias_SxH, grad_scale_SxH, grad_xq_SxBxTxHxD  its gradients.

Usage:
  python scripts/make_knn_fixtures.py /work/.mirror/google-research+meliad/repo \
      [--out tests/fixtures]

Needs gin-config and einops (pip) besides this package's dependencies.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import types

import numpy as np

B, H, D, S, K, T = 2, 2, 4, 16, 4, 4
SEGMENTS = 6
RESET_AT = 3  # row 1 starts a new sequence here
BIAS_H = np.array([0.4, -0.9], np.float32)
SCALE_H = np.array([2.5, -3.0], np.float32)  # theirs takes the absolute value

GIN = """
transformer_base.MemTransformerBase.attn_mlp_factory = @transformer_attn/nn_components.MLP
transformer_base.MemTransformerBase.ffn_factory = @transformer_ffn/nn_components.MLP
transformer_base.MemTransformerBase.normalize_keys = True
transformer_base.MemTransformerBase.dropout_rate = 0.0
transformer_attn/nn_components.MLP.num_layers = 1
transformer_attn/nn_components.MLP.hidden_activation = None
transformer_attn/nn_components.MLP.use_bias = False
transformer_ffn/nn_components.MLP.num_layers = 2
transformer_ffn/nn_components.MLP.hidden_activation = "relu"
transformer_ffn/nn_components.MLP.use_bias = False
"""


def export_code(source: str, dest: str) -> str:
  """Copies meliad's code from ``source`` (a checkout, or a bare mirror's
  ``git archive HEAD``) to ``dest``; returns the root to import from."""
  if os.path.isdir(os.path.join(source, "transformer")):
    return source
  tar = subprocess.run(
      ["git", f"--git-dir={source}", "archive", "HEAD"], check=True, capture_output=True
  ).stdout
  with tarfile.open(fileobj=io.BytesIO(tar)) as t:
    t.extractall(dest, filter="data")
  return dest


def import_meliad(root: str):
  """Their modules, with the ones the memory path never calls stubbed."""
  sys.path.insert(0, root)
  summary = types.ModuleType("metrics_summary")
  summary.vshape = lambda x: str(getattr(x, "shape", x))
  sys.modules["metrics_summary"] = summary
  for name in ("seqio", "model_base", "transformer.text_dataset", "transformer.language_model"):
    sys.modules[name] = types.ModuleType(name)
  import gin  # noqa: F401  (theirs needs it)
  from transformer import attention, nn_components  # noqa: F401
  from transformer.memory import memory_factory, transformer_base, transformer_layer

  gin.parse_config(GIN)
  return attention, memory_factory, transformer_base, transformer_layer


def inputs(rng: np.random.Generator, normalize):
  """Queries, keys (normalised by theirs) and values per segment, with
  repeated keys (ties), one zero key (an empty slot) and the resets."""
  shape = (SEGMENTS, B, T, H, D)
  q = normalize(rng.normal(size=shape).astype(np.float32))
  k = normalize(rng.normal(size=shape).astype(np.float32))
  k[2, 0, 1] = k[0, 0, 3]  # a key written again: equal scores in one group
  k[4, 1, 2, 0] = 0.0  # a zero key: scored as an empty slot
  v = rng.normal(size=shape).astype(np.float32)
  sos = np.zeros((SEGMENTS, B), bool)
  sos[0] = True
  sos[RESET_AT, 1] = True
  return q, k, v, sos


def memory_manager(memory_factory):
  """Their memory as ``memory_on_tpu_factory`` builds it by default
  (``cross_batch_memory=False``: a store per row and head)."""
  return memory_factory.MemoryManager(
      batch_size=B,
      mode="train",
      num_heads=H,
      key_size=D,
      value_size=D,
      database_size=S,
      cross_batch_memory=False,
  )


def run_store(memory_factory, q, k, v, sos):
  """Their store over the segments: reset, retrieve, update."""
  import jax
  import jax.numpy as jnp

  manager = memory_manager(memory_factory)
  layer = manager.create_memory_layer()
  layer = layer.clone(wrapped=layer.wrapped.clone(report_scores_and_indices=True))

  def step(mem, query, key, value, start):
    mem.reset(jnp.repeat(start, H))
    rkeys, rvals = mem.topk_retrieval(query, K)
    mem.update(key, value)
    return rkeys, rvals

  variables = layer.init(
      jax.random.PRNGKey(0), q[0], K, method=lambda m, x, n: m.topk_retrieval(x, n)
  )
  out = {n: [] for n in ("rkeys", "rvals", "scores", "slots", "key_db", "value_db", "index")}
  for s in range(SEGMENTS):
    (rkeys, rvals), variables = layer.apply(
        variables, q[s], k[s], v[s], jnp.asarray(sos[s]), method=step, mutable=["database"]
    )
    db = variables["database"]["wrapped"]
    out["rkeys"].append(np.asarray(rkeys))
    out["rvals"].append(np.asarray(rvals))
    out["scores"].append(np.asarray(db["retrieved_indices_scores"]).reshape(B, H, T, K))
    out["slots"].append(np.asarray(db["retrieved_indices"]).reshape(B, H, T, K))
    out["key_db"].append(np.asarray(db["key_db"]).reshape(B, H, S, D))
    out["value_db"].append(np.asarray(db["value_db"]).reshape(B, H, S, D))
    out["index"].append(np.asarray(db["database_index"]).reshape(B, H)[:, 0])
  return {n: np.stack(x) for n, x in out.items()}


def run_layer(attention, memory_factory, transformer_base, transformer_layer, q, k, v, sos):
  """Their layer over the segments, recording the memory path; then the
  gradient pass (see the module docstring)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  segment = {"s": 0}
  orig_kvq = transformer_base.MemTransformerBase.kvq

  def kvq(self, xs):  # their projections run (parameters made); ours replace them
    keys, values, queries, queries2 = orig_kvq(self, xs)
    s = segment["s"]
    raw_q = xs.reshape(B, T, H, D)
    q_norm = transformer_base.normalize_kq(raw_q, jnp.float32)
    return jnp.asarray(k[s]), jnp.asarray(v[s]), q_norm, queries2

  transformer_base.MemTransformerBase.kvq = kvq
  record: dict[str, list] = {"local": [], "ext": [], "gated": [], "rkeys": [], "rvals": []}
  orig_simple, orig_external = attention.simple_attention, attention.external_attention
  orig_post = transformer_base.MemTransformerBase.post_attn_ffn
  fixed_local = {"value": None}

  def simple_attention(*args, **kwargs):
    if fixed_local["value"] is not None:
      return fixed_local["value"]
    ys = orig_simple(*args, **kwargs)
    record["local"].append(ys)
    return ys

  def external_attention(keys, values, queries, *, scale_factor=None, dtype=jnp.float32):
    record["rkeys"].append(keys)
    record["rvals"].append(values)
    ys = orig_external(keys, values, queries, scale_factor=scale_factor, dtype=dtype)
    record["ext"].append(ys)
    return ys

  gated_only = {"on": False}

  def post_attn_ffn(self, xs, attn_ys, cross_attn_ys):
    record["gated"].append(attn_ys)
    if gated_only["on"]:
      return attn_ys.reshape(xs.shape)
    return orig_post(self, xs, attn_ys, cross_attn_ys)

  attention.simple_attention = simple_attention
  attention.external_attention = external_attention
  transformer_base.MemTransformerBase.post_attn_ffn = post_attn_ffn

  manager = memory_manager(memory_factory)

  class Layer(nn.Module):
    """Their layer with its window state loaded and stored, as their
    DecoderStack runs it."""

    def setup(self):
      self.layer = transformer_layer.TransformerLayer(
          mode="train",
          batch_size=B,
          embedding_size=H * D,
          memory=manager,
          num_heads=H,
          head_size=D,
          mlp_dim=16,
          window_length=T,
          relative_position_type=None,
          memory_num_neighbors=K,
      )

    def __call__(self, xs, start):
      window = self.layer.load_window_state(start)
      ys, _, window, _, _ = self.layer(xs, start, global_info={}, window_state=window)
      self.layer.store_window_state(window)
      return ys

  model = Layer()
  xq = q.reshape(SEGMENTS, B, T, H * D)  # the layer input: the raw queries (unit already)
  variables = model.init(jax.random.PRNGKey(1), jnp.asarray(xq[0]), jnp.asarray(sos[0]))
  params = jax.tree.map(np.asarray, variables["params"])
  params["layer"]["external_memory_bias"] = BIAS_H
  params["layer"]["tbase"]["_kvq"]["attention_scale"] = SCALE_H
  for key in record:
    record[key].clear()
  state = {n: x for n, x in variables.items() if n != "params"}
  for s in range(SEGMENTS):
    segment["s"] = s
    _, state = model.apply(
        {"params": params, **state},
        jnp.asarray(xq[s]),
        jnp.asarray(sos[s]),
        mutable=["state", "database"],
    )
  out = {n: np.stack([np.asarray(x) for x in record[n]]) for n in record}

  # The gradient pass: the local output fixed, the layer's output the gated one.
  rng = np.random.default_rng(7)
  cot = rng.normal(size=(SEGMENTS, B, T, H, D)).astype(np.float32)
  gated_only["on"] = True
  state = {n: x for n, x in variables.items() if n != "params"}
  grads = {"bias": [], "scale": [], "xq": []}
  for s in range(SEGMENTS):
    segment["s"] = s
    fixed_local["value"] = jnp.asarray(out["local"][s])

    def loss(bias, scale, x, state=state):
      p = jax.tree.map(lambda a: a, params)
      p["layer"]["external_memory_bias"] = bias
      p["layer"]["tbase"]["_kvq"]["attention_scale"] = scale
      ys, new_state = model.apply(
          {"params": p, **state}, x, jnp.asarray(sos[s]), mutable=["state", "database"]
      )
      return jnp.sum(ys.reshape(B, T, H, D) * cot[s]), new_state

    (_, state), g = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
        jnp.asarray(BIAS_H), jnp.asarray(SCALE_H), jnp.asarray(xq[s])
    )
    grads["bias"].append(np.asarray(g[0]))
    grads["scale"].append(np.asarray(g[1]))
    grads["xq"].append(np.asarray(g[2]).reshape(B, T, H, D))
  out.update(cot=cot, **{f"grad_{n}": np.stack(x) for n, x in grads.items()})
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("meliad", help="a checkout of google-research/meliad, or a bare mirror")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../tests/fixtures"))
  args = parser.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  with tempfile.TemporaryDirectory() as tmp:
    root = export_code(args.meliad, tmp)
    attention, memory_factory, transformer_base, transformer_layer = import_meliad(root)
    import jax.numpy as jnp

    def normalize(x):
      return np.array(transformer_base.normalize_kq(jnp.asarray(x), jnp.float32))

    q, k, v, sos = inputs(np.random.default_rng(0), normalize)
    store = run_store(memory_factory, q, k, v, sos)
    layer = run_layer(attention, memory_factory, transformer_base, transformer_layer, q, k, v, sos)
  out = {
      "q_SxBxTxHxD": q,
      "k_SxBxTxHxD": k,
      "v_SxBxTxHxD": v,
      "sos_SxB": sos,
      "rkeys_SxBxTxHxKxD": store["rkeys"],
      "rvals_SxBxTxHxKxD": store["rvals"],
      "scores_SxBxHxTxK": store["scores"],
      "slots_SxBxHxTxK": store["slots"].astype(np.int32),
      "key_db_SxBxHxSxD": store["key_db"],
      "value_db_SxBxHxSxD": store["value_db"],
      "index_SxB": store["index"].astype(np.int32),
      "bias_H": BIAS_H,
      "scale_H": SCALE_H,
      "layer_rkeys_SxBxTxHxKxD": layer["rkeys"],
      "layer_rvals_SxBxTxHxKxD": layer["rvals"],
      "local_SxBxTxHxD": layer["local"],
      "ext_SxBxTxHxD": layer["ext"],
      "gated_SxBxTxHxD": layer["gated"],
      "cot_SxBxTxHxD": layer["cot"],
      "grad_bias_SxH": layer["grad_bias"],
      "grad_scale_SxH": layer["grad_scale"],
      "grad_xq_SxBxTxHxD": layer["grad_xq"],
  }
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "knn_meliad.npz")
  np.savez_compressed(path, **out)
  print(f"wrote {path}: " + ", ".join(f"{n} {x.shape}" for n, x in out.items()))


if __name__ == "__main__":
  main()
