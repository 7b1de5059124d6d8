"""``vs_pytorch.py --compare``: every number of a benchmark run beside an
earlier run's, with the change, and the regressions beyond a tolerance.

Stdlib only; the runs are the JSON files that ``vs_pytorch.py`` writes
(``benchmarks/results/<date>_<time>_<host>.json``), and ``generation.py``'s
(the same layout: ``results.<ours|pytorch>.<cell>``).
"""

from __future__ import annotations

import json
from typing import Any

# Which way is better, by the last part of a number's name (--compare).
_HIGHER_IS_BETTER = ("tokens_per_sec", "pct_of_matmul_limit", "ratio")
_LOWER_IS_BETTER = ("ms_per_step", "rss", "faults", "wall_seconds", "latency")


def _direction(name: str) -> int:
  """+1 if a larger value of the number ``name`` is better, -1 if a smaller
  one is, 0 if neither (counts, losses, the machine's matmul limit)."""
  if name.startswith("matmul."):
    return 0
  last = "ratio" if name.startswith("ratio.") else name.rsplit(".", 1)[-1]
  if any(s in last for s in _HIGHER_IS_BETTER):
    return 1
  return -1 if any(s in last for s in _LOWER_IS_BETTER) else 0


def flatten_numbers(tree: Any, prefix: str = "") -> dict[str, float]:
  """{dotted.name: value} of every int/float leaf of nested dicts (lists,
  strings and booleans are left out)."""
  out = {}
  if isinstance(tree, dict):
    for k, v in tree.items():
      out.update(flatten_numbers(v, f"{prefix}.{k}" if prefix else str(k)))
  elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
    out[prefix] = float(tree)
  return out


def comparable_numbers(run: dict) -> dict[str, float]:
  """The numbers of a saved run that --compare lists: every number of its
  results and matmul limit, plus ratio.<phase> = ours/PyTorch tokens/s."""
  nums = flatten_numbers({"results": run.get("results", {}), "matmul": run.get("matmul", {})})
  res = run.get("results", {})
  for phase, r in res.get("ours", {}).items():
    if not isinstance(r, dict):  # n_params
      continue
    o = r.get("median_tokens_per_sec")
    t = res.get("pytorch", {}).get(phase, {}).get("median_tokens_per_sec")
    if o and t:
      nums[f"ratio.{phase}"] = o / t
  return nums


def _num(x: float) -> str:
  return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def compare_runs(old: dict, new: dict, tolerance: float) -> tuple[list[str], int]:
  """Every number of ``new`` beside ``old``'s, with the change in percent.

  A number whose name ends in one of ``_HIGHER_IS_BETTER`` (tokens/s,
  % of the matmul limit, the ratio) that fell by more than ``tolerance``
  percent, or one of ``_LOWER_IS_BETTER`` (ms per step, RSS, page
  faults, wall seconds, latencies) that rose by more, is marked REGRESSION; the
  opposite moves are marked "better".  Settings and machines that differ
  are listed first, since they explain changes.

  Returns:
    (lines to print, number of regressions).
  """
  lines = []
  o_args, n_args = old.get("args", {}), new.get("args", {})
  skip = ("json", "compare", "new", "tolerance")
  diff = [
      f"{k}: {o_args.get(k)!r} -> {n_args.get(k)!r}"
      for k in sorted(set(o_args) | set(n_args))
      if k not in skip and o_args.get(k) != n_args.get(k)
  ]
  om, nm = old.get("machine", {}), new.get("machine", {})
  lines.append(
      f"compare: old {om.get('date', '?')} ({om.get('cpu', '?')}, load "
      f"{om.get('loadavg_start', '?')}) -> new {nm.get('date', '?')} "
      f"({nm.get('cpu', '?')}, load {nm.get('loadavg_start', '?')})"
  )
  lines.append("settings that differ: " + ("; ".join(diff) if diff else "none"))
  o_num, n_num = comparable_numbers(old), comparable_numbers(new)
  names = sorted(set(o_num) | set(n_num))
  width = max([len(n) for n in names] + [6])
  lines.append(f"{'number':<{width}}  {'old':>12}  {'new':>12}  {'change':>8}")
  regressions = 0
  for name in names:
    if name not in o_num or name not in n_num:
      where = "old" if name in o_num else "new"
      value = o_num.get(name, n_num.get(name))
      lines.append(f"{name:<{width}}  {'':>12}  {'':>12}  {'':>8}  only in {where}: {_num(value)}")
      continue
    a, b = o_num[name], n_num[name]
    change = (b - a) / abs(a) * 100 if a else None
    verdict, sign = "", _direction(name)
    if change is not None:
      if sign and sign * change < -tolerance:
        verdict, regressions = "REGRESSION", regressions + 1
      elif sign and sign * change > tolerance:
        verdict = "better"
    ch = "n/a" if change is None else f"{change:+.1f}%"
    lines.append(f"{name:<{width}}  {_num(a):>12}  {_num(b):>12}  {ch:>8}  {verdict}".rstrip())
  lines.append(
      f"{regressions} regression(s) beyond {tolerance:g}% (throughput down, or time / memory up)"
  )
  return lines, regressions


def load_json(path: str) -> dict:
  """A saved run.

  Raises:
    SystemExit: the file cannot be read or is not JSON (one ``error: ...`` line).
  """
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError) as err:
    raise SystemExit(f"error: cannot read {path}: {err}") from None
