"""The integrity record of a checkpoint, and the check of a restored state against it.

Every checkpoint (``checkpointing.save``) holds, beside the state and the
iterator position, an ``integrity`` item (JSON): a fingerprint of every
array of the state with its shape and dtype, and the ``meta`` the caller
passes (the model config the checkpoint was made with, ``workdir.py``).
Fingerprints are computed on the devices (``fingerprints.fingerprint``: a
uint32 hash of each array's bits, summed over the elements; no array is
copied to the host), when saving (``make_record``) and again after
restoring (``verify``): a checkpoint whose files changed, were truncated or
lost a file, or that holds a non-finite value, is found out, and
``checkpointing.restore_latest`` falls back to the previous one.

The functions raise ``CheckpointError`` with the reason alone (e.g. "its
integrity record cannot be read (...)"); ``checkpointing`` puts it into a
message that names the checkpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import jax
from etils import epath

from transformer_xl import errors
from transformer_xl.run.fingerprints import fingerprint

RECORD_FORMAT = 1

CheckpointError = errors.CheckpointError


def _shape_dtype(tree: Any) -> dict[str, list]:
  return {
      jax.tree_util.keystr(p): [list(x.shape), str(x.dtype)]
      for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def _short(names: list[str], n: int = 3) -> str:
  more = f" and {len(names) - n} more" if len(names) > n else ""
  return ", ".join(names[:n]) + more


def make_record(state: Any, step: int, meta: Mapping[str, Any] | None = None) -> dict:
  """The integrity record of ``state`` saved as checkpoint ``step``.

  Args:
    state: pytree of arrays (the TrainState).
    step: the checkpoint's step.
    meta: JSON-serialisable dict stored in the record (``read_record``
      returns it).

  Returns:
    The record: ``{"format", "step", "leaves": {path: {"fingerprint",
    "shape", "dtype"}}, "meta"}`` (JSON-serialisable).

  Raises:
    CheckpointError: ``state`` holds a non-finite value (the reason names
      the arrays); such a state is never saved.
  """
  fps, finite = fingerprint(state)
  bad = [p for p, ok in finite.items() if not ok]
  if bad:
    raise CheckpointError(f"non-finite values in {_short(bad)}")
  shapes = _shape_dtype(state)
  return {
      "format": RECORD_FORMAT,
      "step": int(step),
      "leaves": {
          p: {"fingerprint": fps[p], "shape": shapes[p][0], "dtype": shapes[p][1]} for p in fps
      },
      "meta": dict(meta or {}),
  }


def _written_with_record(step_dir: epath.Path) -> bool:
  """Whether the checkpoint in ``step_dir`` was written with an integrity record: orbax's
  own step metadata (``_CHECKPOINT_METADATA``) lists the items it saved; a
  checkpoint of a version before records lists no ``integrity``."""
  try:
    saved = json.loads((epath.Path(step_dir) / "_CHECKPOINT_METADATA").read_text())
  except (OSError, ValueError):
    return False
  return "integrity" in (saved.get("item_handlers") or {})


def read_record(step_dir: epath.Path) -> dict | None:
  """The integrity record saved with the checkpoint in ``step_dir``
  (``<workdir>/checkpoints/<step>``).

  Returns:
    The record dict, or None for a checkpoint written before records
    existed (orbax's step metadata lists no ``integrity`` item).

  Raises:
    CheckpointError: the record cannot be read or parsed, or it is missing
      although the checkpoint was written with one (deleted or lost: the
      checkpoint cannot be verified, so it is not used).
  """
  path = epath.Path(step_dir) / "integrity"
  if not (path / "metadata").exists():
    if _written_with_record(step_dir):
      raise CheckpointError(
          "its integrity record is missing (it was written with one, which "
          "was deleted or lost), so its files cannot be verified"
      )
    return None
  try:
    record = json.loads((path / "metadata").read_text())
  except (OSError, ValueError) as err:
    raise CheckpointError(f"its integrity record cannot be read ({err})") from None
  if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
    raise CheckpointError("its integrity record is damaged or of an unknown format")
  return record


def _as_recorded(path: str, recorded: Mapping[str, Any]) -> str:
  """A leaf path of a partial restore (a dict of the state's fields,
  ``['params']['crit']...``) as the record spells it when the saved state
  was a dataclass (``.params['crit']...``)."""
  if path in recorded:
    return path
  return re.sub(r"^\['([A-Za-z_]\w*)'\]", r".\1", path)


def verify(state: Any, record: dict | None, partial: bool = False) -> str | None:
  """Why a restored state is not usable (fingerprint or finiteness), or None.

  With ``partial`` the state holds some of the saved fields only: those
  leaves are checked against their fingerprints, the others not read.

  Args:
    state: the restored pytree of arrays.
    record: its checkpoint's record (``read_record``); None (a checkpoint
      of a version before records): finiteness only.
    partial: ``state`` is a dict of some of the saved state's top-level
      fields.

  Returns:
    The reason, for a message (e.g. "fingerprint mismatch in ..."), or None.
  """
  fps, finite = fingerprint(state)
  bad = [p for p, ok in finite.items() if not ok]
  if bad:
    return f"non-finite values in {_short(bad)}"
  if record is None:
    return None
  want = record.get("leaves", {})
  if partial:
    fps = {_as_recorded(p, want): v for p, v in fps.items()}
    missing = sorted(set(fps) - set(want))
  else:
    missing = sorted(set(want) ^ set(fps))
  if missing:
    return f"its arrays differ from its record ({_short(missing)})"
  changed = [p for p in fps if fps[p] != want[p]["fingerprint"]]
  if changed:
    return (
        f"fingerprint mismatch in {_short(changed)}: its files changed after they were "
        "written (disk or copy corruption)"
    )
  return None
