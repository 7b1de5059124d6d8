"""The kNN memory's store and reads (model/memory/knn.py) against the
authors' code and naive implementations.

``tests/fixtures/knn_meliad.npz`` was written by running google-research/
meliad's ``MemoryOnTpu``/``BatchedMemory`` and its ``TransformerLayer``'s
external-memory path (``scripts/make_knn_fixtures.py``): six segments of
two rows and two heads into a store of 16 slots (it wraps around after
four), row 1 restarting at segment 3, a repeated key (a tie inside a
bucket) and a zero key (an empty slot).  Each check is to 1e-5.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl.model.memory import knn

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "knn_meliad.npz")
K = 4  # the fixture's neighbours


@pytest.fixture(scope="module")
def meliad():
  with np.load(FIXTURE) as f:
    return dict(f)


def _bh(x):
  """[B, T, H, ...] -> [B, H, T, ...]."""
  return jnp.swapaxes(jnp.asarray(x), 1, 2)


@pytest.mark.smoke
def test_store_and_retrieval_equal_the_authors_segment_by_segment(meliad):
  """Reset, read, write per segment, as their ``_query_external_memory``:
  the slots and scores of the neighbours, their keys and values, the store
  and its index after each write (the wrap-around and the reset row)."""
  n_seg, b, _, h, d = meliad["q_SxBxTxHxD"].shape
  s = meliad["key_db_SxBxHxSxD"].shape[3]
  keys, values = jnp.zeros((b, h, s, d)), jnp.zeros((b, h, s, d))
  index = jnp.zeros((b,), jnp.int32)
  for seg in range(n_seg):
    keys, values, index = knn.reset(keys, values, index, jnp.asarray(meliad["sos_SxB"][seg]))
    rk, rv, score, slot = knn.retrieve(_bh(meliad["q_SxBxTxHxD"][seg]), keys, values, K)
    np.testing.assert_array_equal(slot, meliad["slots_SxBxHxTxK"][seg], err_msg=f"segment {seg}")
    np.testing.assert_allclose(score, meliad["scores_SxBxHxTxK"][seg], atol=1e-5)
    np.testing.assert_allclose(_bh(rk), meliad["rkeys_SxBxTxHxKxD"][seg], atol=1e-5)
    np.testing.assert_allclose(_bh(rv), meliad["rvals_SxBxTxHxKxD"][seg], atol=1e-5)
    keys, values, index = knn.write(
        keys,
        values,
        index,
        _bh(meliad["k_SxBxTxHxD"][seg]),
        _bh(meliad["v_SxBxTxHxD"][seg]),
    )
    np.testing.assert_allclose(keys, meliad["key_db_SxBxHxSxD"][seg], atol=1e-6)
    np.testing.assert_allclose(values, meliad["value_db_SxBxHxSxD"][seg], atol=1e-6)
    np.testing.assert_array_equal(index, meliad["index_SxB"][seg])
  # The fixture exercises what it says: a wrap-around, a reset row, an empty slot.
  assert meliad["index_SxB"][-1, 0] > s and meliad["index_SxB"][-1, 1] < meliad["index_SxB"][-1, 0]
  assert (meliad["scores_SxBxHxTxK"] == knn.EMPTY_SCORE).any()


def _memory_path(meliad, seg, raw_q, bias, scale):
  """The layer's gated output given its local attention: our functions in
  the order of their layer (the queries normalised, the scale's absolute
  value, the neighbours their layer retrieved)."""
  q = knn.normalize(raw_q)
  ext = knn.attend(
      q,
      meliad["layer_rkeys_SxBxTxHxKxD"][seg],
      meliad["layer_rvals_SxBxTxHxKxD"][seg],
      jnp.abs(scale),
  )
  return knn.gate(meliad["local_SxBxTxHxD"][seg], ext, bias), ext


def test_gated_memory_attention_and_its_gradients_equal_the_authors(meliad):
  """Their layer's memory attention, its gated combination with the local
  attention, and the gradients of sum(gated * cotangent) with respect to the
  gate bias, the attention scale and the raw queries."""
  bias, scale = jnp.asarray(meliad["bias_H"]), jnp.asarray(meliad["scale_H"])
  for seg in range(meliad["q_SxBxTxHxD"].shape[0]):
    raw_q = jnp.asarray(meliad["q_SxBxTxHxD"][seg])  # their layer input: the raw queries
    gated, ext = _memory_path(meliad, seg, raw_q, bias, scale)
    np.testing.assert_allclose(ext, meliad["ext_SxBxTxHxD"][seg], atol=1e-5)
    np.testing.assert_allclose(gated, meliad["gated_SxBxTxHxD"][seg], atol=1e-5)
    cot = meliad["cot_SxBxTxHxD"][seg]
    loss = lambda b_, s_, q_: jnp.sum(_memory_path(meliad, seg, q_, b_, s_)[0] * cot)
    g_bias, g_scale, g_q = jax.grad(loss, argnums=(0, 1, 2))(bias, scale, raw_q)
    np.testing.assert_allclose(g_bias, meliad["grad_bias_SxH"][seg], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(g_scale, meliad["grad_scale_SxH"][seg], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(g_q, meliad["grad_xq_SxBxTxHxD"][seg], atol=1e-5, rtol=1e-5)


def _store(rng, b=2, h=3, s=24, d=5, empty=5):
  keys = knn.normalize(rng.normal(size=(b, h, s, d)))
  keys = keys.at[:, :, rng.choice(s, empty, replace=False)].set(0.0)  # empty slots
  values = jnp.asarray(rng.normal(size=(b, h, s, d)), jnp.float32)
  q = knn.normalize(rng.normal(size=(b, h, 7, d)))
  return q, keys, values


def test_bucketed_retrieval_is_the_best_slot_of_each_group_by_index_mod_k():
  """Neighbour n is the argmax over the slots s = n (mod k) (numpy), its key
  and value exactly that slot's; a group with no written slot gives zeros."""
  rng = np.random.default_rng(0)
  q, keys, values = _store(rng)
  k = 6
  rk, rv, score, slot = knn.retrieve(q, keys, values, k)
  raw = np.einsum("bhed,bhsd->bhes", q, keys)
  raw = raw + np.where(np.asarray(keys).sum(-1) == 0, knn.EMPTY_SCORE, 0)[:, :, None, :]
  for n in range(k):
    group = np.arange(n, keys.shape[2], k)
    best = group[np.argmax(raw[..., group], axis=-1)]
    np.testing.assert_array_equal(slot[..., n], best)
    np.testing.assert_allclose(
        score[..., n], np.take_along_axis(raw, best[..., None], -1)[..., 0], atol=1e-6
    )
    want = np.take_along_axis(np.asarray(keys)[:, :, None], best[..., None, None], axis=3)[
        ..., 0, :
    ]
    np.testing.assert_allclose(rk[..., n, :], want, atol=1e-6)
  # Group 2 never written (keys and values zero, as a new or reset store's).
  keys, values = keys.at[:, :, 2::6].set(0.0), values.at[:, :, 2::6].set(0.0)
  rk, rv, score, _ = knn.retrieve(q, keys, values, k)
  np.testing.assert_array_equal(rk[..., 2, :], 0.0)
  np.testing.assert_array_equal(rv[..., 2, :], 0.0)
  np.testing.assert_array_equal(score[..., 2], knn.EMPTY_SCORE)


@pytest.mark.parametrize("mode", ["exact", "approx"])
def test_exact_and_approximate_retrieval_are_the_true_top_k(mode):
  """``exact`` (and ``approx`` on the CPU, where approx_max_k is exact) read
  the k best slots, best first, their keys and values gathered."""
  rng = np.random.default_rng(1)
  q, keys, values = _store(rng)
  k = 5
  rk, rv, score, slot = knn.retrieve(q, keys, values, k, mode=mode)
  raw = np.asarray(knn.scores(q, keys))
  want = np.argsort(-raw, axis=-1, kind="stable")[..., :k]
  np.testing.assert_array_equal(np.sort(slot, -1), np.sort(want, -1))
  assert (np.diff(np.asarray(score), axis=-1) <= 0).all()
  gathered = np.take_along_axis(np.asarray(values)[:, :, None], np.asarray(slot)[..., None], 3)
  np.testing.assert_allclose(rv, gathered, atol=0)


def test_writes_are_a_ring_buffer():
  """The store after any writes equals a naive ring buffer (numpy): each
  entry at slot (entries written before it) mod S, segments of any length
  (one that wraps inside itself, one longer than the store); a reset empties
  a row only."""
  rng = np.random.default_rng(2)
  b, h, s, d = 2, 1, 12, 3
  keys, values = jnp.zeros((b, h, s, d)), jnp.zeros((b, h, s, d))
  index = jnp.zeros((b,), jnp.int32)
  naive = np.zeros((b, h, s, d), np.float32)
  count = np.zeros(b, int)
  for step, t in enumerate([4, 4, 5, 1, 4, 7, 15, 4]):
    if step == 4:
      keys, values, index = knn.reset(keys, values, index, jnp.array([False, True]))
      naive[1], count[1] = 0, 0
    new = rng.normal(size=(b, h, t, d)).astype(np.float32)
    keys, values, index = knn.write(keys, values, index, new, new * 2)
    for r in range(b):
      for j in range(t):
        naive[r, :, (count[r] + j) % s] = new[r, :, j]
      count[r] += t
    np.testing.assert_array_equal(keys, naive, err_msg=f"write {step} of {t}")
    np.testing.assert_array_equal(values, naive * 2)
    np.testing.assert_array_equal(index, count)


def test_no_gradient_flows_into_the_store():
  """The read and the write stop the gradient: the store's keys and values
  get none from the memory attention; the queries do."""
  rng = np.random.default_rng(3)
  q, keys, values = _store(rng, empty=0)

  def loss(q, keys, values):
    rk, rv, _, _ = knn.retrieve(q, keys, values, 4)
    out = knn.attend(
        jnp.swapaxes(q, 1, 2), jnp.swapaxes(rk, 1, 2), jnp.swapaxes(rv, 1, 2), jnp.full((3,), 3.0)
    )
    return jnp.sum(out**2)

  g_q, g_k, g_v = jax.grad(loss, argnums=(0, 1, 2))(q, keys, values)
  assert float(jnp.abs(g_q).max()) > 0
  assert float(jnp.abs(g_k).max()) == 0 and float(jnp.abs(g_v).max()) == 0
  # Nor from what is written: the written entries are constants.
  new_k, new_v = keys[:, :, :4], values[:, :, :4]
  written = lambda nk, nv: sum(
      jnp.sum(x**2) for x in knn.write(keys, values, jnp.zeros(2, jnp.int32), nk, nv)[:2]
  )
  g_nk, g_nv = jax.grad(written, argnums=(0, 1))(new_k, new_v)
  assert float(jnp.abs(g_nk).max()) == 0 and float(jnp.abs(g_nv).max()) == 0


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda k, v: knn.retrieve(k[:, :, :3], k, v, 5), "k must be at most S and divide it"),
        (lambda k, v: knn.retrieve(k[:, :, :3], k, v, 5, mode="exact"), None),
        (lambda k, v: knn.retrieve(k[:, :, :3], k, v, 13, mode="exact"), "k must be at most S."),
        (lambda k, v: knn.retrieve(k[:, :, :3], k, v, 4, mode="faiss"), "use one of"),
    ],
)
def test_bad_shapes_and_modes_are_refused_in_one_message(call, words):
  keys = values = jnp.ones((1, 1, 12, 2))
  if words is None:
    call(keys, values)  # exact retrieval needs no divisor
    return
  with pytest.raises(ValueError, match=words):
    call(keys, values)


# ---- The variant in the model (model.memory="knn") -------------------------------

SIZES = dict(n_token=24, n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=4)


def _model(memory="knn", **knn_kw):
  from transformer_xl.model import models

  fields = {**SIZES, "mem_len": 4, "dropout": 0.0, "dropatt": 0.0, "memory": memory}
  if memory == "knn":
    fields["knn"] = {"memory_size": 8, "num_neighbors": 2, "layers": (1,), **knn_kw}
  cfg = models.ModelConfig.from_dict(fields)
  return cfg, models.TransformerXL(cfg)


def _segments(n=5, b=2, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(rng.integers(1, SIZES["n_token"], size=(b, n * 4 + 1)), jnp.int32)


def _run(cfg, model, params, tokens):
  from transformer_xl.model import memory

  mem = memory.init_memory(cfg, tokens.shape[0])
  step = jax.jit(lambda p, m, x, y: model.apply({"params": p}, x, m, y))
  out = []
  for s in range((tokens.shape[1] - 1) // 4):
    nll, mem = step(params, mem, tokens[:, 4 * s : 4 * s + 4], tokens[:, 4 * s + 1 : 4 * s + 5])
    out.append(nll)
  return jnp.concatenate(out, axis=1), mem


def test_a_closed_gate_leaves_the_xl_model_as_it_is():
  """With the gate closed (bias -40: g = 4e-18) the model scores every
  segment as the XL model with the same other parameters: the kNN path adds
  to the layer's attention and changes nothing else (its cache, the other
  layers)."""
  from transformer_xl.model import memory

  cfg, model = _model()
  xl_cfg, xl_model = _model("xl")
  tokens = _segments()
  params = model.init(
      jax.random.PRNGKey(0), tokens[:, :4], memory.init_memory(cfg, 2), tokens[:, 1:5]
  )["params"]
  closed = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.full_like(x, -40.0)
      if "knn_gate_bias" in jax.tree_util.keystr(path)
      else x,
      params,
  )
  xl_params = {
      **params,
      "layers": {
          **params["layers"],
          "attn": {k: v for k, v in params["layers"]["attn"].items() if not k.startswith("knn_")},
      },
  }
  nll, mem = _run(cfg, model, closed, tokens)
  xl_nll, xl_mem = _run(xl_cfg, xl_model, xl_params, tokens)
  np.testing.assert_allclose(nll, xl_nll, atol=1e-5)
  np.testing.assert_allclose(mem.mems_LxBxMxD, xl_mem.mems_LxBxMxD, atol=1e-5)
  # ... and with it open the memory layer reads the store: scores differ once it is filled.
  open_nll, _ = _run(cfg, model, params, tokens)
  assert not np.allclose(open_nll[:, 4:], xl_nll[:, 4:], atol=1e-4)


def test_only_the_memory_layers_hold_a_store_and_learn_its_gate():
  """One store per memory layer (not per layer), written 4 entries a segment
  with a wrap-around; the gate and scale of the other layers get no
  gradient, the memory layer's do."""
  from transformer_xl.model import memory

  cfg, model = _model(layers=(-2,))
  tokens = _segments(n=3)
  mem = memory.init_memory(cfg, 2)
  assert mem.variant_state["knn_keys_NxBxHxSxDh"].shape == (1, 2, 2, 8, 8)
  params = model.init(jax.random.PRNGKey(1), tokens[:, :4], mem, tokens[:, 1:5])["params"]
  _, mem = _run(cfg, model, params, tokens)
  np.testing.assert_array_equal(mem.variant_state["knn_index_NxB"], [[12, 12]])

  def loss(p):
    return jnp.mean(model.apply({"params": p}, tokens[:, 4:8], mem, tokens[:, 5:9])[0])

  grads = jax.grad(loss)(params)["layers"]["attn"]
  for name in ("knn_gate_bias", "knn_scale"):
    g = np.asarray(nn_unbox(grads[name]))  # [n_layer, H]
    assert np.abs(g[1]).max() > 0, name
    np.testing.assert_array_equal(g[[0, 2]], 0.0)


def nn_unbox(x):
  import flax.linen as nn

  return nn.unbox(x)


@pytest.mark.parametrize(
    "knn_kw, words",
    [
        ({"layers": (3,)}, "model.knn.layers=(3,): layer 3 is not one of the 3 layers"),
        ({"memory_size": 10, "num_neighbors": 4}, "must be a multiple of model.knn.num_neighbors"),
        ({"num_neighbors": 9}, "model.knn.num_neighbors=9 is more than"),
        ({"retrieval": "faiss"}, "model.knn.retrieval='faiss': use one of"),
        ({"recall_target": 0.0}, "model.knn.recall_target=0.0 must be in"),
        ({"layers": ()}, "model.knn.layers=() must be a non-empty tuple"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(knn_kw, words):
  with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
    _model(**knn_kw)


def test_a_token_never_reads_its_own_segment_from_the_store():
  """Causality with a filled store: the scores of a segment's first
  positions do not change when its last input token does (a store written
  before it is read would hand every query the keys after it)."""
  from transformer_xl.model import memory

  cfg, model = _model(layers=(0, 2))
  tokens = _segments(n=3)
  params = model.init(
      jax.random.PRNGKey(2), tokens[:, :4], memory.init_memory(cfg, 2), tokens[:, 1:5]
  )["params"]
  _, mem = _run(cfg, model, params, tokens[:, :9])  # two segments in the store
  x, y = tokens[:, 8:12], tokens[:, 9:13]
  changed = x.at[:, 3].set((x[:, 3] + 1) % SIZES["n_token"])
  a, _ = model.apply({"params": params}, x, mem, y)
  b, _ = model.apply({"params": params}, changed, mem, y)
  np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-6)
  assert not np.allclose(a[:, 3], b[:, 3])


def test_a_document_start_inside_a_segment_empties_the_store():
  """Documents masked apart (``data.documents="reset"``): a document that
  starts at position 2 of the third segment, after two segments of another
  one filled the store, is scored exactly as the same document alone (an
  empty memory, the segment's first 2 positions front padding), and leaves
  the same store; the old document's queries before it still read the
  store (they score as without documents)."""
  from transformer_xl.model import memory

  cfg, model = _model(memory_size=8, num_neighbors=2, layers=(1,))
  tokens = _segments(n=4, b=1, seed=3)
  params = model.init(
      jax.random.PRNGKey(4), tokens[:, :4], memory.init_memory(cfg, 1), tokens[:, 1:5]
  )["params"]
  step = jax.jit(lambda m, x, y, d: model.apply({"params": params}, x, m, y, doc_pos_BxT=d))
  plain = jax.jit(lambda m, x, y: model.apply({"params": params}, x, m, y))
  seg = lambda s: (tokens[:, 4 * s : 4 * s + 4], tokens[:, 4 * s + 1 : 4 * s + 5])
  far = 1000  # an offset beyond every key: the document started long ago
  docs = [[[far] * 4], [[far] * 4], [[far, far, 0, 1]], [[2, 3, 4, 5]]]
  mem, nll = memory.init_memory(cfg, 1), []
  for s in range(4):
    if s == 2:
      without, _ = plain(mem, *seg(s))
    out, mem = step(mem, *seg(s), jnp.asarray(docs[s], jnp.int32))
    nll.append(out)
  # The old document's first two queries of segment 2 read the store as without documents.
  np.testing.assert_allclose(nll[2][:, :2], without[:, :2], atol=1e-6)
  alone = memory.init_memory(cfg, 1).with_front_padding(jnp.asarray([2]))
  a2, alone = plain(alone, *seg(2))
  a3, alone = plain(alone, *seg(3))
  np.testing.assert_allclose(nll[2][:, 2:], a2[:, 2:], atol=1e-5)
  np.testing.assert_allclose(nll[3], a3, atol=1e-5)
  for name in ("knn_keys_NxBxHxSxDh", "knn_values_NxBxHxSxDh", "knn_index_NxB"):
    np.testing.assert_allclose(mem.variant_state[name], alone.variant_state[name], atol=1e-6)
  np.testing.assert_array_equal(mem.variant_state["knn_index_NxB"], [[8]])
  # Without the documents' offsets the new document reads the old one's entries.
  mem = memory.init_memory(cfg, 1)
  for s in range(3):
    out, mem = plain(mem, *seg(s))
  assert not np.allclose(out[:, 2:], a2[:, 2:], atol=1e-4)


def test_a_trained_workdir_starts_a_knn_run_with_its_parameters(tmp_path):
  """train.init_from: the source's parameters in place of the fresh ones,
  the kNN gate and scale fresh (zeros, ones), the optimizer at step 0; a
  model that differs in a field that gives the parameters their meaning
  is refused naming it."""
  import optax

  from transformer_xl import default_config, sharding
  from transformer_xl.model import models
  from transformer_xl.run import run_dir
  from transformer_xl.training import init_from, train_state

  from helpers import toy_config, train_toy

  mesh = sharding.make_mesh((2, 1), ("data", "model"), devices=jax.devices()[:2])
  source = tmp_path / "xl"
  train_toy(source, mesh, toy_config(num_steps=2))
  config = toy_config(init_from=str(source))
  config.model.update(memory="knn")
  config.model.knn.update(memory_size=12, num_neighbors=2, layers=(-1,))
  mcfg = default_config.model_config(config, 32)
  model, tx = models.TransformerXL(mcfg), optax.adam(1e-3)
  _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
  state = init_from.initial_state(config, model, tx, mesh, shardings, "word")
  _, loaded = run_dir.restore_params(
      str(source), default_config.model_config(toy_config(), 32), mesh
  )
  got, want = init_from._by_path(state.params), init_from._by_path(loaded)
  assert sorted(set(got) - set(want)) == ["layers/attn/knn_gate_bias", "layers/attn/knn_scale"]
  for name, x in want.items():
    np.testing.assert_array_equal(got[name], x, err_msg=name)
  np.testing.assert_array_equal(got["layers/attn/knn_gate_bias"], 0.0)
  np.testing.assert_array_equal(got["layers/attn/knn_scale"], 1.0)
  assert int(state.step) == 0

  config.model.d_inner = 48
  other = models.TransformerXL(default_config.model_config(config, 32))
  _, other_shardings = train_state.abstract_train_state(other, tx, 8, mesh)
  with pytest.raises(default_config.ConfigError, match=r"model\.d_inner=48 differs from"):
    init_from.initial_state(config, other, tx, mesh, other_shardings, "word")
  config.model.d_inner = 32
  with pytest.raises(default_config.ConfigError, match="trained on word units, this corpus has"):
    init_from.initial_state(config, model, tx, mesh, shardings, "char")


def test_the_paper_config_holds_its_settings_and_the_parameter_count_it_states():
  """configs/knn_pg19.py: Wu et al. 2022, Sec. 4.1's model (12 layers,
  1024 wide, 8 heads of 128, FFN 4096, k = 32 at the 9th layer, segments and
  cache of 512) for each store size, the counts its docstring states being
  those of the models it builds; an unknown variant is one message."""
  import flax

  from transformer_xl import default_config
  from transformer_xl.model import models

  from helpers import CONFIGS, load_config

  text = (CONFIGS / "knn_pg19.py").read_text()
  sizes = {"xl": 0, "knn_8k": 8192, "knn_32k": 32768, "knn_65k": 65536, "knn_262k": 262144}
  for name, size in sizes.items():
    config = load_config("knn_pg19", name)
    m = config.model
    assert (m.n_layer, m.d_model, m.n_head, m.d_head, m.d_inner) == (12, 1024, 8, 128, 4096)
    assert (m.tgt_len, m.mem_len, config.eval.mem_len) == (512, 512, 512)
    assert m.memory == ("knn" if size else "xl")
    if size:
      assert (m.knn.memory_size, m.knn.num_neighbors, tuple(m.knn.layers)) == (size, 32, (-4,))
    default_config.validate(config, 1)
    if name in ("xl", "knn_65k"):
      mc = default_config.model_config(config, 32000)
      init = lambda key, mc=mc: models.init_params(models.TransformerXL(mc), key)
      shapes = flax.linen.unbox(jax.eval_shape(init, jax.random.PRNGKey(0)))
      count = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
      assert count == 196_490_496 + (2 * 8 * 12 if size else 0), name
      assert f"{count:,}" in text, name
  with pytest.raises(ValueError, match="unknown variant 'knn_1k'; use one of"):
    load_config("knn_pg19", "knn_1k")
