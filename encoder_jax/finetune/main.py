"""Fine-tuning command: flags -> finetune_and_evaluate(config, workdir).

  python -m encoder_jax.finetune.main \
      --config=configs/finetune.py:task=rotten_tomatoes,init=minilm --workdir=/tmp/ft --seeds=3
  python -m encoder_jax.finetune.main --report=/tmp/ft,/tmp/ft_random   # one table of runs
"""
from __future__ import annotations

import json
import sys

from absl import app, flags
from etils import epath
from ml_collections import config_flags

from encoder_jax import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Fine-tuning config file and its argument, e.g. "
    "configs/finetune.py:task=glue/rte,init=minilm; override any leaf with "
    "--config.a.b=value (see the file's docstring).", lock_config=True)
flags.DEFINE_string("workdir", None, "Where results.json, results.md and optional embeddings / "
                    "best checkpoints go (created if absent).")
flags.DEFINE_integer("seeds", None, "Fine-tuning seeds from the one backbone (seed, seed+1, "
                     "...); reports median, mean and std. Default: the config's `seeds`.")
flags.DEFINE_list("report", [], "Instead of training: workdirs of finished runs whose "
                  "results.json are printed as one markdown table.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from encoder_jax.finetune.run import finetune_and_evaluate, markdown_table
  if FLAGS.report:
    results = []
    for d in FLAGS.report:
      path = epath.Path(d) / "results.json"
      if not path.exists():
        raise app.UsageError(f"--report: {path} does not exist (was the run finished?)")
      results.append(json.loads(path.read_text()))
    print(markdown_table(results))
    return
  config = cli.loaded_config()
  if config is None or FLAGS.workdir is None:
    raise app.UsageError("--config and --workdir are required, e.g. "
                         "--config=configs/finetune.py:task=rotten_tomatoes --workdir=/tmp/ft")
  if FLAGS.seeds is not None:
    with config.unlocked():
      config.seeds = FLAGS.seeds
  results = finetune_and_evaluate(config, FLAGS.workdir)
  print(markdown_table([results]))


def run():
  cli.run(main, "encoder_jax.finetune.main")


if __name__ == "__main__":
  sys.exit(run())
