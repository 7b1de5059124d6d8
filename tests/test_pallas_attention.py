"""The fused Pallas attention (model.attention_impl="pallas") equals the XLA path.

The kernels run in Pallas interpret mode on CPU: both backends' formulations
(TPU: the relative shift as a barrel shifter of uniform rotations, which
test_pallas_mosaic compiles with Mosaic; GPU: scratch tile and gathering
loads) are checked against the XLA path (``pallas_attention.xla_reference``, built
from ``attention_ops``, which test_attention checks against a literal
Sec. 3.3 computation) (values and every gradient) over a grid of
shapes, the whole model against the XLA model, and the train and eval steps
lower for TPU and CUDA with ``jax.export``.
"""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from transformer_xl import default_config, sharding
from transformer_xl.model import attention, attention_ops, models, pallas_attention
from transformer_xl.training import lowering, train_state, train_step

from helpers import (
    run_main,
    small_args,
    tiny_config,
    tiny_flags,
    tiny_model_config,
    tiny_model_inputs,
    write_ptb_sample,
)

SLOW = pytest.mark.slow
TPU_I = pallas_attention.Flavor("tpu", 8, interpret=True)
GPU_I = pallas_attention.Flavor("gpu", 8, interpret=True)


def random_inputs(b, t, m, h, dh, dtype, seed=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  k_len = m + t
  shapes = [(b, t, h, dh), (b, k_len, h, dh), (b, k_len, h, dh), (k_len, h, dh), (h, dh), (h, dh)]
  scales = [1, 1, 1, 1, 0.3, 0.3]
  return tuple(
      (s * jax.random.normal(kk, shape)).astype(dtype) for kk, shape, s in zip(ks, shapes, scales)
  )


GRID = [
    # (flavor, B, T, M, H, Dh, same_length, mlen_B, documents, dtype)
    (TPU_I, 2, 13, 7, 2, 8, False, [7, 3], False, "float32"),  # T, K not multiples
    (GPU_I, 2, 13, 7, 2, 8, False, [7, 3], False, "float32"),
    pytest.param(TPU_I, 2, 8, 0, 2, 8, False, [0, 0], False, "float32", marks=SLOW),  # K = T
    pytest.param(GPU_I, 1, 16, 16, 3, 8, True, [16], False, "float32", marks=SLOW),
    pytest.param(TPU_I, 2, 20, 12, 2, 8, True, [5, 12], False, "float32", marks=SLOW),
    pytest.param(TPU_I, 3, 9, 9, 1, 4, False, [0, 4, 9], False, "float32", marks=SLOW),
    pytest.param(GPU_I, 2, 11, 0, 2, 8, False, [-3, 0], False, "float32", marks=SLOW),
    pytest.param(TPU_I, 2, 12, 6, 2, 8, False, [6, 2], True, "float32", marks=SLOW),
    pytest.param(GPU_I, 2, 12, 6, 2, 8, True, [6, 6], True, "float32", marks=SLOW),
    pytest.param(TPU_I, 2, 17, 9, 2, 16, False, [9, 1], False, "bfloat16", marks=SLOW),
    pytest.param(GPU_I, 2, 17, 9, 2, 16, True, [9, 5], True, "bfloat16", marks=SLOW),
    # several tiles per row and column, the default interpret block (0 = auto)
    pytest.param(
        pallas_attention.INTERPRET, 2, 40, 24, 2, 8, False, [24, 10], True, "float32", marks=SLOW
    ),
]


@pytest.mark.parametrize("flavor,b,t,m,h,dh,same_length,mlen,documents,dtype", GRID)
def test_kernel_equals_the_xla_path(flavor, b, t, m, h, dh, same_length, mlen, documents, dtype):
  """Values and the gradients of q, k, v, r, u and v-bias; rows that may
  attend to some key (front padding, mlen < 0, has none)."""
  args = random_inputs(b, t, m, h, dh, jnp.dtype(dtype))
  mlen_B = jnp.asarray(mlen, jnp.int32)
  doc = None
  if documents:  # documents start at several places, before and inside the segment
    starts = np.random.default_rng(1).integers(-m, t, size=(b, 3))
    pos = np.arange(t)[None, :, None] - np.sort(starts, 1)[:, None, :]
    doc = jnp.asarray(np.where(pos >= 0, pos, 10**6).min(-1), jnp.int32)
  mask = attention_ops.attention_mask(t, m, mlen_B, same_length, doc)
  has_keys = jnp.any(mask[:, 0], axis=-1)[:, :, None, None]
  assert bool(jnp.any(~has_keys)) == (min(mlen) < 0)
  weights = jax.random.normal(jax.random.PRNGKey(9), (b, t, h, dh))

  def loss(fn):
    return lambda *a: jnp.sum(jnp.where(has_keys, fn(*a).astype(jnp.float32), 0) * weights)

  ref = lambda *a: pallas_attention.xla_reference(
      *a, mlen_B, doc, mem_len=m, same_length=same_length
  )
  got = lambda *a: pallas_attention.rel_attention(
      *a, mlen_B, doc, mem_len=m, same_length=same_length, flavor=flavor
  )
  tol = 1e-5 if dtype == "float32" else 3e-2
  out_ref, out = ref(*args), got(*args)
  assert out.dtype == out_ref.dtype == jnp.dtype(dtype)
  np.testing.assert_allclose(
      np.where(has_keys, np.asarray(out, np.float32), 0),
      np.where(has_keys, np.asarray(out_ref, np.float32), 0),
      rtol=tol,
      atol=tol,
  )
  g_ref = jax.grad(loss(ref), argnums=range(6))(*args)
  g = jax.grad(loss(got), argnums=range(6))(*args)
  for name, a, r in zip(("q", "k", "v", "r", "u", "v-bias"), g, g_ref):
    assert a.dtype == r.dtype, name
    a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
    assert np.abs(r).max() > 0, name
    err = np.abs(a - r).max() / np.abs(r).max()
    assert err < tol, (name, err)


def test_kernel_refuses_shapes_that_do_not_agree():
  q, k, v, r, u, rr = random_inputs(1, 4, 2, 1, 8, jnp.float32)
  with pytest.raises(ValueError, match="need K = mem_len \\+ T"):
    pallas_attention.rel_attention(
        q, k, v, r, u, rr, jnp.zeros(1, jnp.int32), mem_len=3, same_length=False
    )


@pytest.mark.parametrize("q,w", [(8, 16), (128, 256), (4, 32)])
@pytest.mark.parametrize(
    "stride_of",
    [lambda w: 0, lambda w: 1, lambda w: 3, lambda w: w - 1],
    ids=["0", "1", "3", "W-1"],
)
def test_barrel_roll_rotates_each_row_as_jnp_roll(q, w, stride_of):
  """TPU's per-row rotation (uniform pltpu.roll's and selects, what Mosaic
  compiles) equals ``jnp.roll`` of row a by shift + a * stride, _Rotate's
  ``out[a, c] = x[a, (c - shift - a * stride) mod W]``; the kernels' strides
  are 1 and 2b - 1, their shifts b + 1, b - 1 and 0."""
  stride = stride_of(w)
  x = jax.random.normal(jax.random.PRNGKey(0), (q, w))
  for shift in (0, 1, q - 1, q + 1, w - 1):
    got = np.asarray(jax.jit(lambda x: pallas_attention._barrel_roll(x, shift, stride))(x))
    per_row = jax.vmap(jnp.roll)(x, shift + jnp.arange(q) * stride)  # row a by its amount
    np.testing.assert_array_equal(got, np.asarray(per_row))
    rows, cols = np.arange(q)[:, None], np.arange(w)[None, :]
    np.testing.assert_array_equal(got, np.asarray(x)[rows, (cols - shift - rows * stride) % w])


# --------------------------------------------------------------------------- #
# The model with attention_impl="pallas" equals the XLA model.

MODEL_CASES = [
    (dict(same_length=True, clamp_len=3), "partial", False),
    pytest.param(dict(), "empty", False, marks=SLOW),
    pytest.param(dict(pre_lnorm=True, untie_r=True), "full", False, marks=SLOW),
    pytest.param(dict(), "partial", True, marks=SLOW),  # documents
    pytest.param(dict(dtype="bfloat16", same_length=True), "partial", False, marks=SLOW),
    pytest.param(dict(remat="full", scan_unroll=1), "partial", False, marks=SLOW),
]


@pytest.mark.parametrize("options,memory,documents", MODEL_CASES)
def test_model_with_the_kernel_equals_the_xla_model(options, memory, documents):
  """Per-token NLL, the next memory and every parameter's gradient."""
  cfg = tiny_model_config(n_token=37, d_inner=24, dropout=0.0, tgt_len=7, mem_len=5, **options)
  xla_model = models.TransformerXL(cfg)
  pallas_model = models.TransformerXL(dataclasses.replace(cfg, attention_impl="pallas"))
  params, tokens, mem = tiny_model_inputs(cfg, memory)
  doc = jnp.asarray([[9, 10, 11, 0, 1, 2, 3], [0, 1, 0, 1, 2, 0, 1]]) if documents else None

  def loss(p, model):
    nll, new_mem = model.apply(
        {"params": p},
        tokens[:, :-1],
        mem,
        tokens[:, 1:],
        deterministic=False,
        rngs={"dropout": jax.random.PRNGKey(5)},
        doc_pos_BxT=doc,
    )
    return nll.mean(), (nll, new_mem)

  grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (_, (nll_x, mem_x)), g_x = grad(params, xla_model)
  (_, (nll_p, mem_p)), g_p = grad(params, pallas_model)
  tol = 2e-2 if options.get("dtype") == "bfloat16" else 1e-5
  np.testing.assert_allclose(np.asarray(nll_p), np.asarray(nll_x), rtol=tol, atol=tol)
  np.testing.assert_allclose(
      np.asarray(mem_p.mems_LxBxMxD, np.float32),
      np.asarray(mem_x.mems_LxBxMxD, np.float32),
      rtol=tol,
      atol=tol,
  )
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_p), jax.tree_util.tree_leaves(g_x)):
    a, b = np.asarray(a), np.asarray(b)
    assert np.abs(a - b).max() <= 10 * tol * max(np.abs(b).max(), 1e-3), path


def test_dropatt_in_training_falls_back_to_xla_and_says_so_once(caplog):
  """The kernel has no dropatt: a training step with dropatt > 0 computes
  exactly the XLA path's numbers (same dropout masks), logged once."""
  cfg = tiny_model_config(n_token=37, d_inner=24, dropout=0.1, dropatt=0.3, tgt_len=7, mem_len=5)
  xla_model = models.TransformerXL(cfg)
  pallas_model = models.TransformerXL(dataclasses.replace(cfg, attention_impl="pallas"))
  params, tokens, mem = tiny_model_inputs(cfg, "empty")
  run = lambda model: model.apply(
      {"params": params},
      tokens[:, :-1],
      mem,
      tokens[:, 1:],
      deterministic=False,
      rngs={"dropout": jax.random.PRNGKey(5)},
  )[0]
  pallas_attention_log = "model.attention_impl='pallas' has no dropatt"
  attention._log_dropatt_fallback.cache_clear()  # noqa: SLF001 (once per process)
  with caplog.at_level(logging.WARNING):
    got = run(pallas_model)
    run(pallas_model)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(run(xla_model)))
  assert caplog.text.count(pallas_attention_log) == 1
  # evaluation (deterministic) uses the kernel: the same numbers as XLA's evaluation
  ev = lambda model: model.apply({"params": params}, tokens[:, :-1], mem, tokens[:, 1:])[0]
  np.testing.assert_allclose(
      np.asarray(ev(pallas_model)), np.asarray(ev(xla_model)), rtol=1e-5, atol=1e-5
  )


def test_attention_impl_is_validated():
  with pytest.raises(ValueError, match="model.attention_impl='cuda': use one of"):
    models.ModelConfig(n_token=5, attention_impl="cuda")
  with pytest.raises(ValueError, match="model.attn_type=2 needs model.attention_impl='xla'"):
    models.ModelConfig(n_token=5, attention_impl="pallas", attn_type=2)
  assert models.ModelConfig(n_token=5).attention_impl == "xla"


# --------------------------------------------------------------------------- #
# The train and eval steps with the kernel lower for TPU and CUDA.


def _steps(mesh):
  """The train and eval steps with the kernel (``lowering.abstract_step``),
  their batches with documents."""
  config = default_config.get_config()
  config.model.update(
      n_layer=2,
      d_model=32,
      n_head=4,
      d_head=8,
      d_inner=64,
      dropout=0.1,
      dropatt=0.0,
      tgt_len=16,
      mem_len=16,
      attention_impl="pallas",
      dtype="bfloat16",
  )
  config.train.update(global_batch=8)
  mcfg = lowering.resolved_model_config(config, 64)
  steps = {}
  for step in ("train", "eval"):
    fn, args = lowering.abstract_step(config, mcfg, mesh, step)
    batch = args[-1]
    batch["doc_pos"] = jax.ShapeDtypeStruct(
        batch["inputs"].shape, jnp.int32, sharding=batch["inputs"].sharding
    )
    steps[step] = (fn, args)
  return steps


@pytest.mark.parametrize(
    "platform,custom_call", [("tpu", "tpu_custom_call"), ("cuda", "__gpu$xla.gpu.triton")]
)
def test_train_and_eval_steps_lower_for_accelerators(platform, custom_call):
  """``jax.export`` for the real targets from this CPU machine: Mosaic and
  Triton lower every kernel (forward; dq, dk/dv and dr in training), the
  steps sharded over 8 devices."""
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  kernels = {
      "train": ["txl_attention_fwd", "txl_attention_dq", "txl_attention_dkv", "txl_attention_dr"],
      "eval": ["txl_attention_fwd"],
  }
  for step, (fn, args) in _steps(mesh).items():
    exported = export.export(
        fn,
        platforms=(platform,),
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(*args)
    text = exported.mlir_module()
    assert exported.platforms == (platform,)
    assert custom_call in text, step
    names = ["txl_attention_fwd", "txl_attention_dq", "txl_attention_dkv", "txl_attention_dr"]
    assert [n for n in names if n in text] == kernels[step], step


@pytest.mark.slow
def test_sharded_training_with_the_kernel_equals_xla_on_one_device():
  """Two train steps over a (data 4, model 2) mesh, the kernel as a
  shard_map in interpret mode, documents on: the XLA path's losses and
  parameters on one device."""
  tokens = np.random.default_rng(0).integers(0, 64, size=8 * 6 * 2 + 8).astype(np.int32)
  results = {}
  for impl, mesh in (
      ("xla", sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])),
      ("pallas", sharding.make_mesh((4, 2), ("data", "model"))),
  ):
    config = tiny_config()
    config.model.update(attention_impl=impl, dropatt=0.0)
    mcfg = default_config.model_config(config, 64)
    model = models.TransformerXL(mcfg)
    tx = train_state.make_optimizer(config.train)
    _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
    state = train_state.create_train_state(model, tx, 8, mesh, jax.random.PRNGKey(0), shardings)
    step_fn = train_step.make_train_step(model, tx, mesh, shardings, 1, 7)
    losses = []
    for s in range(2):
      rows = tokens[s * 48 : s * 48 + 56].reshape(8, 7)
      batch = {
          "inputs": rows[:, :6],
          "targets": rows[:, 1:],
          "weights": np.ones((8, 6), np.float32),
          "reset": np.zeros(8, bool),
          "doc_pos": np.tile(np.arange(6) + 2 * s, (8, 1)).astype(np.int32),
      }
      batch = jax.device_put(batch, sharding.rows_sharding(mesh))
      state, metrics = step_fn(state, batch)
      losses.append(float(metrics["loss"]))
    results[impl] = (losses, jax.device_get(state.params))
  np.testing.assert_allclose(results["pallas"][0], results["xla"][0], rtol=1e-5)
  for a, b in zip(
      jax.tree_util.tree_leaves(results["pallas"][1]), jax.tree_util.tree_leaves(results["xla"][1])
  ):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_command_line_trains_evaluates_scores_and_generates_with_the_kernel(tmp_path):
  """The kernel from the command line on CPU (interpret mode): training
  (dropatt 0, so its backward kernels run), then eval with each
  implementation (a free setting: the same results), score and generate."""
  import json  # noqa: PLC0415

  manual = write_ptb_sample(tmp_path / "ptb", n_lines=(300, 40, 40))
  workdir = tmp_path / "wd"
  r = run_main(
      small_args(
          tmp_path,
          workdir,
          manual,
          "--config.model.attention_impl=pallas",
          "--config.model.attn_type=2",
      )
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr
  assert "model.attn_type=2 needs model.attention_impl='xla'" in r.stderr
  assert not workdir.exists()
  tiny = tiny_flags(train__log_every=None, model__dropatt=0.0, eval__tgt_len=8, eval__mem_len=16)
  r = run_main(
      small_args(
          tmp_path,
          workdir,
          manual,
          *tiny,
          "--config.train.num_steps=4",
          "--config.model.attention_impl=pallas",
      ),
      timeout=900,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "has no dropatt" not in r.stderr
  results = {}
  for impl in ("pallas", "xla"):
    r = run_main(
        small_args(
            tmp_path, workdir, manual, *tiny, "--mode=eval", f"--config.model.attention_impl={impl}"
        ),
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    results[impl] = json.loads((workdir / "eval_results.json").read_text())
  for split in ("valid", "test"):
    assert results["pallas"][split]["tokens"] == results["xla"][split]["tokens"] > 0
    assert results["pallas"][split]["loss_nats"] == pytest.approx(
        results["xla"][split]["loss_nats"], rel=1e-5
    )
  (tmp_path / "some.txt").write_text("the house saw a bird\n")
  r = run_main(
      small_args(
          tmp_path,
          workdir,
          manual,
          *tiny,
          "--mode=score",
          f"--text={tmp_path / 'some.txt'}",
          f"--out={tmp_path / 'nll.npy'}",
          "--config.model.attention_impl=pallas",
      ),
      timeout=900,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert np.isfinite(np.load(tmp_path / "nll.npy")).all()
  r = run_main(
      small_args(
          tmp_path,
          workdir,
          manual,
          *tiny,
          "--mode=generate",
          "--prompt=the house",
          "--num_tokens=5",
          "--config.model.attention_impl=pallas",
      ),
      timeout=900,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.strip()
