"""`finetune_and_evaluate(config, workdir)`: N seeds from one backbone, results to JSON + a
markdown table, optional pooled-embedding export. `config` is configs/finetune.py's ConfigDict,
read once into frozen settings (setup.build, which fails a typo before any work).

Outputs in workdir (a local folder or gs://bucket/...; written through encoder_jax.paths):
  results.json   config, backbone, data sizes, one record per seed (best epoch, dev and test
                 metrics, per-epoch history, rates) and the median / mean / std over seeds
  results.md     the same summary as a markdown table (`markdown_table` joins several runs)
  embeddings/<task>_<split>_<pooling>.npy (+ _labels.npy)   with export_embeddings set
  seed_<s>/best  the best parameters of each seed (Orbax), with save_best
"""
from __future__ import annotations

import io
import json
import time
from typing import Any

from etils import epath
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from encoder_jax import paths
from encoder_jax.finetune import backbone as backbone_lib
from encoder_jax.finetune import metrics as metrics_lib
from encoder_jax.finetune import setup
from encoder_jax.finetune import tasks as tasks_lib
from encoder_jax.finetune import trainer
from encoder_jax.model.attention import describe_attention
from encoder_jax.model.matmul import describe_dots
from encoder_jax.model.config import SIZES, ModelConfig
from encoder_jax.model.heads import pool
from encoder_jax.train import pretrained, sharding


def _random_config(b: setup.BackboneSettings) -> tuple[ModelConfig, str | None]:
  """The shape (and vocab, when known) of a random encoder: random_like, a size or a source
  whose exact shape, numerics and vocab to take ('minilm', 'hf:<dir>', 'ckpt:<dir>')."""
  if b.random_like in SIZES:
    return ModelConfig(**{**SIZES[b.random_like], **b.overrides}), None
  return pretrained.backbone_config(b.random_like, b.overrides, b.cache_dir)


def _backbone(b: setup.BackboneSettings) -> pretrained.Backbone:
  if b.init == "random":
    cfg, vocab = _random_config(b)
    return pretrained.Backbone(cfg, None, None, "random", vocab)
  return pretrained.load_backbone(b.init, model_overrides=b.overrides, cache_dir=b.cache_dir)


def _tokenizer(b: setup.BackboneSettings, bb: pretrained.Backbone):
  from encoder_jax.data import tokenizer
  from encoder_jax.data.fetch import minilm_vocab
  from encoder_jax.data.vocab import resolve_vocab
  vocab = b.vocab or bb.vocab  # the flag, else what the source was trained with
  if not vocab and bb.encoder is not None:
    raise ValueError(f"{bb.source} has no vocab (vocab.txt, or vocab.json + merges.txt) beside "
                     "its weights; pass the vocab it was trained with (--config.vocab=<file>).")
  path = resolve_vocab(vocab, b.cache_dir) if vocab else minilm_vocab(b.cache_dir)
  tok = tokenizer.load(path, lowercase=b.lowercase)
  if tok.vocab_size > bb.cfg.vocab_size:
    raise ValueError(f"vocab {path} has {tok.vocab_size} tokens but the encoder's vocab_size is "
                     f"{bb.cfg.vocab_size}; pass the vocab it was trained with (--config.vocab).")
  return tok


def load_data(spec: tasks_lib.TaskSpec, tok, d: setup.DataSettings
              ) -> dict[str, tasks_lib.Encoded]:
  data = {}
  for split in spec.splits:
    t0 = time.time()
    limit = d.max_train_examples if split == spec.train_split else d.max_eval_examples
    records = tasks_lib.read_split(spec, split, data_dir=d.data_dir, cache_dir=d.cache_dir,
                                   max_examples=limit, download=d.download)
    data[split] = tasks_lib.encode(spec, records, tok, max_length=d.max_length,
                                   doc_stride=d.doc_stride,
                                   max_query_length=d.max_query_length)
    logging.info("%s/%s: %d records -> %d rows of %d tokens (%.1f s)", spec.name, split,
                 len(records), len(data[split]), d.max_length, time.time() - t0)
  return data


def finetune_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs config.seeds fine-tuning seeds (config.seed, config.seed + 1, ...) from one
  backbone; writes results.json and results.md to workdir and returns the results dict.
  The ConfigDict is read once, by setup.build; everything below reads its frozen Settings."""
  t_start = time.time()
  s = setup.build(config)  # the one boundary: checks every key, then freezes
  del config
  workdir = paths.absolute(workdir)  # local or gs:// (encoder_jax.paths)
  if not paths.is_uri(workdir):
    workdir.mkdir(parents=True, exist_ok=True)
  spec, t = s.task, s.train
  if t.freeze_encoder and t.layer_decay < 1:
    logging.warning("freeze_encoder makes layer_decay=%s moot (the encoder gets no update)",
                    t.layer_decay)
  bb = _backbone(s.backbone)
  _describe(bb.cfg, t.dropout)
  if s.data.max_length > bb.cfg.max_positions:
    raise ValueError(f"max_length={s.data.max_length} > the encoder's max_positions="
                     f"{bb.cfg.max_positions}; lower --config.max_length.")
  tok = _tokenizer(s.backbone, bb)
  data = load_data(spec, tok, s.data)
  runs = _run_seeds(s, bb, data, workdir)
  results = {
      "task": spec.name, "init": s.backbone.init, "backbone": bb.source,
      "model": {k: v for k, v in bb.cfg.to_dict().items()},
      "config": json.loads(s.config), "data_rows": {k: len(e) for k, e in data.items()},
      "runs": runs, "summary": summarize_runs(runs), "seconds": round(time.time() - t_start, 1),
  }
  paths.write_atomic(workdir / "results.json", json.dumps(results, indent=1, default=float) + "\n")
  paths.write_atomic(workdir / "results.md", markdown_table([results]) + "\n")
  logging.info("wrote %s and results.md (%.0f s)", workdir / "results.json",
               time.time() - t_start)
  return results


def _describe(cfg: ModelConfig, dropout: bool) -> None:
  logging.info("backbone: %d layers, d=%d, vocab %d", cfg.num_layers, cfg.hidden_size,
               cfg.vocab_size)
  # The attention path of the fine-tuning step (dropout=False trains in eval mode: no dropout).
  logging.info("%s", describe_attention(cfg if dropout else cfg.replace(attention_dropout=0.0)))
  logging.info("%s", describe_dots(cfg.dot_dtype, cfg.dtype))


def _run_seeds(s: setup.Settings, bb: pretrained.Backbone, data, workdir) -> list[dict]:
  """Each seed's record; the first seed's embeddings exported, each seed's best saved, as
  the settings ask."""
  runs, mesh = [], sharding.mesh_from_config(s.mesh)
  for i in range(s.seeds):
    seed = s.seed + i
    model = backbone_lib.build_model(bb, s.task.kind, s.task.num_labels,
                                     pooling=s.backbone.pooling, seed=seed)
    # Every seed has the same module structure and optimizer: the first seed's steps serve
    # them all (trainer.build_steps).
    runs.append(trainer.finetune_one_seed(s.task, model, data, s.train, seed, mesh))
    logging.info("seed %d done: %s", seed, _one_line(runs[-1]))
    if s.output.save_best:
      _save_params(workdir / f"seed_{seed}" / "best", model)
    if i == 0 and s.output.export_embeddings:
      export_embeddings(model, s.task, data, s.output, s.train, workdir / "embeddings")
  return runs


def _one_line(run: dict[str, Any]) -> str:
  parts = [f"best epoch {run['best_epoch']}"]
  for where in ("dev", "test"):
    for split, m in (run[where].items() if where == "dev" else [("test", run["test"])]):
      if m:
        parts.append(f"{split} " + " ".join(f"{k}={v:.4f}" for k, v in m.items()
                                             if not k.endswith("total")))
  return "; ".join(parts)


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
  """'<split>/<metric>' -> median / mean / std / n over seeds (dev at each seed's best epoch)."""
  values: dict[str, list[float]] = {}
  for r in runs:
    for split, m in list(r["dev"].items()) + ([("test", r["test"])] if r["test"] else []):
      for k, v in m.items():
        if not k.endswith("total"):
          values.setdefault(f"{split}/{k}", []).append(float(v))
  return {k: metrics_lib.summarize(v) for k, v in values.items()}


def markdown_table(results: list[dict[str, Any]]) -> str:
  """One row per run: task, backbone, seeds, then median (mean ± std) of each metric."""
  keys = []
  for res in results:
    keys += [k for k in res["summary"] if k not in keys and not k.endswith("/score")]
  lines = ["| task | init | seeds | " + " | ".join(keys) + " |",
           "|---|---|---|" + "---|" * len(keys)]
  for res in results:
    cells = []
    for k in keys:
      s = res["summary"].get(k)
      cells.append("" if s is None else f"{s['median']:.4f} ({s['mean']:.4f} ± {s['std']:.4f})")
    lines.append(f"| {res['task']} | {res['init']} | {len(res['runs'])} | "
                 + " | ".join(cells) + " |")
  return "\n".join(lines)


def export_embeddings(model, spec, data, out: setup.OutputSettings, t: setup.TrainSettings,
                      out_dir: epath.Path) -> list[epath.Path]:
  """Pooled sentence embeddings ([CLS] or masked mean of the last layer) of the configured
  splits to .npy (float32 [N, D]), with the split's labels beside them."""
  from flax import nnx
  if not paths.is_uri(out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
  kind = out.export_pooling
  embed = nnx.jit(lambda m, ids, mask, types: pool(
      m.encoder(ids, mask, types).hidden_BxTxD, mask, kind))
  written = []
  for split in out.export_embeddings:  # (setup.check: splits of the task)
    enc = data[split]
    chunks = []
    for idx, batch in trainer.batches(enc, np.arange(len(enc)), t.eval_batch_size,
                                      t.length_bucket):
      e = embed(model, jnp.asarray(batch["input_ids"]), jnp.asarray(batch["mask"]),
                jnp.asarray(batch["token_types"]))
      chunks.append(np.asarray(jax.device_get(e))[:len(idx)])
    stem = f"{spec.name.replace('/', '_')}_{split}_{kind}"
    path = out_dir / f"{stem}.npy"
    _save_npy(path, np.concatenate(chunks).astype(np.float32))
    written.append(path)
    if "labels" in enc.arrays:
      _save_npy(out_dir / f"{stem}_labels.npy", enc.arrays["labels"])
    logging.info("exported %s embeddings of %s/%s to %s", kind, spec.name, split, path)
  return written


def _save_npy(path: epath.Path, array: np.ndarray) -> None:
  buf = io.BytesIO()
  np.save(buf, array)
  paths.write_atomic(path, buf.getvalue())


def _save_params(path: epath.Path, model) -> None:
  import orbax.checkpoint as ocp
  from flax import nnx
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(paths.absolute(path), nnx.to_pure_dict(nnx.state(model, nnx.Param)), force=True)
  ckptr.wait_until_finished()
