"""Sampling with the cached memory (Dai et al. 2019, Sec. 3.2 and Appendix E).

``Generator`` continues token-id prompts: the prompt fills the evaluation
model's memory segment by segment, then every new token is one forward pass
of length 1 against the cached memory (and, for attn_type 0 and 1, a
decoding cache of the memory's keys and values), sampled on the device
``chunk`` tokens per compiled loop.  The sampling rule (temperature,
top-k, top-p) is ``sampling.py``'s.  Text in and out, and the workdir,
are ``language_model.py``'s.

How the prompt is read, what the cache holds, when rows end and what
context each new token sees: docs/guide/generation.md ("How generation
works" in the documentation site).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from transformer_xl import default_config, sharding
from transformer_xl.inference import sampling
from transformer_xl.model import attention, models
from transformer_xl.model import memory as memory_lib

Array = jax.Array


class Generator:
  """Continues token-id prompts with a model and its cached memory.

  See the module docstring for how the prompt is read and what context each
  new token has.  The jitted steps (each compiled once per batch size):
  ``segment_step`` (the prompt's segments of tgt_len), ``token_step`` (one
  token, the memory projected again: attn_type 2 and 3, or ``use_cache``
  off) and, with the decoding cache (attn_type 0 and 1), ``start_step``
  (one token; projects the memory once into the cache) and ``chunk_step``
  (up to ``chunk`` tokens in one ``lax.fori_loop`` on the device: each pass
  reads the cached keys and values of the memory, samples the next token
  and feeds it back, so no token makes a round trip to the host).  Rows are replicated over the mesh (every
  device holds all B samples); parameters keep their shardings.

  Args:
    model_cfg: the evaluation ModelConfig (``eval_steps.eval_model_config``):
      tgt_len is the prompt's segment length, mem_len M the memory,
      clamp_len and same_length as in evaluation.
    mesh: the device mesh the parameters live on.
    use_cache: decode with the cache where the attention type has one
      (``models.TransformerXL.decode``; the same distributions, tested);
      False: every token projects the memory again (``token_step``).
    chunk: tokens per ``chunk_step`` (the streaming granularity).
    compact: with the cache, when rows have ended (stop conditions,
      ``stream``) and at most a quarter of the batch is still live with
      more than a chunk to go, continue with the live rows only, padded to
      a power of 2 (``take_rows``; a compilation of ``chunk_step`` per
      such size, made once); False: ended rows keep their place.

  Raises:
    default_config.ConfigError: mem_len < 1 (no memory: each token would
      see only itself), or chunk < 1.
  """

  def __init__(
      self,
      model_cfg: models.ModelConfig,
      mesh: Mesh,
      use_cache: bool = True,
      chunk: int = 32,
      compact: bool = True,
  ):
    if model_cfg.mem_len < 1:
      raise default_config.ConfigError(
          f"generation needs a memory: eval.mem_len={model_cfg.mem_len} must be >= 1."
      )
    if chunk < 1:
      raise default_config.ConfigError(f"chunk={chunk} must be >= 1.")
    self.cfg = model_cfg
    self.model = models.TransformerXL(model_cfg)
    # The cache needs an attention type that has one (0, 1) and a memory that
    # it can carry (``memory.Plan.decode_cache``): otherwise every token
    # projects the memory again (``token_step``).
    self.memory_plan = memory_lib.plan(model_cfg)
    self.use_cache = (
        bool(use_cache)
        and attention.variant(model_cfg).DECODE_CACHE
        and self.memory_plan.decode_cache
    )
    self.chunk = int(chunk)
    self.compact = bool(compact)
    self._replicated = sharding.replicated(mesh)
    rep = self._replicated
    jit = lambda fn: jax.jit(
        sharding.traced_with_mesh(fn, mesh),
        in_shardings=(None,) + (rep,) * 7,
        out_shardings=(rep, rep, rep),
        donate_argnums=(1,),
    )
    self.segment_step = jit(self._step)  # tokens [B, tgt_len]
    self.token_step = jit(
        lambda params, memory, tokens_B, *rest: self._step(params, memory, tokens_B[:, None], *rest)
    )  # tokens [B]
    self.start_step = jax.jit(
        sharding.traced_with_mesh(self._start, mesh),
        in_shardings=(None,) + (rep,) * 7,
        out_shardings=(rep,) * 4,
        donate_argnums=(1,),
    )
    self.partial_step = jax.jit(  # whole segments only: an open segment, the memory kept
        sharding.traced_with_mesh(self._partial, mesh),
        in_shardings=(None,) + (rep,) * 8,
        out_shardings=(rep, rep),
    )
    self.take_rows = jax.jit(self._take, in_shardings=(rep,) * 6, out_shardings=(rep,) * 5)
    self.chunk_step = jax.jit(
        sharding.traced_with_mesh(self._chunk, mesh),
        in_shardings=(None,) + (rep,) * 11,
        out_shardings=(rep,) * 6,
        donate_argnums=(1, 2),
        static_argnums=(12,),
    )

  def _next(
      self,
      params: Any,
      hidden_BxTxD: Array,
      key: Array,
      index: Array,
      top_k: Array,
      top_p: Array,
      temperature: Array,
  ) -> tuple[Array, Array]:
    """(the token after the last position, row b drawn with ``fold_in(keys[b],
    index)``; the log-probabilities it was drawn from, float32 [B, V], nats).
    ``key`` holds the rows' keys, [B, 2]."""
    logp_BxV = self.model.apply(
        {"params": params}, hidden_BxTxD[:, -1:], method=models.TransformerXL.log_probs
    )[:, 0]
    keys_B = jax.vmap(jax.random.fold_in, in_axes=(0, None))(key, index)
    next_B = sampling.sample_tokens(keys_B, logp_BxV, top_k, top_p, temperature)
    return next_B, logp_BxV

  def _step(
      self,
      params: Any,
      memory: memory_lib.Memory,
      tokens_BxT: Array,
      key: Array,
      index: Array,
      top_k: Array,
      top_p: Array,
      temperature: Array,
  ):
    """One pass over a segment; samples the token after its last position.

    Returns:
      (next_B int32, log_probs_BxV float32 of the last position (nats),
      the next Memory).
    """
    hidden_BxTxD, memory = self.model.apply(
        {"params": params}, tokens_BxT, memory, True, method=models.TransformerXL.hidden
    )
    next_B, logp_BxV = self._next(params, hidden_BxTxD, key, index, top_k, top_p, temperature)
    return next_B, logp_BxV, memory

  def _partial(
      self,
      params: Any,
      memory: memory_lib.Memory,
      tokens_BxT: Array,
      last: Array,
      key: Array,
      index: Array,
      top_k: Array,
      top_p: Array,
      temperature: Array,
  ):
    """Memory tokens: samples the token after position ``last`` of an open
    segment ``tokens_BxT`` (positions after ``last`` are filler: a segment
    position sees no later one, and no write token); the memory is left as
    it was.  Returns (next_B, log_probs_BxV)."""
    hidden_BxTxD, _ = self.model.apply(
        {"params": params}, tokens_BxT, memory, True, method=models.TransformerXL.hidden
    )
    hidden_Bx1xD = jax.lax.dynamic_slice_in_dim(hidden_BxTxD, last, 1, axis=1)
    return self._next(params, hidden_Bx1xD, key, index, top_k, top_p, temperature)

  def _token_stream(self, params, rows, num_tokens, key, knobs, item, done_B) -> Iterator[Any]:
    """``stream`` with a memory that runs on whole segments only
    (``memory.Plan.whole_segments``, e.g. memory tokens): every row's
    sequence (prompt, then the tokens drawn) is read in segments of tgt_len
    from its start, as ``score`` reads a text, so each token is drawn from
    the distribution that scoring the sequence gives it.  The open (last,
    incomplete) segment is run again for every token (``partial_step``:
    filler after its end, the memory kept); once it holds tgt_len tokens it
    is committed (``segment_step``), and what it writes to the memory (the
    memory tokens) is read by the next.  No decoding cache: each token
    costs a pass over a segment.

    Raises:
      ValueError: prompts of different lengths.
    """
    if len({len(r) for r in rows}) > 1:
      raise ValueError(
          f"the model's memory ({self.memory_plan.names()}) runs on whole segments: the "
          f"prompts must have one length (got {sorted({len(r) for r in rows})}): generate "
          "them apart."
      )
    t, b = self.cfg.tgt_len, len(rows)
    seq_BxL = np.stack(rows).astype(np.int32)
    full = (seq_BxL.shape[1] - 1) // t  # the open segment holds 1 .. t tokens
    memory = jax.device_put(memory_lib.init_memory(self.cfg, b), self._replicated)
    for s in range(full):
      _, _, memory = self.segment_step(
          params, memory, seq_BxL[:, s * t : (s + 1) * t], key, np.int32(0), *knobs
      )
    open_BxK = seq_BxL[:, full * t :]
    for i in range(num_tokens):
      k = open_BxK.shape[1]
      if k == t:  # a full segment: commit it, its written tokens go on
        next_B, logp_BxV, memory = self.segment_step(
            params, memory, open_BxK, key, np.int32(i), *knobs
        )
        open_BxK = open_BxK[:, :0]
      else:
        filled_BxT = np.zeros((b, t), np.int32)
        filled_BxT[:, :k] = open_BxK
        next_B, logp_BxV = self.partial_step(
            params, memory, filled_BxT, np.int32(k - 1), key, np.int32(i), *knobs
        )
      yield item(next_B, logp_BxV)
      if done_B.all():
        return
      open_BxK = np.concatenate([open_BxK, np.asarray(next_B, np.int32)[:, None]], axis=1)

  def _start(
      self,
      params: Any,
      memory: memory_lib.Memory,
      tokens_B: Array,
      key: Array,
      index: Array,
      top_k: Array,
      top_p: Array,
      temperature: Array,
  ):
    """``_step`` for one token, making the decoding cache of the memory.

    Returns:
      (next_B, log_probs_BxV, the next Memory, the next ``CachedKV``).
    """
    hidden_BxTxD, memory, cache = self.model.apply(
        {"params": params}, tokens_B[:, None], memory, None, method=models.TransformerXL.decode
    )
    next_B, logp_BxV = self._next(params, hidden_BxTxD, key, index, top_k, top_p, temperature)
    return next_B, logp_BxV, memory, cache

  def _chunk(
      self,
      params: Any,
      memory: memory_lib.Memory,
      cache: Any,
      token_B: Array,
      key: Array,
      index: Array,
      n: Array,
      done_B: Array,
      stop_ids_S: Array,
      top_k: Array,
      top_p: Array,
      temperature: Array,
      with_logp: bool,
  ):
    """Up to ``n`` (traced, 1 <= n <= ``chunk``) passes of one token with the
    cache, each sampling the next token (drawn with ``fold_in(key, index +
    i)``) and feeding it to the next pass; one compilation whatever ``n``.
    A row is done once it has drawn one of ``stop_ids_S`` (or was done on
    entry, ``done_B``): its later tokens are -1; the loop (a
    ``lax.while_loop``) ends early when every row is done.

    Returns:
      (tokens_CxB int32, -1 where nothing was drawn; log_probs_CxBxV float32
      or None; the next Memory; the next cache; the last token [B]; done_B
      bool), C = ``chunk``.
    """
    b = token_B.shape[0]
    tokens_CxB = jnp.full((self.chunk, b), -1, jnp.int32)
    logp_CxBxV = jnp.zeros((self.chunk, b, self.cfg.n_token), jnp.float32) if with_logp else None

    def more(carry):
      i, done_B = carry[0], carry[6]
      return (i < n) & ~jnp.all(done_B)

    def one(carry):
      i, memory, cache, token_B, tokens_CxB, logp_CxBxV, done_B = carry
      hidden_BxTxD, memory, cache = self.model.apply(
          {"params": params}, token_B[:, None], memory, cache, method=models.TransformerXL.decode
      )
      next_B, logp_BxV = self._next(params, hidden_BxTxD, key, index + i, top_k, top_p, temperature)
      tokens_CxB = tokens_CxB.at[i].set(jnp.where(done_B, -1, next_B))
      if with_logp:
        logp_CxBxV = logp_CxBxV.at[i].set(logp_BxV)
      done_B = done_B | jnp.any(next_B[:, None] == stop_ids_S[None, :], axis=-1)
      return i + 1, memory, cache, next_B, tokens_CxB, logp_CxBxV, done_B

    _, memory, cache, last_B, tokens_CxB, logp_CxBxV, done_B = jax.lax.while_loop(
        more, one, (jnp.int32(0), memory, cache, token_B, tokens_CxB, logp_CxBxV, done_B)
    )
    return tokens_CxB, logp_CxBxV, memory, cache, last_B, done_B

  def stream(
      self,
      params: Any,
      prompts: Any,
      num_tokens: int,
      settings: sampling.SamplingSettings = sampling.SamplingSettings(),
      seed: Any = 0,
      log_probs: bool = False,
      stop_tokens: Sequence[int] = (),
      done_B: np.ndarray | None = None,
      first_row: int = 0,
  ) -> Iterator[Any]:
    """Generates up to ``num_tokens`` tokens after each row's prompt.

    The prompts are read in segments aligned to their ends, rows of
    different lengths padded in front (module docstring).  With the
    decoding cache, tokens come from the device ``chunk`` at a time
    (``_chunk``) and are yielded one by one; the next chunk is
    dispatched before the current one is read back.  Without it, one step
    per token, likewise dispatched ahead.  Token i of row b is drawn with
    the key ``fold_in(row_key[b], i)``: ``row_key[b] = fold_in(PRNGKey(seed),
    b)`` for an int seed, ``fold_in(PRNGKey(seed[b]), 0)`` for one seed per
    row.  So a seed gives the same tokens on every run, with the cache or
    without, and a row given its own seed gets the tokens it gets alone
    with that seed (an int), whatever the other rows.

    Stopping per row: a row is done after it draws one of ``stop_tokens``
    (that token is its last), or when the caller sets its entry of
    ``done_B`` (e.g. at a stop string it found in the text); a done row
    yields -1 from then on, and the generation ends when every row is done
    (the loop on the device stops within the chunk; a row the caller marks
    done counts from the next chunk dispatched, so at most two chunks late
    on the device, never in what is yielded).  With the cache and
    ``compact``, once at most a quarter of the rows are live the others
    are dropped from the batch (the live ones padded to a power of 2), so
    they stop costing compute; rows go on exactly as they would have.

    Args:
      params: model parameters.
      prompts: integer [B, N] token ids, or a sequence of B integer 1-D
        arrays (lengths may differ), each of length >= 1; row b is sample
        b's prompt (rows are independent; generation runs them as one
        batch).
      num_tokens: tokens to generate at most, >= 1.
      settings: temperature, top_k, top_p.
      seed: an int, or B ints (one per row; the row's as if it were alone).
      log_probs: also yield the distribution each token was drawn from.
      stop_tokens: ids that end a row (e.g. the corpus's ``boundary_id``).
      done_B: optional bool [B] numpy array, shared: this method sets the
        rows that drew a stop token, the caller may set rows it has ended
        (before iterating, or while it iterates).
      first_row: with an int seed, row b is drawn as row ``first_row + b``
        (``row_key = fold_in(PRNGKey(seed), first_row + b)``): a long list
        of prompts generated batch by batch gets the tokens of one batch.

    Yields:
      int32 [B] (token i of every row; -1 for a row already done), or with
      ``log_probs`` a pair (that, float32 [B, V] log-probabilities in nats
      before temperature and cut; meaningless for a done row).

    Raises:
      ValueError: prompts that are not integer token ids in [0, n_token),
        an empty prompt, stop tokens out of range, a ``done_B`` of another
        shape, or seeds that do not match the rows (before anything is
        compiled).
      default_config.ConfigError: num_tokens < 1.
    """
    rows = self._rows(prompts)
    if num_tokens < 1:
      raise default_config.ConfigError(f"num_tokens={num_tokens} must be >= 1.")
    b, t = len(rows), self.cfg.tgt_len
    stop_ids_S = np.asarray(list(stop_tokens) or [-1], np.int32)  # -1: no token stops
    if stop_tokens and (stop_ids_S.min() < 0 or stop_ids_S.max() >= self.cfg.n_token):
      raise ValueError(f"stop_tokens={list(stop_tokens)} must be ids in [0, {self.cfg.n_token}).")
    if done_B is None:
      done_B = np.zeros(b, bool)
    elif np.shape(done_B) != (b,) or np.asarray(done_B).dtype != bool:
      raise ValueError(
          f"done_B must be a bool array of shape ({b},); got "
          f"{np.asarray(done_B).dtype} {np.shape(done_B)}."
      )
    if np.ndim(seed) == 0:  # row b: fold_in(PRNGKey(seed), b)
      key = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
          jax.random.PRNGKey(int(seed)), np.arange(first_row, first_row + b, dtype=np.uint32)
      )
    elif np.shape(seed) == (b,):  # row b: fold_in(PRNGKey(seed[b]), 0), as alone
      key = jax.vmap(lambda s: jax.random.fold_in(jax.random.PRNGKey(s), 0))(
          np.asarray(seed, np.uint32)
      )
    else:
      raise ValueError(f"give one seed or {b} seeds (one per row); got {np.shape(seed)}.")
    knobs = (np.int32(settings.top_k), np.float32(settings.top_p), np.float32(settings.temperature))

    def item(token_B, logp_BxV):
      """The host's copy of one token step, -1 for rows done before it;
      marks the rows that drew a stop token."""
      token_B = np.where(done_B, -1, np.asarray(token_B)).astype(np.int32)
      done_B[np.isin(token_B, stop_ids_S) & (token_B >= 0)] = True
      return (token_B, np.asarray(logp_BxV)) if log_probs else token_B

    if self.memory_plan.whole_segments:  # segments from the start, no padding
      yield from self._token_stream(params, rows, num_tokens, key, knobs, item, done_B)
      return
    n = -(-max(len(r) for r in rows) // t) * t  # the longest prompt, rounded up to segments
    prompt_BxN = np.zeros((b, n), np.int32)
    for r, row in enumerate(rows):
      prompt_BxN[r, n - len(row) :] = row
    front_pad_B = np.asarray([n - len(row) for row in rows], np.int32)
    memory = memory_lib.init_memory(self.cfg, b).with_front_padding(front_pad_B)
    memory = jax.device_put(memory, self._replicated)
    first = np.int32(0)  # the key index of generated token 0
    for s in range(n // t):
      segment_BxT = prompt_BxN[:, s * t : (s + 1) * t]
      next_B, logp_BxV, memory = self.segment_step(params, memory, segment_BxT, key, first, *knobs)

    if not self.use_cache:  # one token_step per token, the next dispatched before a read back
      for i in range(num_tokens):
        token_B, token_logp_BxV = next_B, logp_BxV
        if i + 1 < num_tokens:
          next_B, logp_BxV, memory = self.token_step(
              params, memory, token_B, key, np.int32(i + 1), *knobs
          )
        yield item(token_B, token_logp_BxV)
        if done_B.all():
          return
      return
    # Token 0 comes from the prompt; token 1 from a pass over token 0 that
    # starts the decoding cache; then chunks.
    yield item(next_B, logp_BxV)
    if num_tokens == 1 or done_B.all():
      return
    next_B, logp_BxV, memory, cache = self.start_step(
        params, memory, next_B, key, np.int32(1), *knobs
    )
    yield item(next_B, logp_BxV)
    # The device batch: row r of it is row rows_R[r] of the caller's (-1: padding).  When
    # no more than a quarter of its rows are live, the live ones (padded to a power of 2)
    # go on alone: done rows stop costing compute (one more compilation per size).
    rows_R = np.arange(b)
    device_done_R = jax.device_put(done_B.copy(), self._replicated)
    i, pending = 2, None
    while (i < num_tokens and not done_B.all()) or pending is not None:
      dispatched = None
      if i < num_tokens and not done_B.all():  # dispatched before the pending chunk is read
        host_done_R = (rows_R < 0) | done_B[rows_R]
        live_R = np.flatnonzero(~host_done_R)
        size = 1 << int(len(live_R) - 1).bit_length()  # the next power of 2
        if self.compact and 4 * len(live_R) <= len(rows_R) and num_tokens - i > self.chunk:
          take_R = np.r_[live_R, np.full(size - len(live_R), live_R[0])].astype(np.int32)
          memory, cache, next_B, key, device_done_R = self.take_rows(
              memory, cache, next_B, key, device_done_R, take_R
          )
          rows_R = np.r_[rows_R[live_R], np.full(size - len(live_R), -1)]
          host_done_R = (rows_R < 0) | done_B[rows_R]
        k = min(self.chunk, num_tokens - i)
        toks, logps, memory, cache, next_B, device_done_R = self.chunk_step(
            params,
            memory,
            cache,
            next_B,
            key,
            np.int32(i),
            np.int32(k),
            device_done_R | host_done_R,
            stop_ids_S,
            *knobs,
            log_probs,
        )
        dispatched, i = (toks, logps, k, rows_R), i + k
      if pending is not None:
        toks_NxR, n_read, from_R = np.asarray(pending[0]), pending[2], pending[3]
        logps_NxRxV = np.asarray(pending[1]) if log_probs else None
        real_R = from_R >= 0
        for r in range(n_read):
          if done_B.all():
            return
          token_B = np.full(b, -1, np.int32)
          token_B[from_R[real_R]] = toks_NxR[r][real_R]
          logp_BxV = None
          if log_probs:
            logp_BxV = np.zeros((b, self.cfg.n_token), np.float32)
            logp_BxV[from_R[real_R]] = logps_NxRxV[r][real_R]
          yield item(token_B, logp_BxV)
      pending = dispatched

  @staticmethod
  def _take(
      memory: memory_lib.Memory,
      cache: Any,
      token_B: Array,
      key: Array,
      done_B: Array,
      take_R: Array,
  ):
    """Rows ``take_R`` of the decoding state (the batch axis of each part)."""
    rows = lambda x, axis: jnp.take(x, take_R, axis=axis)
    memory = memory.map_rows(rows)
    cache = cache._replace(
        k_BxMxHxDh=rows(cache.k_BxMxHxDh, 1), v_BxMxHxDh=rows(cache.v_BxMxHxDh, 1)
    )
    return memory, cache, rows(token_B, 0), rows(key, 0), rows(done_B, 0)

  def _rows(self, prompts: Any) -> list[np.ndarray]:
    """The prompts as B int32 1-D arrays, checked (see ``stream``)."""
    if isinstance(prompts, np.ndarray) or not isinstance(prompts, (list, tuple)):
      array = np.asarray(prompts)
      if array.ndim != 2:
        raise ValueError(
            f"the prompts must be an integer array [B, N] or a sequence of 1-D "
            f"arrays; got shape {array.shape}."
        )
      prompts = list(array)
    rows = [np.asarray(p) for p in prompts]
    if not rows:
      raise ValueError("no prompt: give at least one row.")
    for r, row in enumerate(rows):
      if row.ndim != 1 or row.size < 1 or not np.issubdtype(row.dtype, np.integer):
        raise ValueError(
            f"prompt {r} must be a non-empty 1-D array of integer token ids; got "
            f"{row.dtype} {row.shape}."
        )
      if row.min() < 0 or row.max() >= self.cfg.n_token:
        raise ValueError(
            f"prompt ids must be in [0, {self.cfg.n_token}); prompt {r} has "
            f"[{row.min()}, {row.max()}]."
        )
    return [row.astype(np.int32) for row in rows]

  def generate(
      self,
      params: Any,
      prompts: Any,
      num_tokens: int,
      settings: sampling.SamplingSettings = sampling.SamplingSettings(),
      seed: Any = 0,
  ) -> np.ndarray:
    """All of ``stream`` at once: int32 [B, num_tokens] token ids.

    Raises:
      ValueError: as ``stream``.
      default_config.ConfigError: as ``stream``.
    """
    return np.stack(list(self.stream(params, prompts, num_tokens, settings, seed)), axis=1)
