r"""Runs the RMT authors' synthetic-task code and writes a small test fixture.

Bulatov et al. 2022's code (``booydar/LM-RMT``): their generators
(``pytorch/experiment_utils/generate_data.py``: ``copy_generator``,
``reverse_generator``, ``retrieval_generator`` with ``retrieval.py``) draw
a batch of each task at their settings (24 symbols of ids 2..11; 4
key-value pairs), their ``data_loader`` stacks it into inputs and targets,
and ``train_synthetic.py``'s ``torch.chunk`` cuts those into segments (12
positions for copy and reverse, 2 for retrieval, as their
``short_synthetic+MT.csv`` runs).  The fixture holds, per task: ``X`` and
``y`` [B, ...], the segments of inputs and targets [n_chunks, T, B] (their
time-major layout) and their ``answer_size`` (run_copy.sh 48,
run_reverse.sh 24, run_retrieval.sh 1).  ``tests/test_synthetic_tasks.py``
checks against it that ``data/synthetic.py`` makes the same answers from
the same inputs and the same segments and loss positions.

    mkdir -p /tmp/lm-rmt && git --git-dir=PATH/TO/LM-RMT/.git archive HEAD | tar -x -C /tmp/lm-rmt
    python scripts/synthetic_authors_fixture.py --authors_repo=/tmp/lm-rmt \
        --out=tests/fixtures/synthetic_authors.npz

Needs torch (CPU is enough: their generators' ``.cuda()`` masks, unused
here, are kept on the CPU).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import types

import numpy as np

BATCH = 8
SEED = 0
# task -> (their generator's name and arguments, segment length, answer_size)
TASKS = {
    "copy": (
        ("copy_generator", dict(batch_size=BATCH, enc_seq_len=24, dec_seq_len=48, num_tokens=12)),
        12,
        48,
    ),
    "reverse": (
        (
            "reverse_generator",
            dict(batch_size=BATCH, enc_seq_len=24, dec_seq_len=24, num_tokens=12),
        ),
        12,
        24,
    ),
    "associative_retrieval": (
        ("retrieval_generator", dict(K=4, num_tokens=10, batch_size=BATCH)),
        2,
        1,
    ),
}


def _numpy2_shim(retrieval) -> None:
  """Lets their ``retrieval.create_sequence`` run under numpy 2.

  It draws the query with ``np.random.choice(range(K), 1, replace=False)``
  and assigns ``letters[index]``, a one-element array, to one element of X,
  which numpy 2 refuses (numpy 1 took the element).  Here that call returns
  its one element: the same draw from the same random state.
  """
  draw = np.random.choice

  def choice(a, size=None, replace=True, p=None):
    out = draw(a, size, replace, p)
    return out[0] if size == 1 else out

  retrieval.np = types.SimpleNamespace(
      zeros=np.zeros, eye=np.eye, array=np.array, random=types.SimpleNamespace(choice=choice)
  )


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--authors_repo", required=True, help="a checkout of booydar/LM-RMT")
  parser.add_argument("--out", required=True, help="the .npz to write")
  args = parser.parse_args(argv)
  pytorch_dir = pathlib.Path(args.authors_repo) / "pytorch"
  if not (pytorch_dir / "experiment_utils" / "generate_data.py").is_file():
    sys.exit(
        f"error: {pytorch_dir}/experiment_utils/generate_data.py not found: pass --authors_repo."
    )
  import torch  # noqa: PLC0415 (only this script needs it)

  torch.Tensor.cuda = lambda self, *a, **k: self  # their masks; no GPU needed
  sys.path.insert(0, str(pytorch_dir))
  from experiment_utils import generate_data as gd  # noqa: PLC0415 (their code)

  _numpy2_shim(sys.modules["experiment_utils.retrieval"])
  np.random.seed(SEED)  # their generators draw from numpy's global state
  out = {}
  for task, ((name, kwargs), tgt_len, answer_size) in TASKS.items():
    x, y, _, _ = next(getattr(gd, name)(**kwargs))
    x, y = np.asarray(x), np.asarray(y)
    with tempfile.TemporaryDirectory() as d:
      np.save(f"{d}/{task}_train_X.npy", x)
      np.save(f"{d}/{task}_train_y.npy", y)
      loader = gd.data_loader("train", task, path=d, batch_size=BATCH, tgt_len=tgt_len)
      src, tgt, _ = next(iter(loader))  # time-major [L, B], as train_synthetic.py reads them
    # train_synthetic.py: torch.chunk(data_, data_.shape[0] // args.tgt_len)
    src_segs = torch.chunk(src, src.shape[0] // tgt_len)
    tgt_segs = torch.chunk(tgt, tgt.shape[0] // tgt_len)
    out[f"{task}_X"], out[f"{task}_y"] = x.astype(np.int32), y.astype(np.int32)
    out[f"{task}_inputs"] = np.stack([s.numpy() for s in src_segs]).astype(np.int32)
    out[f"{task}_targets"] = np.stack([t.numpy() for t in tgt_segs]).astype(np.int32)
    out[f"{task}_tgt_len"] = np.int32(tgt_len)
    out[f"{task}_answer_size"] = np.int32(answer_size)
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(args.out, **out)
  print(f"Wrote {args.out}: {', '.join(f'{k} {v.shape}' for k, v in out.items())}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
