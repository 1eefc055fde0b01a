"""HF ELECTRA <-> encoder_jax, through safetensors (never pickle).

Import:
  load_hf_electra(dir)      a discriminator (HF ElectraForPreTraining -> our
                            ElectraDiscriminator with its RTD head; ElectraModel or a fine-tuned
                            ELECTRA -> the encoder alone) or a generator (ElectraForMaskedLM ->
                            our ElectraGenerator), told apart by the heads the tensors hold.
  load_hf_electra_pair(disc_dir, gen_dir)   both halves as our ElectraModel, with the tied
                            embeddings of pre-training, to continue pre-training.
Export: `export_hf_electra(model, dir)` writes what transformers' `from_pretrained` loads with
nothing missing: a discriminator as ElectraForPreTraining (ElectraModel without RTD head), a
generator as ElectraForMaskedLM, and our ElectraModel as both: the discriminator in `dir`, the
generator in `dir/generator`. import(export(params)) is bit-exact (transposes and reshapes).
A generator is BERT's MLM model with ELECTRA's embedding projection, so an MLM run with an
embedding_size != hidden_size (which HF BERT cannot hold) exports as ElectraForMaskedLM too
(FAMILY, encoder_jax.hf.FAMILIES).

Tied embeddings: our ElectraModel keeps ONE embeddings module (token, position and type tables
and their LayerNorm) for generator and discriminator, as ELECTRA pre-training does; HF keeps a
copy in each model. Export writes the same tables into both folders; importing a pair checks
that the two copies agree, and where they do not, keeps the discriminator's and logs how far
apart they were.

The encoder layers are BERT's (same tensor names), so the per-layer maps are bert.py's; ELECTRA
adds `embeddings_project` when embedding_size != hidden_size (ELECTRA-small: 128 -> 256).
"""
from __future__ import annotations

import os
import pathlib
from typing import Any

import jax
import numpy as np
from absl import logging
from flax import nnx

from encoder_jax.hf.bert import (_assign, _dense_from_hf, _dense_to_hf, _encoder_from_hf,
                                 _encoder_to_hf, _mlm_head_from_hf, _mlm_head_to_hf,
                                 _pure_params, _taking, hf_config, hf_config_to_model_config,
                                 read_hf_folder, write_hf_folder)
from encoder_jax.hf.families import Family, Gap, Weights, Written, encoder_gaps, mlm_head_gaps
from encoder_jax.model.bert import BertForPreTraining
from encoder_jax.model.config import ModelConfig
from encoder_jax.model.electra import ElectraDiscriminator, ElectraGenerator, ElectraModel
from encoder_jax.objectives.pretraining import ObjectiveConfig

# Buffers and tied copies that carry no parameter of their own.
_IGNORED_KEYS = ("embeddings.position_ids", "embeddings.token_type_ids",
                 "generator_lm_head.weight")
_RTD, _GEN = "discriminator_predictions.", "generator_predictions."


def hf_electra_gaps(cfg: ModelConfig, *, generator: bool = False) -> list[Gap]:
  """What in `cfg` (a generator's when `generator`) HF ELECTRA cannot represent; empty: the
  export computes what we compute. (No token types, type_vocab_size=0, exports as one type of
  zeros: bert._encoder_to_hf.)"""
  gaps = encoder_gaps(cfg)
  # HF's ElectraGeneratorPredictions applies exact GELU whatever hidden_act says; our MLM head
  # applies cfg.activation, so only "gelu" gives the same numbers on both sides.
  if generator:
    gaps += mlm_head_gaps(cfg, "ELECTRA generator")
  return gaps


def hf_electra_pair_gaps(disc: ModelConfig, gen: ModelConfig) -> list[Gap]:
  """hf_electra_gaps of a pre-training pair: the discriminator's, then what only the
  generator has."""
  gaps = hf_electra_gaps(disc)
  return gaps + [Gap(f"{g.switch} in the generator", g.why, g.fix)
                 for g in hf_electra_gaps(gen, generator=True)
                 if g.switch not in {d.switch for d in gaps}]


def run_gaps(cfg: ModelConfig, obj: ObjectiveConfig) -> list[Gap]:
  """FAMILY.gaps: an ELECTRA run exports as the pair; an MLM run (ELECTRA-small's embedding
  projection, say) as a generator-shaped ElectraForMaskedLM, which is BERT's MLM model with
  ELECTRA's embeddings_project."""
  if obj.is_electra:
    return hf_electra_pair_gaps(cfg, obj.generator_config(cfg))
  gaps = hf_electra_gaps(cfg, generator=True)
  if obj.sentence_task != "none":
    gaps.append(Gap(f"objective.sentence_task={obj.sentence_task!r}", "HF's ELECTRA classes "
                    "have no sentence-pair head", (("objective.sentence_task", "none"),)))
  return gaps


def _check_generator_activation(cfg: ModelConfig, where: str) -> None:
  if cfg.activation != "gelu":
    raise ValueError(f"{where}: HF's ELECTRA generator head always uses exact GELU, but this "
                     f"model's activation is {cfg.activation!r}; only activation='gelu' "
                     "generators convert exactly.")


# ----------------------------------------------------------------------------- tensors
def hf_electra_tensors_to_params(t: dict[str, np.ndarray], cfg: ModelConfig
                                 ) -> tuple[str, dict[str, Any]]:
  """HF tensor dict -> (head kind, our pure parameter dict).

  kind "rtd": {"encoder", "rtd"} (ElectraDiscriminator); "mlm": {"encoder", "mlm"}
  (ElectraGenerator); "none": {"encoder"} (ElectraDiscriminator(rtd=False)).
  Raises if a tensor the model needs is missing; logs the leftovers (e.g. a fine-tuned
  classifier head, which has no counterpart here).
  """
  t = {k.removeprefix("electra."): v for k, v in t.items() if not k.endswith(_IGNORED_KEYS)}
  kind = ("rtd" if any(k.startswith(_RTD) for k in t)
          else "mlm" if any(k.startswith(_GEN) for k in t) else "none")
  with _taking(t, "ELECTRA", f"a {kind!r}-headed model of this config (layers="
               f"{cfg.num_layers}, embedding_size={cfg.embed_size}, hidden_size="
               f"{cfg.hidden_size})"):
    params: dict[str, Any] = {"encoder": _encoder_from_hf(t, cfg)}
    if kind == "rtd":
      params["rtd"] = {"dense": _dense_from_hf(t, f"{_RTD}dense"),
                       "out": _dense_from_hf(t, f"{_RTD}dense_prediction")}
    elif kind == "mlm":
      params["mlm"] = _mlm_head_from_hf(t, f"{_GEN}dense", f"{_GEN}LayerNorm",
                                        "generator_lm_head.bias")
  return kind, params


def params_to_hf_electra_tensors(encoder: dict[str, Any], cfg: ModelConfig, *,
                                 rtd: dict[str, Any] | None = None,
                                 mlm: dict[str, Any] | None = None,
                                 prefix: str = "electra.") -> dict[str, np.ndarray]:
  """Our encoder (+ RTD or MLM head) parameters -> HF tensor names."""
  out = {prefix + k: v for k, v in _encoder_to_hf(encoder, cfg).items()}
  if rtd is not None:
    out.update(_dense_to_hf(rtd["dense"], f"{_RTD}dense"))
    out.update(_dense_to_hf(rtd["out"], f"{_RTD}dense_prediction"))
  if mlm is not None:
    out.update(_mlm_head_to_hf(mlm, f"{_GEN}dense", f"{_GEN}LayerNorm",
                               "generator_lm_head.bias"))
  return out


# ----------------------------------------------------------------------------- import
def _read(path: str | os.PathLike, overrides: dict[str, Any]
          ) -> tuple[ModelConfig, str, dict[str, Any]]:
  hf_cfg, tensors = read_hf_folder(path)
  if hf_cfg.get("model_type") != "electra":
    raise ValueError(f"{path}/config.json has model_type={hf_cfg.get('model_type')!r}, not "
                     "'electra'" + ("; load BERT checkpoints with load_hf_bert."
                                    if hf_cfg.get("model_type") == "bert" else "."))
  cfg = model_config(hf_cfg, **overrides)
  kind, params = hf_electra_tensors_to_params(tensors, cfg)
  if kind == "mlm":
    _check_generator_activation(cfg, str(path))
  return cfg, kind, params


def load_hf_electra(path: str | os.PathLike, **config_overrides: Any
                    ) -> ElectraDiscriminator | ElectraGenerator:
  """Loads one HF ELECTRA folder (config.json + model.safetensors), in eval mode.

  A folder with the generator's MLM head gives an ElectraGenerator; one with the RTD head an
  ElectraDiscriminator; one with neither (ElectraModel, or a fine-tuned model whose task head
  has no counterpart here: it is logged as unused) an ElectraDiscriminator(rtd=False).
  `config_overrides` change numerics, not shapes (scan_layers=False, dtype="bfloat16", ...).
  """
  cfg, kind, params = _read(path, config_overrides)
  if kind == "mlm":
    model = nnx.eval_shape(lambda: ElectraGenerator(cfg, rngs=nnx.Rngs(0)))
  else:
    model = nnx.eval_shape(lambda: ElectraDiscriminator(cfg, rtd=kind == "rtd",
                                                        rngs=nnx.Rngs(0)))
  _assign(model, params)
  model.eval()
  return model


def load_hf_electra_pair(discriminator_path: str | os.PathLike,
                         generator_path: str | os.PathLike, **config_overrides: Any
                         ) -> ElectraModel:
  """A HF discriminator (with RTD head) + generator pair as our ElectraModel (eval mode).

  The two folders each hold a copy of the embeddings; ours are one module. If the copies
  differ, the discriminator's are kept and a warning says by how much (a generator and a
  discriminator that were not pre-trained together).
  """
  disc_cfg, disc_kind, disc = _read(discriminator_path, config_overrides)
  gen_cfg, gen_kind, gen = _read(generator_path, config_overrides)
  if disc_kind != "rtd":
    raise ValueError(f"{discriminator_path} has no RTD head (discriminator_predictions.*): "
                     "pass the ElectraForPreTraining checkpoint as the discriminator.")
  if gen_kind != "mlm":
    raise ValueError(f"{generator_path} has no generator MLM head (generator_predictions.*): "
                     "pass the ElectraForMaskedLM checkpoint as the generator.")
  d_emb, g_emb = disc["encoder"]["embeddings"], gen["encoder"]["embeddings"]
  shapes = lambda tree: jax.tree.map(np.shape, tree)
  if shapes(d_emb) != shapes(g_emb):
    raise ValueError(f"The generator's embedding tables {shapes(g_emb)} do not have the "
                     f"discriminator's shapes {shapes(d_emb)}; ELECTRA ties them, so the pair "
                     "must share vocab_size, embedding_size, max_position_embeddings and "
                     "type_vocab_size.")
  diff = max(float(np.max(np.abs(a - b))) for a, b in
             zip(jax.tree.leaves(d_emb), jax.tree.leaves(g_emb)))
  if diff:
    logging.warning("The generator's embeddings differ from the discriminator's (max abs diff "
                    "%.3g); ELECTRA ties them, so the discriminator's are kept for both.", diff)
  model = nnx.eval_shape(lambda: ElectraModel(disc_cfg, gen_cfg, main_head="rtd",
                                              rngs=nnx.Rngs(0)))
  # The generator holds the discriminator's embeddings module: fill it through the
  # discriminator, the rest of the generator without it.
  gen_enc = {k: v for k, v in gen["encoder"].items() if k != "embeddings"}
  _assign(model, {"discriminator": disc["encoder"], "generator": gen_enc,
                  "gen_mlm": gen["mlm"], "rtd": disc["rtd"]})
  model.eval()
  return model


# ----------------------------------------------------------------------------- export
def export_hf_electra(model: ElectraDiscriminator | ElectraGenerator | ElectraModel,
                      out_dir: str | os.PathLike, *, vocab: str | os.PathLike | None = None
                      ) -> list[pathlib.Path]:
  """Writes HF ELECTRA folder(s) that transformers' from_pretrained loads; returns them.

  ElectraModel (a pre-training run) -> `out_dir` (discriminator: ElectraForPreTraining) and
  `out_dir/generator` (ElectraForMaskedLM), each with its own copy of the shared embeddings.
  Heads HF's ELECTRA classes have no place for (the Replace-MLM / All-Tokens MLM
  discriminator heads, an NSP pooler) are left out with a warning; their discriminator is
  written as a bare ElectraModel. `vocab`: a vocab.txt to copy into every folder.
  """
  written = _export(model, pathlib.Path(out_dir), vocab)
  for _, _, dropped in written:
    if dropped:
      logging.warning("HF ELECTRA has no place for the discriminator heads %s of this "
                      "main_head=%r model; the discriminator is exported without them.",
                      dropped, model.main_head)
  return [folder for folder, _, _ in written]


def _export(model, out_dir: pathlib.Path, vocab) -> list[tuple[pathlib.Path, str, list[str]]]:
  """(folder, HF class, our heads left out) of each folder written."""
  if isinstance(model, ElectraModel):
    # Both halves checked before either folder is written: never a discriminator alone.
    if gaps := hf_electra_pair_gaps(model.disc_cfg, model.gen_cfg):
      raise ValueError(f"HF ELECTRA cannot represent this model, which has "
                       f"{' and '.join(f'{g.switch} ({g.why})' for g in gaps)}: transformers "
                       "would compute something else. Nothing was written.")
    disc_enc = _pure_params(model.discriminator)
    # _pure_params of the generator reaches the shared embeddings through it: the copy HF
    # needs in the generator's folder.
    gen_enc = _pure_params(model.generator)
    rtd = _pure_params(model.rtd) if model.main_head == "rtd" else None
    dropped = [name for name, head in (("rtd (All-Tokens MLM copy head)",
                                        model.rtd if model.main_head == "copy_mlm" else None),
                                       ("disc_mlm", model.disc_mlm), ("pooler", model.pooler),
                                       ("nsp", model.nsp)) if head is not None]
    return [(out_dir, _export_one(model.disc_cfg, disc_enc, out_dir, vocab, rtd=rtd), dropped),
            (out_dir / "generator", _export_one(model.gen_cfg, gen_enc, out_dir / "generator",
                                                vocab, mlm=_pure_params(model.gen_mlm)), [])]
  if isinstance(model, BertForPreTraining) and model.nsp is None:
    # An MLM run: BERT's MLM model, with ELECTRA's embedding projection where it has one.
    encoder, mlm = _pure_params(model.bert.encoder), _pure_params(model.mlm)
    return [(out_dir, _export_one(model.cfg, encoder, out_dir, vocab, mlm=mlm), [])]
  if isinstance(model, ElectraGenerator):
    return [(out_dir, _export_one(model.cfg, _pure_params(model.encoder), out_dir, vocab,
                                  mlm=_pure_params(model.mlm)), [])]
  if isinstance(model, ElectraDiscriminator):
    return [(out_dir, _export_one(model.cfg, _pure_params(model.encoder), out_dir, vocab,
                                  rtd=None if model.rtd is None else _pure_params(model.rtd)),
             [])]
  raise TypeError(f"export_hf_electra takes an ElectraModel, ElectraDiscriminator, "
                  f"ElectraGenerator or a BertForPreTraining without NSP, not "
                  f"{type(model).__name__}; export BERT models with export_hf_bert.")


def _export_one(cfg: ModelConfig, encoder: dict[str, Any], out_dir: pathlib.Path, vocab, *,
                rtd=None, mlm=None) -> str:
  arch = ("ElectraForPreTraining" if rtd is not None else
          "ElectraForMaskedLM" if mlm is not None else "ElectraModel")
  hf_cfg = hf_config(cfg, [arch], "electra", hf_electra_gaps(cfg, generator=mlm is not None))
  # A bare ElectraModel's tensors carry no "electra." prefix (HF's base_model_prefix).
  tensors = params_to_hf_electra_tensors(encoder, cfg, rtd=rtd, mlm=mlm,
                                         prefix="" if arch == "ElectraModel" else "electra.")
  write_hf_folder(out_dir, hf_cfg, tensors, vocab=vocab)
  return arch


# ----------------------------------------------------------------------------- the family
def read(path: str | os.PathLike, **config_overrides: Any) -> Weights:
  """FAMILY.read: one HF ELECTRA folder; a generator's MLM head comes as `heads['mlm']` (the
  generator is BERT's MLM model with an embedding projection)."""
  cfg, kind, params = _read(path, config_overrides)
  return Weights(cfg, params["encoder"], None,
                 {"mlm": params["mlm"]} if kind == "mlm" else None)


_AUTO = {"ElectraForPreTraining": "AutoModelForPreTraining",
         "ElectraForMaskedLM": "AutoModelForMaskedLM", "ElectraModel": "AutoModel"}


def _export_run_model(model: ElectraModel | BertForPreTraining, out_dir: pathlib.Path, *,
                      vocab=None, pad_id: int | None = None) -> list[Written]:
  """FAMILY.export of a pre-training run's model (run_gaps found nothing). HF ELECTRA's
  positions are 0..T-1 whatever the pad id, so `pad_id` is not needed."""
  del pad_id
  if isinstance(model, ElectraModel):
    disc = lambda ids, mask: model.discriminator(ids, mask).hidden_BxTxD
    outputs = [
        # The RTD logit per token; a discriminator written without a head: its hidden states.
        (lambda ids, mask: np.asarray(model.rtd(disc(ids, mask)))) if model.main_head == "rtd"
        else (lambda ids, mask: np.asarray(disc(ids, mask))),
        lambda ids, mask: np.asarray(model.gen_mlm(model.generator(ids, mask).hidden_BxTxD,
                                                   model.token_embed))]
  else:
    outputs = [lambda ids, mask: np.asarray(model(ids, mask)[0])]
  return [Written(folder, arch, _AUTO[arch], fn, tuple(dropped),
                  "last_hidden_state" if arch == "ElectraModel" else "logits")
          for (folder, arch, dropped), fn in zip(_export(model, out_dir, vocab), outputs)]


def model_config(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
  """FAMILY.model_config: HF's ElectraConfig default embedding_size (128) where config.json
  leaves it out."""
  return hf_config_to_model_config({"embedding_size": 128, **hf}, **overrides)


FAMILY = Family(name="ELECTRA", model_types=("electra",), gaps=run_gaps,
                model_config=model_config, read=read, export=_export_run_model)
