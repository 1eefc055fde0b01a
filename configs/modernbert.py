"""recipe=modernbert: ModernBERT's pre-training (Warner et al. 2024, arXiv 2412.13663), set on a
configs/pretrain.py config. Every value is the paper's (section 2.2 and Appendix Table 3) or
the AnswerDotAI/ModernBERT repository's yamls/modernbert/modernbert-base-pretrain.yaml (cited
as "the yaml"), converted to this trainer's units where they differ:

  * the block: size=modernbert-base (the default) or modernbert-large, ModernBERT's whole
    block (encoder_jax.model.config.MODERNBERT_BLOCK: pre-LN, GeGLU, RoPE, local/global
    attention, no biases, no token types, no dropout).
  * tokenizer: data.vocab `demo-bpe:50368`, a byte-level BPE of ModernBERT's 50,368 ids
    trained on the demo corpus (the released one is a BPE of 50,368 entries, section 2.2.1).
    The released tokenizer itself (answerdotai/ModernBERT-base's tokenizer.json, an OLMo BPE
    whose specials are [CLS] [SEP] [PAD] [MASK] [UNK]) does not load here: data.vocab takes a
    WordPiece vocab.txt or a RoBERTa-style vocab.json + merges.txt with <s> </s> <pad> <mask>
    <unk>. Train one on your corpus with `python -m encoder_jax.data.train_vocab --kind=bpe
    --vocab_size=50368 --input=... --out=<folder>` and pass --config.data.vocab=<folder>.
  * data: FULL-SENTENCES rows of 1,024 tokens (the yaml's max_seq_len; section 2.2.2 trains
    1.7T tokens at 1,024 before extending to 8,192), packed with a segment per document
    (data.pack; the yaml's sequence_packing: true, section 2.2.1 "sequence packing"), no NSP.
  * MLM at 30% (the yaml's mlm_probability: 0.3; section 2.2.2), 80/10/10, dynamic masking.
  * batch 4,608 (base) / 4,928 (large) sequences (the yaml's global_train_batch_size; Table 3).
    ModernBERT warms the batch size up too (768 -> 4,608 over 50B tokens, base; 448 -> 4,928
    over 10B, large; section 2.2.2; the yaml's batch_size_warmup_tokens: 50B): this trainer's
    loader has one global batch size, so the recipe trains at the full batch from step 0.
  * steps: 1.719T tokens (the yaml's max_duration: 1_719_000_000_000tok) at batch x 1,024
    tokens a step: 364,304 steps (base), 340,648 (large).
  * optimizer: StableAdamW in ModernBERT (section 2.2.2; the yaml's decoupled_stableadamw),
    b1 0.9, b2 0.98, eps 1e-6, weight decay 1e-5 off biases and norms (the yaml's
    filter_bias_norm_wd), peak lr 8e-4 (base) / 5e-4 (large) (section 2.2.2; the yaml's lr).
    Here: AdamW with those betas, eps and decay mask (the decision below), and
    * weight decay 1e-5 / peak lr (0.0125 base, 0.02 large): ModernBERT's decay is "fully
      decoupled" (torch-optimi's decouple_lr=True, which the yaml's decoupled_ name selects:
      every step multiplies a weight by 1 - 1e-5 * lr_t / lr_peak), optax's AdamW multiplies
      it by 1 - lr_t * weight_decay; the two are equal at weight_decay = 1e-5 / lr_peak.
    * no gradient clipping: ModernBERT clips none (the yaml configures none); StableAdamW's
      update clipping is its guard instead, which AdamW lacks.
  * schedule: warm-up-stable-decay (section 2.2.2, "trapezoidal"; the yaml's
    warmup_stable_decay): linear warm-up over 3B tokens (base; the yaml's t_warmup) / 2B
    (large; section 2.2.2) = 636 / 397 steps at the full batch, the peak held, then ModernBERT's
    1-sqrt decay (Hägele et al. 2024; section 2.2.2) to 0 over its last 50B tokens
    (optim.decay_frac = 50B / 1.719T). ModernBERT decays after its context extension (250B
    tokens at 8,192 with global RoPE theta 160,000 at lr 3e-4, then the 50B decay), which this
    one-phase recipe leaves out: its decay ends the 1,024-token phase instead.

Decision, StableAdamW: AdamW is an honest stand-in for steady training and not for spikes.
StableAdamW (Wortsman et al. 2023) is AdamW whose step size per tensor is lr / max(1, RMS),
RMS = sqrt(mean(g^2 / v_hat)) over the tensor: it equals AdamW's step whenever no tensor's
gradient exceeds its running second moment (RMS <= 1), and shrinks a tensor's step in the steps
where it does (early training, loss spikes). A run on this recipe that spikes can clip
gradients globally (--config.optim.clip_grad_norm=1.0), a different remedy from ModernBERT's.

Other departures: the yaml drops out 10% of the attention output (attn_out_dropout_prob 0.1),
the released config and MODERNBERT_BLOCK none; the yaml evaluates at 15% masking, here the
held-out rows are masked at the training rate; ModernBERT-large starts from base's weights
tiled (section 2.2.3) and restarted at lr 5e-5 after a plateau, here it starts at random.
"""
import math

import ml_collections

from encoder_jax.model.config import MODERNBERT_BLOCK, SIZES

SIZES_OF_RECIPE = ("modernbert-base", "modernbert-large")
VOCAB_SIZE = 50_368  # ModernBERT's tokenizer (section 2.2.1; its released config's vocab_size)
MAX_LENGTH = 1024  # the yaml's max_seq_len
MASK_RATE = 0.3  # the yaml's mlm_probability
TRAIN_TOKENS = 1.719e12  # the yaml's max_duration
DECAY_TOKENS = 50e9  # section 2.2.2: the final 1-sqrt decay
WEIGHT_DECAY = 1e-5  # the yaml's weight_decay (fully decoupled: see the module docstring)
# size: (peak lr, warm-up tokens, global batch): section 2.2.2, Table 3, the yaml.
BY_SIZE = {"modernbert-base": (8e-4, 3e9, 4608), "modernbert-large": (5e-4, 2e9, 4928)}


def check(args: dict[str, str], size: str) -> None:
  """The settings recipe=modernbert refuses, each in one line."""
  if args["runlocal"] == "True":
    raise ValueError("recipe=modernbert and runlocal are two recipes; choose one.")
  if args["phase"] != "1":
    raise ValueError("phase=2 is BERT's second phase; recipe=modernbert is ModernBERT's "
                     "1,024-token phase (recipe=modernbert, phase=1).")
  if args["objective"] != "mlm" or args["nsp"] != "none":
    raise ValueError("recipe=modernbert trains MLM without a sentence task; drop objective=/"
                     "nsp= or use recipe=bert.")
  if size not in SIZES_OF_RECIPE:
    raise ValueError(f"recipe=modernbert trains ModernBERT's block: size=modernbert-base "
                     f"(the default) or modernbert-large, not size={size}; for another width "
                     "override --config.model.num_layers/hidden_size/num_heads/ffn_size.")
  if args["norm"] not in ("", "pre"):
    raise ValueError("recipe=modernbert is pre-LN (ModernBERT's block); drop norm=post.")


def recipe(config: ml_collections.ConfigDict) -> None:
  """Sets ModernBERT's recipe on `config` (module docstring), whose size is checked already."""
  lr, warmup_tokens, batch = BY_SIZE[config.size]
  assert all(SIZES[config.size][k] == v for k, v in MODERNBERT_BLOCK.items())
  tokens_per_step = batch * MAX_LENGTH
  steps = math.ceil(TRAIN_TOKENS / tokens_per_step)
  config.data.update(dict(vocab=f"demo-bpe:{VOCAB_SIZE}", format="full_sentences",
                          max_length=MAX_LENGTH, batch_size=batch, pack=True))
  config.objective.update(dict(objective="mlm", sentence_task="none", mask_rate=MASK_RATE,
                               mask_frac=0.8, random_frac=0.1, masking="dynamic",
                               whole_word=False))
  config.optim.update(dict(
      optimizer="adamw", learning_rate=lr, b1=0.9, b2=0.98, eps=1e-6,
      weight_decay=WEIGHT_DECAY / lr, clip_grad_norm=0.0, schedule="wsd",
      warmup_steps=math.ceil(warmup_tokens / tokens_per_step), end_lr_frac=0.0,
      decay_frac=DECAY_TOKENS / TRAIN_TOKENS, decay_shape="1-sqrt"))
  config.train.steps = steps
