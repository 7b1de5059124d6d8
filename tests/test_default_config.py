"""Config schema and validation: one error that lists every problem, the model
section derived from ModelConfig, and the converter's inverse."""
import dataclasses

import pytest

from transformer_xl import default_config, models


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
      (dict(mesh=dict(shape=(8, 1)), train=dict(global_batch=20)), "global_batch=20 is not divisible"),
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
    with pytest.raises(default_config.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       if "\\" not in message else message):
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
  for needle in ("model.dropout=1.5", "model.d_model=15", "model.remat='everything'",
                 "train.learning_rate=-1.0", "train.clip=0.0", "eval: tgt_len must be >= 1",
                 "data.dataset='enwik9'"):
    assert needle in message, (needle, message)
  assert message.count("\n  - ") == 7


def test_model_section_is_derived_from_model_config():
  c = default_config.get_config()
  fields = {f.name for f in dataclasses.fields(models.ModelConfig)}
  assert set(c.model.keys()) == fields - {"n_token"}
  cfg = default_config.model_config(c, 256)
  assert cfg == models.ModelConfig(n_token=256)


def test_vocabulary_checks_come_with_the_corpus():
  c = _ptb_config()
  c.model.cutoffs = (100, 20000)
  default_config.validate(c, 8)  # the vocabulary is not known yet: nothing to say
  with pytest.raises(default_config.ConfigError, match="must all be < n_token=10000"):
    default_config.model_config(c, 10_000)


def test_set_model_config_is_the_inverse_of_model_config():
  cfg = models.ModelConfig(n_token=100, n_layer=3, d_model=32, n_head=4, d_head=8, d_inner=64,
                           dropout=0.2, init_std=0.03, dtype="bfloat16", remat="save_proj",
                           proj_init_std=0.02, d_embed=16, div_val=2, cutoffs=(10, 50),
                           tie_projs=(False, True, True), clamp_len=7, same_length=True)
  c = default_config.get_config()
  default_config.set_model_config(c, cfg)
  assert default_config.model_config(c, 100) == cfg


def test_ranges_a_user_could_get_wrong_are_each_named_once():
  c = _ptb_config()
  c.model.update(dropatt=1.0, init_std=0.0)
  c.train.update(warmup_steps=10, num_steps=5, adam_b1=1.0, adam_b2=-0.1, adam_eps=0.0,
                 min_lr=1.0, nonfinite="ignore", max_skipped_steps=0, global_batch=0)
  c.eval.update(tgt_len=0)
  with pytest.raises(default_config.ConfigError) as err:
    default_config.validate(c, 8)
  message = str(err.value)
  for needle in ("model.dropatt=1.0 must be in [0, 1)", "model.init_std=0.0 must be > 0",
                 "train.warmup_steps=10 must be <= train.num_steps=5",
                 "train.adam_b1=1.0 must be in [0, 1)", "train.adam_b2=-0.1 must be in [0, 1)",
                 "train.adam_eps=0.0 must be > 0",
                 "train.min_lr=1.0 must be <= train.learning_rate=0.00025",
                 "train.nonfinite='ignore': use one of ('stop', 'skip')",
                 "train.max_skipped_steps=0 must be >= 1", "train.global_batch=0 must be >= 1",
                 "eval: tgt_len must be >= 1"):
    assert message.count(needle) == 1, (needle, message)
  assert message.count("\n  - ") == 11, message
  # Infinite rates are caught too.
  c = _ptb_config()
  c.train.learning_rate = float("inf")
  with pytest.raises(default_config.ConfigError, match="must be finite"):
    default_config.validate(c, 8)
