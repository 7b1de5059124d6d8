r"""How fast one's own text is prepared, and in how much memory (data.dataset="text").

    python benchmarks/prepare_text.py --source=../shared/data/wikitext-2/wiki.train.tokens \
        --target_mb=512 --files=64 --tokenizers=word,sentencepiece

Builds a corpus of at least ``--target_mb`` MB by repeating the source text
over at most ``--files`` files (whole copies per file; every fourth file
gzip-compressed), then, for each
tokenizer, prepares it in a fresh subprocess (``text_builder.load_text_corpus``,
valid and test a copy of the source) and records the wall time, MB of text
per second and the subprocess's peak RSS (``ru_maxrss``).  The baseline,
measured in the same run: one pass that only reads and decompresses the
files and splits them into lines (what any preparation must do at least),
so the ratio says what tokenising and writing cost on top.  Results go to
``benchmarks/results/prepare_text_<date>_<host>.json``; the target is a
peak RSS under 2 GB whatever the corpus size.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  pylint: disable=wrong-import-position

_WORKER = r"""
import json, resource, sys, time
from transformer_xl.data import text_builder, text_reading, text_settings
args = json.loads(sys.argv[1])
start = time.perf_counter()
if args["mode"] == "read":
  n = 0
  files = text_reading.resolve_files(text_settings.TextSettings(**args["settings"]))["train"]
  for line, _ in text_reading.document_lines(files, "file"):
    n += 1
  result = {"lines": n}
else:
  corpus = text_builder.load_text_corpus(text_settings.TextSettings(**args["settings"]),
                                         data_dir=args["data_dir"])
  result = {"tokens": corpus.splits["train"].num_tokens, "vocab": corpus.vocab_size,
            "documents": corpus.documents["train"].num_sentences,
            "bytes": corpus.num_bytes["train"]}
result["seconds"] = time.perf_counter() - start
result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(result))
"""


def make_corpus(source: str, folder: str, target_mb: float, files: int) -> int:
  """Writes copies of ``source`` over ``files`` files (every 4th gzip) until the
  text reaches ``target_mb`` MB; returns the bytes of text written."""
  with open(source, "rb") as f:
    text = f.read()
  copies = max(1, -(-int(target_mb * 1e6) // len(text)))
  per_file = -(-copies // files)
  written, i = 0, 0
  os.makedirs(folder, exist_ok=True)
  while written < copies * len(text):
    n = min(per_file, copies - written // len(text))
    name = os.path.join(folder, f"part{i:04d}.txt" + (".gz" if i % 4 == 3 else ""))
    opener = gzip.open if name.endswith(".gz") else open
    with opener(name, "wb") as out:
      for _ in range(n):
        out.write(text)
    written += n * len(text)
    i += 1
  return written


def run_worker(mode: str, settings: dict, data_dir: str) -> dict:
  """The worker's JSON line; raises RuntimeError if it failed."""
  proc = subprocess.run(
      [
          sys.executable,
          "-c",
          _WORKER,
          json.dumps({"mode": mode, "settings": settings, "data_dir": data_dir}),
      ],
      env=common.worker_env(),
      cwd=common.REPO,
      capture_output=True,
      text=True,
  )
  if proc.returncode != 0:
    raise RuntimeError(f"{mode} worker failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--source", required=True, help="a text file to repeat (UTF-8)")
  p.add_argument("--target_mb", type=float, default=512.0, help="corpus size, MB of text")
  p.add_argument(
      "--files",
      type=int,
      default=64,
      help="files to spread the corpus over, at most (whole copies of --source each)",
  )
  p.add_argument(
      "--tokenizers",
      default="word,sentencepiece",
      help="comma-separated data.tokenizer values to prepare with",
  )
  p.add_argument("--vocab_size", type=int, default=8000, help="for sentencepiece")
  p.add_argument("--workdir", default=None, help="where the corpus is built (default: a temp dir)")
  p.add_argument("--out", default=None, help="result JSON (default: benchmarks/results/...)")
  args = p.parse_args(argv)
  info = common.machine_info(("tensorflow-datasets", "sentencepiece", "numpy"))
  tmp = args.workdir or tempfile.mkdtemp(prefix="prepare_text_")
  try:
    corpus_dir = os.path.join(tmp, "corpus")
    shutil.rmtree(corpus_dir, ignore_errors=True)
    n_bytes = make_corpus(args.source, corpus_dir, args.target_mb, args.files)
    mb = n_bytes / 1e6
    print(f"corpus: {mb:,.1f} MB of text in {len(os.listdir(corpus_dir))} files")
    base = {
        "train_files": f"{corpus_dir}/*",
        "valid_files": args.source,
        "test_files": args.source,
        "allow_split_overlap": True,  # valid and test: the same file (only train is timed)
    }
    rows = []
    read = run_worker("read", dict(base), os.path.join(tmp, "tfds"))
    rows.append(
        {
            "what": "baseline: read, decompress, split lines",
            "seconds": read["seconds"],
            "mb_per_s": mb / read["seconds"],
            "peak_rss_mib": read["peak_rss_mib"],
        }
    )
    for tok in args.tokenizers.split(","):
      settings = dict(
          base, tokenizer=tok, vocab_size=args.vocab_size if tok == "sentencepiece" else 0
      )
      data_dir = os.path.join(tmp, f"tfds_{tok}")
      shutil.rmtree(data_dir, ignore_errors=True)
      r = run_worker("prepare", settings, data_dir)
      rows.append(
          {
              "what": f"prepare, tokenizer={tok}",
              "seconds": r["seconds"],
              "mb_per_s": mb / r["seconds"],
              "peak_rss_mib": r["peak_rss_mib"],
              "train_tokens": r["tokens"],
              "vocab": r["vocab"],
              "x_baseline_time": r["seconds"] / read["seconds"],
          }
      )
      print(json.dumps(rows[-1]))
    result = {
        "machine": info,
        "corpus_mb": mb,
        "files": args.files,
        "source": args.source,
        "rows": rows,
        "loadavg_end": common.loadavg(),
        "peak_rss_target_mib": 2048,
        "all_under_target": all(r["peak_rss_mib"] < 2048 for r in rows),
    }
    common.write_json(args.out or common.default_json_path(info["host"], "prepare_text_"), result)
    print(f"{'what':<44} {'s':>8} {'MB/s':>8} {'peak RSS MiB':>13}")
    for r in rows:
      print(f"{r['what']:<44} {r['seconds']:8.1f} {r['mb_per_s']:8.2f} {r['peak_rss_mib']:13.0f}")
    return 0 if result["all_under_target"] else 1
  finally:
    if not args.workdir:
      shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
