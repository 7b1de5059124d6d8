r"""Relative effective context length of a model group (Dai et al. 2019, App. C).

    python -m transformer_xl.analysis.recl --workdirs=W1,W2,... --split=valid \
        --context_lengths=16,32,48,64,80 --r=0.1,0.5,1.0 --out=DIR \
        [--delta=16] [--threshold=0.01] [--names=a,b,...] [--max_tokens=N]

The command line of ``transformer_xl.analysis.recl`` (what it measures,
writes and decides: that package's docstring): absl flags in, one
``recl.run`` out.  Bad input, a bad flag included, is one ``error: ...``
line on stderr and exit status 2, before anything is compiled.
"""

from __future__ import annotations

import sys
from typing import NoReturn

from absl import app, flags

from transformer_xl.analysis import recl
from transformer_xl.analysis.relative_gain import DEFAULT_THRESHOLD
from transformer_xl.cli import process_settings

_WORKDIRS = flags.DEFINE_list(
    "workdirs", None, "The model group's workdirs (trained or converted), comma-separated."
)
_NAMES = flags.DEFINE_list(
    "names", [], "Model names, comma-separated (default: the workdirs' last path components)."
)
_SPLIT = flags.DEFINE_enum("split", "valid", ["train", "valid", "test"], "The split to score.")
_CONTEXT_LENGTHS = flags.DEFINE_list(
    "context_lengths", None, "Context lengths c, comma-separated, strictly increasing."
)
_R = flags.DEFINE_list("r", ["0.1", "0.5", "1.0"], "Ratios r in (0, 1], comma-separated.")
_DELTA = flags.DEFINE_integer(
    "delta",
    None,
    "The step Delta of Appendix C in tokens (default: each evaluated length to the next).",
)
_THRESHOLD = flags.DEFINE_float(
    "threshold", DEFAULT_THRESHOLD, "The relative-gain threshold of Appendix C."
)
_OUT = flags.DEFINE_string("out", None, "Output directory.")
_MAX_TOKENS = flags.DEFINE_integer(
    "max_tokens", 0, "Score only the first N tokens of the split (0 = all)."
)
_SEGMENT_ROWS = flags.DEFINE_integer(
    "segment_rows",
    1,
    "Rows of segment models (1: every token but the split's first c sees c tokens; each "
    "further row starts with an empty memory).",
)
_WINDOW_BATCH = flags.DEFINE_integer(
    "window_batch",
    0,
    "Windows per step of sliding-window models (0 = the config's eval.global_batch); any "
    "number gives the same losses.",
)
_TGT_LEN = flags.DEFINE_integer(
    "tgt_len", 0, "Segment length of segment models (0 = the config's eval.tgt_len)."
)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Override the workdirs' data.data_dir.")
_MANUAL_DIR = flags.DEFINE_string("manual_dir", None, "Override the workdirs' data.manual_dir.")
flags.mark_flags_as_required(["workdirs", "context_lengths", "out"])

USAGE_STATUS = 2  # the exit status of bad input


def _error(message: object) -> NoReturn:
  """Exits with ``error: <message>`` on stderr and USAGE_STATUS."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(USAGE_STATUS)


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing for ``app.run``: a malformed, unknown or missing flag
  is one ``error: ...`` line and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as err:
    _error(" ".join(str(err).split()))


def main(argv: list[str]) -> None:
  """Flags -> ``recl.make_request`` -> ``recl.run``; a user error is one line
  and exit status 2."""
  if len(argv) > 1:
    _error(f"unexpected arguments {argv[1:]}")
  process_settings.configure_logging(debug=False, verbosity_given=flags.FLAGS["verbosity"].present)
  try:
    request = recl.make_request(
        workdirs=_WORKDIRS.value,
        context_lengths=_CONTEXT_LENGTHS.value,
        out=_OUT.value,
        names=_NAMES.value,
        split=_SPLIT.value,
        r=_R.value,
        delta=_DELTA.value,
        threshold=_THRESHOLD.value,
        max_tokens=_MAX_TOKENS.value,
        segment_rows=_SEGMENT_ROWS.value,
        window_batch=_WINDOW_BATCH.value,
        tgt_len=_TGT_LEN.value,
        data_dir=_DATA_DIR.value,
        manual_dir=_MANUAL_DIR.value,
    )
    print(recl.describe(recl.run(request)), flush=True)
  except (recl.UsageError, ImportError, FileNotFoundError) as err:
    _error(err)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
