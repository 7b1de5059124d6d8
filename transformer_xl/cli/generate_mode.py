"""``--mode=generate``: a checkpoint continues a prompt or a file of prompts.

``run_generate`` checks the flags, the prompts (``read_prompts``), the
output path and the model before anything is compiled, then runs
``LanguageModel.generate`` batch by batch: the text of the first sample
streams to stdout as it is made, every other sample follows its batch,
and ``--out`` receives every ``Generation`` as JSON.  ``modes.run`` calls
it after its checks.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys

import jax
import ml_collections
from etils import epath
from jax.sharding import Mesh

from transformer_xl import default_config
from transformer_xl.cli import user_errors
from transformer_xl.inference import language_model, sampling, trained_model
from transformer_xl.run import workdir as wd
from transformer_xl.util import files


def read_prompts(prompt: str | None, prompt_file: str | None) -> str | list[str]:
  """The prompt of ``--prompt`` (a str), or the prompts of ``--prompt_file``
  (a list: one per line of the UTF-8 file, without the line break; blank
  lines skipped).  Exactly one of the two.

  Raises:
    default_config.ConfigError: both or neither given, a file that is not
      UTF-8 text, or one with no prompt.
    FileNotFoundError: ``prompt_file`` does not exist.
  """
  if (prompt is None) == (prompt_file is None):
    raise default_config.ConfigError(
        "--mode=generate needs exactly one of --prompt=TEXT and --prompt_file=FILE (got "
        f"{'both' if prompt is not None else 'neither'})."
    )
  if prompt_file is None:
    return prompt
  path = epath.Path(prompt_file)
  if not path.exists():
    raise FileNotFoundError(f"--prompt_file={prompt_file} does not exist.")
  try:
    text = path.read_bytes().decode("utf-8")
  except UnicodeDecodeError as err:
    raise default_config.ConfigError(
        f"--prompt_file={prompt_file} is not UTF-8 text: {err}."
    ) from None
  prompts = [line for line in text.splitlines() if line.strip()]
  if not prompts:
    raise default_config.ConfigError(
        f"--prompt_file={prompt_file} has no prompt: write one prompt per line."
    )
  return prompts


def run_generate(
    config: ml_collections.ConfigDict,
    workdir: str,
    mesh: Mesh,
    *,
    prompt: str | None,
    prompt_file: str | None,
    num_tokens: int,
    top_k: int,
    top_p: float,
    temperature: float,
    seed: int,
    num_samples: int,
    out: str | None,
    stop: tuple[str, ...] = (),
    stop_at_eos: bool = False,
    batch_size: int = language_model.DEFAULT_BATCH_SIZE,
    source: str = "--config",
) -> language_model.Generation | list[language_model.Generation]:
  """``--mode=generate``: continues a prompt, or every line of a prompt
  file, with the workdir's latest checkpoint (Dai et al. 2019, Appendix E),
  the rows (prompts x samples) in batches of at most ``batch_size``
  (``LanguageModel.generate``; the samples are those of one batch).

  The model is the trained one with the free settings of ``config.model``
  (``trained_model.apply_free_settings``: ``dtype``, ``attention_impl``,
  ...; ``source`` names the config in the message that refuses another
  architecture); the corpus of one's own text is the workdir's saved
  tokenizer (``trained_model.load_corpus``).  The settings, the prompt
  source, the output path and the model are checked first, then the
  corpus loaded and the prompts encoded, then the checkpoint restored: bad
  input stops before anything is compiled.  The
  generated text of row 0 streams to stdout as it is produced; with
  several rows, each is headed by ``=== sample s ===`` (one prompt) or
  ``=== prompt p ===`` / ``=== prompt p, sample s ===`` (a prompt file),
  and the other rows of a batch follow when it is done.  What the model
  read and the settings go to stderr.  ``out`` (a .json path) receives
  ``language_model.Generation.to_json`` (a prompt file: a list of them,
  in the file's order, written batch by batch to a temporary file renamed
  to ``out`` at the end; an existing ``out`` is replaced, and the last
  line on stderr says so).

  Raises:
    default_config.ConfigError: a bad flag or prompt.
    FileNotFoundError: no prompt file, config, model_config.json or
      checkpoint.
    wd.WorkdirError: ``out`` cannot be written (``user_errors.check_output_path``).
    default_config.ConfigError: ``config`` changes the architecture.
    data.DataError: the corpus cannot be loaded or cannot encode a prompt.
  """
  if out:
    user_errors.check_output_path(out, example="samples.json", error=wd.WorkdirError)
  texts = read_prompts(prompt, prompt_file)
  try:
    sampling.SamplingSettings(top_k=top_k, top_p=top_p, temperature=temperature)
  except default_config.ConfigError as err:  # named as the flags
    raise default_config.ConfigError(
        re.sub(r"\b(top_k|top_p|temperature)=", r"--\1=", str(err))
    ) from None
  if num_tokens < 1 or num_samples < 1:
    raise default_config.ConfigError(
        f"--num_tokens={num_tokens} and --num_samples={num_samples} must be >= 1."
    )
  if batch_size < 1:
    raise default_config.ConfigError(
        f"--batch_size={batch_size} must be >= 1 (rows generated together; default "
        f"{language_model.DEFAULT_BATCH_SIZE})."
    )
  if not all(stop):
    raise default_config.ConfigError("--stop= is empty: give the text that ends a sample.")
  trained, _, _ = trained_model.model_configs(config, workdir, source)
  corpus = trained_model.load_corpus(config, trained, workdir)
  trained_model.require_tokenizer(
      corpus,
      "--prompt_file" if prompt_file else "--prompt",
      "--mode=eval (its accuracies include greedy decoding of every answer) or "
      "--mode=score --tokens=FILE.npy: generation continues text",
  )
  many = not isinstance(texts, str)
  prompt_ids = [
      trained_model.encode_prompt(corpus, t)  # before the checkpoint is read
      for t in (texts if many else [texts])
  ]
  lm = language_model.LanguageModel.from_workdir(workdir, config, mesh, corpus, source=source)
  c, main = lm.eval_cfg, jax.process_index() == 0
  n_rows = len(prompt_ids) * num_samples

  def header(p: int, s: int) -> str:
    if not many:
      return f"=== sample {s} ===\n"
    return f"=== prompt {p} ===\n" if num_samples == 1 else f"=== prompt {p}, sample {s} ===\n"

  if main:
    read = (
        f"the prompt as read ({len(prompt_ids[0])} tokens): {lm.corpus.decode(prompt_ids[0])!r}"
        if not many
        else f"{len(prompt_ids)} prompts of {prompt_file} ({min(map(len, prompt_ids))} to "
        f"{max(map(len, prompt_ids))} tokens as read)"
    )
    vocab = "" if lm.corpus.splits else f" using the tokenizer saved in {workdir}"
    print(
        f"Step {lm.step} of {workdir} ({lm.corpus.name}{vocab}); {read}; {n_rows} rows x up to "
        f"{num_tokens} tokens in batches of up to {batch_size} rows, top_k={top_k} "
        f"top_p={top_p} temperature={temperature} seed={seed}, stop={list(stop)} "
        f"stop_at_eos={stop_at_eos}; prompt segments of {c.tgt_len}, memory {c.mem_len}, "
        f"same_length={c.same_length}, clamp_len={c.clamp_len}.",
        file=sys.stderr,
        flush=True,
    )
    if n_rows > 1:
      sys.stdout.write(header(0, 0))

  # Row 0 streams token by token (it is in the first batch); every other row is printed,
  # and every prompt's Generation written to out, when its batch is done.
  first_batch = [True]
  replaced = bool(out) and epath.Path(out).exists()
  tmp = files.temporary_name(out) if out else None
  try:
    sink = tmp.open("w", encoding="utf-8") if out and main else None
  except OSError as err:
    raise user_errors.output_error(err, out) from None

  def on_text(pieces: list[str]) -> None:
    if main and first_batch[0]:
      sys.stdout.write(pieces[0])
      sys.stdout.flush()

  def on_batch(first: int, generations: list[language_model.Generation]) -> None:
    first_batch[0] = False
    if not main:
      return
    for p, g in enumerate(generations, start=first):
      for s, text in enumerate(g.texts):
        if (p, s) != (0, 0):
          sys.stdout.write(f"\n{header(p, s)}{text}")
    sys.stdout.flush()
    if sink is not None and many:
      sink.write(
          ("[" if first == 0 else ", ")
          + ", ".join(json.dumps(g.to_json(), ensure_ascii=False) for g in generations)
      )
      sink.flush()

  try:
    result = lm.generate(
        texts,
        num_tokens,
        top_k=top_k,
        top_p=top_p,
        temperature=temperature,
        seed=seed,
        num_samples=num_samples,
        stop=stop,
        stop_at_eos=stop_at_eos,
        on_text=on_text,
        batch_size=batch_size,
        on_batch=on_batch,
    )
    if sink is not None:
      sink.write(("]" if many else json.dumps(result.to_json(), ensure_ascii=False)) + "\n")
      sink.close()
      tmp.replace(epath.Path(out))
  except OSError as err:
    if sink is None or err.errno not in user_errors.OS_ERRNOS:
      raise
    raise user_errors.output_error(err, out) from None
  finally:  # a failed or interrupted run leaves no temporary file
    if sink is not None:
      with contextlib.suppress(OSError):  # a full disk fails the close's flush too
        sink.close()
      if tmp.exists():
        tmp.unlink()
  if main:
    sys.stdout.write("\n")
    sys.stdout.flush()
  if out and main:
    note = " (replacing the existing file)" if replaced else ""
    print(f"Wrote {out}{note}", file=sys.stderr, flush=True)
  return result
