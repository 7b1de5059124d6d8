"""``--config.<section>.<key>=value`` overrides on a workdir's saved config (issue 38).

``--mode=eval|score|generate`` without ``--config`` read ``W/config.json``
and apply the overrides to it (``cli/saved_config.py``): the evaluation
settings, the free model settings (the Pallas kernel really used in score
and generate), the mesh (a ``train.global_batch`` the new data axis does not
divide is no reason to refuse an evaluation).  Refused in one line each: an
architecture change (naming the key, before anything is restored or
compiled), a bad value, an unknown key, overrides on a workdir without
``config.json``, and overrides with ``--mode=train`` but no ``--config``.

The end-to-end cases run the real command in subprocesses on one CONVERTED
workdir (``convert.write_workdir``, as the converter writes it: a
PTB-format sample, random parameters); the argv rewriting is also tested
in-process.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from absl import flags

from transformer_xl import data, default_config, errors
from transformer_xl.model import memory
from transformer_xl.run import workdir as wd

from helpers import run_python, tiny_model_config, write_ptb_sample

MODEL = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, tgt_len=8, mem_len=8)
# Evaluation settings other than the saved ones (tgt_len = mem_len = 8, clamp_len 0).
EVAL = ["--config.eval.tgt_len=6", "--config.eval.mem_len=24", "--config.eval.clamp_len=16"]

# The command line with two counters: how often the Pallas kernel was traced, and
# how often a checkpoint was restored (0: the run stopped before anything compiled).
WRAPPER = """
import atexit, json, sys
from transformer_xl.model import pallas_attention
from transformer_xl.run import run_dir
counts = {"pallas": 0, "restore": 0}
kernel, restore = pallas_attention.rel_attention, run_dir.restore_params
def counted(*args, **kwargs):
  counts["pallas"] += 1
  return kernel(*args, **kwargs)
def restored(*args, **kwargs):
  counts["restore"] += 1
  return restore(*args, **kwargs)
pallas_attention.rel_attention, run_dir.restore_params = counted, restored
atexit.register(lambda: print("COUNTS " + json.dumps(counts), flush=True))
from absl import app
from transformer_xl import main
from transformer_xl.cli import user_errors
app.run(main.main, flags_parser=user_errors.parse_flags)
"""


def _main(args, devices=1, counted=False, timeout=600):
  """``python -m transformer_xl.main ARGS`` (``counted``: through WRAPPER) on
  ``devices`` CPU devices; returns (CompletedProcess, counts or None)."""
  command = ["-c", WRAPPER] if counted else ["-m", "transformer_xl.main"]
  r = run_python([*command, *args], devices=devices, timeout=timeout)
  counts = None
  if counted:
    lines = [line for line in r.stdout.splitlines() if line.startswith("COUNTS ")]
    counts = json.loads(lines[-1][len("COUNTS ") :]) if lines else None
  return r, counts


def _one_error(r, *names):
  """Exit status 1, one ``error:`` message on stderr naming ``names``, no traceback;
  returns the message (one line, or ``default_config.validate``'s usual block: an
  ``Invalid config:`` line, then one line per problem)."""
  assert r.returncode == 1, r.stderr[-3000:]
  assert "Traceback" not in r.stderr and r.stderr.count("error:") == 1, r.stderr[-3000:]
  message = r.stderr[r.stderr.index("error:") :].strip()
  lines = message.splitlines()
  assert len(lines) == 1 or lines[0] == "error: Invalid config:", message
  for name in names:
    assert name in message, message
  return message


CONFIG_FILE = """
from transformer_xl import default_config
from transformer_xl.model import models


def get_config():
  c = default_config.get_config()
  default_config.set_model_config(c, models.ModelConfig.from_dict({model!r}))
  c.data.update({data!r})
  c.eval.update(tgt_len=8, mem_len=8, clamp_len=0, same_length=True, global_batch=1)
  c.train.global_batch = 1
  return c
"""


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """(root, workdir, config file, valid tokens [1, N+1]): a workdir written by the
  converter (random parameters for a PTB-format sample's vocabulary; saved eval
  tgt_len = mem_len = 8, global batch 1), and a --config file of the same settings."""
  from transformer_xl import convert

  root = tmp_path_factory.mktemp("converted")
  manual, data_dir = write_ptb_sample(root / "ptb", n_lines=(60, 12, 12)), root / "tfds"
  data_args = dict(
      data_dir=str(data_dir), manual_dir=str(manual), download=False, verify_checksums=False
  )
  corpus = data.load_corpus("ptb", **data_args)
  cfg = tiny_model_config(n_token=corpus.vocab_size, same_length=True, **MODEL)
  rng = np.random.default_rng(0)
  params = convert.unflatten_params(
      {
          p: (0.5 * rng.normal(size=s)).astype(np.float32)
          for p, s in convert.expected_param_shapes(cfg).items()
      }
  )
  workdir = root / "wd"
  convert.write_workdir(str(workdir), params, cfg, dataset="ptb", unit="word", **data_args)
  config_file = root / "same_as_saved.py"
  # As files are written: the config file must read the same in a subprocess where
  # the test-only variants (tests/memory_variants) are not registered.
  model = memory.without_defaults(cfg.to_dict())
  config_file.write_text(CONFIG_FILE.format(model=model, data=dict(dataset="ptb", **data_args)))
  namespace: dict = {}
  exec(compile(config_file.read_text(), str(config_file), "exec"), namespace)
  assert namespace["get_config"]().to_dict() == wd.load_config(str(workdir)).to_dict()
  valid = corpus.splits["valid"]
  tokens = np.concatenate([[corpus.boundary_id], valid.read(0, valid.num_tokens)])[None, :]
  np.save(root / "valid.npy", tokens.astype(np.int32))
  return root, workdir, config_file, tokens


@pytest.fixture(scope="module")
def evals(converted):
  """eval_results.json of three --mode=eval runs: the saved config with the EVAL
  overrides, --config=<file> with the same overrides, and the saved config alone."""
  root, workdir, config_file, _ = converted
  results = {}
  for name, args in (
      ("overrides", EVAL),
      ("config_file", [f"--config={config_file}", *EVAL]),
      ("saved", []),
  ):
    r, _ = _main([f"--workdir={workdir}", "--mode=eval", *args])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    results[name] = json.loads((workdir / "eval_results.json").read_text())
  return results


@pytest.mark.slow
def test_eval_overrides_on_a_converted_workdir_equal_the_same_config_file(evals):
  over, same, saved = evals["overrides"], evals["config_file"], evals["saved"]
  assert over["eval"]["mem_len"] == 24 and over["eval"]["tgt_len"] == 6, over["eval"]
  assert saved["eval"]["mem_len"] == 8, saved["eval"]
  for split in ("valid", "test"):
    assert over[split]["loss_nats"] == same[split]["loss_nats"]
    assert over[split]["tokens"] == saved[split]["tokens"]
    assert abs(over[split]["loss_nats"] - saved[split]["loss_nats"]) > 1e-4


@pytest.mark.slow
def test_score_and_generate_take_eval_overrides_and_the_kernel(converted, evals, tmp_path):
  """score --tokens with the EVAL overrides: the valid stream's mean NLL is eval's
  valid loss at the same settings (eval.global_batch 1: one row); with
  --config.model.attention_impl=pallas the kernel is traced and the NLL is XLA's;
  generate with the kernel and a longer memory."""
  root, workdir, _, tokens = converted
  common = [f"--workdir={workdir}", "--mode=score", f"--tokens={root / 'valid.npy'}"]
  r, counts = _main([*common, f"--out={tmp_path / 'xla.npy'}", *EVAL], counted=True)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  assert counts == {"pallas": 0, "restore": 1}
  xla = np.load(tmp_path / "xla.npy")
  assert xla.shape == (1, tokens.shape[1] - 1)
  valid = evals["overrides"]["valid"]
  assert float(xla.mean(dtype=np.float64)) == pytest.approx(valid["loss_nats"], rel=1e-5)
  assert abs(valid["loss_nats"] - evals["saved"]["valid"]["loss_nats"]) > 1e-4

  kernel = ["--config.model.attention_impl=pallas"]
  r, counts = _main([*common, f"--out={tmp_path / 'pallas.npy'}", *EVAL, *kernel], counted=True)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  assert counts["pallas"] > 0 and counts["restore"] == 1, counts
  np.testing.assert_allclose(np.load(tmp_path / "pallas.npy"), xla, rtol=1e-5, atol=1e-5)

  r, counts = _main(
      [
          f"--workdir={workdir}",
          "--mode=generate",
          "--prompt=the cat",
          "--num_tokens=3",
          "--config.eval.mem_len=24",
          *kernel,
      ],
      counted=True,
  )
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  assert counts["pallas"] > 0 and counts["restore"] == 1, counts
  assert "memory 24" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_a_mesh_override_is_not_refused_for_the_training_batch(converted, evals):
  """2 devices, --config.mesh.shape=(2, 1): train.global_batch=1 (the converter's)
  does not divide the data axis, which evaluation does not use (before: refused);
  the eval batch is padded to the devices and the result is the one-device one."""
  _, workdir, _, _ = converted
  r, _ = _main(
      [f"--workdir={workdir}", "--mode=eval", "--config.mesh.shape=(2, 1)", *EVAL], devices=2
  )
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  got = json.loads((workdir / "eval_results.json").read_text())
  for split in ("valid", "test"):
    want = evals["overrides"][split]["loss_nats"]
    assert got[split]["loss_nats"] == pytest.approx(want, rel=1e-5)


def test_validate_checks_the_training_batch_against_the_mesh_only_to_train():
  config = default_config.get_config()
  config.train.global_batch = 3  # a data axis of 2 does not divide it
  with pytest.raises(errors.ConfigError, match=r"train\.global_batch=3 is not divisible"):
    default_config.validate(config, 2)
  assert default_config.validate(config, 2, training=False) == (2, 1)
  config.train.update(global_batch=4, batch_chunk=4)  # 4 rows in 4 chunks on 2 devices
  with pytest.raises(errors.ConfigError, match="batch_chunk"):
    default_config.validate(config, 2)
  assert default_config.validate(config, 2, training=False) == (2, 1)
  config.eval.mem_len = -1  # everything else is still checked
  with pytest.raises(errors.ConfigError, match="mem_len"):
    default_config.validate(config, 2, training=False)


def test_the_python_api_loads_a_workdir_whose_training_batch_the_devices_do_not_divide(
    converted,
):
  """LanguageModel.from_workdir on this process's 8 devices: the converter's
  train.global_batch=1 is no reason to refuse (before: 'not divisible')."""
  from transformer_xl.inference import language_model

  _, workdir, _, _ = converted
  lm = language_model.LanguageModel.from_workdir(str(workdir))
  assert lm.config.train.global_batch == 1 and lm.mesh.size == 8


@pytest.mark.slow
def test_refused_overrides_are_one_line_before_anything_compiles(converted, tmp_path):
  root, workdir, _, _ = converted
  score = [f"--workdir={workdir}", "--mode=score", f"--tokens={root / 'valid.npy'}"]
  out = tmp_path / "nll.npy"
  r, counts = _main([*score, f"--out={out}", "--config.model.n_layer=3"], counted=True)
  line = _one_error(r, "model.n_layer=3 (trained: 2)", f"{workdir}/config.json")
  assert "--config.* overrides" in line, line
  assert counts == {"pallas": 0, "restore": 0} and not out.exists()

  r, counts = _main(
      [f"--workdir={workdir}", "--mode=eval", "--config.eval.method=windows"], counted=True
  )
  _one_error(r, "eval.method='windows'")
  assert counts["restore"] == 0

  r, _ = _main([*score, f"--out={out}", "--config.eval.no_such_key=1"])
  _one_error(r, "unknown config key", "no_such_key")

  empty = tmp_path / "no_config"
  empty.mkdir()
  r, _ = _main([f"--workdir={empty}", "--mode=eval", "--config.eval.mem_len=24"])
  with pytest.raises(FileNotFoundError) as missing:
    wd.load_config(str(empty))
  assert _one_error(r) == f"error: {missing.value}"

  r, _ = _main([f"--workdir={workdir}", "--config.train.num_steps=5"])
  _one_error(r, "--config=FILE", "train")


# In-process: how the command line is rewritten (no jax compile, no subprocess).


@pytest.fixture
def flag_values():
  """The flags ``saved_config`` reads: --mode, --workdir and a string and a bool flag."""
  fv = flags.FlagValues()
  flags.DEFINE_enum("mode", "train", ["train", "eval", "score", "generate"], "", flag_values=fv)
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  flags.DEFINE_string("prompt", None, "", flag_values=fv)
  flags.DEFINE_bool("debug", False, "", flag_values=fv)
  return fv


@pytest.fixture
def saved(tmp_path):
  """A workdir with a config.json (the defaults)."""
  workdir = tmp_path / "w"
  workdir.mkdir()
  wd.save_config(str(workdir), default_config.get_config())
  return workdir


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--mode=eval", "--workdir={w}"], marks=pytest.mark.smoke),
        ["--mode", "score", "--workdir", "{w}"],
        ["-mode=generate", "-workdir={w}", "--debug"],
        ["--mode=train", "--workdir={w}", "--prompt", "--mode=x", "--mode=eval"],
    ],
)
def test_overrides_without_config_read_the_saved_config(args, saved, flag_values):
  from transformer_xl.cli import saved_config

  args = [a.format(w=saved) for a in args]
  argv = ["main.py", *args, "--config.eval.mem_len=3", "--noconfig.eval.same_length"]
  got = saved_config.argv_with_saved_config(argv, flag_values)
  assert got == [argv[0], f"--config={saved_config.PATH}:{saved}", *argv[1:]]
  assert saved_config.get_config(str(saved)).to_dict() == wd.load_config(str(saved)).to_dict()
  source = saved_config.source(f"{saved_config.PATH}:{saved}")
  assert source == f"{saved}/config.json with the --config.* overrides"
  assert saved_config.source("configs/quickstart.py") is None


@pytest.mark.parametrize("boolean", ["--debug", "--nodebug", "-debug"])
def test_the_only_override_after_a_boolean_flag_still_reads_the_saved_config(
    boolean, saved, flag_values
):
  """A boolean flag takes no value: the override right after it is an
  override (were it read as the flag's value, the only override would
  silently never reach the saved config)."""
  from transformer_xl.cli import saved_config

  argv = ["main.py", "--mode=eval", f"--workdir={saved}", boolean, "--config.eval.mem_len=3"]
  got = saved_config.argv_with_saved_config(argv, flag_values)
  assert got == [argv[0], f"--config={saved_config.PATH}:{saved}", *argv[1:]]


@pytest.mark.parametrize(
    "args",
    [
        ["--mode=eval", "--workdir={w}"],  # no overrides
        [
            "--mode=eval",
            "--workdir={w}",
            "--config=configs/quickstart.py",
            "--config.eval.x=1",
        ],
        ["--mode=eval", "--workdir={w}", "--", "--config.eval.mem_len=1"],  # positional
    ],
)
def test_argv_without_overrides_or_with_config_is_unchanged(args, saved, flag_values):
  from transformer_xl.cli import saved_config

  argv = ["main.py", *(a.format(w=saved) for a in args)]
  assert saved_config.argv_with_saved_config(argv, flag_values) == argv
  other_tool = flags.FlagValues()  # no --mode, --workdir: not main's command line
  over = ["tool.py", f"--workdir={saved}", "--config.eval.mem_len=1"]
  assert saved_config.argv_with_saved_config(over, other_tool) == over


def test_overrides_that_cannot_read_a_saved_config_are_user_errors(saved, flag_values):
  from transformer_xl.cli import saved_config

  over = "--config.eval.mem_len=3"
  with pytest.raises(errors.ConfigError, match=r"--config=FILE.*train"):
    saved_config.argv_with_saved_config(["m", f"--workdir={saved}", over], flag_values)
  with pytest.raises(errors.ConfigError, match="--workdir"):
    saved_config.argv_with_saved_config(["m", "--mode=eval", over], flag_values)
  (saved / "config.json").write_text("{not json")
  with pytest.raises(errors.WorkdirError) as damaged:
    wd.load_config(str(saved))
  with pytest.raises(errors.WorkdirError) as got:
    saved_config.argv_with_saved_config(
        ["m", "--mode=eval", f"--workdir={saved}", over], flag_values
    )
  assert str(got.value) == str(damaged.value)
