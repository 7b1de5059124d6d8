"""The fsdp mesh axis: placement of parameters and rows, and equivalence with one device."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from transformer_xl import default_config, sharding
from transformer_xl.model import models
from transformer_xl.training import train_state

from helpers import run_steps, tiny_config

MESH3 = ((2, 2, 2), ("data", "fsdp", "model"))


@pytest.mark.smoke
def test_fsdp_shards_parameters_optimizer_state_and_rows():
  config = tiny_config()
  mesh = sharding.make_mesh(*MESH3)
  model = models.TransformerXL(default_config.model_config(config, 64))
  tx = train_state.make_optimizer(config.train)
  _, shardings = train_state.abstract_train_state(model, tx, 8, mesh)
  layers = shardings.params["layers"]
  assert layers["attn"]["qkv_net"]["kernel"].spec == P(None, "fsdp", None, "model", None)
  assert layers["pos_ff"]["ff_2"]["kernel"].spec == P(None, "model", "fsdp")
  mu = shardings.opt_state[1][0].mu
  assert mu["layers"]["attn"]["qkv_net"]["kernel"].spec == P(None, "fsdp", None, "model", None)
  assert shardings.memory.mems_LxBxMxD.spec == P(None, ("data", "fsdp"), None, None)
  assert sharding.batch_sharding(mesh).spec == P(("data", "fsdp"), None)
  assert sharding.data_parallel_size(mesh) == 4


@pytest.mark.slow
def test_fsdp_train_step_matches_single_device():
  tokens = np.random.default_rng(3).integers(0, 64, size=8 * 6 * 5 + 8).astype(np.int32)
  config = tiny_config()
  mesh1 = sharding.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
  mesh3 = sharding.make_mesh(*MESH3)
  losses1, state1 = run_steps(config, mesh1, tokens, 3)
  losses3, state3 = run_steps(config, mesh3, tokens, 3)
  np.testing.assert_allclose(losses3, losses1, rtol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(state3), jax.tree_util.tree_leaves(state1)):
    np.testing.assert_allclose(
        np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=2e-4, atol=2e-6
    )


@pytest.mark.parametrize(
    "name,preset,devices,per_device,mesh,eval_batch",
    [
        ("enwik8_24l", "v3-32", 32, 2, (1, 32, 1), 8),
        ("text8_24l", "v4-32", 16, 4, (1, 16, 1), 8),
        # 512 does not divide d_model 1280: a model axis of 2, so that fsdp (256) shards it.
        ("lm1b_large", "v3-512", 512, 2, (1, 256, 2), 16),
    ],
)
def test_slice_presets_give_valid_pod_configs(name, preset, devices, per_device, mesh, eval_batch):
  import importlib.util
  from pathlib import Path

  from transformer_xl import presets

  path = Path(__file__).resolve().parents[1] / "configs" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(preset)
  assert default_config.validate(c, devices) == mesh
  assert presets.per_device_batch(c, devices) == per_device
  assert c.model.dtype == "bfloat16" and c.model.remat == "full"
  assert c.eval.global_batch == eval_batch  # the paper's eval batch, padded by the evaluator
  with pytest.raises(default_config.ConfigError):
    default_config.validate(c, devices // 2)  # the wrong slice is caught up front
  with pytest.raises(ValueError, match="Unknown TPU slice preset"):
    module.get_config("v9-7")
