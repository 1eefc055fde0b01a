"""encoder_jax entry point: flags -> the job. See README for the commands.

  python -m encoder_jax.main --mode=similarity
      Fetches the all-MiniLM-L6-v2 checkpoint (pinned, sha256-checked, cached outside the repo),
      imports it into our encoder and prints a cosine-similarity table of demo sentences.
  python -m encoder_jax.main --mode=pretrain --workdir=/tmp/demo_run
      --config=configs/pretrain.py:runlocal
      Pre-trains (MLM / ELECTRA, see configs/pretrain.py) into --workdir, resuming from the
      newest good checkpoint there; SIGTERM saves a checkpoint and exits 0.

Errors print one line naming the input and the fix (--verbose: the traceback); SIGTERM at any
point exits 0 (encoder_jax/cli.py).
"""
from __future__ import annotations

import sys
import time

from absl import app, flags
from ml_collections import config_flags

from encoder_jax import cli

FLAGS = flags.FLAGS
MODES = {"pretrain": "train_and_evaluate(--config, --workdir): pre-train, resuming if --workdir "
                     "holds checkpoints (a new run starts from --config.init_from's parameters "
                     "when given)",
         "similarity": "import the all-MiniLM-L6-v2 checkpoint and print a cosine-similarity "
                       "table of demo sentences"}
# The names modes had before, and where each went: "demo" is only ever the main job.
RENAMED = {"demo": "--mode=similarity (the MiniLM similarity table; the main job, pre-training "
                   "+ fine-tuning + comparison, is `python -m encoder_jax.demo`)"}
flags.DEFINE_string("mode", None,
                    "Required: what to run. " + "; ".join(f"{k}: {v}" for k, v in MODES.items())
                    + ". (The main job, pre-training + fine-tuning + comparison, is "
                    "`python -m encoder_jax.demo`.)")
flags.DEFINE_string("workdir", None,
                    "Directory for checkpoints, logs and results of this run (created if absent).")
flags.DEFINE_string("cache_dir", None,
                    "Where fetched artifacts are cached (default: $ENCODER_JAX_CACHE or "
                    "~/.cache/encoder_jax).")
flags.DEFINE_enum("distributed", "none", ["none", "auto", "explicit"],
                  "Multi-host setup through jax.distributed.initialize(): none = one process; "
                  "auto = discover the cluster (TPU VMs, SLURM, ...); explicit = use "
                  "--coordinator_address/--num_processes/--process_id.")
flags.DEFINE_string("coordinator_address", None,
                    "host:port of process 0's coordinator (with --distributed=explicit).")
flags.DEFINE_integer("num_processes", None, "Number of processes (with --distributed=explicit).")
flags.DEFINE_integer("process_id", None, "This process's index (with --distributed=explicit).")
config_flags.DEFINE_config_file(
    "config", None, "A config file, e.g. configs/pretrain.py:size=mini; override any leaf "
    "with --config.a.b=value.", lock_config=True)

DEMO_SENTENCES = [
    "Call me Ishmael.",
    "My name is Ishmael, a sailor.",
    "The whale breached beside the ship.",
    "A great sperm whale rose from the sea near the vessel.",
    "The state of our union is strong.",
    "Our nation is prosperous and secure.",
]


def similarity(cache_dir: str | None) -> None:
  """all-MiniLM-L6-v2 imported into encoder_jax: a cosine-similarity table of DEMO_SENTENCES."""
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from encoder_jax.convert import load_hf_bert
  from encoder_jax.data.fetch import minilm_dir
  from encoder_jax.data import tokenizer
  from encoder_jax.model import pool

  t0 = time.time()
  ckpt = minilm_dir(cache_dir)
  model = load_hf_bert(ckpt)
  tok = tokenizer.load(ckpt)
  batch = tok.batch_encode_pairs(DEMO_SENTENCES, max_length=32)
  embed = nnx.jit(lambda m, x, msk: pool(m(x, msk)[0].hidden_BxTxD, msk, "mean",
                                         normalize=True))
  e = np.asarray(embed(model, jnp.asarray(batch["input_ids"]), jnp.asarray(batch["mask"])))
  sim = e @ e.T
  print(f"all-MiniLM-L6-v2 ({ckpt}) in encoder_jax: masked-mean, L2-normalised embeddings; "
        f"cosine similarity ({time.time() - t0:.1f}s)\n")
  width = max(len(s) for s in DEMO_SENTENCES)
  print(" " * (width + 2) + "".join(f"{i:>7d}" for i in range(len(DEMO_SENTENCES))))
  for i, s in enumerate(DEMO_SENTENCES):
    print(f"{s:<{width}} {i}" + "".join(f"{v:7.3f}" for v in sim[i]))


def init_distributed() -> None:
  """jax.distributed.initialize() before any other JAX call, as JAX requires."""
  if FLAGS.distributed == "none":
    return
  import jax  # pylint: disable=g-import-not-at-top
  if FLAGS.distributed == "auto":
    jax.distributed.initialize()
    return
  missing = [n for n in ("coordinator_address", "num_processes", "process_id")
             if getattr(FLAGS, n) is None]
  if missing:
    raise app.UsageError(f"--distributed=explicit needs {', '.join('--' + m for m in missing)}.")
  # CPU collectives across processes go through gloo. Set unconditionally: it configures only
  # the CPU client, and asking for the backend first (jax.default_backend()) would initialise
  # it, after which jax.distributed.initialize() refuses to run.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                             num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if FLAGS.mode is None:  # no default: a training command must never run something else
    raise app.UsageError("--mode is required: " + "; ".join(
        f"--mode={k} ({v})" for k, v in MODES.items()) + ".")
  if FLAGS.mode in RENAMED:
    raise app.UsageError(f"--mode={FLAGS.mode} is now {RENAMED[FLAGS.mode]}.")
  if FLAGS.mode not in MODES:
    raise app.UsageError(f"--mode={FLAGS.mode!r}; choose one of " + ", ".join(MODES) + ".")
  init_distributed()
  if FLAGS.mode == "similarity":
    similarity(FLAGS.cache_dir)
  elif FLAGS.mode == "pretrain":
    if cli.loaded_config() is None or not FLAGS.workdir:
      raise app.UsageError("--mode=pretrain needs --config (e.g. configs/pretrain.py:runlocal) "
                           "and --workdir (where checkpoints and metrics go).")
    print(f"pre-training into {FLAGS.workdir}: loading the trainer (TFDS, grain, Orbax) ...",
          flush=True)
    config = cli.loaded_config()
    if FLAGS.cache_dir and not config.data.cache_dir:
      config.data.cache_dir = FLAGS.cache_dir
    from encoder_jax.train.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top
    train_and_evaluate(config, FLAGS.workdir)


def run():
  cli.run(main, "encoder_jax.main")


if __name__ == "__main__":
  sys.exit(run())
