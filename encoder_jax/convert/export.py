"""A pre-training run's checkpoint -> HF transformers folder(s).

  python -m encoder_jax.convert.export --workdir=runs/x [--step=N] --out=runs/x/hf
  python -m encoder_jax.convert.export --workdir=gs://bucket/runs/x --out=/tmp/x_hf

Reads <workdir>/config.json (the resolved config encoder_jax.train.loop writes: model sizes,
objective, vocab), restores the parameters of checkpoint N (default: the newest) and writes:
  MLM run       <out>: BertForPreTraining (trained with NSP/SOP) or BertForMaskedLM (without)
  ELECTRA run   <out>: the discriminator (ElectraForPreTraining),
                <out>/generator: the generator (ElectraForMaskedLM), each with its own copy
                of the tied embeddings
with config.json, model.safetensors, vocab.txt and tokenizer_config.json in each, so
`transformers.AutoModelForPreTraining.from_pretrained(out)` / `AutoTokenizer` load it as is.

The workdir is read through encoder_jax.paths (etils.epath): a local folder or gs://, where
runs live. --out is a local folder (what from_pretrained reads); a gs:// --out is refused.
Nothing in the workdir is changed, so a run may be exported while it trains.

Checkpoints: only sealed ones count (with the checksums.json of encoder_jax.train.checkpoint),
and the chosen one's files are verified against their sha256 before it is restored. A damaged
newest checkpoint is skipped with a message naming the file (export then takes the newest that
verifies); a damaged --step=N is refused. Damaged ones are left where they are: the run sets
them aside itself when it resumes.

HF BERT and ELECTRA are post-LN encoders with learned absolute positions: a run they cannot
represent (pre-LN, ALiBi position bias, ...; configs/pretrain.py:runlocal is both) is refused
with one line naming why, before any checkpoint is read or anything is written to --out.
Such a run is fine-tuned by encoder_jax itself: init=ckpt:<workdir> loads its checkpoint as
trained (encoder_jax.finetune.backbone).
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
from typing import Callable

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import app, flags
from etils import epath
from flax import nnx

from encoder_jax import paths
from encoder_jax.convert.hf_bert import export_hf_bert, hf_bert_gaps
from encoder_jax.convert.hf_electra import export_hf_electra, hf_electra_pair_gaps
from encoder_jax.data.builders import resolve_vocab
from encoder_jax.train import checkpoint, setup

flags.DEFINE_string("workdir", None, "The pre-training run's directory, local or gs:// (holds "
                    "config.json and checkpoints/).")
flags.DEFINE_integer("step", None, "The checkpoint step to export (default: the newest whose "
                     "checksums verify).")
flags.DEFINE_string("out", None, "The local folder to write the HF folder to; must not exist or "
                    "be empty.")


class NotRepresentable(ValueError):
  """The run's model has something HF BERT / ELECTRA has no place for."""


def _stderr(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def hf_gaps(s: setup.Setup) -> tuple[str, list[str]]:
  """(the HF class the run would export as, what in its model that class cannot represent)."""
  if s.obj.is_electra:
    return "ELECTRA", hf_electra_pair_gaps(s.model_cfg, s.obj.generator_config(s.model_cfg))
  return "BertModel", hf_bert_gaps(s.model_cfg)


def sealed_steps(ckpt_dir: epath.Path) -> list[int]:
  """The steps with a checksums.json (what encoder_jax.train.checkpoint counts), oldest first."""
  return sorted(int(p.name) for p in ckpt_dir.iterdir()
                if p.name.isdigit() and (p / checkpoint.CHECKSUMS).exists())


def choose_step(ckpt_dir: epath.Path, step: int | None,
                report: Callable[[str], None] = _stderr) -> int:
  """`step` (default: the newest sealed one) once its files match their checksums.

  The newest is skipped when damaged (reported), `step` given and damaged is refused;
  raises checkpoint.CheckpointError, or ValueError for a step without a sealed checkpoint."""
  steps = sealed_steps(ckpt_dir)
  if not steps:
    raise FileNotFoundError(f"{ckpt_dir} holds no finished checkpoint (none has "
                            f"{checkpoint.CHECKSUMS}).")
  if step is not None:
    if step not in steps:
      why = ""
      if (ckpt_dir / str(step)).exists():
        why = f" ({checkpoint.verify(ckpt_dir / str(step))})"
      raise ValueError(f"--step={step} has no sealed checkpoint in {ckpt_dir}{why}; "
                       f"available: {steps}.")
    if problem := checkpoint.verify(ckpt_dir / str(step)):
      raise checkpoint.CheckpointError(
          f"checkpoint {step} in {ckpt_dir} is damaged: {problem}; nothing was exported. "
          f"Choose another --step (sealed: {steps}).")
    return step
  first_problem = None
  for s in reversed(steps):
    problem = checkpoint.verify(ckpt_dir / str(s))
    if problem is None:
      if first_problem is not None:
        report(f"export: exporting checkpoint {s}, the newest whose checksums verify.")
      return s
    first_problem = first_problem or f"{s}: {problem}"
    report(f"export: skipping damaged checkpoint {s} in {ckpt_dir}: {problem}")
  raise checkpoint.CheckpointError(f"every checkpoint in {ckpt_dir} is damaged (newest, "
                                   f"{first_problem}); nothing was exported.")


def export_run(workdir: str | os.PathLike, out: str | os.PathLike, step: int | None = None, *,
               report: Callable[[str], None] = _stderr) -> list[pathlib.Path]:
  """Exports checkpoint `step` (default: newest that verifies) of the run in `workdir` (local
  or gs://) to the local folder `out`; returns the folders written. `report` gets the lines
  about damaged checkpoints skipped."""
  if paths.is_uri(out):
    raise ValueError(f"--out={out}: export writes a local folder (what transformers' "
                     "from_pretrained reads); give a local --out and copy it up afterwards "
                     "(gcloud storage cp -r <out> gs://...).")
  workdir, out = paths.absolute(workdir), pathlib.Path(out)
  cfg_file, ckpt_dir = workdir / setup.CONFIG_FILE, workdir / "checkpoints"
  if not cfg_file.is_file() or not ckpt_dir.is_dir():
    raise FileNotFoundError(f"{workdir} is not a pre-training run: it needs {setup.CONFIG_FILE} "
                            "and checkpoints/ (what `encoder_jax.main --mode=pretrain` writes).")
  if out.exists() and (not out.is_dir() or any(out.iterdir())):
    raise FileExistsError(f"--out={out} is not empty; choose a new folder (nothing there is "
                          "overwritten).")
  config = ml_collections.ConfigDict(json.loads(cfg_file.read_text()))
  s = setup.build(config)
  hf_class, gaps = hf_gaps(s)
  if gaps:
    raise NotRepresentable(
        f"{workdir} has {' and '.join(gaps)}, which HF {hf_class} cannot represent; fine-tune "
        f"it with encoder_jax instead (init=ckpt:{workdir} loads the checkpoint as trained). "
        "Nothing was written to --out.")
  step = choose_step(ckpt_dir, step, report)
  # Restore onto one device whatever mesh the run used: Orbax reshards on read. Read-only:
  # no CheckpointManager, which would clean up (delete) a save the run has in flight.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                          jax.eval_shape(s.init_fn))
  try:
    with ocp.StandardCheckpointer() as reader:
      state = reader.restore(ckpt_dir / str(step) / "state", abstract)
  except Exception as e:  # pylint: disable=broad-except
    first = (str(e).strip().splitlines() or [""])[0]
    raise checkpoint.CheckpointError(
        f"checkpoint {step} in {ckpt_dir} does not restore into the model of {cfg_file} "
        f"({type(e).__name__}: {first}); its files match their checksums, so the config.json "
        "no longer describes it.") from e
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
  except (FileNotFoundError, FileExistsError, ValueError) as e:  # CheckpointError included
    sys.exit(f"export: {e}")
  for folder in folders:
    print(f"wrote {folder}: " + ", ".join(sorted(p.name for p in folder.iterdir()
                                                 if p.is_file())))


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir", "out"])
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main, "encoder_jax.convert.export")
