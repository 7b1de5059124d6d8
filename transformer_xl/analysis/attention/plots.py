"""The figures of the attention maps (Dai et al. 2019, Appendix D, Figs. 5-7), with matplotlib.

Each function draws one figure from what
``transformer_xl.analysis.attention.attention_maps`` computes and writes it
as a PNG file; matplotlib is imported only then, with the Agg backend
(``pip install -e ".[analysis]"``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _pyplot():
  """matplotlib.pyplot with the Agg backend."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def plot_average(avg_LxHxK: np.ndarray, path: str, title: str) -> None:
  """Fig. 5: heads as rows, distance as columns, layer boundaries marked.

  Args:
    avg_LxHxK: the attention averaged by relative distance, float
      [n_layer, n_head, K].
    path: the PNG file to write.
    title: the figure's title.
  """
  plt = _pyplot()
  from matplotlib.colors import PowerNorm

  n_layer, n_head, k = avg_LxHxK.shape
  fig, ax = plt.subplots(figsize=(min(16, 4 + k / 40), 1 + 0.25 * n_layer * n_head))
  image = ax.imshow(
      avg_LxHxK.reshape(n_layer * n_head, k),
      aspect="auto",
      cmap="viridis",
      interpolation="nearest",
      norm=PowerNorm(gamma=0.5),
  )  # long range visible
  for layer in range(1, n_layer):
    ax.axhline(layer * n_head - 0.5, color="white", linewidth=0.8)
  ax.set_yticks([l * n_head + (n_head - 1) / 2 for l in range(n_layer)])
  ax.set_yticklabels([f"layer {l}" for l in range(n_layer)])
  ax.set_xlabel("relative distance (0 = the query itself)")
  ax.set_title(title)
  fig.colorbar(image, ax=ax, fraction=0.02)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_context(
    context_LxHxK: np.ndarray,
    heads: Sequence[tuple[int, int]],
    top: Sequence[np.ndarray],
    mem_len: int,
    path: str,
) -> None:
  """Fig. 6: one query's attention over its context, the top keys highlighted.

  Args:
    context_LxHxK: the query's attention over its K keys (memory slots,
      then the segment), float [n_layer, n_head, K].
    heads: the (layer, head) pairs to draw, one panel each.
    top: per pair of ``heads``, the indices of the keys to highlight (the
      top 20%: ``attention.top_fraction``).
    mem_len: M, the number of memory slots (a dotted line after them).
    path: the PNG file to write.
  """
  plt = _pyplot()
  fig, axes = plt.subplots(len(heads), 1, figsize=(12, 1.6 * len(heads)), squeeze=False)
  for ax, (layer, head), top_keys in zip(axes[:, 0], heads, top):
    w = context_LxHxK[layer, head]
    highlighted = np.zeros_like(w, dtype=bool)
    highlighted[top_keys] = True
    x = np.arange(len(w))
    ax.bar(x[~highlighted], w[~highlighted], color="0.6", width=1.0)
    ax.bar(x[highlighted], w[highlighted], color="tab:red", width=1.0, label="top 20%")
    ax.axvline(mem_len - 0.5, color="k", linestyle=":", linewidth=0.8)
    ax.set_ylabel(f"L{layer} H{head}")
  axes[0, 0].legend(loc="upper left")
  axes[-1, 0].set_xlabel("key (memory slots | segment)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_decomposition(terms_NxLxHxK: np.ndarray, names: Sequence[str], path: str) -> None:
  """Fig. 7: the terms of Sec. 3.3 alone ((a), (b), (d)), each averaged like Fig. 5.

  Args:
    terms_NxLxHxK: per term, the attention averaged by relative distance,
      float [N terms, n_layer, n_head, K].
    names: the N terms' names ("a", "b", "d").
    path: the PNG file to write.
  """
  plt = _pyplot()
  n, n_layer, n_head, k = terms_NxLxHxK.shape
  fig, axes = plt.subplots(
      n, 1, figsize=(min(16, 4 + k / 40), 1.5 + 0.75 * n * n_layer), squeeze=False
  )
  for ax, name, term in zip(axes[:, 0], names, terms_NxLxHxK):
    ax.imshow(
        term.reshape(n_layer * n_head, k), aspect="auto", cmap="viridis", interpolation="nearest"
    )
    ax.set_title(f"term ({name}) alone")
    ax.set_yticks([])
  axes[-1, 0].set_xlabel("relative distance")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
