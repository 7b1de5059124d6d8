"""transformer_xl.harness.HarnessLM: the lm-evaluation-harness's three requests
through the recurrent memory, for every registered memory variant, against
independent computations (the model applied segment by segment; greedy
generation; --mode=score's scoring of a text); tokenisation by the harness's
conventions for word-level and SentencePiece vocabularies."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from lm_eval.api.instance import Instance
from memory_cases import CASES, model_config, model_scores, params_of, run_config

from transformer_xl import data, sharding
from transformer_xl.data import text_settings, text_vocab, tokenizers
from transformer_xl.harness import HarnessError, HarnessLM
from transformer_xl.inference import language_model
from transformer_xl.model import models

from helpers import TOY_VOCAB


def word_corpus() -> data.Corpus:
  """Words ``w0`` .. ``w31``, lines ended by ``w0`` (the boundary), no unknown word."""
  vocab = [f"w{i}" for i in range(TOY_VOCAB)]
  return data.Corpus(
      name="toy",
      unit="word",
      vocab=vocab,
      boundary_id=0,
      splits={},
      tokenizer=tokenizers.LineTokenizer(corpus="toy", end="w0"),
  )


def harness_lm(case: str, batch_size: int = 3, corpus: data.Corpus | None = None) -> HarnessLM:
  """``case``'s small model (random parameters moved off the init) as a harness model."""
  corpus = corpus or word_corpus()
  cfg = model_config(case, n_token=corpus.vocab_size)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  lm = language_model.LanguageModel(run_config(case), cfg, corpus, params_of(cfg), 0, mesh)
  return HarnessLM(lm=lm, batch_size=batch_size)


def reference_nll(h: HarnessLM, stream: list[int]) -> np.ndarray:
  """NLL [len - 1] of one stream alone, by ``model.apply`` segment by segment."""
  t = h.lm.model_cfg.tgt_len
  n = -(-(len(stream) - 1) // t) * t + 1
  padded = np.zeros((1, n), np.int32)
  padded[0, : len(stream)] = stream
  nll, _ = model_scores(h.lm.model_cfg, h.lm.params, padded)
  return nll[0, : len(stream) - 1]


def words(ids) -> str:
  return " ".join(f"w{i}" for i in ids)


def requests(kind: str, args: list[tuple]) -> list[Instance]:
  return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


# Contexts of 0 to 13 words (up to 4 segments of 4), continuations of 1 to 5.
RNG = np.random.default_rng(3)
PAIRS = [
    (words(RNG.integers(1, TOY_VOCAB, n)), " " + words(RNG.integers(1, TOY_VOCAB, m)))
    for n, m in ((0, 2), (5, 1), (13, 3), (2, 5), (9, 2), (1, 1), (7, 4))
]


@pytest.mark.parametrize("case", list(CASES))
def test_loglikelihood_is_the_continuation_scored_after_its_context(case):
  """Every request equals its stream alone through model.apply (batched 3 rows at a
  time, longest first, padded: neither the batch nor the order changes a score)."""
  h = harness_lm(case)
  got = h.loglikelihood(requests("loglikelihood", PAIRS))
  assert len(got) == len(PAIRS)
  for (context, continuation), (logp, _) in zip(PAIRS, got):
    ctx, cont = h.tok_encode(context), h.tok_encode(continuation)
    want = -reference_nll(h, [0, *ctx, *cont])[len(ctx) :].sum()
    np.testing.assert_allclose(logp, want, rtol=2e-5, atol=2e-5)


@pytest.mark.slow  # generation compiles per case: ~10-25 s a case on 2 shared cores
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_is_the_models_own_continuation(case):
  """A continuation the model writes itself (greedy generation) is greedy; the
  same with its last token changed is not; rolling equals --mode=score's NLLs
  (LanguageModel.score_text) and generate_until equals greedy generation cut at
  the stop string."""
  h = harness_lm(case, batch_size=2)
  contexts = ["w3 w9 w4", "w5 " * 9 + "w7", "w1"]
  outs = [h.lm.generate(c, 4, top_k=1) for c in contexts]  # alone: any memory
  greedy = [" " + o.texts[0].strip() for o in outs]
  assert all(len(g.split()) == 4 for g in greedy)  # the toy model never draws w0 here
  wrong = [g.rsplit(" ", 1)[0] + (" w2" if not g.endswith(" w2") else " w6") for g in greedy]
  got = h.loglikelihood(requests("loglikelihood", list(zip(contexts * 2, greedy + wrong))))
  assert [g for _, g in got] == [True] * 3 + [False] * 3
  # rolling: each document's tokens as --mode=score --text reads them
  docs = ["w4 w5 w6\nw7 w8\n", "w1 " * 11, "w9"]
  rolling = h.loglikelihood_rolling(requests("loglikelihood_rolling", [(d,) for d in docs]))
  for doc, logp in zip(docs, rolling):
    np.testing.assert_allclose(logp, -h.lm.score_text(doc).nll.sum(), rtol=1e-5, atol=1e-5)
  # generate_until: the same greedy text, cut before the first stop string
  stop = greedy[0].split()[2]
  gen = h.generate_until(
      requests("generate_until", [(c, {"until": [stop], "max_gen_toks": 4}) for c in contexts])
  )
  for text, g in zip(gen, greedy):
    assert text == g.split(stop)[0]


def test_word_level_pairs_split_as_the_harness_expects():
  h = harness_lm("xl")
  assert h.encode_pair("w1 w2", " w3 w4") == ([1, 2], [3, 4])
  assert h.encode_pair("w1 w2 ", "w3") == ([1, 2], [3])  # the space moves to the continuation
  assert h.encode_pair("", "w3") == ([], [3])
  assert h.encode_pair("w1\nw2", " w3\n") == ([1, 0, 2], [3, 0])  # a line ended by the boundary
  got = h.loglikelihood(requests("loglikelihood", [("w1 w2", ""), ("w1", " w2")]))
  assert got[0] == (0.0, True)  # nothing to score


def test_sentencepiece_pairs_split_where_the_context_ends():
  lines = ["the cat sat on the mat", "a dog ran under the rug", "the big red house"] * 30
  settings = text_settings.TextSettings(
      "a", "b", "c", tokenizer="sentencepiece", vocab_size=277, spm_sample_mb=1.0
  )
  tok = tokenizers.SentencePieceTokenizer(
      "toy", text_vocab.train_sentencepiece(iter(lines), settings, "toy")
  )
  corpus = data.Corpus(
      name="toy", unit="subword", vocab=tok.vocab, boundary_id=tok.end_id, splits={}, tokenizer=tok
  )
  h = harness_lm("xl", corpus=corpus)
  ctx, cont = h.encode_pair("the cat sat on", " the mat")
  assert ctx + cont == h.tok_encode("the cat sat on the mat")
  assert tok.vocab[cont[0]].startswith("\u2581")  # the continuation's space is its own
  ctx2, cont2 = h.encode_pair("the cat sat on ", "the mat")  # trailing space moved
  assert (ctx2, cont2) == (ctx, cont)
  ((logp, _),) = h.loglikelihood(requests("loglikelihood", [("the cat sat on", " the mat")]))
  want = -reference_nll(h, [tok.end_id, *ctx, *cont])[len(ctx) :].sum()
  np.testing.assert_allclose(logp, want, rtol=2e-5, atol=2e-5)


def test_bad_model_arguments_are_one_clear_error(tmp_path):
  with pytest.raises(HarnessError, match="name one model"):
    HarnessLM()
  with pytest.raises(HarnessError, match="batch_size='big'"):
    HarnessLM(workdir=str(tmp_path), batch_size="big")
  h = harness_lm("xl")
  with pytest.raises(HarnessError, match=r"gen_kwargs \['num_beams'\]"):
    h.generate_until(requests("generate_until", [("w1", {"until": ["w2"], "num_beams": 4})]))
  assert isinstance(h.lm.model_cfg, models.ModelConfig)
