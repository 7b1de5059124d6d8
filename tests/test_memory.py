"""The memory's state (model/memory/state.py): its pytree, declared layouts
(row axes, shardings), the per-layer update, reset and advance; and the
auxiliary-loss channel of the train step that memory variants sow into."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer_xl import data, default_config, sharding
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models
from transformer_xl.run import train_checks
from transformer_xl.training import train, train_state, train_step

from helpers import tiny_config, tiny_model_config
from memory_variants.gated import GatedStore

L, B, M, D = 3, 8, 5, 4


def _memory(seed: int = 0, padded: bool = False) -> memory_lib.Memory:
  rng = np.random.default_rng(seed)
  return memory_lib.Memory(
      mems_LxBxMxD=jnp.asarray(rng.normal(size=(L, B, M, D)), jnp.float32),
      mlen_B=jnp.asarray(rng.integers(0, M + 1, size=B), jnp.int32),
      pad_B=jnp.asarray(rng.integers(0, 3, size=B), jnp.int32) if padded else None,
  )


def _assert_memory_equal(a: memory_lib.Memory, b: memory_lib.Memory):
  np.testing.assert_array_equal(a.mems_LxBxMxD, b.mems_LxBxMxD)
  np.testing.assert_array_equal(a.mlen_B, b.mlen_B)
  assert a.mlen_B.dtype == b.mlen_B.dtype and a.mems_LxBxMxD.dtype == b.mems_LxBxMxD.dtype
  assert (a.pad_B is None) == (b.pad_B is None)
  if a.pad_B is not None:
    np.testing.assert_array_equal(a.pad_B, b.pad_B)
  assert list(a.variant_state) == list(b.variant_state)
  for name in a.variant_state:
    np.testing.assert_array_equal(a.variant_state[name], b.variant_state[name])


def _paths(tree) -> list[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def test_pytree_leaves_keep_the_names_checkpoints_hold():
  # Checkpoints hold the leaves by name: the XL memory's two fields (the front
  # padding only when set), then each variant's arrays under their own names
  # (the memory tokens' are the names the earlier optional fields had).
  assert [f.name for f in dataclasses.fields(memory_lib.Memory)] == [
      "mems_LxBxMxD",
      "mlen_B",
      "pad_B",
      "variant_state",
  ]
  assert not any(hasattr(models, n) for n in ("Memory", "init_memory", "reset_memory"))
  assert _paths(_memory()) == [".mems_LxBxMxD", ".mlen_B"]
  assert _paths(_memory(padded=True)) == [".mems_LxBxMxD", ".mlen_B", ".pad_B"]
  tokens = memory_lib.init_memory(tiny_model_config(tokens={"num_mem_tokens": 2}), B)
  assert _paths(tokens) == [".mems_LxBxMxD", ".mlen_B", ".mem_tokens_BxNxD", ".mem_tokens_fresh_B"]
  assert {n: memory_lib.state.leaf(n).row_axis for n in _memory().leaves()} == {
      "mems_LxBxMxD": 1,
      "mlen_B": 0,
  }
  for memory in (_memory(padded=True), tokens):
    back = jax.tree_util.tree_map(lambda x: x, memory)
    _assert_memory_equal(back, memory)


def test_checkpoints_of_the_two_field_memory_restore(tmp_path):
  """A checkpoint written when Memory was a two-field flax struct restores
  into today's Memory (pad_B unset), and today's training memory writes the
  same tree."""
  import flax.struct
  import orbax.checkpoint as ocp

  @flax.struct.dataclass
  class OldMemory:
    mems_LxBxMxD: jax.Array
    mlen_B: jax.Array

  mem = _memory()
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / "old", {"memory": OldMemory(mem.mems_LxBxMxD, mem.mlen_B)})
    ckpt.save(tmp_path / "new", {"memory": mem})
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, {"memory": mem})
    for name in ("old", "new"):
      got = ckpt.restore(tmp_path / name, abstract)["memory"]
      assert isinstance(got, memory_lib.Memory) and got.pad_B is None
      _assert_memory_equal(got, mem)


def test_key_count_is_the_valid_slots_minus_the_padding():
  memory = _memory(padded=True)
  np.testing.assert_array_equal(
      memory.key_count_B(), np.asarray(memory.mlen_B) - np.asarray(memory.pad_B)
  )
  np.testing.assert_array_equal(_memory().key_count_B(), _memory().mlen_B)


def test_init_memory_and_mem_len():
  cfg = tiny_model_config(
      n_token=10, n_layer=L, d_model=D, n_head=2, d_head=2, d_inner=8, tgt_len=3, mem_len=M
  )
  memory = memory_lib.init_memory(cfg, B)
  assert memory.mems_LxBxMxD.shape == (L, B, M, D) and memory.mlen_B.shape == (B,)
  assert memory.mlen_B.dtype == jnp.int32 and not np.any(memory.mlen_B)
  assert memory.mem_len == M and memory.variant_state == {}
  assert memory_lib.init_memory(cfg, B, mem_len=0).mem_len == 0
  abstract = memory_lib.abstract_memory(cfg, B)
  assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(memory)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(abstract))


def test_map_rows_gathers_the_rows_of_every_field():
  memory = _memory()
  idx = jnp.asarray([6, 1, 1, 3])
  taken = memory.map_rows(lambda x, axis: jnp.take(x, idx, axis=axis))
  np.testing.assert_array_equal(taken.mems_LxBxMxD, np.asarray(memory.mems_LxBxMxD)[:, idx])
  np.testing.assert_array_equal(taken.mlen_B, np.asarray(memory.mlen_B)[idx])
  # The inverse permutation brings the rows back.
  perm = jnp.asarray(np.random.default_rng(1).permutation(B))
  back = memory.map_rows(lambda x, axis: jnp.take(x, perm, axis=axis)).map_rows(
      lambda x, axis: jnp.take(x, jnp.argsort(perm), axis=axis)
  )
  _assert_memory_equal(back, memory)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("n_chunk", [1, 2, 4])
def test_map_rows_chunks_round_trip(n_chunk, padded):
  """The train step's micro-batches: row r in chunk r % n_chunk, and back."""
  memory = _memory(padded=padded)
  chunks = memory.map_rows(lambda x, axis: train_step._to_chunks(x, n_chunk, axis))
  assert chunks.mems_LxBxMxD.shape == (n_chunk, L, B // n_chunk, M, D)
  assert chunks.mlen_B.shape == (n_chunk, B // n_chunk)
  for c in range(n_chunk):
    np.testing.assert_array_equal(chunks.mems_LxBxMxD[c], memory.mems_LxBxMxD[:, c::n_chunk])
    np.testing.assert_array_equal(chunks.mlen_B[c], memory.mlen_B[c::n_chunk])
    if padded:
      np.testing.assert_array_equal(chunks.pad_B[c], memory.pad_B[c::n_chunk])
  _assert_memory_equal(chunks.map_rows(train_step._from_chunks), memory)


def _old_memory_sharding(mesh: Mesh) -> memory_lib.Memory:
  """What train_state.memory_sharding built before the memory module."""
  rows = sharding.batch_axes(mesh)
  return memory_lib.Memory(
      mems_LxBxMxD=NamedSharding(mesh, P(None, rows, None, None)),
      mlen_B=sharding.rows_sharding(mesh),
  )


@pytest.mark.parametrize(
    "shape,names",
    [
        ((1,), ("data",)),
        ((2, 4), ("data", "model")),
        ((4, 2), ("fsdp", "model")),
        ((2, 2, 2), ("data", "fsdp", "model")),
        ((2, 2, 2), ("model", "fsdp", "data")),
        ((8,), ("model",)),
    ],
)
def test_shardings_split_rows_over_the_batch_axes(shape, names):
  n = int(np.prod(shape))
  mesh = Mesh(np.asarray(jax.devices()[:n]).reshape(shape), names)
  cfg = tiny_model_config(n_head=2)
  got, want = memory_lib.shardings(cfg, mesh), _old_memory_sharding(mesh)
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    assert isinstance(g, NamedSharding) and g.mesh == w.mesh
    assert g.spec == w.spec and tuple(g.spec) == tuple(w.spec)
    assert g == w
  rows = tuple(a for a in ("data", "fsdp") if a in names)
  assert got.mems_LxBxMxD.spec == P(None, rows, None, None)
  assert got.mlen_B.spec == P(rows)
  assert _memory().shardings(mesh) == got  # from an instance: the same layout
  rep = memory_lib.replicated_shardings(cfg, mesh)
  assert rep.mems_LxBxMxD == sharding.replicated(mesh) == rep.mlen_B


def test_shardings_place_a_memory():
  mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "model"))
  placed = jax.device_put(_memory(), _memory().shardings(mesh))
  # Rows over data x fsdp (4 shards of 2 rows), replicated over model.
  shard_shapes = {s.data.shape for s in placed.mems_LxBxMxD.addressable_shards}
  assert shard_shapes == {(L, B // 4, M, D)}
  assert {s.data.shape for s in placed.mlen_B.addressable_shards} == {(B // 4,)}
  _assert_memory_equal(placed, _memory())
  padded = jax.device_put(_memory(padded=True), _memory(padded=True).shardings(mesh))
  assert {s.data.shape for s in padded.pad_B.addressable_shards} == {(B // 4,)}
  _assert_memory_equal(padded, _memory(padded=True))


def _with_state(seed: int = 0) -> tuple[memory_lib.Memory, object]:
  """A memory with variant state: the gated store (per-layer leaves, rows on
  axis 1, heads on the model axis) and the memory tokens (rows on axis 0),
  every array random (the counts in range)."""
  cfg = tiny_model_config(
      n_layer=L,
      d_model=D,
      n_head=2,
      d_head=2,
      d_inner=8,
      tgt_len=3,
      mem_len=M,
      **GatedStore.example(),
      tokens={"num_mem_tokens": 2},
  )
  rng = np.random.default_rng(seed)

  def fill(x):
    if x.dtype == jnp.bool_:
      return jnp.asarray(rng.integers(0, 2, size=x.shape), jnp.bool_)
    if x.dtype == jnp.int32:
      return jnp.asarray(rng.integers(0, 4, size=x.shape), jnp.int32)
    return jnp.asarray(rng.normal(size=x.shape), x.dtype)

  return jax.tree_util.tree_map(fill, memory_lib.init_memory(cfg, B)), cfg


def test_map_rows_and_shardings_follow_each_declared_leaf():
  memory, cfg = _with_state()
  assert list(memory.variant_state) == [
      "store_keys_LxBxHxSxDh",
      "store_values_LxBxHxSxDh",
      "store_count_LxB",
      "mem_tokens_BxNxD",
      "mem_tokens_fresh_B",
  ]
  idx = jnp.asarray([6, 1, 1, 3])
  taken = memory.map_rows(lambda x, axis: jnp.take(x, idx, axis=axis))
  for name, x in memory.leaves().items():
    axis = 0 if name.startswith("mem_tokens") or name == "mlen_B" else 1
    np.testing.assert_array_equal(taken.leaves()[name], np.take(np.asarray(x), idx, axis=axis))
  chunks = memory.map_rows(lambda x, axis: train_step._to_chunks(x, 2, axis))
  _assert_memory_equal(chunks.map_rows(train_step._from_chunks), memory)
  mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "model"))
  specs = {n: tuple(s.spec) for n, s in memory_lib.shardings(cfg, mesh).leaves().items()}
  rows = ("data", "fsdp")
  assert specs["store_keys_LxBxHxSxDh"] == (None, rows, "model", None, None)  # 2 heads / 2
  assert specs["store_count_LxB"] == (None, rows) and specs["mem_tokens_fresh_B"] == (rows,)
  placed = jax.device_put(memory, memory_lib.shardings(cfg, mesh))
  shard = placed.variant_state["store_keys_LxBxHxSxDh"].addressable_shards[0].data
  assert shard.shape == (L, B // 4, 1, 6, 2)
  _assert_memory_equal(placed, memory)
  # A head axis the model axis does not divide stays whole.
  odd = Mesh(np.asarray(jax.devices()[:3]).reshape(1, 1, 3), ("data", "fsdp", "model"))
  assert memory_lib.state.leaf("store_keys_LxBxHxSxDh").spec(odd, (L, B, 2, 6, 2))[2] is None


def test_reset_resets_each_variants_state_its_way():
  memory, _ = _with_state()
  reset_B = jnp.asarray([True, False] * (B // 2))
  out = memory.reset(reset_B).variant_state
  r = np.asarray(reset_B)
  want_count = np.where(r[None, :], 0, np.asarray(memory.variant_state["store_count_LxB"]))
  np.testing.assert_array_equal(out["store_count_LxB"], want_count)
  want_fresh = np.asarray(memory.variant_state["mem_tokens_fresh_B"]) | r
  np.testing.assert_array_equal(out["mem_tokens_fresh_B"], want_fresh)
  for name in ("store_keys_LxBxHxSxDh", "mem_tokens_BxNxD"):  # contents stay, masked or unread
    np.testing.assert_array_equal(out[name], memory.variant_state[name])


def test_a_leaf_declares_one_rows_axis_and_layers_first():
  assert memory_lib.Leaf(("layers", "batch", None)).row_axis == 1
  assert memory_lib.Leaf(("batch", "heads")).per_layer is False
  for bad in ((None, None), ("batch", "batch"), ("batch", "layers")):
    with pytest.raises(ValueError, match="'batch' exactly once"):
      memory_lib.Leaf(bad)


def _old_layer_update(mem_BxMxD, h_BxTxD):
  """DecoderLayer's inline FIFO before the memory module."""
  mem_len, tgt_len = mem_BxMxD.shape[1], h_BxTxD.shape[1]
  mem_BxMxD = jax.lax.stop_gradient(mem_BxMxD)
  cat_BxKxD = jnp.concatenate([mem_BxMxD, h_BxTxD], axis=1)
  end = mem_len + tgt_len
  return jax.lax.stop_gradient(cat_BxKxD[:, end - mem_len : end])


@pytest.mark.parametrize("mem_len,tgt_len", [(5, 3), (2, 6), (0, 4), (4, 4)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_update_equals_the_inline_fifo(mem_len, tgt_len, dtype):
  rng = np.random.default_rng(mem_len * 100 + tgt_len * 10)
  mem = jnp.asarray(rng.normal(size=(2, mem_len, D)), dtype)
  h = jnp.asarray(rng.normal(size=(2, tgt_len, D)), dtype)
  new = memory_lib.layer_update(memory_lib.layer_read(mem), h)
  old = _old_layer_update(mem, h)
  assert new.shape == (2, mem_len, D) and new.dtype == dtype
  np.testing.assert_array_equal(np.asarray(new, np.float32), np.asarray(old, np.float32))
  # The last M inputs, by hand.
  full = np.concatenate([np.asarray(mem, np.float32), np.asarray(h, np.float32)], axis=1)
  np.testing.assert_array_equal(np.asarray(new, np.float32), full[:, tgt_len:])


def test_layer_read_and_update_stop_the_gradient():
  rng = np.random.default_rng(0)
  mem = jnp.asarray(rng.normal(size=(2, 3, D)), jnp.float32)
  h = jnp.asarray(rng.normal(size=(2, 4, D)), jnp.float32)
  g_read = jax.grad(lambda m: jnp.sum(memory_lib.layer_read(m) ** 2))(mem)
  g_mem, g_h = jax.grad(lambda m, x: jnp.sum(memory_lib.layer_update(m, x) ** 2), argnums=(0, 1))(
      mem, h
  )
  assert not np.any(g_read) and not np.any(g_mem) and not np.any(g_h)
  # Without the stop-gradient the same function has a gradient: the test can fail.
  assert np.any(jax.grad(lambda x: jnp.sum(x**2))(mem))


def test_reset_empties_only_the_flagged_rows():
  memory = _memory()
  reset_B = jnp.asarray([True, False] * (B // 2))
  out = memory.reset(reset_B)
  want = np.where(np.asarray(reset_B), 0, np.asarray(memory.mlen_B))
  np.testing.assert_array_equal(out.mlen_B, want)
  assert out.mlen_B.dtype == jnp.int32
  np.testing.assert_array_equal(out.mems_LxBxMxD, memory.mems_LxBxMxD)


def test_advance_counts_the_valid_slots():
  mlen_B = jnp.asarray([0, 3, 5, -4, -9], jnp.int32)
  np.testing.assert_array_equal(memory_lib.advance_mlen(mlen_B, 5, 3), [3, 5, 5, -1, -6])
  np.testing.assert_array_equal(memory_lib.advance_mlen(mlen_B, 5, 2), [2, 5, 5, -2, -7])
  np.testing.assert_array_equal(memory_lib.advance_mlen(mlen_B, 0, 4), [0, 0, 0, 0, -5])
  memory = _memory()
  new_mems = memory.mems_LxBxMxD + 1.0
  out = memory.advance(new_mems, 2)
  np.testing.assert_array_equal(out.mems_LxBxMxD, new_mems)
  np.testing.assert_array_equal(out.mlen_B, np.minimum(M, np.asarray(memory.mlen_B) + 2))
  assert out.mlen_B.dtype == jnp.int32 and out.pad_B is None


def test_advance_consumes_the_padding_first():
  """p padding positions before a segment of T: max(p - T, 0) remain (they
  carry over), max(T - p, 0) positions become valid slots (at most M)."""
  empty = memory_lib.Memory(jnp.zeros((1, 4, 5, 2)), jnp.zeros((4,), jnp.int32))
  memory = empty.with_front_padding(np.asarray([0, 2, 5, 9], np.int32))
  out = memory.advance(memory.mems_LxBxMxD, 3)
  np.testing.assert_array_equal(out.mlen_B, [3, 1, 0, 0])
  np.testing.assert_array_equal(out.pad_B, [0, 0, 2, 6])
  assert out.mlen_B.dtype == out.pad_B.dtype == jnp.int32
  again = out.advance(out.mems_LxBxMxD, 3)
  np.testing.assert_array_equal(again.mlen_B, [5, 4, 1, 0])
  np.testing.assert_array_equal(again.pad_B, [0, 0, 0, 3])
  reset = again.reset(jnp.asarray([False, False, False, True]))
  np.testing.assert_array_equal(reset.mlen_B, [5, 4, 1, 0])
  np.testing.assert_array_equal(reset.pad_B, [0, 0, 0, 0])


def test_with_front_padding_masks_the_padded_positions():
  cfg = tiny_model_config(
      n_token=20, n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=16, tgt_len=6, mem_len=0
  )
  pad_B = np.asarray([0, 2, 5], np.int32)
  memory = memory_lib.init_memory(cfg, 3, mem_len=0).with_front_padding(pad_B)
  np.testing.assert_array_equal(memory.pad_B, pad_B)
  np.testing.assert_array_equal(memory.mlen_B, 0)
  np.testing.assert_array_equal(memory.key_count_B(), -pad_B)
  assert memory.pad_B.dtype == jnp.int32
  # The real tokens of a padded row score as they would alone.
  model = models.TransformerXL(cfg)
  params = models.init_params(model, jax.random.PRNGKey(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 20, size=(3, 6)), jnp.int32)
  log_probs, _ = model.apply({"params": params}, tokens, memory)
  for b, p in enumerate(pad_B):
    alone, _ = model.apply(
        {"params": params}, tokens[b : b + 1, p:], memory_lib.init_memory(cfg, 1, mem_len=0)
    )
    np.testing.assert_allclose(log_probs[b, p:], alone[0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# The auxiliary-loss channel of the train step (modules sow into "losses").

AUX = 0.75  # the scalar the test modules sow


class _SowingModel(models.TransformerXL):
  """Sows AUX plus ``scale`` times the mean nll (so it has a gradient)."""

  scale: float = 0.0

  def __call__(self, *args, **kwargs):
    out = super().__call__(*args, **kwargs)
    self.sow("losses", "extra", jnp.float32(AUX) + self.scale * jnp.mean(out[0]))
    return out


class _SowingLayer(models.DecoderLayer):
  """Every layer sows AUX (stacked over the scanned layers)."""

  def __call__(self, *args, **kwargs):
    out = super().__call__(*args, **kwargs)
    self.sow("losses", "per_layer", jnp.float32(AUX))
    return out


def _one_step(model_cls, weight, batch_chunk=1, **model_kw):
  config = tiny_config(batch_chunk=batch_chunk)
  mesh = sharding.make_mesh((2, 1), ("data", "model"), devices=jax.devices()[:2])
  model = model_cls(default_config.model_config(config, 64), **model_kw)
  tx = train_state.make_optimizer(config.train)
  _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
  state = train_state.create_train_state(model, tx, 8, mesh, jax.random.PRNGKey(0), shardings)
  step_fn = train_step.make_train_step(
      model, tx, mesh, shardings, batch_chunk, 7, aux_loss_weight=weight
  )
  tokens = np.random.default_rng(0).integers(0, 64, size=8 * 6 + 8).astype(np.int32)
  it = data.TrainIterator(data.ArraySource(tokens), 8, 6)
  batch = data.to_global_batch(next(it), sharding.batch_sharding(mesh), 8)
  state, metrics = step_fn(state, batch)
  return jax.device_get(metrics), jax.device_get(state.params)


@pytest.fixture(scope="module")
def baseline_step():
  return _one_step(models.TransformerXL, 1.0)


def test_nothing_sown_adds_no_metric(baseline_step):
  metrics, _ = baseline_step
  assert set(metrics) == {"loss", "grad_norm", "finite"}
  assert train_step.aux_losses({}) == {}


@pytest.mark.parametrize("weight", [0.5, 2.0])
def test_sown_scalar_adds_weight_times_it_to_the_loss(baseline_step, weight):
  base, base_params = baseline_step
  metrics, params = _one_step(_SowingModel, weight)
  assert metrics["loss"] == base["loss"]  # the cross-entropy itself is unchanged
  assert metrics["aux_loss/extra"] == pytest.approx(AUX)
  assert metrics["total_loss"] == pytest.approx(base["loss"] + weight * AUX, rel=1e-6)
  assert metrics["finite"]
  # A constant has no gradient: the update is the baseline's.
  assert metrics["grad_norm"] == base["grad_norm"]
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(base_params)):
    np.testing.assert_array_equal(a, b)
  logged = train.aux_loss_means([{k: float(v) for k, v in metrics.items()}] * 2)
  assert set(logged) == {"aux_loss/extra", "total_loss"}
  assert logged["total_loss"] == pytest.approx(float(metrics["total_loss"]))


def test_sown_loss_with_a_gradient_changes_the_update(baseline_step):
  base, _ = baseline_step
  m0, _ = _one_step(_SowingModel, 0.0, scale=1.0)
  m1, _ = _one_step(_SowingModel, 1.0, scale=1.0)
  # Weight 0: the objective's gradient is the cross-entropy's.
  assert m0["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-6)
  assert m0["total_loss"] == pytest.approx(base["loss"], rel=1e-6)
  # Weight 1, aux = AUX + mean nll: the gradient changes, total = loss + aux.
  assert m1["grad_norm"] != pytest.approx(base["grad_norm"], rel=1e-3)
  assert m1["total_loss"] == pytest.approx(m1["loss"] + m1["aux_loss/extra"], rel=1e-6)
  assert m1["aux_loss/extra"] == pytest.approx(AUX + m1["loss"], rel=1e-5)  # all weights 1


def test_sown_in_every_layer_and_over_micro_batches(monkeypatch):
  base, _ = _one_step(models.TransformerXL, 1.0, batch_chunk=2)
  monkeypatch.setattr(models, "DecoderLayer", _SowingLayer)
  metrics, _ = _one_step(models.TransformerXL, 1.0, batch_chunk=2)
  n_layer = 2  # tiny_config; one AUX per layer, averaged over the 2 micro-batches
  assert metrics["aux_loss/per_layer"] == pytest.approx(n_layer * AUX)
  assert metrics["total_loss"] == pytest.approx(metrics["loss"] + n_layer * AUX, rel=1e-6)
  assert metrics["loss"] == base["loss"] and metrics["grad_norm"] == base["grad_norm"]


def test_aux_loss_weight_is_validated():
  c = default_config.get_config()
  assert c.train.aux_loss_weight == 1.0
  c.train.aux_loss_weight = -1.0
  problems = train_checks.optimizer_problems(c.train, set())
  assert any("train.aux_loss_weight=-1.0 must be >= 0" in p for p in problems), problems
  c.train.aux_loss_weight = 0.0
  assert train_checks.optimizer_problems(c.train, set()) == []
