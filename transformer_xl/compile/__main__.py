r"""Compile a config's steps with the TPU compiler before you create the slice.

    python -m transformer_xl.compile --config=configs/enwik8_24l.py:v4-128
    python -m transformer_xl.compile --config=configs/enwik8_24l.py:v4-128 --topology=v5e:16x16
    python -m transformer_xl.compile --config=configs/wt103_large.py:v3-64 \
        --steps=train,eval,generate_token --config.model.attention_impl=pallas

Runs on a CPU machine with ``pip install 'transformer_xl[tpu-compile]'``
(libtpu's compile-only client; no TPU, nothing executed); H100s
(``--topology=h100x8``) with ``[gpu-compile]`` (jax's CUDA plugin and a
target description of the GPU; no GPU).  The devices are
the config's slice preset (``configs/FILE.py:PRESET``) or ``--topology``
(a slice type such as ``v5e-256`` or libtpu's name such as ``v5e:16x16``;
a topology other than the preset gets the preset's mesh rule for its
device count, ``presets.shard_over``).  For each step it prints, and
writes to ``--json``:

* memory per device (arguments, outputs, aliased, temporaries, generated
  code) against the chip's HBM, FITS / TIGHT / DOES NOT FIT, and for a step
  that does not fit the first remat / attn_block / train.batch_chunk
  setting that does;
* the matrix FLOPs and bytes accessed per device per step, and the
  collectives of the compiled program (count and bytes per step);
* the roofline ceiling: max(FLOPs / peak, bytes / HBM bandwidth) per
  device and the MFU it allows.  A ceiling, not a measurement.

Exit status: 0 when every step fits (FITS or TIGHT), 3 when one does not,
1 with one ``error:`` line for bad input (before anything is compiled).
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile only: never take a TPU in use

import sys

from absl import app, flags
from ml_collections import config_flags

from transformer_xl.compile import report

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py[:PRESET]).", lock_config=True
)
_TOPOLOGY = flags.DEFINE_string(
    "topology",
    None,
    "A slice type (v4-128, v5e-256, v5p-64, v6e-16, v3-32), a libtpu topology (v5e:16x16, "
    "v4:4x4x4) or H100s (h100, h100x8, h100:2x8; needs [gpu-compile]); default: the config's "
    "slice preset.",
)
_NUM_SLICES = flags.DEFINE_integer(
    "num_slices", 1, "Slices of --topology (multislice: the data axis spans them)."
)
_STEPS = flags.DEFINE_list(
    "steps",
    ["train", "eval"],
    "Steps to compile: train, eval, generate_segment, generate_token, generate_chunk "
    "(generate = the three generation steps).",
)
_VOCAB = flags.DEFINE_integer(
    "vocab", None, "Vocabulary size (default: the dataset's, for corpora of a fixed size)."
)
_MARGIN = flags.DEFINE_float("margin", 10.0, "Percent of HBM kept free for FITS (the rest: TIGHT).")
_NO_SEARCH = flags.DEFINE_bool("no_search", False, "No search for a setting that fits.")
_MAX_TRIES = flags.DEFINE_integer("max_tries", 12, "Compilations per step at most in the search.")
_JSON = flags.DEFINE_string(
    "json", None, "Write the results here (default: compile_<config>_<topology>.json in the cwd)."
)
_DEBUG = flags.DEFINE_bool("debug", False, "Show tracebacks of bad input too.")


def main(argv):
  """Flags in, one call out: ``report.run``."""
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}; flags only (see --help)")
  if _CONFIG.value is None:
    sys.exit("error: give --config=configs/FILE.py[:PRESET]")
  spec = config_flags.get_config_filename(flags.FLAGS["config"])
  result = report.run(
      _CONFIG.value,
      spec,
      _TOPOLOGY.value,
      _NUM_SLICES.value,
      _STEPS.value,
      _VOCAB.value,
      _MARGIN.value / 100,
      not _NO_SEARCH.value,
      _MAX_TRIES.value,
      _JSON.value,
      _DEBUG.value,
  )
  sys.exit(result)


def parse_flags(argv):
  """absl parsing with one ``error:`` line for a bad --config or flag."""
  from transformer_xl.cli import user_errors  # noqa: PLC0415

  problem = user_errors.config_file_problem(argv)
  if problem and "--debug" not in argv:
    sys.exit(f"error: {problem}")
  try:
    return flags.FLAGS(argv)
  except flags.Error as err:
    sys.exit(f"error: {err}")
  except (AttributeError, KeyError, ValueError, FileNotFoundError) as err:
    if "--debug" in argv:
      raise
    sys.exit(f"error: --config: {' '.join(str(err).split())}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
