"""The free model settings in every mode, score's units, and what score/generate need.

On one tiny model trained in this process on one's own text (word tokenizer): the
config's free model settings (``model.dtype``, ``model.attention_impl``, ...) are those
that eval, score, generate and ``LanguageModel`` use; a setting of the architecture that
differs from the trained one is refused in one line naming it; score reports bits per
token, bits per byte and word-level perplexity, compared with a hand computation;
score and generate use the workdir's saved tokenizer and prepare nothing.
"""

import copy
import dataclasses
import json
import math
import os

import numpy as np
import pytest

from transformer_xl import data, default_config, sharding
from transformer_xl.cli import eval_modes, modes
from transformer_xl.inference import evaluate, generate, language_model, text_scores, trained_model
from transformer_xl.model import pallas_attention, tuning

from helpers import TEXT, tiny_model_config, tiny_text_config, write_corpus


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """(root, workdir, config): a workdir trained for 2 steps (float32, attention "xla"); about
  a minute on 2 cores, so the tests that use it are slow."""
  root = tmp_path_factory.mktemp("overrides")
  config = tiny_text_config(write_corpus(root / "corpus"), root / "tfds")
  workdir = root / "wd"
  modes.run(modes.Request(mode="train", workdir=str(workdir), config=config))
  assert json.loads((workdir / "model_config.json").read_text())["model"]["dtype"] == "float32"
  return root, workdir, config


def with_model(config, **model):
  c = copy.deepcopy(config)
  c.model.update(**model)
  return c


def score(workdir, out, text_path, config=None):
  """--mode=score --text: the NLL it wrote."""
  modes.run(
      modes.Request(
          mode="score", workdir=str(workdir), config=config, text=str(text_path), out=str(out)
      )
  )
  return np.load(out)


@pytest.fixture
def text_file(tmp_path):
  path = tmp_path / "some.txt"
  path.write_text(TEXT)
  return path


@pytest.fixture
def spy(monkeypatch):
  """What the model was built with: the dtypes of every Evaluator's and Generator's
  model config, and how often the Pallas kernel was traced."""
  seen = {"evaluator": [], "generator": [], "pallas": 0}
  ev_init, gen_init, kernel = (
      evaluate.Evaluator.__init__,
      generate.Generator.__init__,
      pallas_attention.rel_attention,
  )

  def evaluator(self, *args, **kwargs):
    ev_init(self, *args, **kwargs)
    seen["evaluator"].append(self.cfg)

  def generator(self, cfg, *args, **kwargs):
    gen_init(self, cfg, *args, **kwargs)
    seen["generator"].append(cfg)

  def counted(*args, **kwargs):
    seen["pallas"] += 1
    return kernel(*args, **kwargs)

  monkeypatch.setattr(evaluate.Evaluator, "__init__", evaluator)
  monkeypatch.setattr(generate.Generator, "__init__", generator)
  monkeypatch.setattr(pallas_attention, "rel_attention", counted)
  return seen


@pytest.mark.slow
def test_score_computes_in_the_dtype_of_the_config(trained, tmp_path, text_file, spy):
  """--config.model.dtype=bfloat16 scores in bfloat16 (the NLL differs a little from
  float32's); float32 gives what the saved config (no --config) gives."""
  _, workdir, config = trained
  saved = score(workdir, tmp_path / "saved.npy", text_file)
  f32 = score(workdir, tmp_path / "f32.npy", text_file, with_model(config, dtype="float32"))
  bf16 = score(workdir, tmp_path / "bf16.npy", text_file, with_model(config, dtype="bfloat16"))
  assert [c.dtype for c in spy["evaluator"]] == ["float32", "float32", "bfloat16"]
  np.testing.assert_array_equal(f32, saved)
  assert 1e-4 < np.abs(bf16 - f32).max() < 0.2


@pytest.mark.slow
def test_generate_and_the_python_api_use_the_dtype_of_the_config(trained, spy):
  _, workdir, config = trained
  bf16 = with_model(config, dtype="bfloat16")
  modes.run(
      modes.Request(
          mode="generate", workdir=str(workdir), config=bf16, prompt="the cat", num_tokens=3
      )
  )
  assert [c.dtype for c in spy["generator"]] == ["bfloat16"]
  lm = language_model.LanguageModel.from_workdir(str(workdir), config=bf16)
  assert lm.model_cfg.dtype == lm.eval_cfg.dtype == "bfloat16"
  lm32 = language_model.LanguageModel.from_workdir(str(workdir))
  assert lm32.model_cfg.dtype == "float32"
  diff = np.abs(lm.score_text(TEXT).nll - lm32.score_text(TEXT).nll).max()
  assert 1e-4 < diff < 0.2


@pytest.mark.slow
def test_eval_computes_in_the_dtype_of_the_config(trained, spy):
  """Before, eval refused a dtype other than the trained one (the checkpoint's model)."""
  _, workdir, config = trained
  corpus = data.load_configured(config.data.to_dict())
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  f32 = eval_modes.run_eval(config, str(workdir), corpus, mesh)
  bf16 = eval_modes.run_eval(with_model(config, dtype="bfloat16"), str(workdir), corpus, mesh)
  assert [c.dtype for c in spy["evaluator"]] == ["float32", "bfloat16"]
  assert 1e-5 < abs(bf16["valid"]["loss_nats"] - f32["valid"]["loss_nats"]) < 0.1


@pytest.mark.slow
def test_score_and_generate_use_the_kernel_of_the_config(trained, tmp_path, text_file, spy):
  """attention_impl="pallas" (interpret mode on CPU) over a workdir trained with "xla":
  the kernel is traced, and the scores are XLA's."""
  _, workdir, config = trained
  xla = score(workdir, tmp_path / "xla.npy", text_file)
  assert spy["pallas"] == 0
  pallas = with_model(config, attention_impl="pallas")
  kernel = score(workdir, tmp_path / "pallas.npy", text_file, pallas)
  assert spy["pallas"] > 0 and spy["evaluator"][-1].attention_impl == "pallas"
  np.testing.assert_allclose(kernel, xla, rtol=1e-5, atol=1e-5)
  traced = spy["pallas"]
  modes.run(
      modes.Request(
          mode="generate", workdir=str(workdir), config=pallas, prompt="the cat", num_tokens=2
      )
  )
  assert spy["pallas"] > traced and spy["generator"][-1].attention_impl == "pallas"


@pytest.mark.parametrize(
    "model,named",
    [
        ({"d_model": 64, "n_head": 4}, "model.d_model=64"),
        ({"tgt_len": 16}, "eval.tgt_len"),
        ({"cutoffs": (5,)}, "model.cutoffs"),
    ],
)
@pytest.mark.slow
def test_an_architecture_change_is_refused_in_every_mode(trained, tmp_path, model, named):
  _, workdir, config = trained
  other = with_model(config, **model)
  (tmp_path / "t.txt").write_text(TEXT)
  requests = [
      modes.Request(
          mode="score",
          workdir=str(workdir),
          config=other,
          text=str(tmp_path / "t.txt"),
          out=str(tmp_path / "nll.npy"),
      ),
      modes.Request(mode="generate", workdir=str(workdir), config=other, prompt="the"),
      modes.Request(mode="eval", workdir=str(workdir), config=other),
  ]
  for request in requests:
    with pytest.raises(SystemExit) as exit_:  # exit status 1, the message on stderr
      modes.run(request)
    message = str(exit_.value.code)
    assert message.startswith("error: --config sets") and "\n" not in message
    assert named in message and "only model.dtype, remat" in message, message
  with pytest.raises(default_config.ConfigError, match=named.replace(".", r"\.")):
    language_model.LanguageModel.from_workdir(str(workdir), config=other)
  assert not (tmp_path / "nll.npy").exists()


@pytest.mark.slow
def test_training_only_settings_are_not_refused(trained, tmp_path, text_file):
  """Dropout and the initialisers do not change a trained model (eval has no dropout)."""
  _, workdir, config = trained
  saved = score(workdir, tmp_path / "saved.npy", text_file)
  other = with_model(config, dropout=0.3, dropatt=0.2, init_std=0.5)
  np.testing.assert_array_equal(score(workdir, tmp_path / "o.npy", text_file, other), saved)


@pytest.mark.slow
def test_score_reports_bits_per_byte_and_word_perplexity(trained, tmp_path, reports):
  """Against a hand computation from the NLL written: bits per byte = total NLL / (UTF-8
  bytes x ln 2), word perplexity = exp(total NLL / whitespace-separated words)."""
  _, workdir, _ = trained
  text = "the big cat sat  on the mat\nthé small dog ran\tunder a red log\n"  # é: 2 bytes
  path = tmp_path / "t.txt"
  path.write_text(text, encoding="utf-8")
  nll = score(workdir, tmp_path / "nll.npy", path).astype(np.float64)
  total, n_bytes, n_words = nll.sum(), len(text.encode("utf-8")), len(text.split())
  assert (n_words, nll.size) == (15, 17) and n_bytes == len(text) + 1  # 2 <eos>; é
  bpb, word_ppl = total / (n_bytes * math.log(2)), math.exp(total / n_words)
  line = [x for x in reports.lines if "scored" in x][-1]
  assert f"bits per token {total / nll.size / math.log(2):.4f}" in line
  assert f"bits per byte {bpb:.4f} (over {n_bytes} bytes)" in line
  assert f"word perplexity {word_ppl:.3f} (over {n_words} words)" in line
  assert "bpc" not in line
  lm = language_model.LanguageModel.from_workdir(str(workdir))
  s = lm.score_text(text)
  assert s.num_bytes == n_bytes and s.num_words == n_words
  assert s.bits_per_byte == pytest.approx(s.nll.sum(dtype=np.float64) / (n_bytes * math.log(2)))
  assert s.bits_per_byte == pytest.approx(bpb, rel=1e-5)
  assert s.word_ppl == pytest.approx(word_ppl, rel=1e-5)
  assert s.bits_per_token == pytest.approx(s.loss_nats / math.log(2))
  assert s.bpc is None  # a word-level corpus: bits per token are not bits per character


@pytest.mark.slow
def test_score_of_tokens_says_bytes_and_words_are_unknown(trained, tmp_path, reports):
  _, workdir, _ = trained
  np.save(tmp_path / "tok.npy", np.array([[1, 5, 6, 7, 2]]))
  modes.run(
      modes.Request(
          mode="score",
          workdir=str(workdir),
          tokens=str(tmp_path / "tok.npy"),
          out=str(tmp_path / "nll.npy"),
      )
  )
  line = [x for x in reports.lines if "scored" in x][-1]
  assert "bits per byte: unknown for --tokens" in line


@pytest.mark.slow
def test_out_is_replaced_with_a_note(trained, tmp_path, text_file, reports, capsys):
  _, workdir, _ = trained
  out = tmp_path / "nll.npy"
  out.write_bytes(b"old")
  score(workdir, out, text_file)
  assert np.load(out).shape[0] == 1
  assert any(f"wrote {out} (replacing the existing file)" in x for x in reports.lines)
  samples = tmp_path / "samples.json"
  samples.write_text("old")
  modes.run(
      modes.Request(
          mode="generate", workdir=str(workdir), prompt="the", num_tokens=2, out=str(samples)
      )
  )
  assert json.loads(samples.read_text())["prompt"] == "the"
  assert f"Wrote {samples} (replacing the existing file)" in capsys.readouterr().err


@pytest.mark.slow
def test_score_and_generate_after_the_corpus_changed_use_the_saved_tokenizer(
    trained, tmp_path, text_file, monkeypatch
):
  """The corpus files changed (another vocabulary): score and generate still work, with
  the workdir's tokenizer.json, and prepare nothing."""
  root, workdir, config = trained
  before = score(workdir, tmp_path / "before.npy", text_file)
  train = root / "corpus" / "train.txt"
  original, stat = train.read_text(), train.stat()
  try:
    train.write_text(original + "zebra giraffe\n")
    tfds_before = sorted(p.name for p in (root / "tfds").rglob("*"))

    def refuse(*args, **kwargs):
      raise AssertionError("a corpus was loaded")

    monkeypatch.setattr(data, "load_configured", refuse)
    after = score(workdir, tmp_path / "after.npy", text_file)
    np.testing.assert_array_equal(after, before)
    modes.run(modes.Request(mode="generate", workdir=str(workdir), prompt="the", num_tokens=2))
    lm = language_model.LanguageModel.from_workdir(str(workdir), config=config)
    np.testing.assert_allclose(lm.score_text(TEXT).nll, before[0], rtol=1e-6)
    assert sorted(p.name for p in (root / "tfds").rglob("*")) == tfds_before
  finally:  # the same path, size and time: the prepared dataset of the others' config
    train.write_text(original)
    os.utime(train, ns=(stat.st_atime_ns, stat.st_mtime_ns))


TRAINED = tiny_model_config(n_token=40, d_embed=16, dtype="bfloat16")


def test_free_settings_are_applied_and_training_only_ones_ignored():
  settings = {
      **TRAINED.to_dict(),
      "dtype": "float32",
      "attention_impl": "pallas",
      "remat": "full",
      "attn_block": 4,
      "scan_unroll": 2,
      "dropout": 0.5,  # training only: not applied, not refused
      "init_std": 1.0,
      "d_embed": 0,  # the same as d_embed=d_model: no projection
      "n_token": 99,  # the vocabulary is the trained one's
  }
  used = trained_model.apply_free_settings(TRAINED, settings)
  assert used == dataclasses.replace(
      TRAINED, dtype="float32", attention_impl="pallas", remat="full", attn_block=4, scan_unroll=2
  )
  assert trained_model.apply_free_settings(TRAINED, {}) == TRAINED
  config = default_config.get_config()  # a config's model section (a ConfigDict)
  default_config.set_model_config(config, TRAINED)
  config.model.update(dtype="float32", dropout=0.3)
  assert trained_model.apply_free_settings(TRAINED, config.model) == dataclasses.replace(
      TRAINED, dtype="float32"
  )
  assert set(tuning.FREE_MODEL_KEYS) < set(trained_model.FREE_KEYS)


@pytest.mark.parametrize(
    "key,value",
    [("n_layer", 3), ("d_model", 32), ("cutoffs", [5]), ("tie_weight", False), ("mem_len", 7)],
)
def test_a_change_of_the_architecture_is_refused_naming_the_key(key, value):
  with pytest.raises(default_config.ConfigError) as err:
    trained_model.apply_free_settings(
        TRAINED, {key: value, "dtype": "float32"}, source="--config", where="W/model_config.json"
    )
  message = str(err.value)
  assert message.startswith(f"--config sets model.{key}={value!r} (trained: ")
  assert "(W/model_config.json)" in message and "\n" not in message
  assert ("eval.mem_len" in message) == (key == "mem_len")
  with pytest.raises(default_config.ConfigError, match="attn_type 0"):
    trained_model.apply_free_settings(
        dataclasses.replace(TRAINED, attn_type=2), {"attention_impl": "pallas"}
    )


def test_text_score_units_against_a_hand_computation():
  nll = np.array([1.5, 0.25, 2.0, 0.75], np.float32)  # 4.5 nats
  s = text_scores.TextScore(np.arange(4), nll, "word", num_bytes=9, num_words=3)
  assert s.bits_per_byte == pytest.approx(4.5 / (9 * math.log(2)), rel=1e-12)
  assert s.word_ppl == pytest.approx(math.exp(4.5 / 3), rel=1e-12)
  assert s.bits_per_token == pytest.approx(4.5 / 4 / math.log(2), rel=1e-12)
  assert s.ppl == pytest.approx(math.exp(4.5 / 4), rel=1e-6) and s.bpc is None
  assert text_scores.TextScore(np.arange(4), nll, "char").bpc == s.bits_per_token
  unknown = text_scores.TextScore(np.arange(4), nll, "word")
  assert unknown.bits_per_byte is None and unknown.word_ppl is None
  assert text_scores.text_size("thé  cat\n") == (10, 2)
