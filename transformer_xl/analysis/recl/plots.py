"""The figures of RECL (Dai et al. 2019, Appendix C, Figs. 3-4), with matplotlib.

``plot_gains`` draws Figure 3 (the unnormalised relative perplexity gains
over the steps of the walk) and ``plot_perplexity`` Figure 4 (ppl or bpc
against the context length), each as PNG bytes, from what
``transformer_xl.analysis.recl.run`` computes; the command writes them as
``FIGURE_3`` and ``FIGURE_4`` into its ``--out``.  matplotlib is imported
only when a figure is made, with the Agg backend (``pip install -e
".[analysis]"``).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

FIGURE_3 = "fig3_relative_gains.png"
FIGURE_4 = "fig4_perplexity.png"


def pyplot():
  """matplotlib.pyplot with the Agg backend.

  Raises:
    ImportError: matplotlib is not installed (``pip install -e ".[analysis]"``).
  """
  try:
    import matplotlib
  except ImportError as err:
    raise ImportError('the RECL plots need matplotlib: pip install -e ".[analysis]"') from err
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _png_bytes(fig) -> bytes:
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
  return buf.getvalue()


def plot_gains(names: Sequence[str], rs: Sequence[float], results: dict, title: str = "") -> bytes:
  """Figure 3 of the paper (Appendix C): exp f_i(c, c) - exp f_i(c, c') over
  the steps (c, c') of the walk, one line per model, one panel per r.

  Args:
    names: the N model names; rs: the ratios (one panel each).
    results: r -> the dict of ``relative_gain.recl``.
    title: the figure title (default: the paper's caption).

  Returns:
    PNG bytes.

  Raises:
    ImportError: no matplotlib.
  """
  plt = pyplot()
  fig, axes = plt.subplots(1, len(rs), figsize=(4.2 * len(rs), 3.6), squeeze=False)
  for ax, r in zip(axes[0], rs):
    res = results[r]
    steps = [f"{a}→{b}" for a, b in zip(res["walk"], res["walk"][1:])]
    for i, name in enumerate(names):
      ax.plot(range(len(steps)), res["unnormalized_gain"][i], marker="o", label=name)
    ax.axhline(0.0, color="gray", lw=0.6)
    ax.set_xticks(range(len(steps)), steps, rotation=45, ha="right", fontsize=8)
    ax.set_title(f"r = {r}")
    ax.set_xlabel("context length c → c'")
  axes[0][0].set_ylabel("exp f(c, c) - exp f(c, c')")
  axes[0][-1].legend(fontsize=8)
  fig.suptitle(title or "Relative perplexity gains (Dai et al. 2019, Fig. 3)", fontsize=10)
  png = _png_bytes(fig)
  plt.close(fig)
  return png


def plot_perplexity(
    names: Sequence[str],
    lengths: Sequence[int],
    values_NxC: np.ndarray,
    metric: str,
    title: str = "",
) -> bytes:
  """Figure 4 of the paper (Appendix C): ppl exp(mean_t l_i(c, t)) (or bpc)
  against c, one line per model.

  Args:
    names: the N model names; lengths: the C context lengths (tokens).
    values_NxC: ppl or bpc, float [N, C]; metric: its name (y label).
    title: the figure title (default: the paper's caption).

  Returns:
    PNG bytes.

  Raises:
    ImportError: no matplotlib.
  """
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5.0, 3.6))
  for name, v in zip(names, values_NxC):
    ax.plot(lengths, v, marker="o", label=name)
  ax.set_xscale("log", base=2)
  ax.set_xticks(lengths, [str(c) for c in lengths])
  ax.minorticks_off()
  ax.set_xlabel("context length c")
  ax.set_ylabel(metric)
  ax.legend(fontsize=8)
  ax.set_title(title or "Perplexity vs context length (Dai et al. 2019, Fig. 4)", fontsize=10)
  png = _png_bytes(fig)
  plt.close(fig)
  return png
