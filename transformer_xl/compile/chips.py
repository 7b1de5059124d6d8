"""TPU chips and slices: memory, peak speed, and the compiler's topology names.

Per chip, from the Cloud TPU documentation's system-architecture pages
(cloud.google.com/tpu/docs/{v2,v3,v4,v5e,v5p,v6e}, read 2026-12):

| chip | HBM per chip | HBM bandwidth | peak bf16 | JAX devices per chip |
|---|---|---|---|---|
| v2  | 16 GiB | 600 GB/s  | 45 TFLOP/s  | 2 (one per TensorCore) |
| v3  | 32 GiB | 900 GB/s  | 123 TFLOP/s | 2 (one per TensorCore) |
| v4  | 32 GiB | 1200 GB/s | 275 TFLOP/s | 1 (megacore) |
| v5e | 16 GiB | 819 GB/s  | 197 TFLOP/s | 1 |
| v5p | 95 GiB | 2765 GB/s | 459 TFLOP/s | 1 (megacore) |
| v6e | 32 GiB | 1640 GB/s | 918 TFLOP/s | 1 |

The numbers here are per JAX device (a v2/v3 TensorCore gets half its
chip's).  And one GPU, compiled by XLA:GPU through jax's CUDA plugin
(``[gpu-compile]``) for a target described here (``h100_target_config``),
with no GPU: the NVIDIA H100 SXM (datasheet: 80 GB HBM3 at 3.35 TB/s, 989
TFLOP/s dense bf16; 132 SMs of compute capability 9.0), as ``h100`` (one),
``h100x8`` (one host of eight) or ``h100:2x8`` (hosts x GPUs).  A slice type (``v4-128``: 128 TensorCores, 64 chips;
``v5e-256``/``v5litepod-256``, ``v6e-64``: chips) or the compiler's own
topology name (``v5e:16x16``, ``v4:4x4x4``) names the devices; libtpu's
compile-only client builds them (``compiler.topology_devices``).  The
TensorCore generations before v4 still compile with libtpu 0.0.42 (v2, v3).
"""

from __future__ import annotations

import dataclasses
import math
import re

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation, per JAX device."""

  name: str  # v2, v3, v4, v5e, v5p, v6e
  hbm_gib: float  # per JAX device
  hbm_bytes_per_s: float  # per JAX device
  peak_flops: float  # bf16 FLOP/s per JAX device
  devices_per_chip: int
  topology_prefix: str  # libtpu's name: v4:..., v5:... (v5p), v5e:...
  megacore: bool  # two TensorCores as one device: chip_config_name="megacore"
  dims: int  # torus dimensions of its topology names (2 or 3; GPUs: 0)
  platform: str = "tpu"  # or "cuda"


CHIPS = {
    "v2": Chip("v2", 8, 300e9, 22.5e12, 2, "v2", False, 2),
    "v3": Chip("v3", 16, 450e9, 61.5e12, 2, "v3", False, 2),
    "v4": Chip("v4", 32, 1200e9, 275e12, 1, "v4", True, 3),
    "v5e": Chip("v5e", 16, 819e9, 197e12, 1, "v5e", False, 2),
    "v5p": Chip("v5p", 95, 2765e9, 459e12, 1, "v5", True, 3),
    "v6e": Chip("v6e", 32, 1640e9, 918e12, 1, "v6e", False, 2),
    "h100": Chip("h100", 80, 3.35e12, 989e12, 1, "h100", False, 0, "cuda"),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e", "v5": "v5p"}


class TopologyError(ValueError):
  """A slice or topology name this module does not know; the message says which exist."""


@dataclasses.dataclass(frozen=True)
class Slice:
  """A single TPU slice: its chip, libtpu's topology name, its JAX devices."""

  chip: Chip
  topology: str  # e.g. "v4:4x4x4"
  devices: int
  name: str  # what the user typed, or the slice type it came from

  @property
  def chips(self) -> int:
    return self.devices // self.chip.devices_per_chip


def _grid(chips: int, dims: int) -> str:
  """The most cubic torus of ``chips`` chips as libtpu names it (2x2x1,
  2x2x4, 4x4x4 for 3-D; 2x2, 4x8, 16x16 for 2-D), sides powers of two."""
  if chips < 1 or chips & (chips - 1):
    raise TopologyError(f"{chips} chips: slices here have a power-of-two chip count")
  if dims == 2:
    if chips == 1:
      return "1x1"
    if chips == 2:
      return "1x2"
    log = int(math.log2(chips))
    a = 2 ** (log // 2)
    return f"{a}x{chips // a}"
  if chips <= 4:
    return {1: "1x1x1", 2: "1x2x1", 4: "2x2x1"}[chips]
  sides = [2, 2, 1]
  rest = chips // 4
  i = 2
  while rest > 1:  # grow the smallest side, the last first: 2x2x2, 2x2x4, 2x4x4, 4x4x4
    sides[i] *= 2
    rest //= 2
    i = min(range(3), key=lambda k: (sides[k], -k))
  sides.sort()
  return "x".join(map(str, sides))


def parse(name: str) -> Slice:
  """A slice type (``v4-128``, ``v3-32``, ``v5e-256``, ``v5litepod-16``,
  ``v5p-64``, ``v6e-8``) or a libtpu topology (``v5e:16x16``, ``v4:4x4x4``,
  ``v5:2x2x1`` or ``v5p:2x2x1``).

  Raises:
    TopologyError: an unknown generation or a malformed name.
  """
  text = name.strip()
  gpu = re.fullmatch(r"h100(?:(?:x|-)(\d+)|:(\d+)x(\d+))?", text)
  if gpu:
    per_host, hosts = int(gpu.group(1) or gpu.group(3) or 1), int(gpu.group(2) or 1)
    if per_host < 1 or hosts < 1 or per_host > 8:
      raise TopologyError(f"--topology={name!r}: 1 to 8 H100s per host, e.g. h100x8 or h100:2x8")
    return Slice(CHIPS["h100"], f"1x{hosts}x{per_host}", hosts * per_host, text)
  m = re.fullmatch(r"(v\d[a-z]*)([-:])([\dx]+)", text)
  if not m:
    raise TopologyError(
        f"--topology={name!r}: give a slice type (v4-128, v5e-256, v5p-64, v6e-16, v3-32), "
        "a libtpu topology (v5e:16x16, v4:4x4x4) or H100s (h100, h100x8, h100:2x8)"
    )
  gen, sep, size = m.groups()
  gen = _ALIASES.get(gen, gen)
  if gen not in CHIPS or CHIPS[gen].platform != "tpu":
    raise TopologyError(f"--topology={name!r}: unknown TPU generation; one of {sorted(CHIPS)}")
  chip = CHIPS[gen]
  if sep == ":":
    sides = [int(s) for s in size.split("x") if s]
    if len(sides) != chip.dims or min(sides) < 1:
      raise TopologyError(
          f"--topology={name!r}: {gen} topologies have {chip.dims} sides, e.g. "
          f"{chip.topology_prefix}:{_grid(4, chip.dims)}"
      )
    chips = math.prod(sides)
    return Slice(chip, f"{chip.topology_prefix}:{size}", chips * chip.devices_per_chip, text)
  if "x" in size:
    raise TopologyError(f"--topology={name!r}: a slice type ends in a number, e.g. {gen}-32")
  n = int(size)
  # v2/v3/v4/v5p slice types count TensorCores (2 per chip); v5e/v6e count chips.
  cores_per_chip = 2 if gen in ("v2", "v3", "v4", "v5p") else 1
  if n % cores_per_chip:
    raise TopologyError(f"--topology={name!r}: {gen} slice types count {cores_per_chip} per chip")
  chips = n // cores_per_chip
  return Slice(
      chip, f"{chip.topology_prefix}:{_grid(chips, chip.dims)}", chips * chip.devices_per_chip, text
  )


def for_devices(kind: str, devices: int) -> Slice:
  """The slice of ``devices`` JAX devices of chip ``kind`` (v3 and 8 ->
  v3-8; v4 and 4 -> v4-8; v5e and 16 -> v5e-16).

  Raises:
    TopologyError: an unknown kind or a count no slice has.
  """
  if kind not in CHIPS:
    raise TopologyError(f"unknown TPU generation {kind!r}; one of {sorted(CHIPS)}")
  if CHIPS[kind].platform == "cuda":
    return parse(f"{kind}x{devices}")
  cores = devices * (2 if kind in ("v4", "v5p") else 1)  # slice types count TensorCores
  return parse(f"{kind}-{cores}")


def h100_target_config() -> str:
  """XLA:GPU's target description (a ``GpuTargetConfigProto`` in text form)
  of an NVIDIA H100 SXM, for compiling without the GPU.

  The numbers are the published ones: NVIDIA's H100 datasheet and Hopper
  tuning guide (132 SMs, 1.98 GHz boost clock, 50 MiB L2, 3.35 TB/s of
  HBM3, 80 GiB) and the CUDA C++ Programming Guide's table for compute
  capability 9.0 (228 KiB of shared memory per SM, 227 KiB per block
  opted in, 48 KiB by default; 64 Ki registers per SM and per block; 2048
  threads per SM, 1024 per block; grid limits).  XLA reads them to tile
  its kernels; cuDNN's version is the one jax's CUDA 12 wheels bring.
  """
  return """gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  thread_dim_limit_x: 1024
  thread_dim_limit_y: 1024
  thread_dim_limit_z: 64
  memory_bandwidth: 3350000000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 85899345920
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  cuda_compute_capability { major: 9 minor: 0 }
}
platform_name: "CUDA"
dnn_version_info { major: 9 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""
