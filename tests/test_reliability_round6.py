"""Reliability, round 6 (issue 62): each case found by trying round 5's memories
as a user and a hostile tester would, tested at its cause."""

from __future__ import annotations

import json

import numpy as np
import pytest

from transformer_xl import default_config

from helpers import (
    CONFIGS,
    REPO,
    armt_fixture_inputs,
    babilong_data_cfg,
    load_config,
    run_main,
    run_module,
)
from hf_reference import BASE


def _problems(config) -> str:
  with pytest.raises(default_config.ConfigError) as err:
    default_config.validate(config, 1)
  return str(err.value)


@pytest.mark.parametrize("name", ["KNN", "knnn", "compresive"])
def test_a_misspelt_memory_is_one_problem_not_a_key_error(name):
  c = load_config("quickstart")
  c.model.memory = name
  message = _problems(c)
  # (the choices include the test-only variants when those are registered in this process)
  assert (
      f"model.memory={name!r}: use one of ('armt', 'compressive'" in message and "'xl'" in message
  )
  assert message.count("\n  - ") <= 1  # that problem alone


def test_a_misspelt_memory_on_the_command_line_is_one_error_line(tmp_path):
  r = run_main(
      [
          f"--config={CONFIGS / 'quickstart.py'}",
          f"--workdir={tmp_path}",
          "--config.model.memory=knnn",
      ],
      devices=1,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr
  assert "model.memory='knnn': use one of" in r.stderr


def test_a_bad_knn_setting_is_reported_once_under_its_own_key():
  c = load_config("quickstart")
  c.model.memory = "knn"
  c.model.knn.num_neighbors = 0
  message = _problems(c)
  assert message.count("num_neighbors") == 1 and "eval.knn" not in message


def test_a_bad_knn_eval_override_names_the_key_given():
  c = load_config("quickstart")
  c.model.memory = "knn"
  c.model.knn.update(memory_size=64, num_neighbors=8)
  c.eval.knn.memory_size = 4  # fewer entries than the model's 8 neighbours
  message = _problems(c)
  assert "eval.knn.memory_size=4" in message
  assert "eval.knn.num_neighbors" not in message and "eval.knn.layers" not in message


@pytest.mark.parametrize(
    "tensor",
    [
        "memory_cell.model.transformer.layers.1.W_mv.weight",  # the memory's own tensors
        "memory_cell.model.transformer.word_emb.emb_layers.0.weight",  # the backbone's
    ],
)
def test_an_armt_checkpoint_with_nan_is_one_error_line_and_nothing_written(tensor, tmp_path):
  state, hparams = armt_fixture_inputs(tmp_path)
  state = {k: v for k, v in state.items() if not k.startswith("memory_cell.layers.")}
  state[tensor] = np.full_like(state[tensor], np.nan)
  np.savez(tmp_path / "nan.npz", **state)
  workdir = tmp_path / "wd"
  r = run_module(
      "transformer_xl.convert",
      "--from=armt",
      f"--checkpoint={tmp_path / 'nan.npz'}",
      f"--hparams={hparams}",
      f"--workdir={workdir}",
      timeout=120,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
  (line,) = r.stderr.strip().splitlines()
  assert line.startswith("error: checkpoint ") and "NaN or infinite values" in line
  assert tensor.rsplit("transformer.", 1)[-1].split(".weight")[0] in line
  assert not workdir.exists()


def test_memory_tokens_with_nan_are_refused_by_the_fork_converter():
  from transformer_xl import convert
  from transformer_xl.convert import rmt

  hp = {**BASE, "num_mem_tokens": 2, "mem_at_end": True, "read_mem_from_cache": False}
  cfg = rmt.model_config_from_rmt_hparams(rmt.load_rmt_hparams(hp))
  base = cfg.with_memory("tokens", num_mem_tokens=0)
  params = convert.unflatten_params(
      {p: np.zeros(s, np.float32) for p, s in convert.expected_param_shapes(base).items()}
  )
  state = convert.state_dict_from_params(params, base)
  state["mem_tokens"] = np.full((2, 1, cfg.d_model), np.nan, np.float32)
  with pytest.raises(convert.ConvertError, match="mem_tokens holds 32 NaN or infinite values"):
    rmt.params_from_rmt_state_dict(state, cfg)


@pytest.mark.parametrize("existing", [False, True])
def test_a_conversion_that_fails_while_writing_leaves_nothing_behind(
    existing, tmp_path, monkeypatch
):
  """A failure inside the checkpoint's write (here injected) removes the
  config files and checkpoints/ the conversion made; a directory given
  keeps what it held."""
  from transformer_xl import convert
  from transformer_xl.run import checkpointing

  cfg = convert.model_config_from_hparams(convert.load_hparams(BASE))
  params = convert.unflatten_params(
      {p: np.zeros(s, np.float32) for p, s in convert.expected_param_shapes(cfg).items()}
  )
  workdir = tmp_path / "wd"
  if existing:
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")

  def fail(*args, **kwargs):
    raise checkpointing.CheckpointError("injected: the disk went away")

  monkeypatch.setattr(checkpointing, "save", fail)
  with pytest.raises(checkpointing.CheckpointError, match="injected"):
    convert.write_workdir(str(workdir), params, cfg)
  if existing:
    assert sorted(p.name for p in workdir.iterdir()) == ["notes.txt"]
  else:
    assert not workdir.exists()


# A bAbI file a user could give: each case one line naming the file and split, before any
# text is generated.
BAD_BABI = {
    "a Latin-1 byte": (
        lambda p: p.write_bytes(p.read_bytes() + b"1 Mary went to the caf\xe9.\n"),
        "not UTF-8 text",
    ),
    "random bytes": (lambda p: p.write_bytes(bytes(range(200, 256)) * 20), "not UTF-8 text"),
    "empty": (lambda p: p.write_text(""), "is empty"),
    "not bAbI": (lambda p: p.write_text("hello world\nthis is prose\n"), "is not 'N text'"),
    "no question": (
        lambda p: p.write_text("1 Mary moved to the hallway.\n2 John went home.\n"),
        "no question line",
    ),
}


@pytest.mark.parametrize("case", list(BAD_BABI))
def test_a_bad_babi_file_names_the_file_and_what_is_wrong(case, tmp_path):
  from transformer_xl import data

  cfg = babilong_data_cfg(tmp_path)
  (train,) = (tmp_path / "babi").glob("*_train.txt")
  write, expected = BAD_BABI[case]
  write(train)
  with pytest.raises(data.DataError) as err:
    data.load_configured(cfg)
  message = str(err.value)
  assert train.name in message and expected in message, message
  assert "\n" not in message and "babilong_valid_size" not in message


def test_every_sample_dropped_by_max_n_facts_says_so_and_a_negative_one_is_refused(tmp_path):
  from transformer_xl import data

  with pytest.raises(data.DataError, match=r"data.babilong_max_n_facts=1 drops every one"):
    data.load_configured(babilong_data_cfg(tmp_path, babilong_max_n_facts=1))
  with pytest.raises(
      default_config.ConfigError, match=r"babilong_max_n_facts=-1 must be an integer >= 0"
  ):
    data.load_configured(babilong_data_cfg(tmp_path, babilong_max_n_facts=-1))


def test_init_from_the_runs_own_workdir_is_refused_before_the_data(tmp_path):
  workdir = tmp_path / "w"
  r = run_main(
      [
          f"--config={CONFIGS / 'quickstart.py'}",
          f"--workdir={workdir}",
          f"--config.train.init_from={tmp_path}/./w/",  # the same directory, written otherwise
          f"--config.data.manual_dir={tmp_path / 'nowhere'}",
          "--config.data.download=False",
      ],
      devices=1,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert "is this run's own --workdir" in r.stderr and "drop train.init_from" in r.stderr
  assert "Corpus" not in r.stdout + r.stderr  # refused before any data is read


def test_armt_hparams_without_a_vocabulary_size_ask_for_vocab_size(tmp_path):
  from transformer_xl.convert import ConvertError, armt

  _, path = armt_fixture_inputs(tmp_path)
  hparams = json.loads(path.read_text())
  del hparams["transfo_xl_config"]["vocab_size"]
  with pytest.raises(ConvertError, match=r"transfo_xl_config has no vocab_size \(HuggingFace"):
    armt.load_armt_hparams(hparams)
  hparams["transfo_xl_config"]["n_token"] = 24  # the reference's name is accepted too
  assert armt.load_armt_hparams(hparams)["hparams"]["n_token"] == 24


def test_random_bytes_named_pt_are_not_called_pickled_objects(tmp_path):
  import torch

  from transformer_xl.convert import ConvertError, pytorch

  path = tmp_path / "model.pt"
  path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
  with pytest.raises(ConvertError) as err:
    pytorch.read_state_dict(str(path))
  assert "damaged or not a torch file" in str(err.value) and "pickled" not in str(err.value)
  # A real pickle of more than tensors is still described as such.
  torch.save({"w": torch.zeros(2), "module": torch.nn.Linear(2, 2)}, tmp_path / "whole.pt")
  with pytest.raises(ConvertError, match="holds pickled Python objects"):
    pytorch.read_state_dict(str(tmp_path / "whole.pt"))


@pytest.mark.parametrize("source", ["pytorch", "safetensors", "tf"])
def test_armt_hparams_with_another_converter_suggest_from_armt(source, tmp_path):
  from transformer_xl import convert

  _, hparams = armt_fixture_inputs(tmp_path)
  checkpoint = tmp_path / ("x.safetensors" if source == "safetensors" else "x.pt")
  with pytest.raises(convert.ConvertError) as err:
    convert.convert_to_workdir(source, str(checkpoint), str(hparams), str(tmp_path / "w"))
  message = str(err.value)
  assert "use --from=armt" in message or "convert with --from=armt" in message, message
  assert len(message) < 300 and not (tmp_path / "w").exists()


def test_a_repeated_override_is_refused_not_joined(tmp_path):
  r = run_main(
      [
          f"--config={CONFIGS / 'quickstart.py'}",
          f"--workdir={tmp_path}",
          "--config.model.memory=knn",
          "--config.model.knn.layers=(-1,)",
          "--config.model.knn.layers=(1,)",
      ],
      devices=1,
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  (line,) = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert "--config.model.knn.layers is given twice" in line


def test_another_memory_on_a_trained_workdir_says_the_memory_is_the_models(tmp_path):
  """--mode=eval --config.model.memory=xl on a kNN workdir: one line saying the memory
  is the trained model's (not "leave model.knn at its defaults")."""
  from transformer_xl.run import workdir as wd

  from helpers import tiny_model_config

  config = load_config("quickstart")
  config.model.memory = "knn"
  config.model.knn.update(memory_size=16, num_neighbors=4, layers=(-1,))
  wd.save_config(str(tmp_path), config)
  cfg = tiny_model_config(
      memory="knn", knn={"memory_size": 16, "num_neighbors": 4, "layers": (-1,)}
  )
  wd.save_model_config(str(tmp_path), cfg, "word", "ptb")
  r = run_main([f"--workdir={tmp_path}", "--mode=eval", "--config.model.memory=xl"], devices=1)
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  (line,) = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert "was trained with model.memory='knn'" in line and "at its defaults" not in line


# ---------------------------------------------------------------------------------------------
# Mutants of round 5 the suite let through: each a fast test that the mutant fails.


def test_babilong_greedy_scores_cut_the_prediction_at_the_first_eos(tmp_path):
  """An answer written after an end token does not count (their compare_answers
  reads the decoded text up to the first eos)."""
  from transformer_xl import data

  corpus = data.load_configured(babilong_data_cfg(tmp_path))
  ex = corpus.examples["test"][:3]
  a_len, eos = corpus.settings.answer_len, corpus.boundary_id
  truth = ex[:, -a_len:]
  preds = truth.copy()  # row 0: the answer, then eos: right
  preds[1] = np.roll(truth[1], 1)  # row 1: eos first, then the answer: wrong
  preds[1][0] = eos
  preds[2] = eos  # row 2: nothing: wrong
  got = corpus.greedy_scores("test", ex, preds)
  assert got["babilong_accuracy"] == pytest.approx(1 / 3)


def test_babilong_splits_have_their_sizes_and_valid_is_not_trained_on(tmp_path, monkeypatch):
  """The validation samples (the train file's last babilong_valid_size) are not in
  the training split; test is the test file's."""
  from transformer_xl import data
  from transformer_xl.data import babilong

  orders = {}
  generate = babilong.generate_split

  def recording(samples, documents, encode, s, seed, order, sizes):
    orders[seed - s.seed] = (len(samples), list(map(int, order)))
    return generate(samples, documents, encode, s, seed, order, sizes)

  monkeypatch.setattr(babilong, "generate_split", recording)
  corpus = data.load_configured(babilong_data_cfg(tmp_path, babilong_valid_size=10))
  for split in ("train", "valid", "test"):
    corpus.examples[split]  # generated when first read
  (n_train_file, train), (_, valid), (_, test) = orders[2], orders[1], orders[0]
  assert len(valid) == 10 and valid == list(range(n_train_file - 10, n_train_file))
  assert len(train) == n_train_file - 10 and not set(train) & set(valid)
  assert corpus.examples["valid"].shape[0] == 10 and len(test) == corpus.examples["test"].shape[0]


def test_the_fork_converter_fills_in_the_forks_own_defaults():
  """An LM-RMT hparams file without mem_at_end / read_mem_from_cache converts to
  the model the fork builds without them: its MemTransformerLM.__init__ defaults
  are mem_at_end=True, read_mem_from_cache=False (booydar/LM-RMT,
  pytorch/mem_transformer.py); lm_rmt_mem.npz was made with those values given."""
  from transformer_xl.convert import rmt
  from transformer_xl.model.memory.tokens import MemoryTokens

  hp = json.loads(str(np.load(REPO / "tests" / "fixtures" / "lm_rmt_mem.npz")["hparams"]))
  assert (hp.pop("mem_at_end"), hp.pop("read_mem_from_cache")) == (True, False)
  s = MemoryTokens.settings(rmt.model_config_from_rmt_hparams(rmt.load_rmt_hparams(hp)))
  assert (s.mem_at_end, s.read_mem_from_cache, s.num_mem_tokens) == (True, False, 2)


def test_the_knn_memory_attention_scales_by_the_absolute_scale():
  """meliad's attention_scale is used as |scale|: a negative learned scale attends
  as its absolute value does (the initial scale of 1 hides the sign)."""
  import jax
  from memory_cases import _tokens, model_config, model_scores, params_of

  cfg = model_config("knn")
  params = params_of(cfg)
  paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0] if "knn_scale" in str(p)]
  assert paths
  flipped = jax.tree_util.tree_map_with_path(
      lambda p, x: -x if "knn_scale" in str(p) else x, params
  )
  tokens = _tokens(2, 6)  # 6 segments: the store holds earlier ones to retrieve from
  a, _ = model_scores(cfg, params, tokens)
  b, _ = model_scores(cfg, flipped, tokens)
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  c, _ = model_scores(
      cfg,
      jax.tree_util.tree_map_with_path(lambda p, x: 3 * x if "knn_scale" in str(p) else x, params),
      tokens,
  )
  assert np.abs(c - a).max() > 1e-4  # the scale matters at all


def test_an_armt_checkpoint_converted_in_process_scores_as_their_wrapper(tmp_path):
  """The fast form of test_armt_convert's conversion check: their wrapper's state
  dict converted (W_mv transposed, the cell's copies folded in) scores their
  NLLs, segment by segment from an empty memory."""
  import jax

  from transformer_xl import sharding
  from transformer_xl.convert import armt
  from transformer_xl.inference import evaluate

  state, hparams = armt_fixture_inputs(tmp_path)
  h = armt.load_armt_hparams(str(hparams))
  cfg = armt.model_config_from_armt_hparams(h)
  params = jax.tree_util.tree_map(np.asarray, armt.params_from_armt_state_dict(state, cfg))
  config = load_config("quickstart")
  config.eval.update(tgt_len=4, mem_len=0, same_length=False, clamp_len=0, global_batch=2)
  mesh = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  f = np.load(REPO / "tests" / "fixtures" / "armt_model.npz")
  got = evaluate.Evaluator(config, cfg, None, mesh).score(params, f["tokens"])
  np.testing.assert_allclose(got, f["corr/nll"], rtol=1e-5, atol=1e-5)


def test_an_eval_store_size_override_is_the_evaluated_models(tmp_path):
  """eval.knn.memory_size (and num_neighbors) replace the trained model's in the
  evaluation model, and the evaluation memory has that many slots."""
  import jax

  from transformer_xl.inference import eval_steps
  from transformer_xl.model import memory
  from transformer_xl.model.memory.knn import KNNMemory

  from helpers import tiny_model_config

  cfg = tiny_model_config(
      memory="knn", knn={"memory_size": 16, "num_neighbors": 4, "layers": (-1,)}
  )
  config = load_config("quickstart")
  config.model.memory = "knn"
  config.eval.knn.memory_size, config.eval.knn.num_neighbors = 48, 8
  ecfg = eval_steps.eval_model_config(config, cfg)
  s = KNNMemory.settings(ecfg)
  assert (s.memory_size, s.num_neighbors) == (48, 8)
  assert KNNMemory.settings(cfg).memory_size == 16  # the trained model's is unchanged
  mem = jax.eval_shape(lambda: memory.init_memory(ecfg, 2))
  assert mem.variant_state["knn_keys_NxBxHxSxDh"].shape[3] == 48


def test_babilong_curriculum_lengths_leave_room_for_the_question(tmp_path, monkeypatch):
  """data.babilong_train_sample_sizes are whole samples: the context drawn for
  each is the size less data.babilong_qa_margin (the question and answer)."""
  from transformer_xl import data
  from transformer_xl.data import babilong

  sizes = {}
  generate = babilong.generate_split

  def recording(samples, documents, encode, s, seed, order, sample_sizes):
    sizes[seed - s.seed] = sample_sizes
    return generate(samples, documents, encode, s, seed, order, sample_sizes)

  monkeypatch.setattr(babilong, "generate_split", recording)
  cfg = babilong_data_cfg(tmp_path, babilong_train_sample_sizes="100,160", babilong_qa_margin=30)
  corpus = data.load_configured(cfg)
  corpus.examples["train"], corpus.examples["test"]
  assert sizes[2] == [70, 130] and sizes[0] == 130  # 160 - 30: the test split's


def test_a_model_converted_without_a_dataset_names_no_corpus(tmp_path):
  """config.json says data.dataset='converted' (model_config.json too); generation
  on it is one line saying so, not a download of the default corpus."""
  from transformer_xl import convert

  cfg = convert.model_config_from_hparams(convert.load_hparams(BASE))
  params = convert.unflatten_params(
      {p: np.zeros(s, np.float32) for p, s in convert.expected_param_shapes(cfg).items()}
  )
  workdir = tmp_path / "wd"
  convert.write_workdir(str(workdir), params, cfg)
  assert json.loads((workdir / "config.json").read_text())["data"]["dataset"] == "converted"
  r = run_main(
      [f"--workdir={workdir}", "--mode=generate", "--prompt=the", "--num_tokens=2"],
      devices=1,
      env={"TFDS_DATA_DIR": str(tmp_path / "tfds")},
  )
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert "converted without --dataset" in r.stderr and "--mode=score --tokens" in r.stderr
  assert not (tmp_path / "tfds").exists()  # nothing downloaded or prepared
