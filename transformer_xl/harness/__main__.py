r"""The lm-evaluation-harness's command line with this package's model registered.

    python -m transformer_xl.harness run --model transformer_xl \
        --model_args workdir=workdirs/quickstart --batch_size 8 \
        --tasks wikitext --include_path my_tasks/

Every argument is the harness's (``lm-eval run --help``; its version is
the ``[harness]`` extra's pin); ``--model transformer_xl`` is
``model.HarnessLM`` and its ``--model_args`` are that class's
(``workdir=DIR`` or ``pretrained=NAME``, ``max_gen_toks``, ``seed``); the
rows per batch are the harness's ``--batch_size`` (its default is 1: give
8 or more).  A bad model argument, a workdir that cannot be
loaded, or a missing harness ends with one ``error:`` line (exit 1).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
  """Registers the model, then runs the harness's command line on ``argv``."""
  try:
    from lm_eval import __main__ as lm_eval_main  # noqa: N813
  except ImportError:
    sys.exit("error: python -m transformer_xl.harness needs pip install 'transformer_xl[harness]'")
  from transformer_xl import errors
  from transformer_xl.harness import model  # noqa: F401 (registers "transformer_xl")

  sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
  try:
    lm_eval_main.cli_evaluate()
  except (errors.UserError, FileNotFoundError) as err:
    sys.exit(f"error: {err}")


if __name__ == "__main__":
  main()
