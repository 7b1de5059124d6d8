"""Command line of the converter: ``python -m transformer_xl.convert --help``.

The flags, and ``main``, which parses them and calls
``transformer_xl.convert.convert_to_workdir`` (``--from``) or
``transformer_xl.convert.export_pytorch`` (``--to``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import transformer_xl.convert as package
from transformer_xl.convert import pretrained, releases
from transformer_xl.convert.download import CACHE_ENV
from transformer_xl.convert.errors import ConvertError, one_line
from transformer_xl.convert.export import export_pytorch
from transformer_xl.convert.vocab import UNSEEN_BIAS
from transformer_xl.convert.workdir_io import convert_to_workdir


def _define_flags(fv):
  """Defines the command-line flags in the FlagValues ``fv``; returns name -> FlagHolder.

  A FlagValues of its own, so that the converter's flags never collide with
  absl's global ones (``transformer_xl.main`` defines ``--workdir`` there).
  """
  from absl import flags

  f = {}
  f["from"] = flags.DEFINE_enum(
      "from",
      None,
      ["pytorch", "safetensors", "tf", "armt"],
      "Convert a reference checkpoint into --workdir (safetensors: "
      "--from=pytorch for a .safetensors file only; armt: ARMT's wrapper around "
      "HuggingFace's TransfoXL, its state dict in any format --from=pytorch reads, "
      "--hparams with the sections transfo_xl_config, memory_cell, recurrent_wrapper).",
      flag_values=fv,
  )
  f["to"] = flags.DEFINE_enum(
      "to",
      None,
      ["pytorch", "safetensors"],
      "Export --workdir's latest checkpoint to --checkpoint "
      "(safetensors: --to=pytorch into a .safetensors file only).",
      flag_values=fv,
  )
  f["checkpoint"] = flags.DEFINE_string(
      "checkpoint",
      None,
      "--from=pytorch: state dict (.npz, .safetensors or torch file, by "
      "extension); --from=safetensors: a .safetensors file; --from=tf: TF checkpoint prefix "
      "or directory; --to=pytorch: output file (.npz, .safetensors or torch, by extension); "
      "--to=safetensors: a .safetensors output file.",
      flag_values=fv,
  )
  f["overwrite"] = flags.DEFINE_boolean(
      "overwrite",
      False,
      "--to: replace an existing --checkpoint or hparams file (otherwise refused).",
      flag_values=fv,
  )
  f["hparams"] = flags.DEFINE_string(
      "hparams",
      None,
      "JSON of the reference constructor's arguments (input for --from; "
      "output for --to, default <checkpoint>.hparams.json).",
      flag_values=fv,
  )
  f["workdir"] = flags.DEFINE_string(
      "workdir", None, "Our workdir (output of --from, input of --to).", flag_values=fv
  )
  f["cluster_order"] = flags.DEFINE_enum(
      "cluster_order",
      "auto",
      ["auto", "reference", "forward"],
      "Adaptive-softmax head column of tail cluster i in the state dict: reference = -i "
      "(PyTorch reference), forward = cutoffs[0]+i-1 (HuggingFace 4.35, TF); auto = forward "
      "for names with HuggingFace's 'transformer.' prefix (--from) or --layout=hf (--to).",
      flag_values=fv,
  )
  f["layout"] = flags.DEFINE_enum(
      "layout",
      "reference",
      ["reference", "hf"],
      "--to: reference (MemTransformerLM) or hf (TransfoXLLMHeadModel) names.",
      flag_values=fv,
  )
  f["vocab"] = flags.DEFINE_string(
      "vocab",
      None,
      "The model's vocabulary file (one symbol per line); mapped onto --dataset's vocabulary.",
      flag_values=fv,
  )
  f["dataset"] = flags.DEFINE_string(
      "dataset", None, "Our corpus (data.dataset of the converted config).", flag_values=fv
  )
  f["data_dir"] = flags.DEFINE_string(
      "data_dir", None, "tfds data dir of --dataset.", flag_values=fv
  )
  f["manual_dir"] = flags.DEFINE_string(
      "manual_dir", None, "Source files of --dataset.", flag_values=fv
  )
  f["download"] = flags.DEFINE_boolean(
      "download", True, "May download --dataset's sources.", flag_values=fv
  )
  f["verify_checksums"] = flags.DEFINE_boolean(
      "verify_checksums",
      True,
      "Check --dataset's source files (False for non-canonical files).",
      flag_values=fv,
  )
  f["unit"] = flags.DEFINE_enum(
      "unit",
      None,
      ["byte", "char", "word"],
      "Token unit (default: --dataset's, else word).",
      flag_values=fv,
  )
  f["unseen_bias"] = flags.DEFINE_float(
      "unseen_bias", UNSEEN_BIAS, "Softmax bias of ids missing from --vocab.", flag_values=fv
  )
  f["eval_tgt_len"] = flags.DEFINE_integer(
      "eval_tgt_len", None, "eval.tgt_len (default: hparams tgt_len).", flag_values=fv
  )
  f["eval_mem_len"] = flags.DEFINE_integer(
      "eval_mem_len", None, "eval.mem_len (default: hparams mem_len).", flag_values=fv
  )
  f["eval_clamp_len"] = flags.DEFINE_integer(
      "eval_clamp_len", None, "eval.clamp_len (default: hparams clamp_len).", flag_values=fv
  )
  f["eval_same_length"] = flags.DEFINE_boolean(
      "eval_same_length",
      None,
      "eval.same_length (default: hparams same_length).",
      flag_values=fv,
  )
  f["global_batch"] = flags.DEFINE_integer(
      "global_batch",
      1,
      "train.global_batch of the converted config (the saved training "
      "memory has this many rows; use a multiple of the data-parallel devices).",
      flag_values=fv,
  )
  f["eval_global_batch"] = flags.DEFINE_integer(
      "eval_global_batch", 1, "eval.global_batch.", flag_values=fv
  )
  f["pretrained"] = flags.DEFINE_enum(
      "pretrained",
      None,
      sorted(releases.RELEASES),
      "A released model of the reference "
      "implementation into --workdir (downloaded, verified and cached; see "
      "transformer_xl.convert.pretrained).  With it, --manual_dir is the directory of the "
      "release's files and --dataset_manual_dir that of the dataset's sources.",
      flag_values=fv,
  )
  f["cache_dir"] = flags.DEFINE_string(
      "cache_dir",
      None,
      f"--pretrained: download cache (default ${CACHE_ENV}, else ~/.cache/transformer_xl).",
      flag_values=fv,
  )
  f["dataset_manual_dir"] = flags.DEFINE_string(
      "dataset_manual_dir",
      None,
      "--pretrained: source files of the release's dataset.",
      flag_values=fv,
  )
  return f


def main(argv: Sequence[str]) -> None:
  """Command line: parses ``argv`` (program name first) and converts.

  ``--help`` prints the usage.  Errors a user can cause (bad flags,
  ConvertError: every unusable input file or setting, data.DataError, an
  OSError such as a missing file or a full disk) exit with status 1 and
  one ``error: ...`` line on stderr, without a traceback; any other
  exception is a bug and shows its traceback.

  Raises:
    SystemExit: a user error (the message), or 0 after ``--help``.
  """
  from absl import flags

  fv = flags.FlagValues()
  holders = _define_flags(fv)
  if any(a in ("--help", "-h", "--helpfull") for a in argv[1:]):
    print(package.__doc__)
    print(fv)
    return
  try:
    rest = fv(list(argv))
  except flags.Error as err:
    sys.exit(f"error: {one_line(err)}")
  if len(rest) > 1:
    sys.exit(f"error: unexpected arguments {rest[1:]}")
  if not flags.FLAGS.is_parsed():  # absl logging in imported modules expects parsed flags
    flags.FLAGS(list(argv[:1]))
  from transformer_xl import errors
  from transformer_xl.cli import process_settings

  process_settings.configure_logging(debug=False)  # orbax logs every file at INFO
  f = {k: v.value for k, v in holders.items()}
  try:
    if f["overwrite"] and not f["to"]:
      raise ConvertError(
          "--overwrite goes with --to (an export); a conversion writes into a new --workdir."
      )
    if f["pretrained"]:
      _convert_pretrained(f)
      return
    if f["dataset_manual_dir"] or f["cache_dir"]:
      raise ConvertError("--dataset_manual_dir and --cache_dir go with --pretrained.")
    if (f["from"] is None) == (f["to"] is None):
      raise ConvertError(
          "give exactly one of --from=pytorch|safetensors|tf|armt and --to=pytorch|safetensors."
      )
    if not f["checkpoint"] or not f["workdir"]:
      raise ConvertError("--checkpoint and --workdir are required.")
    if f["to"]:
      export_pytorch(
          f["workdir"],
          f["checkpoint"],
          f["hparams"],
          f["layout"],
          f["cluster_order"],
          to=f["to"],
          overwrite=f["overwrite"],
      )
      return
    if not f["hparams"]:
      raise ConvertError("--hparams=HPARAMS.json is required with --from.")
    convert_to_workdir(
        f["from"],
        f["checkpoint"],
        f["hparams"],
        f["workdir"],
        cluster_order=f["cluster_order"],
        vocab=f["vocab"],
        dataset=f["dataset"],
        data_dir=f["data_dir"],
        manual_dir=f["manual_dir"],
        download=f["download"],
        verify_checksums=f["verify_checksums"],
        unit=f["unit"],
        unseen_bias=f["unseen_bias"],
        eval_tgt_len=f["eval_tgt_len"],
        eval_mem_len=f["eval_mem_len"],
        eval_clamp_len=f["eval_clamp_len"],
        eval_same_length=f["eval_same_length"],
        global_batch=f["global_batch"],
        eval_global_batch=f["eval_global_batch"],
    )
  except (ConvertError, errors.UserError) as err:  # data, checkpoint, ... errors alike
    sys.exit(f"error: {one_line(err)}")
  except OSError as err:
    sys.exit(f"error: {_os_error_message(err)}")


def _convert_pretrained(f: dict) -> None:
  """``--pretrained=NAME``: ``pretrained.convert_release`` with the flags
  (the release's evaluation settings; flags of the other modes refused)."""
  others = [
      k
      for k in (
          "from",
          "to",
          "checkpoint",
          "hparams",
          "vocab",
          "dataset",
          "unit",
          "eval_tgt_len",
          "eval_mem_len",
          "eval_clamp_len",
          "eval_same_length",
      )
      if f[k] is not None
  ]
  if others:
    raise ConvertError(
        f"--pretrained sets the model, its vocabulary and its evaluation "
        f"settings itself; drop --{', --'.join(others)}."
    )
  if not f["workdir"]:
    raise ConvertError("--workdir is required with --pretrained.")
  pretrained.convert_release(
      f["pretrained"],
      f["workdir"],
      cache_dir=f["cache_dir"],
      manual_dir=f["manual_dir"],
      download=f["download"],
      data_dir=f["data_dir"],
      dataset_manual_dir=f["dataset_manual_dir"],
      verify_checksums=f["verify_checksums"],
  )


def _os_error_message(err: OSError) -> str:
  """One line for an OSError: the path, what happened, what to do (messages
  written for a user, e.g. "... does not exist: ...", are kept)."""
  if err.errno is None or not err.filename:
    return one_line(err)
  return (
      f"{err.filename}: {err.strerror or one_line(err)}; check the path, its permissions "
      "and the free space."
  )


if __name__ == "__main__":
  main(sys.argv)
