"""A pre-training run's checkpoint -> a HF transformers folder, checked by reloading it.

  python -m encoder_jax.convert.export --workdir=runs/x [--step=N] --out=runs/x/hf
  python -m encoder_jax.convert.export --workdir=gs://bucket/runs/x --out=/tmp/x_hf

Reads the run through encoder_jax.train.run_dir (its config.json: model, objective, vocab;
checkpoint N, default the newest whose checksums verify) and writes it as the first HF family
(encoder_jax.hf.FAMILIES) that computes exactly what the run computes:

  run                                       <out> holds               load it with
  MLM, one token type, no NSP/SOP           RobertaForMaskedLM        AutoModelForMaskedLM
    (RoBERTa-shaped)
  MLM + NSP or SOP                          BertForPreTraining        AutoModelForPreTraining
  MLM, two token types, no NSP/SOP          BertForMaskedLM           AutoModelForMaskedLM
  MLM with an embedding projection          ElectraForMaskedLM        AutoModelForMaskedLM
    (embedding_size != hidden_size), no NSP
  ELECTRA (any variant)                     ElectraForPreTraining     AutoModelForPreTraining
                                            (discriminator; a bare ElectraModel for the
                                            Replace-MLM / All-Tokens MLM variants, whose
                                            heads HF has no class for: AutoModel)
                                  <out>/generator: ElectraForMaskedLM AutoModelForMaskedLM

with config.json, model.safetensors, the tokenizer (vocab.txt, or a byte-level BPE's vocab.json
+ merges.txt) and tokenizer_config.json in each folder (files
readable by all, as any file the user writes), so `transformers.<Auto class>.from_pretrained(
out)` and `AutoTokenizer.from_pretrained(out)` load it as is. Where transformers and torch are
installed, export then loads each folder with that class and compares its outputs with ours on
a few rows of text (fp32, right padding, real tokens): the maximum difference is printed, and
one above 1e-4 of the largest output is an error (--nocheck skips it). The last lines printed
name the Auto class.

A run no HF family represents (BERT's block pre-LN, ALiBi position bias, ...: the demo recipe's
former block, configs/pretrain.py:runlocal,block=alibi, has both; the demo recipe itself is
ModernBERT's block and exports as ModernBertForMaskedLM) is refused in one line naming the
switches with no transformers equivalent and the nearest configuration that exports, before any
checkpoint is read or anything is written to --out. Such a run is fine-tuned by encoder_jax
itself: init=ckpt:<workdir> loads its checkpoint as trained (encoder_jax.train.pretrained).

The workdir is read through encoder_jax.paths (etils.epath): a local folder or gs://, where
runs live. --out is a local folder (what from_pretrained reads); a gs:// --out is refused.
Nothing in the workdir is changed, so a run may be exported while it trains: a damaged newest
checkpoint is skipped with a line naming the file (the run sets it aside itself when it
resumes), a damaged --step=N is refused.

Progress goes to stdout with print(), one line per stage; the libraries' INFO logging is off
unless --verbosity=0 asks for it.
"""
from __future__ import annotations

import os
import pathlib
import sys
from typing import Callable

import jax
from absl import app, flags, logging

from encoder_jax import hf, paths
from encoder_jax.hf import families
from encoder_jax.hf.families import Written
from encoder_jax.train.run_dir import RunDir

# Relative to the largest |output| (at least 1): fp32 on both sides differs by ~1e-7 of it
# (tests/convert), a tensor mapped to the wrong place by a sizeable part of it.
CHECK_TOL = 1e-4
TEXTS = ["Call me Ishmael.", "The state of our union is strong, and growing.",
         "The jury said the election was conducted well."]


class NotRepresentable(ValueError):
  """The run's model has something no HF family here has a place for."""


def refusal(workdir, cfg, obj, found: list[tuple[families.Family, list[families.Gap]]]) -> str:
  """The one line for a run no family represents: the switches no family has a place for, what
  else the closest family (fewest gaps; the registry's order breaks ties) lacks, and the
  configuration that closes its gaps."""
  closest, gaps = min(found, key=lambda fg: len(fg[1]))
  names = "/".join(f.name for f, _ in found)
  common = [g for g in gaps if all(g.switch in {h.switch for h in fg} for _, fg in found)]
  rest = [g for g in gaps if g not in common]
  say = lambda gs: f"{' and '.join(g.switch for g in gs)} ({'; '.join(g.why for g in gs)})"
  parts = []
  if common:
    verb = "has" if len(common) == 1 else "have"
    parts.append(f"{' and '.join(g.switch for g in common)} {verb} no transformers "
                 f"equivalent in {names} ({'; '.join(g.why for g in common)})")
  if rest:
    parts.append(f"{'' if common else f'no family in {names} represents this run: '}the "
                 f"closest, {closest.name}, has no place for {say(rest)}")
  msg = "; ".join(parts)
  fixed = families.apply_fix(cfg, obj, gaps)
  nearest = next((f.name for f, _ in found if not f.gaps(*fixed)), None)
  if nearest:
    msg += (f"; the nearest exportable configuration is this run's with "
            f"{families.fix_flags(gaps)}, which exports as {nearest}")
    if {k for g in gaps for k, _ in g.fix} <= {"norm_first", "position_bias"}:
      preset = ",".join(["size=tiny"] + [f"objective={obj.objective}"] * obj.is_electra +
                        [f"nsp={obj.sentence_task}"] * (obj.sentence_task != "none"))
      msg += (" (as configs/pretrain.py's presets are without runlocal, e.g. "
              f"configs/pretrain.py:{preset})")
  return (f"{msg}. Fine-tune this run with encoder_jax instead (init=ckpt:{workdir} loads "
          "the checkpoint as trained). Nothing was written to --out.")


def _check_out(out) -> pathlib.Path:
  if paths.is_uri(out):
    raise ValueError(f"--out={out}: export writes a local folder (what transformers' "
                     "from_pretrained reads); give a local --out and copy it up afterwards "
                     "(gcloud storage cp -r <out> gs://...).")
  out = pathlib.Path(out)
  if out.exists() and not out.is_dir():
    raise FileExistsError(f"--out={out} is a file; export writes a folder (config.json, "
                          f"model.safetensors, ...): give a folder that does not exist yet, "
                          f"e.g. --out={out}_hf (the file is left as it is).")
  if out.exists() and any(out.iterdir()):
    raise FileExistsError(f"--out={out} is not empty; choose a new folder (nothing there is "
                          "overwritten).")
  return out


def export_run(workdir: str | os.PathLike, out: str | os.PathLike, step: int | None = None, *,
               check: bool = True, report: Callable[[str], None] = print) -> list[Written]:
  """Exports checkpoint `step` (default: newest that verifies) of the run in `workdir` (local
  or gs://) to the local folder `out`; returns what was written. `report` gets the progress
  lines; with `check`, each folder is reloaded with transformers (if installed) and compared."""
  out = _check_out(out)
  run = RunDir.find(workdir)
  report(f"export: reading {run.config_file}")
  s = run.setup
  family, found = hf.exporting_family(s.model_cfg, s.obj)
  if family is None:
    raise NotRepresentable(refusal(run.workdir, s.model_cfg, s.obj, found))
  report(f"export: verifying the checksums of {run.checkpoints}")
  step = run.good_step(step, report=lambda line: report(f"export: {line}"))
  report(f"export: restoring checkpoint {step} onto one device")
  # fp32 numerics whatever the run computed in ("auto" is bf16 on TPU/GPU): the folder holds
  # fp32 weights and the reload check compares with transformers in fp32. The token table's
  # padding rows (model.vocab_pad_multiple) stay behind: HF's tables have vocab_size rows.
  model = run.model(step, dtype="float32", dot_dtype="", vocab_pad_multiple=1)
  report(f"export: writing {family.name} to {out}")
  tok = _tokenizer(run.vocab)
  written = family.export(model, out, vocab=run.vocab, pad_id=tok.pad_id)
  for w in written:
    files = ", ".join(sorted(p.name for p in w.folder.iterdir() if p.is_file()))
    report(f"export: wrote {w.folder}: {w.hf_class} ({files})")
    if w.dropped:
      report(f"export: left out {', '.join(w.dropped)}: {w.hf_class} has no place for them")
  if check:
    reload_check(written, tok, s.model_cfg.max_positions, report)
  for w in written:
    report(f"export: load it with transformers.{w.auto_class}.from_pretrained('{w.folder}')")
  return written


def _tokenizer(vocab: str):
  from encoder_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
  return tokenizer.load(vocab)


def reload_check(written: list[Written], tok, max_positions: int,
                 report: Callable[[str], None] = print) -> float | None:
  """Loads each folder with its Auto class and compares its outputs with ours on TEXTS (right
  padded, fp32) at the real tokens; returns the largest difference, None without
  transformers. Raises ValueError past CHECK_TOL or when transformers initialised a tensor
  randomly (missing from the folder)."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    report("export: reload check skipped: transformers and torch are not installed (pip "
           "install transformers torch, and export compares the folder's outputs with the run's)")
    return None
  transformers.utils.logging.disable_progress_bar()  # (a bar per folder loaded)
  rows = tok.batch_encode_pairs(TEXTS, max_length=min(32, max_positions))
  ids, mask = rows["input_ids"], rows["mask"].astype(bool)
  worst = 0.0
  for w in written:
    hf, info = getattr(transformers, w.auto_class).from_pretrained(
        w.folder, local_files_only=True, output_loading_info=True)
    if info["missing_keys"]:
      raise ValueError(f"reload check: transformers initialised {sorted(info['missing_keys'])}"
                       f" of {w.folder} randomly: the export misses them.")
    with torch.no_grad():
      theirs = getattr(hf.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                                 attention_mask=torch.tensor(mask, dtype=torch.long)),
                       w.output).numpy()
    # fp32 matmuls in full: on a GPU, XLA's default for fp32 would take TF32 passes (~1e-3).
    with jax.default_matmul_precision("highest"):
      ours = w.ours(ids, rows["mask"])
    diff = float(abs(ours[mask] - theirs[mask]).max())
    scale = max(1.0, float(abs(theirs[mask]).max()))
    report(f"export: reload check: transformers.{w.auto_class} on {len(TEXTS)} rows: max "
           f"|{w.output} difference| {diff:.2g} (of values up to {scale:.3g})")
    if not diff <= CHECK_TOL * scale:
      raise ValueError(f"reload check: {w.folder} loaded in transformers computes {w.output} "
                       f"up to {diff:.3g} away from the run's (tolerance {CHECK_TOL} x "
                       f"{scale:.3g}); the folder is written but does not reproduce the run.")
    worst = max(worst, diff)
  return worst


def _define_flags() -> None:
  """The command's flags, defined only when it runs as one: export_run is also a library
  function (the main job calls it), whose importer has flags of its own (--workdir)."""
  flags.DEFINE_string("workdir", None, "The pre-training run's directory, local or gs:// (holds "
                      "config.json and checkpoints/).")
  flags.DEFINE_integer("step", None, "The checkpoint step to export (default: the newest whose "
                       "checksums verify).")
  flags.DEFINE_string("out", None, "The local folder to write the HF folder to; must not exist or "
                      "be empty.")
  flags.DEFINE_bool("check", True, "Reload the folder with transformers (where installed) and "
                    "compare its outputs with the run's.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  args = flags.FLAGS
  if not args["verbosity"].present:  # the libraries' INFO lines (Orbax, JAX): --verbosity=0
    logging.set_verbosity(logging.WARNING)
  try:
    export_run(args.workdir, args.out, args.step, check=args.check)
  except (FileNotFoundError, FileExistsError, ValueError) as e:  # CheckpointError included
    sys.exit(f"export: {e}")


if __name__ == "__main__":
  _define_flags()
  flags.mark_flags_as_required(["workdir", "out"])
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  cli.run(main, "encoder_jax.convert.export")
