"""EleutherAI's lm-evaluation-harness over this package's models (``[harness]`` extra).

``model.HarnessLM``: any workdir or released model as a harness model
(registered as ``transformer_xl``); ``python -m transformer_xl.harness``:
the harness's command line with it registered.  Guide:
docs/guide/harness.md.  Importing this package does not import the
harness; ``HarnessLM`` and ``HarnessError`` do (an ImportError naming the
extra where it is missing).
"""

from typing import Any

__all__ = ["HarnessError", "HarnessLM"]


def __getattr__(name: str) -> Any:
  if name not in __all__:
    raise AttributeError(f"module 'transformer_xl.harness' has no attribute {name!r}")
  try:
    from transformer_xl.harness import model  # pylint: disable=import-outside-toplevel
  except ImportError as err:  # one line naming the extra
    raise ImportError(
        "transformer_xl.harness needs EleutherAI's lm-evaluation-harness: "
        "pip install 'transformer_xl[harness]'"
    ) from err
  return getattr(model, name)
