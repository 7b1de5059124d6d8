"""LanguageModel and --mode=generate end to end, on a tiny model trained on a PTB sample."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from transformer_xl import LanguageModel, default_config
from transformer_xl.inference import sampling

from helpers import run_main, small_args, start_main, tiny_flags, write_ptb_sample

pytestmark = pytest.mark.slow  # end to end: a model trained by the command line

PROMPT = "the company said"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A workdir trained for 2 steps; eval segments of 4 tokens, memory 6, same_length."""
  tmp = tmp_path_factory.mktemp("lm")
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
  return tmp, workdir


@pytest.fixture
def read_only_dir(tmp_path):
  """make(name, copy_of=None): a read-only directory (holding a copy of copy_of): a tmpfs
  remounted read-only as root, chmod otherwise; None when neither can be had."""
  mounted = []

  def make(name, copy_of=None):
    path = tmp_path / name
    path.mkdir()
    if os.geteuid() != 0:
      if copy_of is not None:
        shutil.copytree(copy_of, path, dirs_exist_ok=True)
      for p in [path, *path.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
      return path
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(path)])
    if r.returncode != 0:
      return None
    mounted.append(path)
    if copy_of is not None:
      shutil.copytree(copy_of, path, dirs_exist_ok=True)
    r = subprocess.run(["mount", "-o", "remount,ro", str(path)])
    return path if r.returncode == 0 else None

  yield make
  for path in mounted:
    subprocess.run(["umount", str(path)], check=False)


@pytest.fixture(scope="module")
def lm(trained):
  return LanguageModel.from_workdir(str(trained[1]))


def words(lm):
  """A prompt of words the sample corpus has."""
  return " ".join(lm.corpus.vocab[i] for i in (5, 9, 2))


def test_generate_and_score_text_agree(lm):
  """The generated text re-read by score_text (Evaluator.score) gets, token for token, the
  log-probabilities it was sampled from (same_length: the same context)."""
  prompt = words(lm)
  out = lm.generate(prompt, 9, top_k=0, seed=4, num_samples=2)
  assert out.tokens.shape == (2, 9) and out.tokens.dtype == np.int32
  ids = lm.encode_prompt(prompt)
  np.testing.assert_array_equal(out.prompt_tokens, ids)
  assert ids[0] == lm.corpus.boundary_id and ids[-1] != lm.corpus.boundary_id  # line left open
  for b in range(2):
    assert lm.corpus.decode(np.concatenate([ids, out.tokens[b]])) == (
        lm.corpus.decode(ids) + out.texts[b]
    )
  steps = list(
      lm.generator.stream(
          lm.params,
          np.tile(ids, (2, 1)),
          9,
          sampling.SamplingSettings(top_k=0),
          seed=4,
          log_probs=True,
      )
  )
  np.testing.assert_array_equal(np.stack([t for t, _ in steps], 1), out.tokens)
  logp = np.stack([lp[0][t[0]] for t, lp in steps])
  score = lm.score_text(lm.corpus.decode(ids[1:]) + out.texts[0])
  n = len(ids) - 1
  np.testing.assert_array_equal(score.tokens[n : n + 9], out.tokens[0])
  np.testing.assert_allclose(-score.nll[n : n + 9], logp, atol=2e-5)
  assert score.ppl == pytest.approx(np.exp(score.nll.mean()), rel=1e-6)


def test_a_batch_of_prompts_gives_each_what_it_gets_alone(lm):
  """Prompts of different lengths in one call, one seed each: every prompt's Generation
  (tokens and text) is the one it gets alone with its seed; a list of one prompt gives a
  list."""
  v = lm.corpus.vocab
  long_prompt = " ".join(v[i % len(v)] for i in (7, 3, 12, 4, 9, 8, 21, 5, 6, 30, 2))
  prompts = [words(lm), long_prompt, v[11 % len(v)]]
  outs = lm.generate(prompts, 6, top_k=0, seed=[3, 1, 9])
  assert [o.prompt for o in outs] == prompts and [o.settings["seed"] for o in outs] == [3, 1, 9]
  for text, seed, out in zip(prompts, [3, 1, 9], outs):
    alone = lm.generate(text, 6, top_k=0, seed=seed)
    np.testing.assert_array_equal(out.tokens, alone.tokens)
    assert out.texts == alone.texts
  (one,) = lm.generate([prompts[0]], 6, top_k=0, seed=[3])
  np.testing.assert_array_equal(one.tokens, outs[0].tokens)
  with pytest.raises(default_config.ConfigError, match="one seed per prompt"):
    lm.generate(prompts, 6, seed=[1, 2])


def test_samples_end_at_their_stop_conditions(lm):
  """Three prompts x 2 samples, up to 40 tokens: with stop_at_eos every sample is its
  unstopped self up to and including its first <eos> ("eos"), or whole ("length"); with a
  stop string (a word one sample draws late, another early) each sample ends with the
  token that completes its first occurrence ("stop") or has none in its whole text; the
  texts still continue the prompts token for token; the batch ends with its last sample."""
  v = lm.corpus.vocab
  prompts = [words(lm), v[11 % len(v)], " ".join(v[i % len(v)] for i in (7, 3, 12, 4, 9))]
  kw = dict(top_k=0, seed=5, num_samples=2)
  free = lm.generate(prompts, 40, **kw)
  free_rows = [(g, s) for g in free for s in range(2)]
  eos = lm.corpus.boundary_id

  def check(outs, ends):
    n = max(ends)
    for (g, s), (o, so), end in zip(free_rows, [(o, s) for o in outs for s in range(2)], ends):
      assert o.tokens.shape[1] == n
      np.testing.assert_array_equal(o.tokens[so], np.r_[g.tokens[s, :end], [-1] * (n - end)])
      assert lm.corpus.decode(np.r_[o.prompt_tokens, o.tokens[so, :end]]) == (
          lm.corpus.decode(o.prompt_tokens) + o.texts[so]
      )

  ends = [
      int(np.argmax(g.tokens[s] == eos)) + 1 if (g.tokens[s] == eos).any() else 40
      for g, s in free_rows
  ]
  assert 40 in ends and min(ends) < 40, ends  # some samples stop, not all
  outs = lm.generate(prompts, 40, stop_at_eos=True, **kw)
  check(outs, ends)
  assert [o.finish_reasons[s] for o in outs for s in range(2)] == [
      "length" if e == 40 and (g.tokens[s] != eos).all() else "eos"
      for (g, s), e in zip(free_rows, ends)
  ]

  def first_end(g, s, word):  # the tokens up to the one whose text completes ` word`
    for end in range(1, 41):
      if (
          word
          in lm.corpus.decode(np.r_[g.prompt_tokens, g.tokens[s, :end]])[
              len(lm.corpus.decode(g.prompt_tokens)) :
          ]
      ):
        return end
    return 40

  drawn = np.bincount(np.concatenate([g.tokens.ravel() for g in free]), minlength=len(v))
  drawn[eos] = 0
  word = " " + v[int(drawn.argmax())]  # the most frequent word, after a space
  ends = [first_end(g, s, word) for g, s in free_rows]
  assert len(set(ends)) > 1, ends
  outs = lm.generate(prompts, 40, stop=["zzz never", word], **kw)
  check(outs, ends)
  for o in outs:
    for s in range(2):
      assert o.finish_reasons[s] == ("stop" if word in o.texts[s] else "length")
      assert o.to_json()["samples"][s]["finish_reason"] == o.finish_reasons[s]
  with pytest.raises(default_config.ConfigError, match="non-empty"):
    lm.generate(prompts, 3, stop=[""])


def test_prompts_in_batches_get_what_they_get_in_one_batch(lm):
  """5 prompts of different lengths in batches of 2 rows (and 2 samples each in batches of
  3 rows: a prompt's samples split over two batches), with an int seed and with one seed per
  prompt: the same Generations as one batch; on_batch hands them out in order as their
  batches end."""
  v = lm.corpus.vocab
  prompts = [" ".join(v[(7 * j + i) % len(v)] for i in range(1 + 3 * j)) for j in range(5)]
  for kw, batch_size in [
      (dict(seed=4), 2),
      (dict(seed=[3, 1, 9, 2, 5]), 2),
      (dict(seed=6, num_samples=2), 3),
      (dict(seed=6, stop_at_eos=True, num_samples=2), 3),
  ]:
    whole = lm.generate(prompts, 7, top_k=0, **kw)
    handed = []
    batched = lm.generate(
        prompts,
        7,
        top_k=0,
        batch_size=batch_size,
        on_batch=lambda first, gens: handed.append((first, len(gens))),
        **kw,
    )
    assert [b.to_json() for b in batched] == [w.to_json() for w in whole], (kw, batch_size)
    if "stop_at_eos" not in kw:  # no stop: every batch takes num_tokens steps
      for b, w in zip(batched, whole):
        np.testing.assert_array_equal(b.tokens, w.tokens)
    assert [f for f, _ in handed] == list(np.cumsum([0] + [n for _, n in handed])[:-1])
    assert sum(n for _, n in handed) == 5 and len(handed) > 1, handed


def test_text_streams_step_by_step(lm):
  seen = []
  out = lm.generate(words(lm), 6, top_k=1, num_samples=2, on_text=seen.append)
  assert len(seen) == 6 and all(len(p) == 2 for p in seen)
  assert "".join(p[0] for p in seen) == out.texts[0] == out.texts[1]  # greedy: identical rows


@pytest.mark.parametrize(
    "prompt, kwargs, match",
    [
        ("", {}, "is empty"),
        ("   ", {}, "is empty"),
        ("zzqx qqzx", {}, "has no known token: every word would be <unk>"),
        ("the", dict(num_tokens=0), "num_tokens=0"),
        ("the", dict(top_p=1.5), "top_p=1.5"),
        ("the", dict(temperature=-1.0), "temperature=-1.0"),
        ("the", dict(temperature=float("inf")), "temperature=inf must be > 0 and finite"),
        ("the", dict(temperature=float("nan")), "temperature=nan must be > 0 and finite"),
        ("the", dict(batch_size=0), "batch_size=0 must be an integer >= 1"),
    ],
)
def test_bad_generation_input_is_a_config_error(lm, prompt, kwargs, match):
  args = {"num_tokens": 3, **kwargs}
  with pytest.raises(default_config.ConfigError, match=match):
    lm.generate(prompt, **args)
  assert lm.generator.token_step._cache_size() <= 1  # nothing new compiled


def test_generate_from_the_command_line(trained, lm):
  tmp, workdir = trained
  out = tmp / "gen.json"
  r = run_main(
      [
          f"--workdir={workdir}",
          "--mode=generate",
          f"--prompt={words(lm)}",
          "--num_tokens=7",
          "--num_samples=2",
          "--top_k=5",
          "--top_p=0.9",
          "--temperature=0.8",
          "--seed=3",
          f"--out={out}",
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "Traceback" not in r.stderr
  got = json.loads(out.read_text())
  assert got["prompt"] == words(lm)
  assert (
      got["seed"],
      got["top_k"],
      got["top_p"],
      got["temperature"],
      got["num_tokens"],
      got["num_samples"],
      got["step"],
  ) == (3, 5, 0.9, 0.8, 7, 2, 2)
  assert got["context"] == {"tgt_len": 4, "mem_len": 6, "same_length": True, "clamp_len": 0}
  assert len(got["samples"]) == 2
  assert got["tokens"] == got["samples"][0]["tokens"] and got["text"] == got["samples"][0]["text"]
  # The same call through the API gives the same samples (the seed fixes them).
  api = lm.generate(words(lm), 7, top_k=5, top_p=0.9, temperature=0.8, seed=3, num_samples=2)
  assert [s["tokens"] for s in got["samples"]] == api.tokens.tolist()
  assert [s["text"] for s in got["samples"]] == list(api.texts)
  assert got["prompt_tokens"] == lm.encode_prompt(words(lm)).tolist()
  # stdout: sample 0 streamed, then sample 1; the settings go to stderr.
  assert r.stdout == (f"=== sample 0 ===\n{api.texts[0]}\n=== sample 1 ===\n{api.texts[1]}\n")
  assert "the prompt as read" in r.stderr


def test_generate_a_prompt_file_from_the_command_line(trained, lm, tmp_path):
  """--prompt_file: one prompt per line (a blank line skipped), one batch; with
  --stop_at_eos and a --stop string: stdout has each prompt's text under its header, --out
  a list of the API's Generations, in the file's order."""
  _, workdir = trained
  v = lm.corpus.vocab
  prompts = [words(lm), " ".join(v[i % len(v)] for i in (7, 3, 12, 4, 9))]
  prompt_file = tmp_path / "prompts.txt"
  prompt_file.write_text(f"{prompts[0]}\n\n{prompts[1]}\n")
  out = tmp_path / "gen.json"
  r = run_main(
      [
          f"--workdir={workdir}",
          "--mode=generate",
          f"--prompt_file={prompt_file}",
          "--num_tokens=12",
          "--top_k=0",
          "--seed=2",
          "--stop_at_eos",
          f"--stop={v[5]}",
          f"--out={out}",
      ]
  )
  assert r.returncode == 0, r.stderr[-3000:]
  api = lm.generate(prompts, 12, top_k=0, seed=2, stop_at_eos=True, stop=[v[5]])
  got = json.loads(out.read_text())
  assert [g["prompt"] for g in got] == prompts
  assert got == [json.loads(json.dumps(a.to_json())) for a in api]
  assert r.stdout == f"=== prompt 0 ===\n{api[0].texts[0]}\n=== prompt 1 ===\n{api[1].texts[0]}\n"
  # In batches of one row: the same stdout and --out, each batch printed as it ends.
  out1 = tmp_path / "gen1.json"
  r1 = run_main([a.replace(str(out), str(out1)) for a in r.args[3:]] + ["--batch_size=1"])
  assert r1.returncode == 0, r1.stderr[-3000:]
  assert r1.stdout == r.stdout and json.loads(out1.read_text()) == got
  assert "in batches of up to 1 rows" in r1.stderr
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary


def _run_all(arg_lists):
  """Runs the command lines at once (each a separate process) and waits for all."""
  procs = [start_main(args, env={"JAX_LOG_COMPILES": "1"}) for args in arg_lists]
  return [p.communicate(timeout=300) + (p.returncode,) for p in procs]


def test_bad_input_from_the_command_line(trained, tmp_path, read_only_dir):
  _, workdir = trained
  ro = read_only_dir("ro")
  bare = tmp_path / "no_checkpoint"  # the run's files but no checkpoint
  bare.mkdir()
  for name in ("config.json", "model_config.json"):
    shutil.copy(workdir / name, bare / name)
  prompt_file = tmp_path / "prompt.txt"
  prompt_file.write_text("the\n")
  blank = tmp_path / "blank.txt"
  blank.write_text("\n  \n")
  gen = ["--mode=generate", f"--workdir={workdir}"]
  cases = [
      (["--mode=generate", f"--workdir={bare}", "--prompt=the"], "No checkpoint in"),
      (
          ["--mode=generate", f"--workdir={tmp_path / 'nothing'}", "--prompt=the"],
          "config.json does not exist",
      ),
      (gen + ["--prompt="], "is empty"),
      (gen + ["--prompt=zzqx qqzx"], "has no known token"),
      (gen + ["--prompt=the", "--num_tokens=0"], "--num_tokens=0"),
      (gen + ["--prompt=the", "--top_p=0"], r"top_p=0.0 must be in (0, 1]"),
      (gen + ["--prompt=the", "--temperature=0"], "temperature=0.0 must be > 0"),
      (gen + ["--prompt=the", f"--prompt_file={prompt_file}"], "exactly one of --prompt"),
      (gen + [f"--prompt_file={tmp_path / 'missing.txt'}"], "missing.txt does not exist"),
      (gen + [f"--prompt_file={blank}"], "has no prompt: write one prompt per line"),
      (gen + ["--prompt=the", "--stop="], "--stop= is empty"),
      (gen, "(got neither)"),
      (gen + ["--prompt=the", f"--out={tmp_path / 'no' / 'x.json'}"], "does not exist"),
      # Non-finite sampling settings would sample uniformly (top_k ignored).
      (gen + ["--prompt=the", "--temperature=inf"], "--temperature=inf must be > 0 and finite"),
      (gen + ["--prompt=the", "--temperature=nan"], "--temperature=nan must be > 0 and finite"),
      (gen + ["--prompt=the", "--top_p=nan"], r"--top_p=nan must be in (0, 1]"),
      (gen + ["--prompt=the", "--batch_size=0"], "--batch_size=0 must be >= 1"),
      # --out is checked before the work, not after it.
      (gen + ["--prompt=the", f"--out={tmp_path}"], f"--out={tmp_path} is a directory"),
      (gen + [f"--prompt_file={prompt_file}", f"--out={tmp_path}"], "is a directory"),
  ]
  if ro is not None:
    cases.append((gen + ["--prompt=the", f"--out={ro / 'x.json'}"], "cannot be written"))
  for (args, message), (stdout, stderr, rc) in zip(cases, _run_all([a for a, _ in cases])):
    lines = [l for l in stderr.splitlines() if l.startswith("error: ")]
    assert rc != 0 and len(lines) == 1 and message in lines[0], (args, stderr[-2000:])
    assert "Traceback" not in stderr, stderr[-2000:]
    compiled = [l for l in stderr.splitlines() if "Compiling" in l]
    if "No checkpoint" in message:  # restore_params makes a PRNG key (scalar ops), no more
      assert all("types (ShapedArray(int32[]),)" in l for l in compiled), compiled
    else:
      assert not compiled, (args, compiled)  # stopped before anything was compiled
    assert stdout == ""


def test_eval_of_a_read_only_workdir_prints_the_results_it_cannot_save(
    trained, tmp_path, read_only_dir
):
  """--mode=eval on a read-only workdir: a note before the evaluation, both splits
  evaluated, the results (those a writable copy writes to eval_results.json) printed as
  one JSON line, exit status 0."""
  _, workdir = trained
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  (copy / "eval_results.json").unlink(missing_ok=True)
  ro = read_only_dir("ro_wd", copy_of=copy)
  if ro is None:
    pytest.skip("no read-only directory can be made here")
  writable, read_only = [
      run_main([f"--workdir={w}", "--mode=eval"], timeout=300) for w in (copy, ro)
  ]
  assert writable.returncode == 0, writable.stderr[-3000:]
  saved = json.loads((copy / "eval_results.json").read_text())
  assert read_only.returncode == 0, read_only.stderr[-3000:]
  assert "Traceback" not in read_only.stderr
  out = read_only.stdout + read_only.stderr
  note = out.index(f"--workdir={ro} cannot be written (")
  assert note < out.index("valid: loss") < out.index("test: loss")
  (line,) = [l for l in out.splitlines() if "eval results (not saved): " in l]
  assert f"Could not save {ro / 'eval_results.json'}" in line
  assert json.loads(line.split("eval results (not saved): ", 1)[1]) == saved
  assert not (ro / "eval_results.json").exists()
