"""The fused attention kernels compile with the real TPU compiler (Mosaic).

Compile only, from this CPU machine: libtpu describes a TPU topology
(``jax.experimental.topologies``) and ``jit(...).lower(...).compile()``
runs Mosaic and XLA:TPU for one of its devices; nothing runs.  Interpret
mode (test_pallas_attention) checks the same kernels' values, this checks
that Mosaic accepts them: the strided rotate they used before did not
compile for the backward pass on v5e ("the max shift in a vreg ... is larger
than the vreg's width 128") nor at all on v4 ("only supported in TPU v5+").
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_xl.model import pallas_attention

pytest.importorskip("libtpu", reason="needs libtpu (jax[tpu]) for the TPU compiler")
from jax.experimental import topologies  # noqa: E402

# libtpu takes a lock file per machine unless told that several processes may
# load it (xdist workers, other runs beside these): compiling needs no device.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def _device(chip):
  """One JAX device of a small slice of ``chip`` (v4, v5p: one device per chip, megacore)."""
  if chip in ("v4", "v5p"):
    topo = topologies.get_topology_desc(
        topology_name={"v4": "v4:2x2x1", "v5p": "v5:2x2x1"}[chip],
        platform="tpu",
        chip_config_name="megacore",
        chips_per_host_bounds=(2, 2, 1),
        num_slices=1,
        wrap=(False, False, False),
    )
  else:
    topo = topologies.get_topology_desc(topology_name=f"{chip}:2x2", platform="tpu")
  return topo.devices[0]


@pytest.mark.parametrize(
    "chip,t,m,dh,same_length,dtype",
    [
        ("v4", 128, 128, 64, False, "float32"),  # whole 128-blocks
        ("v5e", 128, 128, 64, False, "float32"),
        ("v4", 80, 200, 41, True, "bfloat16"),  # T, K, d_head off the tiles (wt103_base's 41)
        ("v5e", 80, 200, 41, True, "bfloat16"),
    ],
)
def test_forward_and_backward_compile_with_mosaic(chip, t, m, dh, same_length, dtype):
  """Forward and the gradient of every input (the dq, dk/dv and dr kernels)."""
  mesh = jax.sharding.Mesh(np.array([_device(chip)]), ("x",))
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  bsz, nh, k_len, dt = 1, 2, m + t, jnp.dtype(dtype)
  shapes = [(bsz, t, nh, dh), (bsz, k_len, nh, dh), (bsz, k_len, nh, dh), (k_len, nh, dh)]
  args = [jax.ShapeDtypeStruct(s, dt, sharding=rep) for s in shapes + [(nh, dh)] * 2]
  mlen = jax.ShapeDtypeStruct((bsz,), jnp.int32, sharding=rep)

  def attend(q, k, v, r, u, rr, mlen):
    return pallas_attention.rel_attention(
        q,
        k,
        v,
        r,
        u,
        rr,
        mlen,
        mem_len=m,
        same_length=same_length,
        flavor=pallas_attention.TPU,
    )

  def loss(*a):
    return jnp.sum(attend(*a).astype(jnp.float32))

  fwd = jax.jit(attend).lower(*args, mlen)
  assert "txl_attention_fwd" in fwd.as_text()
  fwd.compile()
  bwd = jax.jit(jax.grad(loss, argnums=range(6))).lower(*args, mlen)
  text = bwd.as_text()
  for kernel in ("txl_attention_dq", "txl_attention_dkv", "txl_attention_dr"):
    assert kernel in text, kernel
  bwd.compile()
