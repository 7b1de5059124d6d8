"""The command-line modes: what ``python -m transformer_xl.main`` does with its flags.

``main.py`` defines the flags and calls ``main``, which checks their usage,
sets the process-wide settings and reads them into a ``Request`` for
``run``; everything here and in the mode modules calls the library
(``train``, ``evaluate``, ``language_model``) and is the only place that
prints results for a user, reads ``--tokens``/``--text``/``--prompt_file``
or writes ``--out``:

* ``--mode=train``: ``run_train``, which calls ``train.train_and_evaluate``;
  SIGTERM or Ctrl-C is a clean stop.
* ``--mode=eval``: ``eval_modes.run_eval``, valid and test of the latest
  checkpoint.
* ``--mode=score``: ``eval_modes.run_score``, the per-token NLL of
  ``--tokens`` or ``--text``.
* ``--mode=generate``: ``generate_mode.run_generate``, which continues
  ``--prompt`` or ``--prompt_file``.

Everything that can be checked before compiling is checked first, in this
order: the output path, the workdir, the config (``default_config.validate``:
keys, values, the mesh against the devices and batch), for eval, score and
generate the config's model against the trained one (its architecture
fixed, its free settings applied: ``trained_model.apply_free_settings``),
then the data files, then the checkpoint's model; so bad input fails in
seconds.  Errors a user can cause end as one ``error: ...`` line with exit
status 1 (``user_errors.report``; ``--debug`` shows their traceback).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import ml_collections
import numpy as np
from absl import app, flags
from etils import epath
from jax.sharding import Mesh

from transformer_xl import data, default_config, sharding
from transformer_xl.cli import (
    dynamic_modes,
    eval_modes,
    generate_mode,
    process_settings,
    saved_config,
    user_errors,
)
from transformer_xl.data import text_vocab
from transformer_xl.inference import dynamic_eval, language_model, text_scores, trained_model
from transformer_xl.run import distributed, lock
from transformer_xl.run import workdir as wd
from transformer_xl.training import curriculum, init_from, train
from transformer_xl.util import report

MODES = ("train", "eval", "score", "generate")


@dataclasses.dataclass(frozen=True)
class Request:
  """What the command line asked for (``main.py``'s flags, same names;
  ``request_of_flags``).

  Attributes:
    mode: one of ``MODES``.
    workdir: the run's directory.
    config: the ``--config`` file's config (None: the workdir's config.json).
    config_source: what ``config`` came from, for the message that refuses
      another architecture (None: "--config", or the workdir's config.json
      when ``config`` is None).
    tokens, text, out: ``--mode=score`` (and ``out`` of ``--mode=generate``).
    dynamic_stats: ``--mode=score`` with dynamic evaluation: the statistics' text
      (.npy token rows or a text file; None: the training split).
    prompt, prompt_file, num_tokens, num_samples, stop, stop_at_eos: ``--mode=generate``.
    batch_size: ``--mode=generate``'s rows generated together at most.
    top_k, top_p, temperature, seed: ``--mode=generate``'s sampling.
    coordinator_address, num_processes, process_id: a multi-process run.
  """

  mode: str
  workdir: str
  config: ml_collections.ConfigDict | None = None
  config_source: str | None = None
  tokens: str | None = None
  text: str | None = None
  out: str | None = None
  prompt: str | None = None
  prompt_file: str | None = None
  num_tokens: int = 100
  stop: tuple[str, ...] = ()
  stop_at_eos: bool = False
  top_k: int = 40
  top_p: float = 1.0
  temperature: float = 1.0
  seed: int = 0
  num_samples: int = 1
  batch_size: int = language_model.DEFAULT_BATCH_SIZE
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  dynamic_stats: str | None = None


def main(argv: Sequence[str], flag_values: flags.FlagValues) -> None:
  """``python -m transformer_xl.main`` once its flags (``main.py``'s) are
  parsed: the usage checks, the process-wide settings (logging, memory
  released after compiles), then ``run`` of the flags' ``Request``.

  Raises:
    app.UsageError: arguments that are not flags, no --workdir, no --config
      to train, or --mode=score without --out and exactly one of --tokens
      and --text.
  """
  f = flag_values
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if f.workdir is None:
    raise app.UsageError("--workdir is required.")
  if f.config is None and f.mode == "train":
    raise app.UsageError("--config is required to train.")
  if f.mode == "score" and (bool(f.tokens) == bool(f.text) or not f.out):
    raise app.UsageError(
        "--mode=score needs --out=NLL.npy and one of --tokens=FILE.npy or --text=FILE."
    )
  process_settings.configure_logging(f.debug, f["verbosity"].present)
  process_settings.release_after_compiles()  # compilers' freed memory back to the kernel
  run(request_of_flags(f), debug=f.debug)


def request_of_flags(f: flags.FlagValues) -> Request:
  """The ``Request`` of ``main.py``'s parsed flags (the same names); the
  config's source is the workdir's config.json when ``--config`` is that
  file with ``--config.*`` overrides (``saved_config.source``)."""
  config_source = None
  if f.config is not None:
    config_source = saved_config.source(f["config"].config_filename)
  return Request(
      mode=f.mode,
      workdir=f.workdir,
      config=f.config,
      config_source=config_source,
      tokens=f.tokens,
      text=f.text,
      out=f.out,
      dynamic_stats=f.dynamic_stats,
      prompt=f.prompt,
      prompt_file=f.prompt_file,
      num_tokens=f.num_tokens,
      stop=tuple(f.stop),
      stop_at_eos=f.stop_at_eos,
      top_k=f.top_k,
      top_p=f.top_p,
      temperature=f.temperature,
      seed=f.seed,
      num_samples=f.num_samples,
      batch_size=f.batch_size,
      coordinator_address=f.coordinator_address,
      num_processes=f.num_processes,
      process_id=f.process_id,
  )


def run(request: Request, debug: bool = False) -> None:
  """Runs one command-line mode; a user's mistake exits with one ``error:``
  line and status 1 (with ``debug``: its traceback).

  Raises:
    SystemExit: a user error (``user_errors.USER_ERRORS``, an OSError of the
      environment).
  """
  with user_errors.report(debug):
    _run(request)


def _run(r: Request) -> None:
  """``run``'s work, in the order of its checks (paths, config, workdir,
  data, then the mode)."""
  process_settings.initialize_distributed(r.coordinator_address, r.num_processes, r.process_id)
  if r.mode == "score":
    user_errors.check_output_path(r.out)
  elif r.mode == "generate" and r.out:
    user_errors.check_output_path(r.out, example="samples.json", error=wd.WorkdirError)
  wd.require_dir(r.workdir)
  config = r.config if r.config is not None else wd.load_config(r.workdir)
  if r.mode != "train":
    _check_trained_memory(config, r.workdir)
  tokens = user_errors.load_tokens(r.tokens) if r.mode == "score" and r.tokens else None
  default_config.validate(
      config,
      jax.device_count(),
      training=r.mode == "train",
      device_kind=jax.devices()[0].device_kind,
  )
  dynamic_modes.check_request(r.mode, r.dynamic_stats, config)
  if r.mode != "train" and config.train.get("curriculum"):
    raise default_config.ConfigError(
        f"--mode={r.mode} takes one model, and train.curriculum trains one per stage: give "
        f"--workdir={epath.Path(r.workdir) / 'stages' / 'NN'} (a stage's run; the last one is "
        "the final model), without train.curriculum. The final model's results at every "
        f"stage are in {epath.Path(r.workdir) / curriculum.RESULTS}."
    )
  if r.mode != "train":
    _run_mode(r, config, tokens)
    return
  wd.check_writable(r.workdir)
  init_from.check_source(config.train.get("init_from", ""), r.workdir)  # before the data
  with lock.training_lock(r.workdir):  # before the data: a second run stops now
    _run_mode(r, config, tokens)


def _check_trained_memory(config: ml_collections.ConfigDict, workdir: str) -> None:
  """``model.memory`` is the trained model's where the workdir has one.

  Raises:
    default_config.ConfigError: the config names another memory than the
      one the workdir's model was trained with (before the config's other
      checks, whose advice is for a run being set up).
  """
  if not (epath.Path(workdir) / "model_config.json").exists():
    return
  trained = wd.load_model_config(workdir)[0].memory
  asked = config.model.get("memory", "xl")
  if asked != trained:
    raise default_config.ConfigError(
        f"model.memory={asked!r}, but {workdir} was trained with model.memory={trained!r}: "
        f"the memory is part of the trained model; drop --config.model.memory (its "
        f"evaluation settings are eval.*, e.g. eval.mem_len), or train a model with "
        f"{asked!r} (train.init_from={workdir} starts one from these parameters)."
    )


def _run_mode(r: Request, config: ml_collections.ConfigDict, tokens: np.ndarray | None) -> None:
  """The mesh, the corpus where the mode needs one, then the mode."""
  mesh = sharding.make_mesh(config.mesh.shape, config.mesh.axis_names)
  source = r.config_source or (
      "--config" if r.config is not None else str(epath.Path(r.workdir) / "config.json")
  )
  if r.mode != "train" and (epath.Path(r.workdir) / "model_config.json").exists():
    trained_model.model_configs(config, r.workdir, source)  # an architecture change: now
  corpus = None
  dynamic = dynamic_eval.DynamicSettings.from_config(config)
  stats_from_split = (
      r.mode == "score" and dynamic.enabled and dynamic.needs_statistics and not r.dynamic_stats
  )
  stats_text = bool(r.dynamic_stats) and not r.dynamic_stats.endswith(".npy")
  if r.mode == "score" and (r.text or stats_text) and not stats_from_split:
    # the workdir's saved tokenizer may stand in for the files
    corpus = trained_model.load_corpus(config, wd.load_model_config(r.workdir)[0], r.workdir)
    if r.text:
      trained_model.require_tokenizer(
          corpus, "--text", "--tokens=FILE.npy (an integer array [B, T+1] of token ids)"
      )
    if stats_text:
      trained_model.require_tokenizer(
          corpus, "--dynamic_stats", "--dynamic_stats=FILE.npy (token ids, like --tokens)"
      )
  elif (r.mode == "train" and not config.train.curriculum) or r.mode == "eval" or stats_from_split:
    data_cfg = config.data.to_dict()
    corpus = distributed.process_0_first(lambda: data.load_configured(data_cfg), (data.DataError,))
    if corpus.name == data.TEXT:  # a resumed or evaluated run: the ids it was trained with
      text_vocab.check_saved_tokenizer(corpus, r.workdir)
  if corpus is not None:
    splits = ", ".join(f"{k} {v.num_tokens:,} tokens" for k, v in corpus.splits.items())
    report.log(
        f"Corpus {corpus.name}: vocab {corpus.vocab_size:,}, "
        + (splits or f"the tokenizer saved in {r.workdir} (no corpus file read)")
        + f"; mesh {dict(mesh.shape)}; {jax.process_count()} process(es)."
    )
  if r.mode == "train":
    run_train(config, r.workdir, corpus, mesh)
  elif r.mode == "eval":
    eval_modes.run_eval(config, r.workdir, corpus, mesh, source=source)
  elif r.mode == "generate":
    generate_mode.run_generate(
        config,
        r.workdir,
        mesh,
        prompt=r.prompt,
        prompt_file=r.prompt_file,
        num_tokens=r.num_tokens,
        stop=r.stop,
        stop_at_eos=r.stop_at_eos,
        top_k=r.top_k,
        top_p=r.top_p,
        temperature=r.temperature,
        seed=r.seed,
        num_samples=r.num_samples,
        out=r.out,
        batch_size=r.batch_size,
        source=source,
    )
  else:
    sizes: tuple[int | None, int | None] = (None, None)
    if tokens is None:
      tokens, text = eval_modes.text_file_tokens(corpus, r.text)
      sizes = text_scores.text_size(text)
    stats = dynamic_modes.stats_tokens(corpus, r.dynamic_stats) if r.dynamic_stats else None
    eval_modes.run_score(
        config,
        r.workdir,
        mesh,
        tokens,
        r.out,
        *sizes,
        source=source,
        dynamic_stats=stats,
        corpus=corpus,
    )


def run_train(
    config: ml_collections.ConfigDict, workdir: str, corpus: data.Corpus | None, mesh: Mesh
) -> dict:
  """``--mode=train``: ``train.train_and_evaluate`` (``curriculum.run`` for a
  ``train.curriculum``, whose stages load their data: ``corpus`` None), with SIGTERM (a
  preempted VM, ``launch/stop.sh``) turned into a checkpoint and a clean
  exit (``process_settings.StopSignals``).

  Returns:
    The last logged training metrics.
  """
  with process_settings.StopSignals() as signals:
    if config.train.curriculum:  # its stages load their own data
      return curriculum.run(config, workdir, mesh, stop_requested=signals.received)
    return train.train_and_evaluate(config, workdir, corpus, mesh, stop_requested=signals.received)
