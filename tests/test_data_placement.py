"""Tests of transformer_xl.data.placement on 8 simulated CPU devices."""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

from transformer_xl import data  # noqa: E402
from transformer_xl.data import ArraySource  # noqa: E402

from data_samples import BOUNDARY, _random_stream  # noqa: E402


@pytest.fixture
def mesh():
  if jax.device_count() < 8:
    pytest.fail(
        f"expected 8 simulated CPU devices, got {jax.device_count()}; "
        f"XLA_FLAGS must be set before jax is imported."
    )
  return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def test_process_row_ids_single_process_has_all_rows(mesh):
  sharding = NamedSharding(mesh, P("data", None))
  assert data.process_row_ids(sharding, 8) == list(range(8))
  assert data.process_row_ids(sharding, 8, tgt_len=16) == list(range(8))
  both = NamedSharding(mesh, P(("data", "model"), None))
  assert data.process_row_ids(both, 16) == list(range(16))
  time_sharded = NamedSharding(mesh, P("data", "model"))
  assert data.process_row_ids(time_sharded, 4) == [0, 1, 2, 3]
  with pytest.raises(ValueError, match="global_batch"):
    data.process_row_ids(sharding, 0)


class _SubsetSharding:
  """Pretends only some devices are addressable (simulates one of several processes)."""

  def __init__(self, sharding, devices):
    self._sharding, self._devices = sharding, set(devices)
    self.device_set = sharding.device_set

  def addressable_devices_indices_map(self, shape):
    full = self._sharding.devices_indices_map(shape)
    return {d: idx for d, idx in full.items() if d in self._devices}


def test_process_row_ids_union_of_addressable_shards(mesh):
  sharding = NamedSharding(mesh, P("data", None))
  # "Process" owning the devices of mesh rows 1 and 3 (data shards 1 and 3).
  devices = list(mesh.devices[1]) + list(mesh.devices[3])
  assert data.process_row_ids(_SubsetSharding(sharding, devices), 8) == [2, 3, 6, 7]
  # Only the first device of each replicated pair: the same rows.
  devices = [mesh.devices[1, 0], mesh.devices[3, 0]]
  assert data.process_row_ids(_SubsetSharding(sharding, devices), 8) == [2, 3, 6, 7]


def test_process_row_ids_rejects_incompatible_batch(mesh):
  sharding = NamedSharding(mesh, P("data", None))
  with pytest.raises(ValueError, match="cannot shard"):
    data.process_row_ids(sharding, 6)


@pytest.mark.parametrize("spec", [P("data", None), P(("data", "model"), None), P()])
def test_to_global_batch_values_and_sharding(mesh, spec):
  sharding = NamedSharding(mesh, spec)
  global_batch = 8
  rows = data.process_row_ids(sharding, global_batch)
  it = data.EvalIterator(ArraySource(_random_stream(150)), global_batch, 6, BOUNDARY, row_ids=rows)
  for local in list(it)[:2]:
    out = data.to_global_batch(local, sharding, global_batch)
    assert set(out) == set(local)
    for key in ("inputs", "targets", "weights"):
      assert isinstance(out[key], jax.Array)
      assert out[key].shape == (global_batch, 6)
      assert out[key].dtype == local[key].dtype
      assert out[key].sharding == sharding
      np.testing.assert_array_equal(np.asarray(out[key]), local[key])
    assert out["reset"].shape == (global_batch,)
    assert out["reset"].dtype == np.bool_
    batch_axis = spec[0] if len(spec) else None
    assert out["reset"].sharding == NamedSharding(mesh, P(batch_axis))
    np.testing.assert_array_equal(np.asarray(out["reset"]), local["reset"])


def test_to_global_batch_shards_rows_across_devices(mesh):
  sharding = NamedSharding(mesh, P("data", None))
  local = next(data.TrainIterator(ArraySource(np.arange(400)), 8, 5))
  out = data.to_global_batch(local, sharding, 8)
  for shard in out["inputs"].addressable_shards:
    assert shard.data.shape == (2, 5)
    np.testing.assert_array_equal(np.asarray(shard.data), local["inputs"][shard.index])


def test_to_global_batch_needs_named_sharding(mesh):
  local = next(data.TrainIterator(ArraySource(np.arange(400)), 8, 5))
  fake = _SubsetSharding(NamedSharding(mesh, P("data", None)), [])
  with pytest.raises(TypeError, match="NamedSharding"):
    data.to_global_batch(local, fake, 8)
