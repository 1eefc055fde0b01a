"""A pre-training run's checkpoint -> HF transformers folder(s).

  python -m encoder_jax.convert.export --workdir=runs/x [--step=N] --out=runs/x/hf

Reads <workdir>/config.json (the resolved config encoder_jax.train.loop writes: model sizes,
objective, vocab), restores the parameters of checkpoint N (default: the newest) through the
same Checkpointer the trainer resumes with, and writes:
  MLM run       <out>: BertForPreTraining (trained with NSP/SOP) or BertForMaskedLM (without)
  ELECTRA run   <out>: the discriminator (ElectraForPreTraining),
                <out>/generator: the generator (ElectraForMaskedLM), each with its own copy
                of the tied embeddings
with config.json, model.safetensors, vocab.txt and tokenizer_config.json in each, so
`transformers.AutoModelForPreTraining.from_pretrained(out)` / `AutoTokenizer` load it as is.
HF BERT and ELECTRA are post-LN models: a pre-LN run (norm=pre) is refused, naming why.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import jax
import ml_collections
from absl import app, flags
from flax import nnx

from encoder_jax.convert.hf_bert import export_hf_bert
from encoder_jax.convert.hf_electra import export_hf_electra
from encoder_jax.data.builders import resolve_vocab
from encoder_jax.train import loop
from encoder_jax.train.checkpoint import Checkpointer

flags.DEFINE_string("workdir", None, "The pre-training run's directory (holds config.json and "
                    "checkpoints/).")
flags.DEFINE_integer("step", None, "The checkpoint step to export (default: the newest).")
flags.DEFINE_string("out", None, "Where to write the HF folder; must not exist or be empty.")


def export_run(workdir: str | os.PathLike, out: str | os.PathLike,
               step: int | None = None) -> list[pathlib.Path]:
  """Exports checkpoint `step` (default: newest) of the run in `workdir`; returns the folders."""
  workdir, out = pathlib.Path(workdir), pathlib.Path(out)
  cfg_file, ckpt_dir = workdir / loop.CONFIG_FILE, workdir / "checkpoints"
  if not cfg_file.is_file() or not ckpt_dir.is_dir():
    raise FileNotFoundError(f"{workdir} is not a pre-training run: it needs {loop.CONFIG_FILE} "
                            "and checkpoints/ (what `encoder_jax.main --mode=pretrain` writes).")
  if out.exists() and any(out.iterdir()):
    raise FileExistsError(f"--out={out} is not empty; choose a new folder (nothing there is "
                          "overwritten).")
  config = ml_collections.ConfigDict(json.loads(cfg_file.read_text()))
  s = loop.build(config)
  ckpt = Checkpointer(ckpt_dir, async_save=False)
  try:
    steps = ckpt.all_steps()
    if not steps:
      raise FileNotFoundError(f"{ckpt_dir} holds no finished checkpoint.")
    step = steps[-1] if step is None else step
    if step not in steps:
      raise ValueError(f"--step={step} has no checkpoint in {ckpt_dir}; available: {steps}.")
    # Restore onto one device whatever mesh the run used: Orbax reshards on read.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                            jax.eval_shape(s.init_fn))
    state, _, _ = ckpt.restore(step, abstract)
  finally:
    ckpt.close()
  model = nnx.merge(s.trainer.graphdef_eval, state.params)
  vocab = resolve_vocab(config.data.vocab, config.data.cache_dir or None)
  if s.obj.is_electra:
    return export_hf_electra(model, out, vocab=vocab)
  export_hf_bert(model, out, vocab=vocab)
  return [out]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = flags.FLAGS
  try:
    folders = export_run(args.workdir, args.out, args.step)
  except (FileNotFoundError, FileExistsError, ValueError) as e:
    sys.exit(f"export: {e}")
  for folder in folders:
    print(f"wrote {folder}: " + ", ".join(sorted(p.name for p in folder.iterdir()
                                                 if p.is_file())))


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir", "out"])
  app.run(main)
