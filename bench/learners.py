"""The two learners bench/learning_vs_hf.py trains, each inside a bench.systems.Worker process.

Both follow the Worker protocol: `run(n)` trains n steps (timed by the Worker), `info()`
evaluates the current parameters on the held-out batches (untimed) and reports what the
learner saw; `warmup()` does nothing, because every step of a learning curve counts.

  OursLearner  our trainer's own pieces, wired as encoder_jax.train.loop wires them: `build`,
               `initial_state`, `make_loader` (train batches in stream order), the jitted
               train step (masks, dropout and updates on device) and `make_eval_step`. Only
               checkpoints and metric files are left out, and the loader is read ahead of the
               timed steps (HF gets its batches from memory too).
  HfLearner    transformers.BertForMaskedLM loaded from our exported initial parameters, torch
               AdamW with HF's linear warm-up/decay schedule, fed the batches the driver
               corrupted with our masking rules and our step's keys.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time

import numpy as np


@dataclasses.dataclass(frozen=True)
class LearnSpec:
  """One learner. Plain values only (it crosses the process boundary); the Worker reads
  `label`, `xla_flags` and `src`."""

  system: str  # ours | hf
  label: str
  threads: int = 2  # torch.set_num_threads (HF); XLA uses every core it sees
  xla_flags: str = ""
  src: str | None = None


def inputs_digest(ids_BxT: np.ndarray, labels_BxT: np.ndarray) -> str:
  """sha256 of a batch's corrupted ids and [B, T] labels (-100 where nothing is predicted)."""
  h = hashlib.sha256()
  for a in (ids_BxT, labels_BxT):
    a = np.ascontiguousarray(a, np.int32)
    h.update(str(a.shape).encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]


def _aggregate(rows: list[dict]) -> dict:
  """Per-batch eval metrics -> totals over all predictions (each batch weighted by its count)."""
  count = sum(float(r["count"]) for r in rows)
  out = {"count": count}
  for key in ("accuracy", "loss", "unigram_accuracy", "unigram_loss"):
    if key in rows[0]:
      out[key] = sum(float(r[key]) * float(r["count"]) for r in rows) / max(count, 1.0)
  return out


class OursLearner:
  """Our trainer on `payload["config"]` (a ConfigDict), evaluated on `payload["eval_config"]`'s
  held-out batches with that config's masking (so runs of other recipes can be scored on the
  same corrupted inputs). `payload["steps"]` train batches are read ahead; with
  `payload["export_dir"]` the initial parameters are exported there as a HF checkpoint."""

  def __init__(self, spec: LearnSpec, payload: dict):
    import jax
    from encoder_jax.data import unigram
    from encoder_jax.data.vocab import resolve_vocab
    from encoder_jax.data import tokenizer
    from encoder_jax.train import loop, setup, sharding
    from encoder_jax.train import step as step_lib
    self.jax, self.spec = jax, spec
    config, eval_config = payload["config"], payload["eval_config"]
    s = setup.build(config)
    self.tokens_per_step = s.tokens_per_step
    mesh = sharding.mesh_from_config(config.get("mesh", "auto"))
    state_shardings = sharding.state_shardings(jax.eval_shape(s.init_fn), mesh)
    self.to_device = lambda batch: sharding.shard_batch(batch, mesh)
    it = iter(setup.make_loader(setup.DataSettings.of(config), "train"))
    self.batches = [next(it) for _ in range(payload["steps"])]
    self.state = loop.initial_state(s.init_fn, state_shardings)
    if payload.get("export_dir"):  # the HF peer starts from exactly these weights
      from flax import nnx
      from encoder_jax.hf.bert import export_hf_bert
      export_hf_bert(nnx.merge(s.trainer.graphdef_eval, self.state.params),
                     payload["export_dir"])

    eval_tok = tokenizer.load(resolve_vocab(eval_config.data.vocab,
                                            eval_config.data.cache_dir or None))
    eval_obj = setup.objective_config(eval_config, eval_tok)
    if eval_obj.vocab_size != s.obj.vocab_size:
      raise ValueError(f"eval_config's vocabulary ({eval_obj.vocab_size} ids) is not the "
                       f"model's ({s.obj.vocab_size}); evaluate on batches of the same vocab.")
    eval_data = setup.DataSettings.of(eval_config)
    eval_it = iter(setup.make_loader(eval_data, eval_data.eval_split))
    self.eval_batches = [self.to_device(next(eval_it))
                         for _ in range(eval_config.train.eval_steps)]
    counts = unigram.row_counts(setup.make_loader(eval_data, "train").rows, eval_obj.vocab_size)
    self.unigram_logp_V = jax.numpy.asarray(unigram.unigram_log_probs(counts,
                                                                      eval_obj.special_ids))
    # The eval step is the trainer's, only its objective (mask rate, fractions) is eval_config's.
    self.eval_step = step_lib.make_eval_step(dataclasses.replace(s.trainer, obj=eval_obj))
    self.first_digest = self._first_batch_digest(s.trainer, step_lib)

    t0 = time.perf_counter()
    train_step = step_lib.make_train_step(s.trainer, state_shardings,
                                          sharding.batch_sharding(mesh))
    first = self.to_device(self.batches[0])
    self.step_fn = train_step.lower(self.state, first).compile()  # ahead of time: untimed
    self.compile_s = time.perf_counter() - t0
    self.step, self.pending, self.train_losses, self.first_loss = 0, [], [], None
    self.lr = None

  def _first_batch_digest(self, tr, step_lib) -> str:
    """What the real step corrupts batch 1 into: `loss_and_metrics` (the step's own code) runs
    with the step's key for step 0 around a stand-in model that hands back what it is given
    (masks do not depend on the model, so no forward pass is needed)."""
    from encoder_jax.objectives import pretraining
    jax, jnp = self.jax, self.jax.numpy
    vocab_size = tr.obj.vocab_size

    def corrupted(batch, key):
      seen = {}

      def model(ids_BxT, *, mlm_positions_BxP, **_):
        seen.update(ids=ids_BxT, positions=mlm_positions_BxP)
        return jnp.zeros(mlm_positions_BxP.shape + (vocab_size,), jnp.float32), None, None

      _, m = pretraining.loss_and_metrics(model, batch, key, tr.obj, train=False,
                                          mask_keys_B=step_lib.static_keys(tr, batch))
      return seen["ids"], seen["positions"], m["mlm_count"]

    key = step_lib.step_key(tr.seed, int(self.state.step))
    ids, pos, count = jax.device_get(jax.jit(corrupted)(self.batches[0], key))
    clean = np.asarray(self.batches[0]["input_ids"])
    # Unused prediction slots hold position 0: a special token ([CLS]) in every row of our
    # formats, so never chosen; check it rather than assume it.
    if not np.isin(clean[:, 0], tr.obj.special_ids).all():
      raise ValueError("a training row does not start with a special token; the recorded "
                       "positions cannot tell chosen slots from unused ones.")
    valid = pos > 0
    if int(valid.sum()) != int(count):
      raise ValueError(f"{int(valid.sum())} chosen positions recorded but the step counted "
                       f"{int(count)}.")
    labels = np.full(clean.shape, -100, np.int32)
    rows = np.broadcast_to(np.arange(clean.shape[0])[:, None], pos.shape)
    labels[rows[valid], pos[valid]] = clean[rows[valid], pos[valid]]
    return inputs_digest(ids, labels)

  def warmup(self):
    """Nothing: an untimed warm-up step would be a step missing from the curve."""

  def run(self, n: int):
    if self.step + n > len(self.batches):
      raise ValueError(f"asked for step {self.step + n} but only {len(self.batches)} batches "
                       "were read ahead; raise payload['steps'].")
    for _ in range(n):
      self.state, metrics = self.step_fn(self.state, self.to_device(self.batches[self.step]))
      self.step += 1
      self.pending.append(metrics)
    self.jax.block_until_ready(self.state)

  def info(self) -> dict:
    """Evaluates now; returns the eval totals, the train losses since the last call, ..."""
    fetched = self.jax.device_get(self.pending)
    self.pending = []
    for i, m in enumerate(fetched):
      if not np.isfinite(m["loss"]):
        raise FloatingPointError(f"non-finite train loss at step "
                                 f"{self.step - len(fetched) + i + 1}")
    if fetched:
      if self.first_loss is None:
        self.first_loss = float(fetched[0]["loss"])
      self.train_losses.append(float(np.mean([m["loss"] for m in fetched])))
      self.lr = float(fetched[-1]["learning_rate"])
    outs = self.jax.device_get([self.eval_step(self.state.params, b, i, self.unigram_logp_V)
                                for i, b in enumerate(self.eval_batches)])
    rows = [dict(accuracy=o["mlm_accuracy"], loss=o["mlm_loss"], count=o["mlm_count"],
                 unigram_accuracy=o["unigram_accuracy"], unigram_loss=o["unigram_loss"])
            for o in outs]
    return dict(step=self.step, eval=_aggregate(rows), first_loss=self.first_loss,
                train_loss=self.train_losses[-1] if fetched else None, lr=self.lr,
                first_digest=self.first_digest, compile_s=self.compile_s,
                tokens_per_step=self.tokens_per_step)


class HfLearner:
  """transformers.BertForMaskedLM (post-LN; HF has no pre-LN BERT) trained with torch.

  payload: hf_dir (our exported initial parameters), data (npz path: train_* [N, B, T] and
  eval_* [K, B, T] arrays: ids, mask, token_types, positions, labels), optim (lr, b1, b2,
  eps, weight_decay, warmup_steps, total_steps, clip), seed.
  """

  def __init__(self, spec: LearnSpec, payload: dict):
    import torch
    import transformers
    self.torch = torch
    torch.set_num_threads(spec.threads)
    torch.manual_seed(payload["seed"])  # dropout masks (ours draw theirs from the step key)
    model, info = transformers.BertForMaskedLM.from_pretrained(
        payload["hf_dir"], output_loading_info=True,
        attn_implementation=payload.get("attn", "sdpa"))
    self._check_loaded(model, info)
    self.model = model.train()
    o = payload["optim"]
    # BERT's decay exclusions (bias, LayerNorm), as encoder_jax.train.optim.decay_mask.
    named = list(self.model.named_parameters())  # tied tensors appear once
    decay = [p for n, p in named if not ("bias" in n or "LayerNorm" in n)]
    no_decay = [p for n, p in named if "bias" in n or "LayerNorm" in n]
    self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                                  {"params": no_decay, "weight_decay": 0.0}],
                                 lr=o["lr"], betas=(o["b1"], o["b2"]), eps=o["eps"])
    self.sched = transformers.get_linear_schedule_with_warmup(
        self.opt, num_warmup_steps=o["warmup_steps"], num_training_steps=o["total_steps"])
    self.clip = o["clip"]
    data = np.load(payload["data"])
    as_long = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.long)
    self.train = {k: as_long(data[f"train_{k}"]) for k in
                  ("ids", "mask", "token_types", "positions", "labels")}
    self.evals = {k: as_long(data[f"eval_{k}"]) for k in
                  ("ids", "mask", "token_types", "positions", "labels")}
    self.first_digest = inputs_digest(self.train["ids"][0].numpy(),
                                      self.train["labels"][0].numpy())
    self.step, self.losses, self.train_losses, self.first_loss = 0, [], [], None

  @staticmethod
  def _check_loaded(model, info):
    """Every tensor of BertForMaskedLM came from our export; the decoder is tied to the word
    embeddings and its bias is `cls.predictions.bias` (our MlmHead's `bias`)."""
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    missing = set(info["missing_keys"]) - tied
    if missing or info["unexpected_keys"] or info["mismatched_keys"]:
      raise ValueError(f"HF BertForMaskedLM did not load our export cleanly: missing {missing}, "
                       f"unexpected {info['unexpected_keys']}, mismatched "
                       f"{info['mismatched_keys']}.")
    p = model.cls.predictions
    if (p.decoder.weight.data_ptr() != model.bert.embeddings.word_embeddings.weight.data_ptr()
        or p.decoder.bias is None or p.decoder.bias.data_ptr() != p.bias.data_ptr()):
      raise ValueError("HF's MLM decoder is not tied to the word embeddings and "
                       "cls.predictions.bias; our head ties both.")

  def _inputs(self, d: dict, i: int) -> dict:
    return dict(input_ids=d["ids"][i], attention_mask=d["mask"][i],
                token_type_ids=d["token_types"][i], position_ids=d["positions"][i],
                labels=d["labels"][i])

  def warmup(self):
    """Nothing: an untimed warm-up step would be a step missing from the curve."""

  def run(self, n: int):
    if self.step + n > self.train["ids"].shape[0]:
      raise ValueError(f"asked for step {self.step + n} but the data holds "
                       f"{self.train['ids'].shape[0]} batches.")
    params = [p for g in self.opt.param_groups for p in g["params"]]
    for _ in range(n):
      self.opt.zero_grad(set_to_none=True)
      loss = self.model(**self._inputs(self.train, self.step)).loss
      loss.backward()
      self.torch.nn.utils.clip_grad_norm_(params, self.clip)
      self.opt.step()
      self.sched.step()
      self.step += 1
      self.losses.append(loss.detach())

  def info(self) -> dict:
    torch = self.torch
    losses = [float(x) for x in self.losses]
    self.losses = []
    if any(not np.isfinite(x) for x in losses):
      raise FloatingPointError(f"non-finite train loss before step {self.step}")
    if losses:
      if self.first_loss is None:
        self.first_loss = losses[0]
      self.train_losses.append(float(np.mean(losses)))
    rows = []
    self.model.eval()
    with torch.no_grad():
      for i in range(self.evals["ids"].shape[0]):
        batch = self._inputs(self.evals, i)
        out = self.model(**batch)
        labels = batch["labels"]
        keep = labels != -100
        pred = out.logits.argmax(-1)
        rows.append(dict(loss=float(out.loss), count=float(keep.sum()),
                         accuracy=float((pred[keep] == labels[keep]).float().mean())))
    self.model.train()
    return dict(step=self.step, eval=_aggregate(rows), first_loss=self.first_loss,
                train_loss=self.train_losses[-1] if losses else None,
                lr=self.sched.get_last_lr()[0], first_digest=self.first_digest,
                tokens_per_step=int(self.train["ids"][0].numel()))
