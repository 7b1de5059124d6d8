"""Documents ("reset"): with ``doc_pos`` no query attends to a key of another document.

A stream of documents packed one after another, scored segment by segment
with the memory carried, gives every document the scores it gets alone from
an empty memory (relative attention: types 0 and 1); the absolute types
give another document's keys exactly zero attention; no ``doc_pos`` (or an
inert one) changes nothing; the blockwise attention, the train step and the
eval step honour it.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.inference import eval_steps, evaluate
from transformer_xl.model import attention_ops, models
from transformer_xl.model import memory as memory_lib
from transformer_xl.training import train_state, train_step

from helpers import tiny_model_config

SLOW = pytest.mark.slow  # a case left out of the fast tier (-m "not slow")

SEP = 0  # the separator that ends every document (and starts the stream)
N_TOKEN = 20
DOC_LENGTHS = ([2, 3, 7, 12, 1, 9], [5, 1, 4, 10, 3])  # one stream per batch row


def tiny_config(**kw):
  # A larger init_std than the reference's 0.02, so that the context matters
  # (at 0.02 a tiny model's scores barely depend on it).
  base = dict(
      n_token=N_TOKEN,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=5,
      mem_len=4,
      same_length=True,
      attn_block=0,
      init_std=0.3,
  )
  base.update(kw)
  return tiny_model_config(**base)


def init_model(cfg, record_attention=False):
  model = models.TransformerXL(cfg, record_attention=record_attention)
  return model, nn.unbox(models.init_params(model, jax.random.PRNGKey(0)))


def make_documents(lengths, seed):
  """Token lists of the given lengths, each ending with SEP, no SEP inside."""
  rng = np.random.default_rng(seed)
  return [list(rng.integers(1, N_TOKEN, n - 1)) + [SEP] for n in lengths]


def doc_positions(lengths):
  """doc_pos of the stream's inputs: each input's offset from its document's
  first input (the separator before the document), by a plain loop."""
  doc_pos = []
  for n in lengths:
    doc_pos.extend(range(n))
  return doc_pos


def stream_arrays(docs_per_row, n_seg, tgt_len):
  """inputs, targets, doc_pos: int32 [B, n_seg * T], rows padded at the end."""
  width = n_seg * tgt_len
  out = np.zeros((3, len(docs_per_row), width), np.int32)
  for b, docs in enumerate(docs_per_row):
    stream = [SEP] + [t for d in docs for t in d]
    n = len(stream) - 1
    out[0, b, :n], out[1, b, :n] = stream[:-1], stream[1:]
    out[2, b, :n] = doc_positions([len(d) for d in docs])
  return out


@functools.cache
def segment_step(model, mutable=()):
  """The jitted (variables, inputs, memory, targets, doc_pos) -> model outputs."""
  return jax.jit(
      lambda p, x, mem, y, d: model.apply(
          p, x, mem, y, doc_pos_BxT=d, mutable=list(mutable) or False
      )
  )


def score_segments(model, params, inputs_BxN, targets_BxN, doc_pos_BxN=None):
  """Per-token NLL [B, N], segment by segment from an empty memory, memory carried."""
  cfg = model.config
  b, n = inputs_BxN.shape
  step = segment_step(model)
  memory, out = memory_lib.init_memory(cfg, b), []
  for s in range(0, n, cfg.tgt_len):
    seg = lambda a: None if a is None else jnp.asarray(a[:, s : s + cfg.tgt_len])
    nll_BxT, memory = step(
        {"params": params}, seg(inputs_BxN), memory, seg(targets_BxN), seg(doc_pos_BxN)
    )
    out.append(np.asarray(nll_BxT))
  return np.concatenate(out, axis=1)


def score_alone(model, params, doc):
  """Per-token NLL of one document scored alone: inputs [SEP, t1..t_{n-1}],
  targets [t1..tn], no doc_pos, an empty memory at its start."""
  t = model.config.tgt_len
  n_seg = -(-len(doc) // t)
  inputs, targets = np.zeros((2, 1, n_seg * t), np.int32)
  inputs[0, : len(doc)], targets[0, : len(doc)] = [SEP] + doc[:-1], doc
  return score_segments(model, params, inputs, targets)[0, : len(doc)]


def assert_stream_matches_alone(model, params, docs_per_row):
  t = model.config.tgt_len
  n_seg = max(-(-sum(map(len, docs)) // t) for docs in docs_per_row)
  inputs, targets, doc_pos = stream_arrays(docs_per_row, n_seg, t)
  nll = score_segments(model, params, inputs, targets, doc_pos)
  for b, docs in enumerate(docs_per_row):
    start = 0
    for doc in docs:
      np.testing.assert_allclose(
          nll[b, start : start + len(doc)],
          score_alone(model, params, doc),
          rtol=0,
          atol=1e-5,
          err_msg=f"row {b}, document {doc}",
      )
      start += len(doc)
  return nll, (inputs, targets)


@pytest.mark.parametrize(
    "attn_type,same_length,mem_len,clamp_len,pre_lnorm",
    [
        (0, True, 4, 0, False),
        (1, True, 4, 0, False),
        pytest.param(0, True, 4, 3, False, marks=SLOW),
        pytest.param(1, True, 4, 3, False, marks=SLOW),
        # Without same_length a query sees distances up to M + i: exact only when
        # the memory holds the longest document.
        (0, False, 12, 0, False),
        pytest.param(1, False, 12, 3, False, marks=SLOW),
        pytest.param(0, True, 4, 0, True, marks=SLOW),
    ],
)
def test_each_document_in_the_stream_scores_as_it_does_alone(
    attn_type, same_length, mem_len, clamp_len, pre_lnorm
):
  cfg = tiny_config(
      attn_type=attn_type,
      same_length=same_length,
      mem_len=mem_len,
      clamp_len=clamp_len,
      pre_lnorm=pre_lnorm,
  )
  model, params = init_model(cfg)
  docs = [make_documents(lengths, seed) for seed, lengths in enumerate(DOC_LENGTHS)]
  nll_1, (inputs, targets) = assert_stream_matches_alone(model, params, docs[:1])  # B = 1
  nll_2, _ = assert_stream_matches_alone(model, params, docs)  # B = 2
  np.testing.assert_allclose(nll_2[:1], nll_1, rtol=0, atol=1e-5)
  # Not vacuous: the same stream without doc_pos scores the later documents otherwise.
  plain = score_segments(model, params, inputs, targets)
  assert np.abs(plain - nll_1).max() > 1e-3


def recorded_probs(model, params, inputs_BxN, targets_BxN, doc_pos_BxN):
  """Per segment: {name: float32 [L, B, H, T, K]} of the recorded attention."""
  cfg = model.config
  step = segment_step(model, ("intermediates",))
  memory, out = memory_lib.init_memory(cfg, inputs_BxN.shape[0]), []
  for s in range(0, inputs_BxN.shape[1], cfg.tgt_len):
    seg = lambda a: None if a is None else jnp.asarray(a[:, s : s + cfg.tgt_len])
    (_, memory), inter = step(
        {"params": params}, seg(inputs_BxN), memory, seg(targets_BxN), seg(doc_pos_BxN)
    )
    out.append({k: np.asarray(v[0]) for k, v in inter["intermediates"]["layers"]["attn"].items()})
  return out


@pytest.mark.parametrize("attn_type", [2, pytest.param(3, marks=SLOW), pytest.param(0, marks=SLOW)])
def test_no_attention_to_another_document(attn_type):
  """Absolute positions (types 2, 3) are not those of a document alone, so
  the scores differ; but every query gives keys of another document
  (segment keys, and memory slots before its document's start) exactly 0."""
  cfg = tiny_config(attn_type=attn_type, same_length=False, mem_len=6)
  model, params = init_model(cfg, record_attention=True)
  t, m = cfg.tgt_len, cfg.mem_len
  docs = [make_documents(lengths, seed) for seed, lengths in enumerate(DOC_LENGTHS)]
  n_seg = max(-(-sum(map(len, d)) // t) for d in docs)
  inputs, targets, doc_pos = stream_arrays(docs, n_seg, t)
  dist_TxK = np.arange(t)[:, None] + m - np.arange(m + t)[None, :]
  with_docs = recorded_probs(model, params, inputs, targets, doc_pos)
  plain = recorded_probs(model, params, inputs, targets, None)
  leaked_without = 0.0
  for s, (probs, plain_probs) in enumerate(zip(with_docs, plain)):
    other_BxTxK = dist_TxK[None] > doc_pos[:, s * t : (s + 1) * t, None]
    other_1xBx1xTxK = other_BxTxK[None, :, None]
    for name, prob_LxBxHxTxK in probs.items():
      assert np.all(np.where(other_1xBx1xTxK, prob_LxBxHxTxK, 0.0) == 0.0), (s, name)
      np.testing.assert_allclose(prob_LxBxHxTxK.sum(-1), 1.0, rtol=0, atol=1e-5)
      leaked_without += np.where(other_1xBx1xTxK, plain_probs[name], 0.0).sum()
  assert leaked_without > 0.1  # not vacuous: without doc_pos those keys are attended


def test_no_doc_pos_and_an_inert_doc_pos_change_nothing():
  cfg = tiny_config(attn_type=0, same_length=False)
  model, params = init_model(cfg)
  rng = np.random.default_rng(3)
  tok = jnp.asarray(rng.integers(0, N_TOKEN, (2, cfg.tgt_len)), jnp.int32)
  memory = memory_lib.init_memory(cfg, 2).replace(
      mems_LxBxMxD=jnp.asarray(rng.normal(size=(2, 2, cfg.mem_len, cfg.d_model)), jnp.float32),
      mlen_B=jnp.array([cfg.mem_len, 2], jnp.int32),
  )
  apply = jax.jit(lambda *a, **kw: model.apply({"params": params}, *a, **kw))
  ref, ref_mem = apply(tok, memory, tok)
  for kw in (
      {"doc_pos_BxT": None},
      {"doc_pos_BxT": jnp.full(tok.shape, cfg.mem_len + cfg.tgt_len - 1, jnp.int32)},
      {"doc_pos_BxT": jnp.full(tok.shape, 10_000, jnp.int32)},
  ):
    nll, new_mem = apply(tok, memory, tok, **kw)
    np.testing.assert_array_equal(np.asarray(nll), np.asarray(ref))
    np.testing.assert_array_equal(
        np.asarray(new_mem.mems_LxBxMxD), np.asarray(ref_mem.mems_LxBxMxD)
    )
  # The mask term itself: inert at the largest distance, M + T - 1; active below.
  mlen_B = jnp.array([cfg.mem_len, 2])
  plain = attention_ops.attention_mask(cfg.tgt_len, cfg.mem_len, mlen_B, False)
  top = cfg.mem_len + cfg.tgt_len - 1
  inert = attention_ops.attention_mask(
      cfg.tgt_len, cfg.mem_len, mlen_B, False, jnp.full((2, cfg.tgt_len), top)
  )
  np.testing.assert_array_equal(inert, plain)
  below = attention_ops.attention_mask(
      cfg.tgt_len, cfg.mem_len, mlen_B, False, jnp.full((2, cfg.tgt_len), top - 1)
  )
  assert below.shape == (2, 1, cfg.tgt_len, top + 1)
  assert not np.array_equal(below, plain)


def test_attention_mask_with_doc_pos_by_a_loop():
  """Every entry against the rule written out: key j of query i of row b is
  allowed iff causal, a valid slot, same_length's bound, and i + M - j <= doc_pos[b, i]."""
  t, m = 4, 3
  mlen_B = np.array([3, 1])
  doc_pos_BxT = np.array([[5, 0, 1, 2], [0, 1, 0, 3]])
  for same_length in (False, True):
    mask = np.asarray(
        attention_ops.attention_mask(
            t, m, jnp.asarray(mlen_B), same_length, jnp.asarray(doc_pos_BxT)
        )
    )
    for b in range(2):
      for i in range(t):
        for j in range(m + t):
          d = i + m - j
          want = (
              d >= 0
              and j >= m - mlen_B[b]
              and (d < m or not same_length)
              and d <= doc_pos_BxT[b, i]
          )
          assert mask[b, 0, i, j] == want, (same_length, b, i, j)


@pytest.mark.parametrize("attn_type", [0, pytest.param(1, marks=SLOW)])
def test_blockwise_attention_honours_doc_pos(attn_type):
  full_cfg = tiny_config(attn_type=attn_type, same_length=False, mem_len=6)
  model_full, params = init_model(full_cfg)
  model_blocks = models.TransformerXL(
      tiny_config(attn_type=attn_type, same_length=False, mem_len=6, attn_block=2)
  )
  assert attention_ops.query_blocks(5, 11, 2) == [(0, 2, 8), (2, 4, 10), (4, 5, 11)]
  docs = [make_documents(lengths, seed) for seed, lengths in enumerate(DOC_LENGTHS)]
  n_seg = max(-(-sum(map(len, d)) // full_cfg.tgt_len) for d in docs)
  inputs, targets, doc_pos = stream_arrays(docs, n_seg, full_cfg.tgt_len)
  full = score_segments(model_full, params, inputs, targets, doc_pos)
  blocks = score_segments(model_blocks, params, inputs, targets, doc_pos)
  np.testing.assert_allclose(blocks, full, rtol=0, atol=1e-6)
  assert np.abs(full - score_segments(model_full, params, inputs, targets)).max() > 1e-3


def test_train_and_eval_steps_pass_doc_pos():
  """The train step (dropout 0, micro-batches, 8 devices) reports the mean NLL
  that the model gives with doc_pos; so does the eval step."""
  config = default_config.get_config()
  config.model.update(
      n_layer=2,
      d_model=16,
      n_head=2,
      d_head=8,
      d_inner=32,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=5,
      mem_len=4,
      same_length=True,
      init_std=0.3,
  )
  config.train.update(
      global_batch=8, num_steps=10, warmup_steps=2, learning_rate=1e-3, batch_chunk=2
  )
  mcfg = default_config.model_config(config, N_TOKEN)
  model = models.TransformerXL(mcfg)
  tx = train_state.make_optimizer(config.train)
  mesh = sharding.make_mesh((4, 2), ("data", "model"))
  _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
  state = train_state.create_train_state(model, tx, 8, mesh, jax.random.PRNGKey(0), shardings)
  params = jax.device_get(nn.unbox(state.params))

  lengths = [[3, 2, 4, 1, 6], [1, 1, 8, 2], [5, 5, 2], [2, 2, 2, 2, 2, 2]] * 2
  docs = [make_documents(row, seed) for seed, row in enumerate(lengths)]
  inputs, targets, doc_pos = stream_arrays(docs, 4, mcfg.tgt_len)[:, :, : mcfg.tgt_len]
  weights = (np.arange(mcfg.tgt_len) < 4).astype(np.float32)[None].repeat(8, 0)
  host = {
      "inputs": inputs,
      "targets": targets,
      "weights": weights,
      "reset": np.ones((8,), bool),
      "doc_pos": doc_pos,
  }
  batch = data.to_global_batch(host, sharding.batch_sharding(mesh), 8)

  nll = np.asarray(
      model.apply(
          {"params": params},
          jnp.asarray(inputs),
          memory_lib.init_memory(mcfg, 8),
          jnp.asarray(targets),
          doc_pos_BxT=jnp.asarray(doc_pos),
      )[0]
  )
  plain = np.asarray(
      model.apply(
          {"params": params},
          jnp.asarray(inputs),
          memory_lib.init_memory(mcfg, 8),
          jnp.asarray(targets),
      )[0]
  )
  want = (nll * weights).sum() / weights.sum()
  assert abs(want - (plain * weights).sum() / weights.sum()) > 1e-4  # doc_pos matters here

  step_fn = train_step.make_train_step(model, tx, mesh, shardings, config.train.batch_chunk, 7)
  _, step_metrics = step_fn(state, batch)
  np.testing.assert_allclose(float(step_metrics["loss"]), want, rtol=1e-5)

  eval_step = eval_steps.make_eval_step(model, mesh)
  eval_batch = {k: v for k, v in batch.items() if k != "weights"}
  memory = jax.device_put(memory_lib.init_memory(mcfg, 8), memory_lib.shardings(mcfg, mesh))
  eval_nll, _ = eval_step(params, memory, eval_batch)
  np.testing.assert_allclose(np.asarray(eval_nll), nll, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attn_type", [0, pytest.param(1, marks=SLOW)])
def test_the_evaluator_scores_each_document_of_a_split_as_alone(attn_type):
  """End to end: a split of packed documents through data.EvalIterator (rows
  start at documents) and the Evaluator with data.documents="reset", on a
  4 x 2 mesh with the rows padded (3 rows to 4): every token's NLL equals the
  document's scoring alone (Evaluator.score of [SEP] + document), to 1e-5."""
  config = default_config.get_config()
  config.model.update(
      n_layer=2,
      d_model=16,
      n_head=2,
      d_head=8,
      d_inner=32,
      dropout=0.0,
      dropatt=0.0,
      tgt_len=5,
      mem_len=4,
      init_std=0.3,
      attn_type=attn_type,
      clamp_len=3,
  )
  config.eval.update(tgt_len=4, mem_len=6, clamp_len=3, same_length=True, global_batch=3)
  config.data.documents = "reset"
  config.mesh.shape = (4, 2)
  mcfg = default_config.model_config(config, N_TOKEN)
  params = init_model(mcfg)[1]
  lengths = [2, 3, 7, 12, 1, 9, 5, 1, 4, 10, 3, 6]
  docs = make_documents(lengths, seed=3)
  stream = np.asarray([t for d in docs for t in d], np.int32)
  corpus = data.Corpus(
      name="text",
      unit="word",
      vocab=[str(i) for i in range(N_TOKEN)],
      boundary_id=SEP,
      splits={"valid": data.ArraySource(stream)},
      documents={"valid": data.ArraySentenceIndex(data.sentence_offsets(np.asarray(lengths)))},
  )
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  evaluator = evaluate.Evaluator(config, mcfg, corpus, mesh)
  nll = np.full(len(stream), np.nan)
  for nll_BxT, weights_BxT, pairs in evaluator._scored_batches(params, "valid"):  # pylint: disable=protected-access
    p, w = pairs(), np.asarray(weights_BxT)
    nll[p[w > 0]] = np.asarray(nll_BxT)[w > 0]
  assert not np.isnan(nll).any()
  start = 0
  for doc in docs:
    alone = evaluator.score(params, np.asarray([[SEP] + doc], np.int32))[0]
    np.testing.assert_allclose(nll[start : start + len(doc)], alone, rtol=0, atol=1e-5)
    start += len(doc)
  stream_config = config.copy_and_resolve_references()
  stream_config.data.documents = "stream"
  plain = evaluate.Evaluator(stream_config, mcfg, corpus, mesh).evaluate(params, "valid")
  assert abs(plain["loss_nats"] - np.mean(nll)) > 1e-3  # the documents matter here
