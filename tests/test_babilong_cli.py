"""BABILong through the real command line (``data.dataset="babilong:qa1"``).

bAbI-format files (``data.babi_like``) in a manual dir, background text from
the test's own files, the fixtures' tokenizer: ``python -m
transformer_xl.main`` trains a tiny model with the curriculum's mixed
lengths, ``--mode=eval`` scores valid and test with the authors' answer
check (``babilong_accuracy``) beside the teacher-forced accuracies, and
missing files or a tokenizer BABILong cannot use end in one message, a
non-zero exit and no traceback.
"""

from __future__ import annotations

import json

import pytest

from transformer_xl.data import babi_like

from helpers import REPO, run_main

pytestmark = pytest.mark.slow  # two commands that compile: ~30 s on 2 shared cores

FIX = REPO / "tests" / "fixtures" / "babilong"


def _args(tmp_path, workdir, *extra):
  noise = []
  docs = json.loads((FIX / "noise_train.json").read_text())
  docs += json.loads((FIX / "noise_test.json").read_text())
  for i, d in enumerate(docs):
    (tmp_path / f"noise{i:02d}.txt").write_text(d)
    noise.append(str(tmp_path / f"noise{i:02d}.txt"))
  babi_like.write_task(tmp_path / "babi", "qa1", train_stories=40, test_stories=6, seed=5)
  return [
      f"--config={REPO / 'configs' / 'quickstart.py'}",
      f"--workdir={workdir}",
      "--config.data.dataset=babilong:qa1",
      f"--config.data.manual_dir={tmp_path / 'babi'}",
      "--config.data.download=False",
      f"--config.data.tokenizer=pretrained:{FIX / 'tokenizer.json'}",
      "--config.data.babilong_noise=text",
      f"--config.data.train_files={','.join(noise[:6])}",
      f"--config.data.valid_files={','.join(noise[6:8])}",
      f"--config.data.test_files={','.join(noise[8:])}",
      "--config.data.babilong_sample_size=128",
      "--config.data.babilong_train_sample_sizes=96,128",
      "--config.data.babilong_mixed_length_ratio=0.5",
      "--config.data.babilong_max_n_facts=6",
      "--config.data.babilong_valid_size=8",
      "--config.data.babilong_test_size=6",
      "--config.model.n_layer=2",
      "--config.model.d_model=16",
      "--config.model.n_head=2",
      "--config.model.d_head=8",
      "--config.model.d_inner=32",
      "--config.model.tgt_len=32",
      "--config.model.mem_len=32",
      "--config.train.num_steps=8",
      "--config.train.warmup_steps=0",
      "--config.train.log_every=4",
      "--config.train.eval_every=8",
      "--config.train.global_batch=4",
      "--config.eval.global_batch=4",
      "--config.eval.tgt_len=32",
      "--config.eval.mem_len=32",
      "--config.checkpoint.every_steps=8",
      *extra,
  ]


def test_train_then_eval_reports_the_authors_accuracy(tmp_path):
  wd = tmp_path / "wd"
  proc = run_main(_args(tmp_path, wd), devices=1)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert "Corpus babilong:qa1" in proc.stdout + proc.stderr
  proc = run_main(_args(tmp_path, wd, "--mode=eval"), devices=1)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  res = json.loads((wd / "eval_results.json").read_text())
  for split, n in (("valid", 8), ("test", 6)):
    r = res[split]
    assert r["greedy_examples"] == n and r["examples"] == n
    for key in ("babilong_accuracy", "greedy_accuracy", "answer_accuracy"):
      assert 0.0 <= r[key] <= 1.0
    # a whole answer decoded exactly is found by the authors' check too
    assert r["babilong_accuracy"] >= r["greedy_accuracy"]
  assert "babilong_accuracy" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "extra, words",
    [
        (
            ("--config.data.manual_dir={empty}",),
            ("qa1_single-supporting-fact_train.txt", "manual dir"),
        ),
        (("--config.data.tokenizer=word",), ("pretrained tokenizer", "tokenizer.json")),
        (("--config.data.babilong_task_start_pct=0.5",), ("set together",)),
        (("--config.model.tgt_len=48",), ("does not divide",)),
    ],
)
def test_bad_input_is_one_message(tmp_path, extra, words):
  extra = [e.format(empty=tmp_path / "empty") for e in extra]
  proc = run_main(_args(tmp_path, tmp_path / "wd", *extra), devices=1)
  out = proc.stdout + proc.stderr
  assert proc.returncode != 0
  assert "Traceback" not in out
  for w in words:
    assert w in out, out[-2000:]
