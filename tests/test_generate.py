"""Generation with the cached memory: exactness against re-scoring, sampling, compilation."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl import default_config, sharding
from transformer_xl.inference import eval_steps, evaluate, generate, sampling
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models

V = 48  # vocabulary
PROMPT = 23  # prompt tokens: 4 segments of tgt_len 5 and 3 single steps
NEW = 10  # generated tokens: more than the memory of 7, which rolls over


def tiny(same_length=True, clamp_len=0, attn_type=0):
  """(config, training ModelConfig, eval ModelConfig, params) of a random tiny model whose
  distributions are peaked enough (init_std 0.5) for greedy decoding to vary with the context."""
  c = default_config.get_config()
  c.model.update(
      n_layer=2,
      d_model=16,
      n_head=2,
      d_head=8,
      d_inner=32,
      dropout=0.0,
      tgt_len=6,
      mem_len=6,
      init_std=0.5,
      attn_type=attn_type,
  )
  c.eval.update(tgt_len=5, mem_len=7, clamp_len=clamp_len, same_length=same_length, global_batch=V)
  mcfg = default_config.model_config(c, V)
  params = nn.unbox(models.init_params(models.TransformerXL(mcfg), jax.random.PRNGKey(0)))
  return c, mcfg, eval_steps.eval_model_config(c, mcfg), params


@pytest.fixture(scope="module")
def mesh():
  return sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def model(mesh):
  c, mcfg, ecfg, params = tiny()
  return c, mcfg, params, generate.Generator(ecfg, mesh)


def prompt(b=1, n=PROMPT, seed=0):
  return np.random.default_rng(seed).integers(0, V, size=(b, n)).astype(np.int32)


def greedy(gen, params, prompt_1xN, num_tokens=NEW):
  steps = list(
      gen.stream(params, prompt_1xN, num_tokens, sampling.SamplingSettings(top_k=1), log_probs=True)
  )
  return np.array([t[0] for t, _ in steps]), np.stack([lp[0] for _, lp in steps])


@pytest.mark.smoke
def test_greedy_equals_rescoring_the_growing_context_with_the_evaluator(model, mesh):
  """same_length: each step's token is the argmax of the next-token distribution that
  Evaluator.score gives the whole growing context, re-scored from scratch in segments of
  the eval tgt_len (every candidate next token as one row: argmin of its NLL)."""
  c, mcfg, params, gen = model
  p = prompt()
  tokens, logp_NxV = greedy(gen, params, p)
  assert len(set(tokens.tolist())) > 2  # not a constant sequence
  ev = evaluate.Evaluator(c, mcfg, None, mesh)
  for k in range(NEW):
    context = np.concatenate([p[0], tokens[:k]])
    rows_VxT1 = np.concatenate([np.tile(context, (V, 1)), np.arange(V)[:, None]], axis=1)
    nll_V = ev.score(params, rows_VxT1)[:, -1]
    assert int(np.argmin(nll_V)) == tokens[k], k
    np.testing.assert_allclose(-nll_V, logp_NxV[k], atol=2e-5)


@pytest.mark.parametrize("attn_type, clamp_len", [(0, 0), (0, 3), (1, 0)])
def test_score_gives_sampled_tokens_the_distributions_they_were_drawn_from(
    mesh, attn_type, clamp_len
):
  """same_length: prompts of 3, 23 and 9 tokens in one batch, 12 tokens sampled (top_k 0)
  with the decoding cache in chunks of 4; Evaluator.score (what --mode=score runs) over each
  row's prompt + its tokens, read from the start in segments, gives every sampled token the
  log-probability of the distribution it was drawn from."""
  c, mcfg, ecfg, params = tiny(same_length=True, clamp_len=clamp_len, attn_type=attn_type)
  gen = generate.Generator(ecfg, mesh, chunk=4)
  assert gen.use_cache
  rows = [prompt(n=n, seed=n)[0] for n in (3, PROMPT, 9)]
  steps = list(
      gen.stream(
          params, rows, 12, sampling.SamplingSettings(top_k=0), seed=[1, 2, 3], log_probs=True
      )
  )
  ev = evaluate.Evaluator(c, mcfg, None, mesh)
  for b, row in enumerate(rows):
    tokens = np.array([t[b] for t, _ in steps])
    drawn = np.array([lp[b, t[b]] for t, lp in steps])
    assert len(set(tokens.tolist())) > 3
    nll = ev.score(params, np.concatenate([row, tokens])[None].astype(np.int32))[0]
    np.testing.assert_allclose(-nll[len(row) - 1 :], drawn, atol=2e-5)


@pytest.mark.parametrize(
    "same_length, clamp_len, attn_type, n_prompt",
    [
        pytest.param(
            True,
            3,
            1,
            PROMPT,  # Shaw et al.'s learned relative positions, clamped
            marks=pytest.mark.slow,
        ),
        (False, 0, 0, 4),  # no same_length: every position of the context sees M + 1 keys
    ],
)
def test_greedy_equals_one_pass_over_the_growing_context(
    mesh, same_length, clamp_len, attn_type, n_prompt
):
  """Each step re-runs the whole growing context from scratch in one segment, with no
  memory and the same attention window: the last M keys with same_length (M - 1 before
  the query and itself), the last M + 1 without (as a same_length model with M + 1 slots;
  the prompt is shorter than tgt_len, so it is read one token at a time too)."""
  c, mcfg, ecfg, params = tiny(same_length, clamp_len, attn_type)
  gen = generate.Generator(ecfg, mesh)
  p = prompt(n=n_prompt)
  tokens, logp_NxV = greedy(gen, params, p)
  assert len(set(tokens.tolist())) > 2
  window = ecfg.mem_len if same_length else ecfg.mem_len + 1
  ref_cfg = dataclasses.replace(ecfg, mem_len=window, same_length=True)
  ref = models.TransformerXL(ref_cfg)
  length = n_prompt + NEW  # padded on the right: causality keeps earlier positions exact
  one_pass = jax.jit(
      lambda x: ref.apply({"params": params}, x, memory_lib.init_memory(ref_cfg, 1))[0][0]
  )
  for k in range(NEW):
    context = np.concatenate([p[0], tokens[:k]])
    padded = np.zeros((1, length), np.int32)
    padded[0, : len(context)] = context
    logp_V = np.asarray(one_pass(padded))[len(context) - 1]
    assert int(np.argmax(logp_V)) == tokens[k], k
    np.testing.assert_allclose(logp_V, logp_NxV[k], atol=2e-5)


@pytest.mark.slow
def test_greedy_without_same_length_equals_segments_then_single_tokens(mesh):
  """No same_length, a prompt of a remainder and full segments: re-computed from scratch at
  every step with plain model calls, the prompt's first PROMPT % tgt_len tokens as one short
  segment, then its full segments of tgt_len (as Evaluator.score reads them), and every
  later token alone against the memory."""
  c, mcfg, ecfg, params = tiny(same_length=False)
  gen = generate.Generator(ecfg, mesh)
  p = prompt()
  tokens, logp_NxV = greedy(gen, params, p)
  model = models.TransformerXL(ecfg)
  apply = jax.jit(lambda x, m: model.apply({"params": params}, x, m))
  t = ecfg.tgt_len
  for k in range(NEW):
    context = np.concatenate([p[0], tokens[:k]])[None, :]
    memory = memory_lib.init_memory(ecfg, 1)
    r = PROMPT % t
    assert r > 0
    logp, memory = apply(context[:, :r], memory)
    for s in range(r, PROMPT, t):
      logp, memory = apply(context[:, s : s + t], memory)
    for j in range(PROMPT, context.shape[1]):
      logp, memory = apply(context[:, j : j + 1], memory)
    logp_V = np.asarray(logp)[0, -1]
    assert int(np.argmax(logp_V)) == tokens[k], k
    np.testing.assert_allclose(logp_V, logp_NxV[k], atol=2e-5)


@pytest.mark.smoke
def test_sampling_is_reproducible_with_a_seed(model):
  _, _, params, gen = model
  s = sampling.SamplingSettings(top_k=0, temperature=1.5)
  p = prompt(b=3)
  a = gen.generate(params, p, 12, s, seed=1)
  assert a.shape == (3, 12) and a.dtype == np.int32
  np.testing.assert_array_equal(gen.generate(params, p, 12, s, seed=1), a)
  assert not np.array_equal(gen.generate(params, p, 12, s, seed=2), a)
  assert not np.array_equal(a[0], a[1])  # the rows of a batch are different draws


@pytest.mark.parametrize(
    "attn_type, same_length, clamp_len, pre_lnorm, n_prompt",
    [
        (0, True, 0, False, 4),  # a prompt shorter than mem_len (7): one padded segment
        (0, False, 3, True, PROMPT),  # longer: 5 segments of 5, the first one padded
        (1, True, 2, False, PROMPT),
        (1, False, 0, True, 4),
        pytest.param(0, True, 4, True, 10, marks=pytest.mark.smoke),  # 2 segments, no padding
    ],
)
def test_the_decoding_cache_gives_the_uncached_distributions(
    mesh, attn_type, same_length, clamp_len, pre_lnorm, n_prompt
):
  """Sampled (top_k 0, temperature 1.3) with the decoding cache and the on-device chunks
  (of 3 tokens, so that passes cross chunk boundaries) and without them (every token
  projects the memory again): the same tokens, each drawn from the same distribution."""
  c, mcfg, ecfg, params = tiny(same_length, clamp_len, attn_type)
  ecfg = dataclasses.replace(ecfg, pre_lnorm=pre_lnorm)
  settings = sampling.SamplingSettings(top_k=0, temperature=1.3)
  runs = {}
  for use_cache in (True, False):
    gen = generate.Generator(ecfg, mesh, use_cache=use_cache, chunk=3)
    assert gen.use_cache == use_cache
    steps = list(
        gen.stream(params, prompt(b=3, n=n_prompt), 2 * NEW, settings, seed=5, log_probs=True)
    )
    runs[use_cache] = (np.stack([t for t, _ in steps]), np.stack([lp for _, lp in steps]))
  (cached, logp_cached), (plain, logp_plain) = runs[True], runs[False]
  assert cached.shape == (2 * NEW, 3) and len(set(cached.ravel().tolist())) > 3
  np.testing.assert_array_equal(cached, plain)
  np.testing.assert_allclose(logp_cached, logp_plain, atol=1e-5)


@pytest.mark.parametrize("same_length, attn_type", [(True, 0), (False, 0), (False, 1)])
def test_rows_of_different_lengths_get_what_they_get_alone(mesh, same_length, attn_type):
  """Prompts of 3, 23, 9 and 1 tokens in one batch, one seed per row (padded in front to
  25, the masked padding longer than a segment for three rows), and each alone with its
  row's seed: the same tokens from the same distributions (sampled, top_k 0)."""
  _, _, ecfg, params = tiny(same_length=same_length, attn_type=attn_type)
  gen = generate.Generator(ecfg, mesh, chunk=4)
  rows = [prompt(n=n, seed=n)[0] for n in (3, PROMPT, 9, 1)]
  settings = sampling.SamplingSettings(top_k=0)
  batched = list(gen.stream(params, rows, NEW, settings, seed=[7, 8, 9, 10], log_probs=True))
  tokens_BxN = np.stack([t for t, _ in batched], axis=1)
  logp_BxNxV = np.stack([lp for _, lp in batched], axis=1)
  assert len(set(tokens_BxN.ravel().tolist())) > 4
  for b, row in enumerate(rows):
    alone = list(gen.stream(params, [row], NEW, settings, seed=7 + b, log_probs=True))
    np.testing.assert_array_equal(np.stack([t[0] for t, _ in alone]), tokens_BxN[b])
    np.testing.assert_allclose(np.stack([lp[0] for _, lp in alone]), logp_BxNxV[b], atol=1e-5)


def stopped(tokens_BxN, stop):
  """What each row of an unstopped run becomes when ``stop`` ends it: its tokens up to and
  including the first ``stop``, then -1; only as many steps as the longest row needs."""
  out = np.full_like(tokens_BxN, -1)
  ends = []
  for b, row in enumerate(tokens_BxN):
    hits = np.flatnonzero(row == stop)
    end = hits[0] + 1 if hits.size else len(row)
    out[b, :end] = row[:end]
    ends.append(end)
  return out[:, : max(ends)], ends


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_row_ends_at_its_stop_token_and_the_batch_when_all_have(mesh, use_cache):
  """Four rows sampled (top_k 0) with stop_tokens=[s]: each row's tokens are those of the
  run without stops up to and including its first s (its later steps -1, marked done in
  done_B), the rows' ends fall inside different chunks of 4, and the stream ends with the
  last row to stop; a token no row draws changes nothing."""
  _, _, ecfg, params = tiny()
  gen = generate.Generator(ecfg, mesh, use_cache=use_cache, chunk=4)
  rows = [prompt(n=n, seed=n)[0] for n in (3, PROMPT, 9, 1)]
  settings, num = sampling.SamplingSettings(top_k=0), 40
  free_BxN = np.stack(list(gen.stream(params, rows, num, settings, seed=3)), axis=1)
  counts = np.bincount(free_BxN.ravel(), minlength=V)
  # a token every row draws, late enough in some row that the rows end apart
  firsts = {
      s: [np.flatnonzero(r == s)[0] for r in free_BxN]
      for s in np.flatnonzero(counts)
      if all((r == s).any() for r in free_BxN)
  }
  stop = max(firsts, key=lambda s: max(firsts[s]) - min(firsts[s]))
  want_BxN, ends = stopped(free_BxN, stop)
  assert len(set(ends)) > 1 and max(ends) < num, ends
  done_B = np.zeros(4, bool)
  got = list(gen.stream(params, rows, num, settings, seed=3, stop_tokens=[stop], done_B=done_B))
  np.testing.assert_array_equal(np.stack(got, axis=1), want_BxN)
  assert done_B.all()
  never = int(np.flatnonzero(counts == 0)[0])
  np.testing.assert_array_equal(
      np.stack(list(gen.stream(params, rows, num, settings, seed=3, stop_tokens=[never])), axis=1),
      free_BxN,
  )


@pytest.mark.parametrize("use_cache", [True, False])
def test_rows_the_caller_ends_yield_nothing_more(mesh, use_cache):
  """The caller marks row 1 done after step 5 and row 0 after step 12 (e.g. at a stop
  string): from then on they yield -1, the other rows are unchanged, and the stream ends
  when the last row is marked."""
  _, _, ecfg, params = tiny()
  gen = generate.Generator(ecfg, mesh, use_cache=use_cache, chunk=4)
  p = prompt(b=2, n=9)
  settings = sampling.SamplingSettings(top_k=0)
  free_BxN = np.stack(list(gen.stream(params, p, 30, settings, seed=1)), axis=1)
  done_B, got = np.zeros(2, bool), []
  for i, token_B in enumerate(gen.stream(params, p, 30, settings, seed=1, done_B=done_B)):
    got.append(token_B)
    if i == 5:
      done_B[1] = True
    if i == 12:
      done_B[0] = True
  got_BxN = np.stack(got, axis=1)
  assert got_BxN.shape == (2, 13)
  np.testing.assert_array_equal(got_BxN[0], free_BxN[0, :13])
  np.testing.assert_array_equal(got_BxN[1], np.r_[free_BxN[1, :6], [-1] * 7])


@pytest.mark.parametrize("compact", [True, False])
def test_rows_left_alone_go_on_as_in_the_whole_batch(mesh, compact):
  """Eight rows; the caller ends six after step 3: with compact the two live rows continue
  as a batch of 2 (chunk_step compiled for 8 and for 2), without it in the batch of 8; either
  way every row's tokens and distributions are those of the run where none ends, -1 after."""
  _, _, ecfg, params = tiny()
  gen = generate.Generator(ecfg, mesh, chunk=3, compact=compact)
  rows = [prompt(n=n, seed=n)[0] for n in (3, PROMPT, 9, 1, 4, 11, 2, 7)]
  settings = sampling.SamplingSettings(top_k=0)
  free = list(gen.stream(params, rows, 24, settings, seed=4, log_probs=True))
  free_BxN = np.stack([t for t, _ in free], axis=1)
  done_B, got = np.zeros(8, bool), []
  for i, (token_B, logp_BxV) in enumerate(
      gen.stream(params, rows, 24, settings, seed=4, log_probs=True, done_B=done_B)
  ):
    got.append((token_B, logp_BxV))
    if i == 3:
      done_B[[0, 1, 3, 4, 6, 7]] = True
  got_BxN = np.stack([t for t, _ in got], axis=1)
  assert got_BxN.shape == (8, 24)
  live = [2, 5]
  np.testing.assert_array_equal(got_BxN[live], free_BxN[live])
  np.testing.assert_array_equal(got_BxN[[0, 1, 3, 4, 6, 7], 4:], -1)
  np.testing.assert_array_equal(got_BxN[:, :4], free_BxN[:, :4])
  np.testing.assert_allclose(
      np.stack([lp[live] for _, lp in got]), np.stack([lp[live] for _, lp in free]), atol=1e-5
  )
  assert gen.chunk_step._cache_size() == (2 if compact else 1)


def test_bad_stop_settings_fail_before_compiling(model):
  _, _, params, gen = model
  with pytest.raises(ValueError, match="stop_tokens"):
    next(gen.stream(params, prompt(), 3, stop_tokens=[V]))
  with pytest.raises(ValueError, match="done_B"):
    next(gen.stream(params, prompt(b=2), 3, done_B=np.zeros(3, bool)))


def test_absolute_attention_types_generate_without_the_cache(mesh):
  """attn_type 2 and 3 have no decoding cache (a cached state carries the absolute
  position of an earlier window): the generator falls back to one step per token."""
  for attn_type in (2, 3):
    _, _, ecfg, params = tiny(attn_type=attn_type)
    gen = generate.Generator(ecfg, mesh)
    assert not gen.use_cache
    assert gen.generate(params, prompt(n=6), 4).shape == (1, 4)


@pytest.mark.parametrize("use_cache", [True, False])
def test_the_per_token_steps_compile_once(mesh, use_cache):
  """One compilation per batch size, whatever the prompt length, settings, seed or
  number of tokens (chunks of every length included)."""
  _, _, ecfg, params = tiny()
  gen = generate.Generator(ecfg, mesh, use_cache=use_cache, chunk=8)
  for n, settings, seed, num in [
      (PROMPT, sampling.SamplingSettings(), 0, 9),
      (7, sampling.SamplingSettings(top_k=1), 1, 3),
      (15, sampling.SamplingSettings(0, 0.7, 0.5), 2, 20),
      (2, sampling.SamplingSettings(5, 1.0, 2.0), 3, 1),
  ]:
    gen.generate(params, prompt(b=2, n=n), num, settings, seed)
  steps = {"token": gen.token_step, "start": gen.start_step, "chunk": gen.chunk_step}
  used = {"start", "chunk"} if use_cache else {"token"}
  assert {k: f._cache_size() for k, f in steps.items()} == {k: int(k in used) for k in steps}
  assert gen.segment_step._cache_size() == 1


# -- the sampling rule on constructed distributions ------------------------------------------

PROBS = np.array([0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.03, 0.02])
ORDER = np.array([5, 2, 7, 0, 3, 6, 1, 4])  # token ORDER[r] has the r-th largest probability
N_DRAWS = 20000


def draws(top_k, top_p, temperature, seed=0):
  logp_V = np.zeros(len(PROBS), np.float32)
  logp_V[ORDER] = np.log(PROBS)
  logits = jnp.asarray(np.tile(logp_V, (N_DRAWS, 1)))
  fn = jax.jit(sampling.sample_tokens)
  out = np.asarray(
      fn(
          jax.random.split(jax.random.PRNGKey(seed), N_DRAWS),
          logits,
          np.int32(top_k),
          np.float32(top_p),
          np.float32(temperature),
      )
  )
  return np.bincount(out, minlength=len(PROBS)) / N_DRAWS


@pytest.mark.parametrize(
    "top_k, top_p, temperature, support",
    [
        (3, 1.0, 1.0, 3),  # top-k
        (0, 0.55, 1.0, 3),  # 0.3 + 0.2 < 0.55 <= 0.3 + 0.2 + 0.15
        (0, 0.25, 1.0, 1),  # the most probable token alone reaches 0.25
        (4, 0.8, 1.0, 3),  # top-p over the renormalised top-4: 0.65 / 0.77 = 0.84 >= 0.8
        (0, 1.0, 0.5, 8),  # temperature: p^2, renormalised
        (1, 1.0, 3.0, 1),  # greedy whatever the temperature
    ],
)
def test_top_k_and_top_p_restrict_the_support_and_cover_it(top_k, top_p, temperature, support):
  freq = draws(top_k, top_p, temperature)
  inside = ORDER[:support]
  assert freq[ORDER[support:]].sum() == 0  # never outside the set
  assert np.all(freq[inside] > 0)  # every member drawn
  want = PROBS[:support] ** (1.0 / temperature)
  np.testing.assert_allclose(freq[inside], want / want.sum(), atol=0.015)


@pytest.mark.smoke
def test_filter_logits_marks_the_support():
  logits = jnp.asarray([[0.0, 3.0, 1.0, 2.0], [4.0, 3.0, 2.0, 1.0]])
  out = np.asarray(sampling.filter_logits(logits, 2, 1.0, 2.0))
  np.testing.assert_array_equal(np.isfinite(out), [[0, 1, 0, 1], [1, 1, 0, 0]])
  np.testing.assert_allclose(out[0, 1], 1.5)  # divided by the temperature


def naive_support(x_V: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
  """The kept tokens by the rule's definition: the whole vocabulary sorted."""
  order = np.argsort(-x_V, kind="stable")
  k = top_k if 0 < top_k <= len(x_V) else len(x_V)
  top = x_V[order[:k]]
  p = np.exp(top - top.max())
  p /= p.sum()
  n_keep = max(int(np.sum((np.cumsum(p) - p < top_p) | (top_p >= 1.0))), 1)
  return x_V >= top[n_keep - 1]


@pytest.mark.parametrize(
    "top_k", [0, 1, 7, sampling.TOP_K_FAST, sampling.TOP_K_FAST + 1, 300, 5000]
)
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.3])
def test_filter_logits_keeps_the_support_of_the_whole_sorted_vocabulary(top_k, top_p):
  """Whichever way the cut is found (lax.top_k for a small top_k, the sorted vocabulary
  otherwise, none when nothing is cut): the support of its definition, ties included."""
  rng = np.random.default_rng(top_k)
  x_BxV = rng.normal(0, 2, (3, 300)).astype(np.float32)
  x_BxV[1, :40] = x_BxV[1, 0]  # a run of ties across the cut
  out = np.asarray(
      jax.jit(sampling.filter_logits)(x_BxV, np.int32(top_k), np.float32(top_p), np.float32(1.0))
  )
  for b in range(3):
    np.testing.assert_array_equal(np.isfinite(out[b]), naive_support(x_BxV[b], top_k, top_p))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(top_k=-1), "top_k=-1"),
        (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
        (dict(top_p=1.5), "top_p=1.5"),
        (dict(temperature=0.0), "temperature=0.0 must be > 0"),
        # Non-finite: inf would tie every logit (top_k ignored, a uniform draw).
        (dict(temperature=float("inf")), "temperature=inf must be > 0 and finite"),
        (dict(temperature=float("nan")), "temperature=nan must be > 0 and finite"),
        (dict(temperature=1e39), "must be > 0 and finite"),  # inf as a float32
        (dict(top_p=float("nan")), r"top_p=nan must be in \(0, 1\]"),
        (dict(top_p=float("inf")), r"top_p=inf must be in \(0, 1\]"),
        (dict(top_k=float("inf")), "top_k=inf must be an integer"),
    ],
)
def test_bad_settings_are_config_errors(kwargs, match):
  with pytest.raises(default_config.ConfigError, match=match):
    sampling.SamplingSettings(**kwargs)


@pytest.mark.smoke
def test_bad_prompts_fail_before_compiling(model):
  _, _, params, gen = model
  before = gen.token_step._cache_size()
  with pytest.raises(ValueError, match=r"prompt 0 must be a non-empty 1-D array"):
    next(gen.stream(params, np.zeros((1, 0), np.int32), 3))
  with pytest.raises(ValueError, match=r"give one seed or 2 seeds"):
    next(gen.stream(params, [prompt()[0], prompt()[0, :4]], 3, seed=[1, 2, 3]))
  with pytest.raises(ValueError, match=rf"\[0, {V}\)"):
    next(gen.stream(params, np.full((1, 3), V), 3))
  with pytest.raises(default_config.ConfigError, match="num_tokens=0"):
    next(gen.stream(params, prompt(), 0))
  assert gen.token_step._cache_size() == before


def test_rows_generated_in_batches_get_the_tokens_of_one_batch(model):
  """first_row: rows 2.. streamed alone as rows 2.. of the call (an int seed) get the
  tokens they get in the whole batch."""
  _, _, params, gen = model
  rows = [prompt(seed=s)[0, : 3 + 4 * s] for s in range(5)]
  settings = sampling.SamplingSettings(top_k=0)
  whole = gen.generate(params, rows, 6, settings, seed=7)
  head = np.stack(list(gen.stream(params, rows[:2], 6, settings, seed=7)), axis=1)
  tail = np.stack(list(gen.stream(params, rows[2:], 6, settings, seed=7, first_row=2)), axis=1)
  np.testing.assert_array_equal(np.concatenate([head, tail]), whole)
  unshifted = np.stack(list(gen.stream(params, rows[2:], 6, settings, seed=7)), axis=1)
  assert not np.array_equal(unshifted, tail)  # the offset matters
