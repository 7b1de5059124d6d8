"""Command line: train, evaluate, score or sample from Transformer-XL.

    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl
    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl --mode=eval
    python -m transformer_xl.main --workdir=/tmp/txl --mode=score --tokens=x.npy --out=nll.npy
    python -m transformer_xl.main --workdir=/tmp/txl --mode=generate --prompt="the" --num_tokens=50

    python -m transformer_xl.main --workdir=/tmp/txl --mode=eval --config.eval.mem_len=1600

Flags in (``cli/command_flags.py``), one call out: ``cli.main``
(``cli/modes.py``) checks their usage, sets the process-wide settings
(``process_settings``) and runs the mode, checking everything it can before
compiling.  Any config value can be overridden with
``--config.<section>.<key>=value``; a restart with the same workdir resumes.
Without ``--config``, eval, score and generate read the workdir's saved
config.json and apply the overrides to it (``cli/saved_config.py``): the
``eval.*`` settings, the free model settings (``model.attention_impl``,
``dtype``, ``remat``, ``attn_block``, ``scan_unroll``), ``mesh.*``,
``data.*`` (e.g. a moved corpus's ``data.manual_dir``); an override of the
trained architecture is refused in one line naming it.  Training needs
``--config``.
"""

from __future__ import annotations

if __name__ == "__main__":  # first, before the imports below: restart once with
  from transformer_xl.cli import process_settings  # glibc's huge pages for XLA:CPU's buffers

  process_settings.reexec_with_hugepages()

from absl import app, flags

from transformer_xl.cli import (
    command_flags,  # noqa: F401  (defines the flags)
    user_errors,
)
from transformer_xl.cli import modes as cli


def main(argv):
  """Flags in, one call out: ``cli.main``."""
  cli.main(argv, flags.FLAGS)


if __name__ == "__main__":
  app.run(main, flags_parser=user_errors.parse_flags)
