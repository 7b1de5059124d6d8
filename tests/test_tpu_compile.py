"""``python -m transformer_xl.compile``: the TPU compiler on a CPU machine.

Fast tests check the pieces against hand counts and naive loops: the HLO
counter (matrix FLOPs of loops times their trip counts, a padded
convolution's multiply-adds, collectives per step) on programs XLA:CPU
compiles here, slice names, the roofline, the preset mesh rule and the
missing-libtpu message.  The slow tests compile a small config with the
TPU compiler (libtpu, the ``[tpu-compile]`` extra; skipped without it) for
two topologies, train and eval, the XLA attention and the fused Pallas
kernel, check the memory report against a hand count of parameters, Adam
moments and memory per device, and a batch too large for the chip.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import default_config, presets
from transformer_xl.compile import chips, compiler, fit, hlo, report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(
    not HAS_LIBTPU, reason="libtpu not installed (pip install 'transformer_xl[tpu-compile]')"
)


def _text(fn, *args):
  return jax.jit(fn).lower(*args).compile().as_text()


# ---------------------------------------------------------------------------
# The HLO counter, on programs XLA:CPU compiles here.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("trips", [1, 3, 7])
def test_matmul_flops_count_each_loop_iteration(trips):
  m, k, n = 8, 16, 24
  a, b = jnp.ones((m, k)), jnp.ones((k, k))

  def f(a, b):
    return jax.lax.fori_loop(0, trips, lambda i, x: jnp.tanh(x @ b), a)

  def g(a, b, c):
    return jax.lax.scan(lambda x, w: (x @ w, None), a, c)[0]

  counts = hlo.count(_text(f, a, b))
  assert counts.matmul_flops == trips * 2 * m * k * k
  assert counts.unknown_trip_counts == []
  # a scan over stacked weights (the layers' nn.scan) and a matmul outside it
  c = jnp.ones((trips, k, k))
  counts = hlo.count(_text(lambda a, b, c: g(a, b, c) @ jnp.ones((k, n)), a, b, c))
  assert counts.matmul_flops == trips * 2 * m * k * k + 2 * m * k * n
  if trips > 1:
    assert counts.matmul_flops_loops_once < counts.matmul_flops


def _naive_conv_macs(lhs_shape, rhs_shape, stride, padding, lhs_dil, rhs_dil):
  """Multiply-adds of a 1-D NWC convolution that touch real input."""
  (b, w, c_in), (kw, _, c_out) = lhs_shape, rhs_shape
  n = (w - 1) * lhs_dil + 1
  span = (kw - 1) * rhs_dil + 1
  out = (n + padding[0] + padding[1] - span) // stride + 1
  macs = 0
  for o in range(out):
    for t in range(kw):
      pos = o * stride - padding[0] + t * rhs_dil
      if 0 <= pos < n and pos % lhs_dil == 0:
        macs += 1
  return b * c_out * c_in * macs


@pytest.mark.parametrize(
    "stride,padding,lhs_dil,rhs_dil",
    [(1, (0, 0), 1, 1), (1, (2, 3), 1, 1), (2, (1, 1), 1, 1), (1, (1, 2), 2, 1), (1, (2, 2), 1, 2)],
)
def test_convolution_flops_exclude_padding(stride, padding, lhs_dil, rhs_dil):
  lhs, rhs = jnp.ones((2, 9, 3)), jnp.ones((3, 3, 5))

  def f(x, k):
    return jax.lax.conv_general_dilated(
        x, k, (stride,), [padding], (lhs_dil,), (rhs_dil,), ("NWC", "WIO", "NWC")
    )

  macs = _naive_conv_macs(lhs.shape, rhs.shape, stride, padding, lhs_dil, rhs_dil)
  assert hlo.count(_text(f, lhs, rhs)).matmul_flops == 2 * macs


def test_collectives_per_step_count_loop_iterations():
  mesh = jax.make_mesh((8,), ("x",))
  spec = jax.sharding.PartitionSpec("x")

  def body(x):
    def step(c, _):
      return jax.lax.psum(c, "x") * 0.5, None

    return jax.lax.scan(step, x, None, length=5)[0]

  f = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
  x = jax.device_put(jnp.ones((8, 128), jnp.float32), jax.sharding.NamedSharding(mesh, spec))
  counts = hlo.count(_text(f, x))
  assert counts.collectives["all-reduce"]["count"] == 5
  assert counts.collectives["all-reduce"]["bytes"] == 5 * 128 * 4  # one row per device
  assert counts.collectives["all-gather"]["count"] == 0


def test_async_collectives_count_once_at_done():
  text = """HloModule m

ENTRY %main (p: f32[4,8]) -> f32[16,8] {
  %p = f32[4,8]{1,0} parameter(0)
  %start = (f32[4,8]{1,0}, f32[16,8]{1,0}) all-gather-start(%p), dimensions={0}
  ROOT %agd = f32[16,8]{1,0} all-gather-done(%start)
}
"""
  counts = hlo.count(text)
  assert counts.collectives["all-gather"] == {"count": 1.0, "bytes": 16 * 8 * 4}


def test_shape_bytes_of_tuples_and_layouts():
  assert hlo.shape_bytes("(f32[2,3]{1,0:T(8,128)}, bf16[4]{0}, pred[])") == 24 + 8 + 1
  assert hlo.shape_bytes("s32[]{:T(128)}") == 4
  with pytest.raises(ValueError, match="ENTRY"):
    hlo.count("not hlo")


# ---------------------------------------------------------------------------
# Slices, roofline, the preset rule, a missing libtpu.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,topology,devices",
    [
        ("v4-8", "v4:2x2x1", 4),
        ("v4-32", "v4:2x2x4", 16),
        ("v4-128", "v4:4x4x4", 64),
        ("v4-512", "v4:4x8x8", 256),
        ("v5p-64", "v5:2x4x4", 32),
        ("v3-8", "v3:2x2", 8),
        ("v3-32", "v3:4x4", 32),
        ("v3-512", "v3:16x16", 512),
        ("v5e-256", "v5e:16x16", 256),
        ("v5litepod-8", "v5e:2x4", 8),
        ("v6e-16", "v6e:4x4", 16),
        ("v5e:16x16", "v5e:16x16", 256),
        ("v4:2x2x1", "v4:2x2x1", 4),
        ("v5p:2x2x1", "v5:2x2x1", 4),
    ],
)
def test_slice_names(name, topology, devices):
  s = chips.parse(name)
  assert (s.topology, s.devices) == (topology, devices)


def test_every_preset_is_a_slice_with_its_device_count():
  for preset, n in presets.SLICE_DEVICES.items():
    assert chips.parse(preset).devices == n, preset
    assert chips.for_devices(preset.split("-")[0], n).topology == chips.parse(preset).topology


@pytest.mark.parametrize("bad", ["v9-8", "v4-7", "v5e:4", "v4:2x2", "tpu", "v4-"])
def test_bad_slice_names_are_refused(bad):
  with pytest.raises(chips.TopologyError, match="topology|generation|per chip|sides"):
    chips.parse(bad)


def test_roofline_by_hand():
  r = fit.roofline(2e12, 1e9, peak_flops=1e14, bandwidth=1e11)  # 20 ms compute, 10 ms memory
  assert r["bound"] == "compute" and r["bound_seconds"] == pytest.approx(0.02)
  assert r["max_mfu"] == pytest.approx(1.0)
  r = fit.roofline(1e12, 4e9, peak_flops=1e14, bandwidth=1e11)  # 10 ms compute, 40 ms memory
  assert r["bound"] == "memory" and r["max_mfu"] == pytest.approx(0.25)


def _config(path, arg=None):
  spec = importlib.util.spec_from_file_location("c", os.path.join(REPO, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def test_shard_over_a_topology_uses_the_model_axis_when_the_batch_is_short():
  c = _config("configs/enwik8_24l.py")  # batch 64, 8 heads, d_model 1024
  with c.unlocked():
    presets.shard_over(c, 256)
  assert tuple(c.mesh.shape) == (1, 64, 4)
  c = _config("configs/enwik8_24l.py")
  with c.unlocked():
    presets.shard_over(c, 64)
  assert tuple(c.mesh.shape) == (1, 64, 1)
  c = _config("configs/quickstart.py")  # 4 heads, batch 16: no mesh of 256 devices
  with c.unlocked(), pytest.raises(ValueError, match="global_batch=16"):
    presets.shard_over(c, 256)


def test_missing_libtpu_names_the_extra(monkeypatch):
  monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(compiler.CompileError, match=r"\[tpu-compile\]"):
    compiler.libtpu_path()


def _run(args, env_extra=None, timeout=900):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_FLAGS", "JAX_COMP"))}
  env.update(PYTHONPATH=REPO, **(env_extra or {}))
  return subprocess.run(
      [sys.executable, "-m", "transformer_xl.compile", *args],
      capture_output=True,
      text=True,
      env=env,
      cwd=REPO,
      timeout=timeout,
  )


def _error_line(proc):
  errs = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert len(errs) == 1, proc.stderr[-2000:]
  return errs[0]


@pytest.mark.slow
def test_bad_input_is_one_error_line(tmp_path):
  cases = [
      (["--config=configs/quickstart.py"], "names no slice preset"),
      (["--config=configs/quickstart.py", "--topology=v9-8"], "unknown TPU generation"),
      (["--config=configs/nope.py"], "not a file"),
      (["--config=configs/quickstart.py", "--topology=v5e-4", "--steps=forward"], "unknown step"),
      (["--config=configs/quickstart.py", "--topology=v5e-256"], "global_batch=16"),
      (
          [
              "--config=configs/quickstart.py",
              "--topology=v3-8",
              "--config.model.attention_impl=pallas",
              "--config.model.dtype=bfloat16",
          ],
          "does not compile for TPU v3",
      ),
      (
          ["--config=configs/quickstart.py", "--topology=v5e-4"],
          "[tpu-compile]",
      ),  # with TPU_LIBRARY_PATH pointing nowhere
  ]
  for args, message in cases:
    env = {"TPU_LIBRARY_PATH": str(tmp_path / "none.so")} if "[tpu" in message else None
    line = _error_line(_run(args, env))
    assert message in line, (args, line)


# ---------------------------------------------------------------------------
# The TPU compiler (libtpu), on a small config: slow.
# ---------------------------------------------------------------------------

SMALL = [
    "--config=configs/quickstart.py",
    "--config.model.n_layer=2",
    "--config.model.d_model=128",
    "--config.model.tgt_len=128",
    "--config.model.mem_len=128",
    "--config.eval.tgt_len=128",
    "--config.eval.mem_len=256",
    "--config.train.global_batch=8",
    "--config.eval.global_batch=8",
]


def _compile(tmp_path, topology, impl, extra=()):
  out = tmp_path / f"{topology.replace(':', '_')}_{impl}.json"
  proc = _run(
      [
          *SMALL,
          f"--topology={topology}",
          f"--config.model.attention_impl={impl}",
          "--config.mesh.shape=(-1, 1)",
          f"--json={out}",
          *extra,
      ]
  )
  return proc, out


@needs_libtpu
@pytest.mark.slow
@pytest.mark.parametrize(
    "topology,impl", list(itertools.product(["v5e:2x2", "v4:2x2x1"], ["xla", "pallas"]))
)
def test_small_config_compiles_for_tpu(tmp_path, topology, impl):
  proc, out = _compile(tmp_path, topology, impl)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads(out.read_text())
  assert res["devices"] == 4 and res["attention_impl"] == impl
  for step in ("train", "eval"):
    r = res["steps"][step]
    assert r["verdict"] == "FITS"
    assert r["as_configured"]["counts"]["matmul_flops"] > 0
    assert r["roofline"]["bound_seconds"] > 0 and 0 < r["max_mfu"] <= 1
  # Data parallel over 4 devices: the gradients are all-reduced every step.
  assert res["steps"]["train"]["as_configured"]["counts"]["collectives"]["all-reduce"]["count"] >= 1
  assert "FITS" in proc.stdout and "roofline ceiling" in proc.stdout

  if impl == "xla" and topology == "v5e:2x2":
    # Arguments of the train step per device = parameters and two Adam moments (float32,
    # replicated on a data-parallel mesh) + the memory of its rows + its batch.
    n_params = res["n_params"]
    rows = 8 // 4
    memory = 2 * rows * 128 * 128 * 4  # n_layer x rows x mem_len x d_model, float32
    batch = rows * 128 * (4 + 4 + 4) + rows
    hand = 3 * n_params * 4 + memory + batch
    args = res["steps"]["train"]["as_configured"]["argument_bytes"]
    assert args == pytest.approx(hand, rel=0.03), (args, hand)


@needs_libtpu
@pytest.mark.slow
def test_a_batch_too_large_for_the_chip_does_not_fit(tmp_path):
  proc, out = _compile(
      tmp_path,
      "v5e:2x2",
      "xla",
      ["--config.train.global_batch=16384", "--steps=train", "--max_tries=2"],
  )
  assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads(out.read_text())
  r = res["steps"]["train"]
  assert r["verdict"] == "DOES NOT FIT"
  assert r["as_configured"]["total_bytes"] > 16 * 2**30
  assert "DOES NOT FIT" in proc.stdout and "what makes it fit" in proc.stdout
  assert len(r["search"]["tried"]) >= 1


@needs_libtpu
@pytest.mark.slow
def test_fit_tool_uses_the_tpu_compiler_for_a_tpu_kind(tmp_path):
  out_json = tmp_path / "fit.json"
  env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_FLAGS", "JAX_COMP"))}
  proc = subprocess.run(
      [
          sys.executable,
          os.path.join(REPO, "benchmarks", "fit.py"),
          *SMALL,
          "--devices=4",
          "--device_kind=v5e",
          "--config.mesh.shape=(4, 1)",
          "--no_search",
          f"--json={out_json}",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=900,
      env=env,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads(out_json.read_text())["results"][0]
  assert res["compiled_by"] == "the TPU compiler (libtpu), v5e:2x2"
  assert "the TPU compiler (libtpu), v5e:2x2" in proc.stdout
  assert res["steps"]["train"]["verdict"] == "FITS"


def test_a_program_the_compiler_refuses_is_read_from_its_message():
  msg = (
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
      "temporaries (54.29G) exceeds available HBM (15.75G)."
  )
  rep = compiler.refused_report(msg, 2**30)
  assert rep["temp_bytes"] == int(54.29 * 2**30) and rep["compiler_hbm_bytes"] == int(15.75 * 2**30)
  assert rep["total_bytes"] == 2**30 + int(54.29 * 2**30)
  rep = compiler.refused_report("RESOURCE_EXHAUSTED: Used 19.05M of 16.00M hbm.", 0)
  assert rep["total_bytes"] == int(19.05 * 2**20)
  # A refused setting never counts as fitting, whatever its (lower-bound) total.
  tiny = dict(compiler.refused_report("RESOURCE_EXHAUSTED: unparsed", 10), remat="full")
  res = fit.search_fit(lambda r, b: dict(tiny, remat=r, attn_block=b), "train", "none", 0, 64,
                       1e9, 8, lambda s: None)  # fmt: skip
  assert res["fix"] is None
  assert fit.verdict(tiny, 2**30, 0.1) == "DOES NOT FIT"  # whatever its lower-bound total
  assert fit.verdict({"total_bytes": 10}, 2**30, 0.1) == "FITS"


@pytest.mark.parametrize(
    "name,topology,devices",
    [("h100", "1x1x1", 1), ("h100x8", "1x1x8", 8), ("h100:2x8", "1x2x8", 16)],
)
def test_gpu_names(name, topology, devices):
  s = chips.parse(name)
  assert (s.topology, s.devices, s.chip.platform) == (topology, devices, "cuda")


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("jax_cuda12_plugin") is None,
    reason="jax's CUDA plugin not installed (pip install 'transformer_xl[gpu-compile]')",
)
@pytest.mark.parametrize("topology", ["h100", "h100x8"])
def test_small_config_compiles_for_h100s(tmp_path, topology):
  out = tmp_path / "gpu.json"
  proc = _run([*SMALL, f"--topology={topology}", "--config.mesh.shape=(-1, 1)", f"--json={out}"])
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads(out.read_text())
  assert res["chip"]["name"] == "h100" and res["devices"] == (8 if topology == "h100x8" else 1)
  for step in ("train", "eval"):
    assert res["steps"][step]["verdict"] == "FITS"
    assert res["steps"][step]["as_configured"]["counts"]["matmul_flops"] > 0


@needs_libtpu
@pytest.mark.slow
def test_two_slices_compile_with_twice_the_devices(tmp_path):
  out = tmp_path / "two.json"
  proc = _run(
      [
          "--config=configs/quickstart.py",
          "--topology=v5e:2x2",
          "--num_slices=2",
          "--config.mesh.shape=(-1, 1)",
          "--steps=eval",
          f"--json={out}",
      ]
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  res = json.loads(out.read_text())
  assert res["devices"] == 8 and res["mesh"] == {"data": 8, "model": 1}


def test_a_custom_call_counts_the_flops_it_declares():
  body = '{"custom_call_config": {"body": "TUxJUg==", "cost_estimate": {"flops": "%s", "x": 1}}}'
  for flops in ("123456", 123456):
    text = f"""HloModule m

ENTRY %main (p: f32[8,128]) -> f32[8,128] {{
  %p = f32[8,128]{{1,0}} parameter(0)
  ROOT %k = f32[8,128]{{1,0}} custom-call(%p), custom_call_target="tpu_custom_call", backend_config={json.dumps(body % flops)}
}}
"""
    assert hlo.count(text).matmul_flops == 123456


@needs_libtpu
def test_the_fused_kernel_declares_its_flops_to_the_tpu_compiler(monkeypatch):
  """The kernel's tiles at full memory (T = M = 256, blocks of 128, no
  same_length: query block i sees key blocks 0..i+2) times 8 b^2 Dh."""
  from transformer_xl.model import pallas_attention as pa

  monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  devices = compiler.topology_devices(chips.parse("v5e:2x2"))
  mesh = jax.sharding.Mesh(np.array(devices[:1]), ("x",))
  sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  b, t, m, h, d = 2, 256, 256, 2, 64
  spec = lambda *s, dt=jnp.bfloat16: jax.ShapeDtypeStruct(s, dt, sharding=sh)
  args = (spec(b, t, h, d), spec(b, t + m, h, d), spec(b, t + m, h, d), spec(t + m, h, d))
  args += (spec(h, d), spec(h, d), spec(b, dt=jnp.int32))

  def f(*a):
    out = pa.rel_attention(*a, mem_len=m, same_length=False, flavor=pa.TPU)
    return out.astype(jnp.float32).sum()

  text = jax.jit(f).lower(*args).compile().as_text()
  tiles = 3 + 4  # query block 0: key blocks 0-2; query block 1: 0-3
  assert hlo.count(text).matmul_flops == 8 * b * h * tiles * 128 * 128 * d


def test_a_kernel_too_large_for_vmem_is_told_apart_from_hbm():
  assert compiler.vmem_overflow(
      "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem. Used 19.05M of 16.00M vmem."
  ) == ("19.05 MiB", "16.00 MiB")
  assert compiler.vmem_overflow(
      "RESOURCE_EXHAUSTED: Allocation (size=25165824) would exceed memory (size=16777216) :: "
      "#allocation12 [shape = 'u8[25165824]{0}', space=vmem, size = 0x1800000, scoped]"
  ) == ("24.00 MiB", "16.00 MiB")
  assert compiler.vmem_overflow("RESOURCE_EXHAUSTED: ... exceeds available HBM (15.75G)") is None


@needs_libtpu
@pytest.mark.slow
def test_a_fused_kernel_too_large_for_vmem_is_one_error_line():
  """v4's 16 MiB of VMEM: the kernel holds a head's K = 24576 keys, values and
  position rows (d_head 128) whole."""
  proc = _run(
      [
          "--config=configs/quickstart.py",
          "--topology=v4:2x2x1",
          "--config.mesh.shape=(-1, 1)",
          "--config.model.n_head=1",
          "--config.model.d_head=128",
          "--config.eval.mem_len=24448",
          "--config.eval.tgt_len=128",
          "--config.model.attention_impl=pallas",
          "--steps=eval",
      ]
  )
  line = _error_line(proc)
  assert "needs 24.00 MiB of VMEM, the chip has 16.00 MiB" in line
  assert "--config.model.attention_impl=xla" in line


def test_a_topology_keeps_the_command_lines_remat_and_dtype():
  from transformer_xl.compile import report

  c = _config("configs/enwik8_24l.py", "v3-32")
  with c.unlocked():
    c.model.remat = "none"
    report.resolve_slice(c, "configs/enwik8_24l.py:v3-32", "v5e-16", ("model.remat",))
  assert tuple(c.mesh.shape) == (1, 16, 1) and c.model.remat == "none"
  assert c.model.dtype == "bfloat16"
  c = _config("configs/enwik8_24l.py", "v3-32")
  with c.unlocked():
    c.model.remat = "none"
    report.resolve_slice(c, "configs/enwik8_24l.py:v3-32", "v5e-16")
  assert c.model.remat == "full"  # the preset rule's, when the command line did not set it


@pytest.mark.parametrize("kind", ["TPU v2", "TPU v3"])
def test_the_fused_kernel_in_bfloat16_is_refused_before_tpu_v4(kind):
  from transformer_xl import default_config

  c = _config("configs/enwik8_24l.py", "v3-32")  # bfloat16
  with c.unlocked():
    c.model.attention_impl = "pallas"
  with pytest.raises(default_config.ConfigError, match="does not compile for " + kind):
    default_config.validate(c, 32, device_kind=kind)
  default_config.validate(c, 32, device_kind="TPU v4")
  default_config.validate(c, 32)  # no device kind: not checked
  with c.unlocked():
    c.model.dtype = "float32"
  default_config.validate(c, 32, device_kind=kind)  # Mosaic compiles it in float32 there


def test_the_vocabulary_of_a_config_is_found_or_asked_for():
  """Fixed corpora, synthetic tasks and a SentencePiece size need no --vocab;
  another tokenizer's file (GPT-2's for BABILong) is asked for in one line."""
  config = default_config.get_config()
  assert report._vocab(config, None) == 256  # enwik8  # pylint: disable=protected-access
  config.data.update(dataset="synthetic:armt_retrieval")
  assert report._vocab(config, None) == 103  # pylint: disable=protected-access
  config.data.update(dataset="tfds:pg19", tokenizer="sentencepiece", vocab_size=32000)
  assert report._vocab(config, None) == 32000  # pylint: disable=protected-access
  assert report._vocab(config, 7) == 7  # pylint: disable=protected-access
  config.data.update(dataset="babilong:qa1", tokenizer="pretrained:gpt2/tokenizer.json")
  with pytest.raises(compiler.CompileError, match="pass --vocab=N"):
    report._vocab(config, None)  # pylint: disable=protected-access
