"""python -m transformer_xl.harness: the lm-evaluation-harness's own command line
on a quickstart workdir, over task YAMLs of local files (no Hub): a
rolling-perplexity task equal to --mode=score, a multiple-choice task and a
generation task; a bad model argument is one error line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import run_main, run_module, small_args, tiny_flags, write_ptb_sample

pytestmark = pytest.mark.slow  # a model trained by the command line, then the harness


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A quickstart workdir on the PTB sample, 2 steps; eval segments 4, memory 6."""
  tmp = tmp_path_factory.mktemp("harness")
  manual = write_ptb_sample(tmp / "ptb")
  workdir = tmp / "wd"
  tiny = tiny_flags(
      train__global_batch=None,
      train__num_steps=2,
      train__warmup_steps=1,
      eval__tgt_len=4,
      eval__mem_len=6,
  )
  r = run_main(small_args(tmp, workdir, manual, *tiny))
  assert r.returncode == 0, r.stderr[-3000:]
  return tmp, manual, workdir


def _jsonl(path: Path, rows: list[dict]) -> Path:
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def write_tasks(folder: Path, docs: list[str]) -> Path:
  """Three task YAMLs over local JSON-lines files (the harness's ``dataset_path: json``)."""
  folder.mkdir(parents=True, exist_ok=True)
  rolling = _jsonl(folder / "rolling.jsonl", [{"text": d} for d in docs])
  mc = _jsonl(
      folder / "mc.jsonl",
      [
          {"context": "the cat sat on the", "choices": [" mat", " blue", " quickly"], "label": 0},
          {"context": "a big red", "choices": [" house", " on"], "label": 0},
      ],
  )
  gen = _jsonl(
      folder / "gen.jsonl",
      [
          {"prompt": "the cat sat", "answer": "on"},
          {"prompt": "a dog ran under the", "answer": "rug"},
      ],
  )
  common = "dataset_path: json\ntest_split: test\nmetadata:\n  version: 1.0\n"
  (folder / "rolling.yaml").write_text(
      f"task: txl_rolling\ndataset_kwargs:\n  data_files:\n    test: {rolling}\n{common}"
      "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
      "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n"
      "  - metric: bits_per_byte\n"
  )
  (folder / "mc.yaml").write_text(
      f"task: txl_mc\ndataset_kwargs:\n  data_files:\n    test: {mc}\n{common}"
      "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\n"
      "doc_to_target: '{{label}}'\ntarget_delimiter: ''\nmetric_list:\n  - metric: acc\n"
  )
  (folder / "gen.yaml").write_text(
      f"task: txl_gen\ndataset_kwargs:\n  data_files:\n    test: {gen}\n{common}"
      "output_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{answer}}'\n"
      "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 3\n  do_sample: false\n"
      "metric_list:\n  - metric: exact_match\n"
  )
  return folder


def _samples(out: Path, task: str) -> list[dict]:
  (path,) = sorted(out.rglob(f"samples_{task}_*.jsonl"))
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_harness_runs_three_local_tasks_and_rolling_equals_mode_score(trained, tmp_path):
  tmp, manual, workdir = trained
  docs = [" the cat sat on the mat \n a dog ran under the rug \n", " the big red house \n"]
  tasks = write_tasks(tmp_path / "tasks", docs)
  out = tmp_path / "out"
  env = {"HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1"}
  r = run_module(
      "transformer_xl.harness",
      "run",
      "--model",
      "transformer_xl",
      "--model_args",
      f"workdir={workdir}",
      "--batch_size",
      "2",
      "--tasks",
      "txl_rolling,txl_mc,txl_gen",
      "--include_path",
      str(tasks),
      "--output_path",
      str(out),
      "--log_samples",
      devices=1,
      env=env,
      timeout=900,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  (results_file,) = sorted(out.rglob("results_*.json"))
  results = json.loads(results_file.read_text())["results"]
  assert set(results) == {"txl_rolling", "txl_mc", "txl_gen"}
  assert (
      0 <= results["txl_mc"]["acc,none"] <= 1 and 0 <= results["txl_gen"]["exact_match,none"] <= 1
  )
  # Rolling: each document's log-likelihood equals --mode=score's NLLs of the same text.
  rolling = {s["doc"]["text"]: s["filtered_resps"][0] for s in _samples(out, "txl_rolling")}
  total_ll, words = 0.0, 0
  for i, doc in enumerate(docs):
    text, nll = tmp_path / f"doc{i}.txt", tmp_path / f"nll{i}.npy"
    text.write_text(doc)
    r = run_main([f"--workdir={workdir}", "--mode=score", f"--text={text}", f"--out={nll}"])
    assert r.returncode == 0, r.stderr[-3000:]
    want = -float(np.load(nll).astype(np.float64).sum())
    np.testing.assert_allclose(float(rolling[doc]), want, rtol=1e-5)
    total_ll, words = total_ll + want, words + len(re.split(r"\s+", doc))  # the harness's count
  # The harness's word perplexity is exp(-sum ll / words) over the two documents.
  got = results["txl_rolling"]["word_perplexity,none"]
  np.testing.assert_allclose(got, np.exp(-total_ll / words), rtol=1e-5)
  # Generation: the greedy continuation, cut at the newline (at most 3 words).
  for s in _samples(out, "txl_gen"):
    assert "\n" not in s["filtered_resps"][0] and len(s["filtered_resps"][0].split()) <= 3


def test_a_bad_model_argument_is_one_error_line(trained, tmp_path):
  _, _, workdir = trained
  r = run_module(
      "transformer_xl.harness",
      "run",
      "--model",
      "transformer_xl",
      "--model_args",
      f"workdir={workdir}",
      "--batch_size",
      "0",
      "--tasks",
      "txl_mc",
      "--include_path",
      str(write_tasks(tmp_path / "tasks", ["the cat\n"])),
      devices=1,
      env={"HF_DATASETS_OFFLINE": "1"},
      timeout=600,
  )
  assert r.returncode == 1
  assert r.stderr.strip().splitlines()[-1].startswith("error: batch_size='0': give an integer >= 1")
  assert "Traceback" not in r.stderr
