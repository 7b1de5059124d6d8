"""Command line: train, evaluate, score or sample from Transformer-XL.

    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl
    python -m transformer_xl.main --config=configs/quickstart.py --workdir=/tmp/txl --mode=eval
    python -m transformer_xl.main --workdir=/tmp/txl --mode=score --tokens=x.npy --out=nll.npy
    python -m transformer_xl.main --workdir=/tmp/txl --mode=generate --prompt="the" --num_tokens=50

    python -m transformer_xl.main --workdir=/tmp/txl --mode=eval --config.eval.mem_len=1600

Flags in, one call out: ``cli.main`` (``cli/modes.py``) checks their usage,
sets the process-wide settings (``process_settings``) and runs the mode,
checking everything it can before compiling.  Any config value can be overridden with
``--config.<section>.<key>=value``; a restart with the same workdir resumes.
Without ``--config``, eval, score and generate read the workdir's saved
config.json and apply the overrides to it (``cli/saved_config.py``): the
``eval.*`` settings, the free model settings (``model.attention_impl``,
``dtype``, ``remat``, ``attn_block``, ``scan_unroll``), ``mesh.*``,
``data.*`` (e.g. a moved corpus's ``data.manual_dir``); an override of the
trained architecture is refused in one line naming it.  Training needs
``--config``.
"""

from __future__ import annotations

if __name__ == "__main__":  # first, before the imports below: restart once with
  from transformer_xl.cli import process_settings  # glibc's huge pages for XLA:CPU's buffers

  process_settings.reexec_with_hugepages()

from absl import app, flags
from ml_collections import config_flags

from transformer_xl.cli import modes as cli
from transformer_xl.cli import user_errors
from transformer_xl.inference.language_model import DEFAULT_BATCH_SIZE

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py).", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, TensorBoard events and eval_results.json."
)
_MODE = flags.DEFINE_enum(
    "mode",
    "train",
    list(cli.MODES),
    "train: train (resuming if possible). "
    "eval: score valid and test from the latest checkpoint. "
    "score: per-token NLL of --tokens or --text, written to --out. "
    "generate: continue --prompt or --prompt_file.",
)
_TOKENS = flags.DEFINE_string(
    "tokens",
    None,
    "--mode=score: .npy integer array [B, T+1]; each row one contiguous stream of token ids.",
)
_TEXT = flags.DEFINE_string(
    "text",
    None,
    "--mode=score: a text file, tokenised with the dataset's vocabulary and "
    "scored as one stream (its first token in the context of the boundary symbol).",
)
_OUT = flags.DEFINE_string(
    "out",
    None,
    "--mode=score: output .npy, float32 [B, T]: entry (b, t) is the NLL in nats "
    "of token t+1 given tokens up to t. --mode=generate (optional): a .json of the prompt, "
    "the tokens and text of every sample, and the settings.",
)
_DYNAMIC_STATS = flags.DEFINE_string(
    "dynamic_stats",
    None,
    "--mode=score with dynamic evaluation (--config.eval.dynamic.lr > 0, rule rms): the "
    "text its gradient statistics come from, a .npy token array like --tokens (each row a "
    "stream, the rows one batch) or a text file like --text; default: the workdir's "
    "training split (eval.dynamic.stats_tokens of it).",
)
_PROMPT = flags.DEFINE_string("prompt", None, "--mode=generate: the text to continue.")
_PROMPT_FILE = flags.DEFINE_string(
    "prompt_file",
    None,
    "--mode=generate: a UTF-8 file of prompts, one per line (blank lines "
    "skipped), continued in batches of --batch_size rows.",
)
_NUM_TOKENS = flags.DEFINE_integer(
    "num_tokens", 100, "--mode=generate: tokens per sample, at most (see --stop, --stop_at_eos)."
)
_STOP = flags.DEFINE_multi_string(
    "stop",
    [],
    "--mode=generate: a sample ends with the token "
    "that completes this string in its text (repeat for several).",
)
_STOP_AT_EOS = flags.DEFINE_bool(
    "stop_at_eos",
    False,
    "--mode=generate: a sample ends with the "
    "corpus's boundary symbol (<eos>, or a newline for character "
    "corpora).",
)
_TOP_K = flags.DEFINE_integer(
    "top_k",
    40,
    "--mode=generate: sample from the k most probable "
    "tokens (0 = all, 1 = greedy; Appendix E: 40).",
)
_TOP_P = flags.DEFINE_float("top_p", 1.0, "--mode=generate: nucleus mass in (0, 1].")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "--mode=generate: softmax temperature.")
_SEED = flags.DEFINE_integer("seed", 0, "--mode=generate: PRNG seed.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "--mode=generate: samples per prompt.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size",
    DEFAULT_BATCH_SIZE,
    "--mode=generate: rows (prompts x samples) generated together at most; a long "
    "--prompt_file is generated batch by batch (the same samples, bounded memory), each "
    "batch's text printed and written to --out when it is done.",
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0 for a multi-process run "
    "(jax.distributed). Leave unset on a Cloud TPU VM slice: it is detected there.",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0-based.")
_DEBUG = flags.DEFINE_bool(
    "debug",
    False,
    "Show the Python traceback of user errors (bad config, data, workdir, "
    "checkpoints, non-finite training, score or generation input) as well as their one-line "
    "message, and every log of orbax's failures.",
)


def main(argv):
  """Flags in, one call out: ``cli.main``."""
  cli.main(argv, flags.FLAGS)


if __name__ == "__main__":
  app.run(main, flags_parser=user_errors.parse_flags)
