"""Attention maps of a trained model (Dai et al. 2019, Appendix D, Figs. 5-7).

    python -m transformer_xl.analysis.attention --workdir=W --split=valid --out=DIR \\
        [--max_tokens=N] [--heads=LAYER:HEAD,...] [--segment=S]

The command line of ``transformer_xl.analysis.attention`` (what it computes
and writes: that package's docstring): absl flags in, one ``attention.run``
out.  Bad input (a bad flag, a missing workdir or corpus, a head outside
the model) is one ``error: ...`` line and exit status 1, as for
``transformer_xl.main``.
"""

from __future__ import annotations

from absl import app, flags

from transformer_xl.analysis import attention
from transformer_xl.cli import process_settings, user_errors

_WORKDIR = flags.DEFINE_string("workdir", None, "A trained (or converted) workdir.")
_SPLIT = flags.DEFINE_enum(
    "split", "valid", ["train", "valid", "test"], "The split to stream over."
)
_OUT = flags.DEFINE_string("out", None, "Output directory.")
_MAX_TOKENS = flags.DEFINE_integer(
    "max_tokens", 0, "Stop after about this many scored tokens (0 = the whole split)."
)
_HEADS = flags.DEFINE_string(
    "heads", "", "LAYER:HEAD,... for the context plot (default: head 0 of every layer)."
)
_SEGMENT = flags.DEFINE_integer(
    "segment", -1, "The step whose row-0 query is plotted (-1: the first with a full memory)."
)
flags.mark_flags_as_required(["workdir", "out"])


def main(argv: list[str]) -> None:
  """Flags -> ``attention.run``; a user error is one ``error: ...`` line."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  process_settings.configure_logging(debug=False, verbosity_given=flags.FLAGS["verbosity"].present)
  with user_errors.report(debug=False):
    attention.run(
        _WORKDIR.value,
        _SPLIT.value,
        _OUT.value,
        max_tokens=_MAX_TOKENS.value,
        heads=_HEADS.value,
        segment=_SEGMENT.value,
    )


if __name__ == "__main__":
  app.run(main, flags_parser=user_errors.parse_flags)
