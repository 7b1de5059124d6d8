"""EleutherAI's lm-evaluation-harness over this package's models (``[harness]`` extra).

``model.HarnessLM``: any workdir or released model as a harness model
(registered as ``transformer_xl``); ``python -m transformer_xl.harness``:
the harness's command line with it registered; ``babilong_export``: a
BABILong workdir's answers in the leaderboard's files.  Guide:
docs/guide/harness.md.
"""

try:
  import lm_eval  # noqa: F401
except ImportError as err:  # one line naming the extra, not a traceback deep in an import
  raise ImportError(
      "transformer_xl.harness needs EleutherAI's lm-evaluation-harness: "
      "pip install 'transformer_xl[harness]'"
  ) from err

from transformer_xl.harness.model import HarnessError, HarnessLM

__all__ = ["HarnessError", "HarnessLM"]
