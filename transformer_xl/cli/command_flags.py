"""The flags of ``python -m transformer_xl.main`` (``main.py``), defined on import.

``cli.modes.main`` reads them by name from the parsed ``absl.flags.FLAGS``
(``request_of_flags``); ``--config`` is ml_collections' config-file flag, so
``--config.<section>.<key>=value`` overrides any config value.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from transformer_xl.cli import modes as cli
from transformer_xl.inference.language_model import DEFAULT_BATCH_SIZE

CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py).", lock_config=True
)
WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, TensorBoard events and eval_results.json."
)
MODE = flags.DEFINE_enum(
    "mode",
    "train",
    list(cli.MODES),
    "train: train (resuming if possible). "
    "eval: score valid and test from the latest checkpoint. "
    "score: per-token NLL of --tokens or --text, written to --out. "
    "generate: continue --prompt or --prompt_file.",
)
TOKENS = flags.DEFINE_string(
    "tokens",
    None,
    "--mode=score: .npy integer array [B, T+1]; each row one contiguous stream of token ids.",
)
TEXT = flags.DEFINE_string(
    "text",
    None,
    "--mode=score: a text file, tokenised with the dataset's vocabulary and "
    "scored as one stream (its first token in the context of the boundary symbol).",
)
OUT = flags.DEFINE_string(
    "out",
    None,
    "--mode=score: output .npy, float32 [B, T]: entry (b, t) is the NLL in nats "
    "of token t+1 given tokens up to t. --mode=generate (optional): a .json of the prompt, "
    "the tokens and text of every sample, and the settings.",
)
DYNAMIC_STATS = flags.DEFINE_string(
    "dynamic_stats",
    None,
    "--mode=score with dynamic evaluation (--config.eval.dynamic.lr > 0, rule rms): the "
    "text its gradient statistics come from, a .npy token array like --tokens (each row a "
    "stream, the rows one batch) or a text file like --text; default: the workdir's "
    "training split (eval.dynamic.stats_tokens of it).",
)
PROMPT = flags.DEFINE_string("prompt", None, "--mode=generate: the text to continue.")
PROMPT_FILE = flags.DEFINE_string(
    "prompt_file",
    None,
    "--mode=generate: a UTF-8 file of prompts, one per line (blank lines "
    "skipped), continued in batches of --batch_size rows.",
)
NUM_TOKENS = flags.DEFINE_integer(
    "num_tokens", 100, "--mode=generate: tokens per sample, at most (see --stop, --stop_at_eos)."
)
STOP = flags.DEFINE_multi_string(
    "stop",
    [],
    "--mode=generate: a sample ends with the token "
    "that completes this string in its text (repeat for several).",
)
STOP_AT_EOS = flags.DEFINE_bool(
    "stop_at_eos",
    False,
    "--mode=generate: a sample ends with the "
    "corpus's boundary symbol (<eos>, or a newline for character "
    "corpora).",
)
TOP_K = flags.DEFINE_integer(
    "top_k",
    40,
    "--mode=generate: sample from the k most probable "
    "tokens (0 = all, 1 = greedy; Appendix E: 40).",
)
TOP_P = flags.DEFINE_float("top_p", 1.0, "--mode=generate: nucleus mass in (0, 1].")
TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "--mode=generate: softmax temperature.")
SEED = flags.DEFINE_integer("seed", 0, "--mode=generate: PRNG seed.")
NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "--mode=generate: samples per prompt.")
BATCH_SIZE = flags.DEFINE_integer(
    "batch_size",
    DEFAULT_BATCH_SIZE,
    "--mode=generate: rows (prompts x samples) generated together at most; a long "
    "--prompt_file is generated batch by batch (the same samples, bounded memory), each "
    "batch's text printed and written to --out when it is done.",
)
COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    None,
    "host:port of process 0 for a multi-process run "
    "(jax.distributed). Leave unset on a Cloud TPU VM slice: it is detected there.",
)
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, 0-based.")
DEBUG = flags.DEFINE_bool(
    "debug",
    False,
    "Show the Python traceback of user errors (bad config, data, workdir, "
    "checkpoints, non-finite training, score or generation input) as well as their one-line "
    "message, and every log of orbax's failures.",
)
