"""Config schema and validation: one error that lists every problem, the model
section derived from ModelConfig, and the converter's inverse."""

import dataclasses
import math
import time

import ml_collections
import pytest

from transformer_xl import default_config
from transformer_xl.model import memory as memory_lib
from transformer_xl.model import models

from helpers import REPO, run_main


def _ptb_config():
  c = default_config.get_config()
  c.data.dataset = "ptb"
  c.train.global_batch = 16
  c.eval.global_batch = 8
  return c


def test_check_config_errors():
  assert default_config.validate(_ptb_config(), 8) == (8, 1)
  cases = [
      (dict(mesh=dict(shape=(3, 1))), "has 3 devices but 8"),
      (dict(mesh=dict(shape=(1, 8)), model=dict(n_head=12)), "n_head=12 is not divisible"),
      (
          dict(mesh=dict(shape=(8, 1)), train=dict(global_batch=20)),
          "global_batch=20 is not divisible",
      ),
      (dict(eval=dict(global_batch=0)), "eval.global_batch=0 must be >= 1"),
      (dict(mesh=dict(shape=(2, 4)), model=dict(n_head=6)), "n_head=6"),
      (dict(eval=dict(mem_len=0, same_length=True)), "same_length=True needs eval.mem_len"),
      (dict(data=dict(dataset="enwik9")), "data.dataset='enwik9'"),
      (dict(model=dict(attn_type=4)), "attn_type=4"),
      (dict(model=dict(attn_type=3, d_head=32)), "n_head \\* d_head == d_model"),
      (dict(train=dict(batch_chunk=4)), "batch_chunk \\* data axis = 4 \\* 8"),
  ]
  for overrides, message in cases:
    c = _ptb_config()
    for section, values in overrides.items():
      c[section].update(values)
    with pytest.raises(
        default_config.ConfigError,
        match=message.replace("(", r"\(").replace(")", r"\)") if "\\" not in message else message,
    ):
      default_config.validate(c, 8)


def test_check_config_counts_fsdp_as_data_parallel():
  c = default_config.get_config()
  c.data.dataset = "ptb"
  c.mesh.axis_names = ("data", "fsdp", "model")
  c.mesh.shape = (2, 2, 2)
  c.train.global_batch = 12
  c.eval.global_batch = 8
  assert default_config.validate(c, 8) == (2, 2, 2)
  c.train.global_batch = 10
  with pytest.raises(default_config.ConfigError, match="data x fsdp = 4"):
    default_config.validate(c, 8)
  c.mesh.axis_names = ("data", "model")
  with pytest.raises(default_config.ConfigError, match="one size per axis"):
    default_config.validate(c, 8)


def test_one_error_lists_every_problem():
  c = _ptb_config()
  c.model.update(dropout=1.5, d_model=15, remat="everything")
  c.train.update(learning_rate=-1.0, clip=0.0)
  c.eval.update(tgt_len=0)
  c.data.dataset = "enwik9"
  with pytest.raises(default_config.ConfigError) as err:
    default_config.validate(c, 8)
  message = str(err.value)
  for needle in (
      "model.dropout=1.5",
      "model.d_model=15",
      "model.remat='everything'",
      "train.learning_rate=-1.0",
      "train.clip=0.0",
      "eval: tgt_len must be >= 1",
      "data.dataset='enwik9'",
  ):
    assert needle in message, (needle, message)
  assert message.count("\n  - ") == 7


def test_model_section_is_derived_from_model_config():
  c = default_config.get_config()
  fields = {f.name for f in dataclasses.fields(models.ModelConfig)}
  # The memory variants' settings are sections of their own (model.<variant>).
  sections = memory_lib.default_sections()
  assert {"compressive", "tokens"} <= set(sections)
  assert set(c.model.keys()) == fields - {"n_token", "memory_settings"} | set(sections)
  for name, section in sections.items():
    assert c.model[name].to_dict() == section, name
  cfg = default_config.model_config(c, 256)
  assert cfg == models.ModelConfig(n_token=256)


def test_vocabulary_checks_come_with_the_corpus():
  c = _ptb_config()
  c.model.cutoffs = (100, 20000)
  default_config.validate(c, 8)  # the vocabulary is not known yet: nothing to say
  with pytest.raises(default_config.ConfigError, match="must all be < n_token=10000"):
    default_config.model_config(c, 10_000)


def test_set_model_config_is_the_inverse_of_model_config():
  cfg = models.ModelConfig(
      n_token=100,
      n_layer=3,
      d_model=32,
      n_head=4,
      d_head=8,
      d_inner=64,
      dropout=0.2,
      init_std=0.03,
      dtype="bfloat16",
      remat="save_proj",
      proj_init_std=0.02,
      d_embed=16,
      div_val=2,
      cutoffs=(10, 50),
      tie_projs=(False, True, True),
      clamp_len=7,
      same_length=True,
      memory_settings={"tokens": {"num_mem_tokens": 2, "mem_at_end": False}},
  )
  c = default_config.get_config()
  default_config.set_model_config(c, cfg)
  assert default_config.model_config(c, 100) == cfg


def test_ranges_a_user_could_get_wrong_are_each_named_once():
  c = _ptb_config()
  c.model.update(dropatt=1.0, init_std=0.0)
  c.train.update(
      warmup_steps=10,
      num_steps=5,
      adam_b1=1.0,
      adam_b2=-0.1,
      adam_eps=0.0,
      min_lr=1.0,
      nonfinite="ignore",
      max_skipped_steps=0,
      global_batch=0,
  )
  c.eval.update(tgt_len=0)
  with pytest.raises(default_config.ConfigError) as err:
    default_config.validate(c, 8)
  message = str(err.value)
  for needle in (
      "model.dropatt=1.0 must be in [0, 1)",
      "model.init_std=0.0 must be > 0",
      "train.warmup_steps=10 must be <= train.num_steps=5",
      "train.adam_b1=1.0 must be in [0, 1)",
      "train.adam_b2=-0.1 must be in [0, 1)",
      "train.adam_eps=0.0 must be > 0",
      "train.min_lr=1.0 must be <= train.learning_rate=0.00025",
      "train.nonfinite='ignore': use one of ('stop', 'skip')",
      "train.max_skipped_steps=0 must be >= 1",
      "train.global_batch=0 must be >= 1",
      "eval: tgt_len must be >= 1",
  ):
    assert message.count(needle) == 1, (needle, message)
  assert message.count("\n  - ") == 11, message
  # Infinite rates are caught too.
  c = _ptb_config()
  c.train.learning_rate = float("inf")
  with pytest.raises(
      default_config.ConfigError,
      match=r"train\.learning_rate=inf is infinite: "
      r"give a finite value > 0 \(e\.g\. 0\.00025\)\.",
  ):
    default_config.validate(c, 8)


# ---------------------------------------------------------------------------
# NaN and inf: every float of the default config, each of nan, inf, -inf.


def _float_keys(node, prefix=""):
  """Dotted names of every float leaf of a config (found, not listed by hand:
  a float added to get_config later is checked here without a new test)."""
  keys = []
  for key, value in node.items():
    if isinstance(value, ml_collections.ConfigDict):
      keys += _float_keys(value, f"{prefix}{key}.")
    elif isinstance(value, float):
      keys.append(f"{prefix}{key}")
  return keys


FLOAT_KEYS = _float_keys(default_config.get_config())


def test_the_float_keys_are_found():
  assert {
      "model.dropout",
      "model.dropatt",
      "model.init_std",
      "model.proj_init_std",
      "train.learning_rate",
      "train.min_lr",
      "train.clip",
      "train.adam_b1",
      "train.adam_b2",
      "train.adam_eps",
  } <= set(FLOAT_KEYS)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_nonfinite_floats_are_refused(key, value):
  """One problem, naming the key and the value and asking for a finite one;
  +inf only where default_config.INFINITY_ALLOWED says what it means."""
  c = _ptb_config()
  section, name = key.rsplit(".", 1)
  c[section][name] = value
  if value == math.inf and key in default_config.INFINITY_ALLOWED:
    default_config.validate(c, 8)
    return
  with pytest.raises(default_config.ConfigError) as err:
    default_config.validate(c, 8)
  message = str(err.value)
  assert message.count("\n  - ") == 1, message  # named once, not also by its range check
  what = "is not a number" if math.isnan(value) else "is infinite"
  assert f"\n  - {key}={value} {what}: give a " in message, message
  assert "finite value" in message or key in default_config.INFINITY_ALLOWED, message
  if section == "model":  # a ModelConfig (e.g. a workdir's model_config.json) refuses it too
    with pytest.raises(ValueError, match=f"{key}={value} {what}"):
      models.ModelConfig(n_token=256, **{name: value})


def test_infinite_clip_means_no_clipping():
  import jax.numpy as jnp
  import optax

  assert set(default_config.INFINITY_ALLOWED) == {"train.clip"}
  g = {"w": jnp.asarray([3e10, -4e10])}  # any finite norm is < inf
  clip = optax.clip_by_global_norm(math.inf)
  assert (clip.update(g, clip.init(g))[0]["w"] == g["w"]).all()


def test_nonfinite_inside_a_tuple_is_refused():
  c = _ptb_config()
  c.model.cutoffs = (math.nan,)
  with pytest.raises(default_config.ConfigError, match=r"model\.cutoffs=\(nan,\) holds nan"):
    default_config.validate(c, 8)


def test_nan_min_lr_on_the_command_line_stops_before_compiling(tmp_path):
  """The user's case: the run used to start and stop at step 1 blaming the
  learning rate.  Now: one error line, exit status 1, no traceback, no corpus
  read, nothing compiled, nothing written into the workdir."""
  workdir = tmp_path / "wd"
  start = time.monotonic()
  r = run_main(
      [
          f"--config={REPO / 'configs' / 'quickstart.py'}",
          f"--workdir={workdir}",
          "--config.train.min_lr=nan",
          f"--config.data.data_dir={tmp_path / 'no_tfds'}",
          "--config.data.download=false",
      ],
      timeout=120,
  )
  elapsed = time.monotonic() - start
  assert r.returncode == 1, r.stderr[-3000:]
  assert "Traceback" not in r.stderr, r.stderr[-3000:]
  errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1, r.stderr
  assert "train.min_lr=nan is not a number: give a finite value >= 0" in r.stderr, r.stderr
  assert "Corpus" not in r.stdout and "Model:" not in r.stdout and "step " not in r.stdout
  assert not (workdir / "checkpoints").exists()
  assert elapsed < 30, elapsed
