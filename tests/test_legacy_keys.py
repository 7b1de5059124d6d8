"""Files written before a model field was removed still load
(``model.config.LEGACY_KEYS``): a workdir's model_config.json and
config.json, a checkpoint's recorded model, with ``ext_len: 0`` (the only
value earlier versions could write) load with the key dropped; any other
value is refused with a message naming the key."""

import json

import pytest

from transformer_xl import default_config
from transformer_xl.model import config as model_config_lib
from transformer_xl.model import models
from transformer_xl.run import workdir as wd

from helpers import tiny_model_config

CFG = tiny_model_config(n_token=40)


def _old_model_config_json(workdir, ext_len):
  """A model_config.json as earlier versions wrote it (with ext_len)."""
  wd.save_model_config(str(workdir), CFG, "word", "ptb")
  path = workdir / "model_config.json"
  saved = json.loads(path.read_text())
  saved["model"]["ext_len"] = ext_len
  path.write_text(json.dumps(saved, indent=2))


def _old_config_json(workdir, ext_len):
  """A config.json as earlier versions wrote it (model.ext_len)."""
  wd.save_config(str(workdir), default_config.get_config())
  path = workdir / "config.json"
  saved = json.loads(path.read_text())
  saved["model"]["ext_len"] = ext_len
  path.write_text(json.dumps(saved, indent=2))


def test_the_removed_field_is_gone():
  assert "ext_len" not in models.ModelConfig.defaults()
  assert "ext_len" not in default_config.get_config().model
  with pytest.raises(TypeError, match="ext_len"):
    models.ModelConfig(n_token=40, ext_len=0)


def test_an_old_model_config_json_with_ext_len_0_loads(tmp_path):
  _old_model_config_json(tmp_path, 0)
  assert "ext_len" in json.loads((tmp_path / "model_config.json").read_text())["model"]
  assert wd.load_model_config(str(tmp_path)) == (CFG, "word")


def test_an_old_model_config_json_with_ext_len_3_is_refused(tmp_path):
  _old_model_config_json(tmp_path, 3)
  with pytest.raises(wd.WorkdirError, match=r"model\.ext_len=3: the extended context") as err:
    wd.load_model_config(str(tmp_path))
  assert str(err.value).count("ext_len=3") == 1, err.value


def test_from_dict_drops_the_legacy_key_at_its_one_value():
  fields = {**CFG.to_dict(), "ext_len": 0}
  assert models.ModelConfig.from_dict(fields) == CFG
  assert "ext_len" in fields  # the caller's dict is left as it was
  for bad in (3, -1, "0", None):
    with pytest.raises(ValueError, match=rf"^model\.ext_len={bad!r}: .*not supported"):
      models.ModelConfig.from_dict({**fields, "ext_len": bad})
  assert model_config_lib.drop_legacy_keys({"ext_len": 0, "d_model": 8}) == {"d_model": 8}


def test_an_old_config_json_with_ext_len_0_loads(tmp_path):
  _old_config_json(tmp_path, 0)
  loaded = wd.load_config(str(tmp_path))
  assert "ext_len" not in loaded.model
  assert loaded.to_json_best_effort() == default_config.get_config().to_json_best_effort()


def test_an_old_config_json_with_ext_len_3_is_refused(tmp_path):
  _old_config_json(tmp_path, 3)
  with pytest.raises(wd.WorkdirError, match=r"model\.ext_len=3: the extended context"):
    wd.load_config(str(tmp_path))


def test_a_damaged_config_json_is_still_called_damaged(tmp_path):
  (tmp_path / "config.json").write_text("[1, 2]")
  with pytest.raises(wd.WorkdirError, match="is damaged"):
    wd.load_config(str(tmp_path))


def test_an_old_checkpoint_meta_with_ext_len_0_matches_the_run():
  new = wd.checkpoint_meta(CFG, "word", "ptb", 8)
  old = json.loads(json.dumps(new))
  old["model"]["ext_len"] = 0
  assert "ext_len" not in new["model"]
  assert wd.run_differences(old, new) == [] and wd.run_differences(new, old) == []


def test_the_reference_format_keeps_ext_len_at_0():
  """The reference's hyperparameters have ext_len: a released model with
  another value is refused, an export writes 0."""
  from transformer_xl.convert import hparams

  hp = hparams.hparams_from_model_config(CFG)
  assert hp["ext_len"] == 0
  assert hparams.load_hparams(hp)["ext_len"] == 0  # read back
  with pytest.raises(hparams.ConvertError, match=r"ext_len=2: extended context is not supported"):
    hparams.load_hparams({**hp, "ext_len": 2})
