r"""Writes tests/fixtures/armt_ar.npz by running the ARMT authors' associative-retrieval code.

Rodkin et al. 2024 (arXiv 2407.04841) train on associative retrieval with
``run_finetuning_associative_retrieval.py`` of
RodkinIvan/associative-recurrent-memory-transformer (PyTorch, Apache-2.0):
``generate_pairs`` and ``ARDataset`` draw the keys (distinct per sample, in
base 16), values and the queried pair, and the ``collate_fn`` defined under
its ``__main__`` lays a batch out (one key-value pair per segment, then the
query and its answer) with and without ``--vary_n_segments``.  This script
exports that file from a checkout or a bare git mirror, takes those four
definitions from it (``ast``: the rest of the script needs accelerate,
datasets and a GPU cluster's paths), runs them with ``torch`` under fixed
seeds and records, per case ``c`` (key size, value size, pairs):

  {c}_keys             int [N, P, K], their ARDataset's keys (digits, least
                       significant first);
  {c}_values           int [N, P, V];
  {c}_target           int [N], the queried pair (``target_key_ind``);
  {c}_input_ids, {c}_input_ids_generate, {c}_labels_mask   what their
                       ``collate_fn`` makes of the N samples as one batch;
  {c}_vary_input_ids, {c}_vary_labels_mask   the same batch with
                       ``--vary_n_segments`` (the last n pairs of each sample,
                       n drawn per batch, the queried pair drawn again);
  {c}_vary_n, {c}_vary_target   that n and the queried pair among the last n
                       (found from the batch: the keys of a sample are distinct).

``tests/test_armt_retrieval.py`` checks ``data/armt_retrieval.py`` against it.

Usage:
  python scripts/make_ar_fixtures.py \
      /work/.mirror/RodkinIvan+associative-recurrent-memory-transformer/repo [--out tests/fixtures]

Needs torch (CPU) and tqdm besides this package's dependencies.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import types

import numpy as np

SCRIPT = "run_finetuning_associative_retrieval.py"
# (key_size, value_size, num_pairs, samples): their first stages, a two-digit key, a longer value.
CASES = ((1, 1, 1, 6), (1, 1, 3, 8), (2, 1, 5, 8), (3, 2, 4, 6))
SEED = 0


def source(checkout: str) -> str:
  """The authors' script's text, from a work tree or a bare mirror."""
  path = os.path.join(checkout, SCRIPT)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return f.read()
  return subprocess.run(
      ["git", "--git-dir", checkout, "show", f"HEAD:{SCRIPT}"],
      check=True,
      capture_output=True,
      text=True,
  ).stdout


def their_definitions(text: str, value_size: int, vary: bool) -> dict:
  """``NUM_SYMBOLS``, ``generate_pairs``, ``ARDataset`` and ``collate_fn``
  of the authors' script, executed with their globals (``args`` holding the
  two flags ``collate_fn`` reads; ``rewrite_setting`` False, as their
  ar-value scripts run)."""
  import torch  # pylint: disable=import-outside-toplevel
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel

  tree = ast.parse(text)
  wanted = []
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "NUM_SYMBOLS" for t in node.targets
    ):
      wanted.append(node)
    elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in (
        "generate_pairs",
        "ARDataset",
    ):
      wanted.append(node)
    elif isinstance(node, ast.If):  # if __name__ == '__main__': ... def collate_fn
      for inner in ast.walk(node):
        if isinstance(inner, ast.FunctionDef) and inner.name == "collate_fn":
          wanted.append(inner)
  names = sorted(n.name if hasattr(n, "name") else "NUM_SYMBOLS" for n in wanted)
  assert names == ["ARDataset", "NUM_SYMBOLS", "collate_fn", "generate_pairs"], names
  namespace = {
      "torch": torch,
      "tqdm": lambda it: it,  # their progress bar, silenced
      "rewrite_setting": False,
      "sep_token": 100,
      "gen_token": 101,
      "eos_token": 102,
      "args": types.SimpleNamespace(vary_n_segments=vary, value_size=value_size),
  }
  del tqdm
  exec(compile(ast.Module(body=wanted, type_ignores=[]), SCRIPT, "exec"), namespace)  # pylint: disable=exec-used
  return namespace


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("checkout", help="the ARMT repository (work tree or bare git mirror)")
  parser.add_argument("--out", default="tests/fixtures")
  args = parser.parse_args()
  import torch  # pylint: disable=import-outside-toplevel

  text = source(args.checkout)
  out = {}
  for k, v, p, n in CASES:
    c = f"k{k}v{v}p{p}"
    fixed = their_definitions(text, v, vary=False)
    torch.manual_seed(SEED)
    ds = fixed["ARDataset"](k, v, sample_len=p, num_samples=n)
    batch = [ds[i] for i in range(len(ds))]
    out[f"{c}_keys"] = ds.keys.numpy().astype(np.int32)
    out[f"{c}_values"] = ds.values.numpy().astype(np.int32)
    out[f"{c}_target"] = ds.target_key_inds.numpy().astype(np.int32)
    made = fixed["collate_fn"](batch)
    for name in ("input_ids", "input_ids_generate", "labels_mask"):
      out[f"{c}_{name}"] = made[name].numpy().astype(np.int32)
    vary = their_definitions(text, v, vary=True)
    torch.manual_seed(SEED + 1)
    made = vary["collate_fn"](batch)
    ids = made["input_ids"].numpy().astype(np.int32)
    seg = k + v + 2
    last_n = ids.shape[1] // seg - 1
    query = ids[:, -seg : -seg + k]  # the queried key
    kept = out[f"{c}_keys"][:, p - last_n :]  # [N, n, K]
    rows, target = np.nonzero((kept == query[:, None, :]).all(axis=2))
    assert np.array_equal(rows, np.arange(n)), "one match per sample: the keys are distinct"
    out[f"{c}_vary_input_ids"] = ids
    out[f"{c}_vary_labels_mask"] = made["labels_mask"].numpy().astype(np.int32)
    out[f"{c}_vary_n"] = np.int32(last_n)
    out[f"{c}_vary_target"] = target.astype(np.int32)
  path = os.path.join(args.out, "armt_ar.npz")
  np.savez_compressed(path, **out)
  print(f"wrote {path}: {len(out)} arrays")


if __name__ == "__main__":
  main()
