"""Pre-training config: a model size, an objective, a sentence task, an input format, a norm.

Run (from the repo root):
  bash run.sh python -m encoder_jax.main --mode=pretrain --workdir=/tmp/run \
      --config=configs/pretrain.py:size=mini,objective=electra,nsp=none,norm=pre
The demo recipe alone (the main job's pre-training; `bash run.sh demo` adds the fine-tuning
comparison):
  bash run.sh python -m encoder_jax.main --mode=pretrain --workdir=/tmp/demo_run \
      --config=configs/pretrain.py:runlocal
Arguments after ':' are comma-separated key=value pairs (`runlocal` alone means runlocal=True):
  recipe     bert | roberta | modernbert: whose pre-training the other settings follow
                                                                             (default bert)
             bert: BERT's (the settings below); roberta: RoBERTa's (Liu et al. 2019, arXiv
             1907.11692, Appendix Table 9): byte-level BPE, FULL-SENTENCES without NSP,
             dynamic masking, batch 8K x 512, 500k steps, Adam b2 0.98; see `roberta` below
             for every value and what to pass for the released tokenizer. size picks base's
             or large's learning rate and warm-up.
             modernbert: ModernBERT's (Warner et al. 2024, arXiv 2412.13663): its block
             (size=modernbert-base, the default, or modernbert-large), a byte-level BPE of
             50,368 ids, FULL-SENTENCES rows of 1,024 packed a document a segment, 30% MLM,
             batch 4,608 / 4,928, b2 0.98, lr 8e-4 / 5e-4, warm-up-stable-1-sqrt-decay;
             configs/modernbert.py has every value, its source and the departures.
  size       tiny | mini | small | medium | base | large | electra-small    (default tiny;
             | modernbert-base | modernbert-large     modernbert-base with recipe=modernbert)
             (ModernBERT's block: pre-LN, GeGLU, RoPE, sliding windows, no biases;
             encoder_jax.model.config.MODERNBERT_BLOCK; their rows are packed by default, as
             ModernBERT's, data.pack)
  objective  mlm | electra | electra_15 | replace_mlm | all_tokens_mlm       (default mlm)
  nsp        none | nsp | sop: the sentence-pair task (needs a pair format)  (default none)
  format     full_sentences | doc_sentences | segment_pair | sentence_pair
             (default full_sentences without a sentence task, segment_pair with one)
  norm       post | pre: post-LN BERT block, or pre-LN with a final LayerNorm (default post;
             pre with runlocal and for the pre-LN sizes, modernbert-*)
  dropout    bert | no_attention | none     (default bert; none with runlocal and modernbert-*)
             bert: hidden and attention-probability dropout 0.1 (BERT, ELECTRA); dropping
               attention probabilities needs them, so training runs the explicit einsum
               attention, not jax.nn.dot_product_attention;
             no_attention: hidden 0.1, attention 0 (MosaicBERT's choice, for its fused
               kernel);
             none: no dropout (Cramming; ModernBERT's defaults; the demo recipe).
             With attention dropout 0 training uses a fused attention, which
             model.attention_impl=auto (the default) runs as cuDNN flash attention on a GPU
             in bf16/fp16, as the Pallas TPU flash-attention kernel on a TPU (rows a
             multiple of 128; it has no dropout, hence no_attention for it) and as XLA's
             jax.nn.dot_product_attention elsewhere. The trainer logs the path its step uses
             at start-up.
  runlocal   the demo recipe for a 2-core CPU (see `runlocal` below): leaves the unigram
             plateau in minutes
  block      modern | alibi: the demo recipe's encoder block (with runlocal; default modern)
             modern: ModernBERT's block at the demo's size (DEMO_BLOCK: RoPE, GeGLU FFN of 2/3
               the width, no biases, the embedding norm in place of layer 0's pre-norm, no
               token types): runs export as transformers' ModernBertForMaskedLM;
             alibi: the demo recipe's block until 2026-12-07 (ALIBI_BLOCK: 8 ALiBi heads over
               a learned position table, GELU, LayerNorm and linears with biases), which no
               transformers class holds; grids (a)-(e) ran on it and keep it
  phase      1 | 2: BERT's two phases (Devlin et al. 2019, A.2; the google-research/bert
             README): phase 1 trains on rows of 128 (90% of the steps), phase 2 on rows of 512
             for 100k steps "to learn the positional embeddings", starting from phase 1's
             parameters, which phase=2 requires as --config.init_from=<phase-1 workdir>. The
             optimizer and the schedule restart (1,000 warm-up steps, linear decay over the
             100k; BERT continued one schedule). The position table must already have 512
             rows in phase 1 (model.max_positions, 512 for every size).   (default 1)
  precision  auto | fp32 | bf16 | bf16_dots: parameters, gradients and optimizer state stay
             float32 in all four. bf16 computes activations and matmuls in bfloat16 (the
             TPU/GPU setting); bf16_dots keeps activations in fp32 and rounds only the matmul
             operands to bf16, accumulating in fp32 (torch's CPU autocast split; the fastest
             on a CPU with AVX-512 BF16 / AMX: bench/README.md); auto is decided for the
             platform the step is compiled for (train/setup.py resolve_numerics; logged at
             start-up): bf16 on TPU/GPU, bf16_dots on a CPU with AVX-512 BF16 / AMX, fp32 on
             other CPUs. fp32 is BERT's own numerics (on a TPU, XLA's default precision still
             multiplies fp32 operands in bf16 passes)                        (default auto)
Any leaf can be overridden on the command line: --config.train.steps=100,
--config.optim.learning_rate=1e-3, --config.model.hidden_dropout=0.0.

Sentinels resolved by the trainer (so one CLI override stays consistent everywhere):
  objective.max_predictions = 0   derived from mask_rate and data.max_length (BERT's 20 at 128)
  optim.total_steps = 0           = train.steps / optim.accumulation_steps (the decay horizon)
  train.steps = 0                 = enough steps to spend train.flops_budget (equal-compute runs)
  model.embedding_size = 0        = hidden_size
model.vocab_size is replaced by the tokenizer's (data.vocab).

Equal-compute comparison (ELECTRA's Table 1 protocol): give both runs the same
--config.train.flops_budget and --config.train.steps=0, so each schedule spans its budget.
"""
import ml_collections

from configs import modernbert, parse_arg
from encoder_jax.data.examples import DOCS_PER_SHARD, FORMATS
from encoder_jax.model.config import MODERNBERT_BLOCK, SIZES, ModelConfig
from encoder_jax.objectives.pretraining import OBJECTIVES, SENTENCE_TASKS

# (hidden_dropout, attention_dropout) of each `dropout` preset (see the module docstring).
DROPOUTS = {"bert": (0.1, 0.1), "no_attention": (0.1, 0.0), "none": (0.0, 0.0)}
RECIPES = ("bert", "roberta", "modernbert")
VOCAB_PAD_MULTIPLE = 128
# The demo recipe's blocks (runlocal's `block`), as ModelConfig fields over the size's.
# modern: ModernBERT's block (model.config.MODERNBERT_BLOCK; arXiv 2412.13663, section 2.1)
# with RoPE's theta 10,000 in every layer (RoFormer's: the demo's rows of 64 are far from the
# 8,192 positions ModernBERT's global 160,000 is for) and a 16-token window (8 each side) in
# every second layer from layer 1 (ModernBERT: 128 in two of three), which layer 1 of the demo's
# two is; the FFN gets 2/3 of the size's width (glu_ffn_size), so a step costs what the plain
# FFN's did.
DEMO_BLOCK = dict(position_bias="none", learned_positions=False, rope=True,
                  rope_theta=10_000.0, rope_theta_local=10_000.0, local_window=16,
                  global_every=2, glu=True, activation="gelu", norm_bias=False,
                  linear_bias=False, first_attn_norm=False, layer_norm_eps=1e-5,
                  type_vocab_size=0)
# alibi: the recipe's block until 2026-12-07: BERT's block (the size's defaults) with 8 ALiBi
# heads (Press et al. 2022, symmetric) over a learned position table.
ALIBI_BLOCK = dict(position_bias="alibi")
DEMO_BLOCKS = {"modern": DEMO_BLOCK, "alibi": ALIBI_BLOCK}


def glu_ffn_size(ffn_size: int) -> int:
  """The gated FFN width with the FLOPs of a one-matrix FFN of `ffn_size`: a gated FFN has three
  d x F matrices to the plain one's two, so F = 2/3 ffn_size (Shazeer 2020, arXiv 2002.05202,
  matched 3072 with 2048), rounded to a multiple of 8 (512 -> 344)."""
  return 8 * round(2 * ffn_size / 3 / 8)


# RoBERTa's vocabulary size: the released byte-level BPE (vocab.json + merges.txt) has 50,265
# entries, the "50K subword units" of Section 4.
ROBERTA_VOCAB_SIZE = 50_265


def _choice(name: str, value: str, choices) -> str:
  if value not in choices:
    raise ValueError(f"{name}={value!r}; choose one of {list(choices)}.")
  return value


def model_config(size: str, norm: str) -> ml_collections.ConfigDict:
  if size not in SIZES:
    raise ValueError(f"size={size!r}; choose one of {sorted(SIZES)}.")
  _choice("norm", norm, ("post", "pre"))
  # remat "dots": the backward pass keeps each block's matmul outputs and recomputes the cheap
  # element-wise ops (GELU, LayerNorm, dropout masks from their keys, softmax). With scanned
  # layers that also drops most of the [L, ...] residual stacks XLA zero-fills and copies every
  # step: the scanned CPU step gets faster and activation memory shrinks (bench/README.md has
  # the measurements). Numerics are unchanged
  # (tests/model/test_invariants.py::test_remat_policies_give_same_gradients).
  #
  # Both "auto": the trainer picks by the backend it runs on (train/setup.py resolve_layers):
  # scanned layers with `dots` remat on TPU/GPU (one compiled block: compile time and program
  # size do not grow with depth, and HBM bandwidth makes the [L, ...] stacks cheap); unrolled
  # layers without remat on CPU, where those stacks are copies the step waits for, measured
  # faster there against HF torch in the same run (bench/README.md). The cost on CPU: a longer
  # compile for deep models.
  # Either can be forced: --config.model.scan_layers=True|False,
  # --config.model.remat_policy=none|full|dots|dots_no_batch.
  fields = ModelConfig(**{**SIZES[size], "norm_first": norm == "pre"}).to_dict()
  fields.update(scan_layers="auto", remat_policy="auto")
  fields["embedding_size"] = fields["embedding_size"] or 0  # ConfigDict leaves need a type
  # The token table padded to a multiple of 128 rows (BERT's 30,522 -> 30,592): whole MXU /
  # tensor-core tiles for the tied decoder, a table that splits evenly over a mesh axis; the
  # padded ids are never predicted (ModelConfig.vocab_pad_multiple). A run resumed from a
  # workdir written before this field keeps its unpadded table (train/setup.py
  # settle_layers); 1 turns padding off.
  fields["vocab_pad_multiple"] = VOCAB_PAD_MULTIPLE
  return ml_collections.ConfigDict(fields)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_arg(arg, flags=("runlocal",), size="", objective="mlm", nsp="none", format="",
                   norm="", dropout="", runlocal="False", precision="",
                   phase="1", recipe="bert", block="")
  recipe = _choice("recipe", args["recipe"], RECIPES)
  args["size"] = args["size"] or ("modernbert-base" if recipe == "modernbert" else "tiny")
  if recipe == "modernbert":
    modernbert.check(args, args["size"])
  # pre-LN and no dropout are part of the demo recipe (runlocal) and of the sizes whose block
  # says so (ModernBERT's); BERT's settings otherwise.
  block = SIZES.get(args["size"], {})
  local = args["runlocal"] == "True"
  args["norm"] = args["norm"] or ("pre" if local or block.get("norm_first") else "post")
  args["dropout"] = args["dropout"] or (
      "none" if local or block.get("hidden_dropout") == 0.0 else "bert")
  args["precision"] = args["precision"] or "auto"
  hidden_dropout, attention_dropout = DROPOUTS[_choice("dropout", args["dropout"], DROPOUTS)]
  objective = _choice("objective", args["objective"], OBJECTIVES)
  task = _choice("nsp", args["nsp"], SENTENCE_TASKS)
  fmt = args["format"] or ("segment_pair" if task != "none" else "full_sentences")
  _choice("format", fmt, FORMATS)
  if task != "none" and fmt not in ("segment_pair", "sentence_pair"):
    raise ValueError(f"nsp={task} needs a pair format (segment_pair or sentence_pair), not "
                     f"format={fmt}; RoBERTa's full/doc_sentences rows have no sentence pair.")
  electra = objective != "mlm"
  # Unpadded packing (data/examples.py) is part of ModernBERT's block's recipe; a sentence task
  # cannot pack (one [CLS] and label per row).
  modern_block = all(block.get(k) == v for k, v in MODERNBERT_BLOCK.items())

  config = ml_collections.ConfigDict()
  config.size = args["size"]
  config.seed = 0  # parameters, data order, masks, dropout: everything derives from it
  config.phase = int(_choice("phase", args["phase"], ("1", "2")))
  # Start a new run from existing parameters: a pre-training workdir (or one of its checkpoint
  # step folders), a HF BERT/ELECTRA folder, or "minilm" (all-MiniLM-L6-v2). Fresh optimizer
  # and schedule; a workdir with checkpoints resumes from them instead (train/init_from.py).
  config.init_from = ""
  # Device mesh "data,fsdp,tensor" (one entry may be -1), or "auto". On a TPU, "auto" is
  # chosen by compiling candidates for the slice (train/layout.py): mesh axes, optimizer
  # placement, rows a chip with accumulation up to the recipe's global batch (data.batch_size
  # x optim.accumulation_steps), remat and layer layout, the fastest that fits HBM by XLA's
  # estimate; it is printed, recorded in `layout` below and reused on resume. On GPUs "auto"
  # is every device data-parallel, on CPU one device. E.g. FSDP by hand: --config.mesh=1,-1,1.
  config.mesh = "auto"
  # What mesh=auto chose (JSON, written by the trainer; empty for a new run).
  config.layout = ""
  # Where the optimizer state and update live: "replicated" (with its parameter) or "zero1"
  # (split over the mesh's data axis, then the new parameters gathered: ZeRO stage 1;
  # train/sharding.py). mesh=auto on a TPU picks it with the layout (train/layout.py).
  config.optim_sharding = "replicated"
  config.model = model_config(args["size"], args["norm"])
  # Attention dropout > 0 keeps training on the explicit attention path (see `dropout` above).
  config.model.update(dict(hidden_dropout=hidden_dropout, attention_dropout=attention_dropout))
  # Mixed precision: model.dtype is the compute dtype, model.param_dtype (float32) the storage
  # dtype of parameters and hence of gradients and optimizer moments; losses are taken in fp32
  # (tests/train/test_bf16.py: losses track fp32's, parameters stay fp32).
  precision = _choice("precision", args["precision"], ("fp32", "bf16", "bf16_dots", "auto"))
  # "auto" (both fields) is resolved by train/setup.py resolve_numerics for the platform the
  # step is compiled for, so one config is the bf16 program on a pod and the fastest CPU one.
  config.model.dtype = {"bf16": "bfloat16", "auto": "auto"}.get(precision, "float32")
  config.model.dot_dtype = {"bf16_dots": "bfloat16", "auto": "auto"}.get(precision, "")

  config.data = ml_collections.ConfigDict(dict(
      # demo (SOTU + Moby-Dick + Brown) | demo:<part>[+<part>] (e.g. demo:moby_dick) |
      # files:<glob>[,<glob>][:<jsonl field>] (.txt, .jsonl, .gz; local or gs://) |
      # parquet:<glob>[:<column>] (default column "text"; local or gs://) |
      # hf:<path or name>[:<config>]:<split>[:<column>] (a `datasets` save_to_disk folder,
      # a folder of data files, or a hub name) |
      # tfds:<name>[/<config>]:<text_field> | a weighted mixture
      # mix:<source>@<weight>+... (BERT: mix:tfds:wikipedia/20230601.en:text@0.75+
      # files:books/*.txt@0.25), NSP negatives drawn within each source
      source="demo",
      # minilm (BERT uncased, 30,522 ids) | demo[:<size>] (WordPiece trained on the demo corpus,
      # cached; 8,192 by default) | demo-bpe[:<size>] (byte-level BPE, likewise) | a path to a
      # vocab.txt (WordPiece), to a vocab.json with merges.txt beside it (byte-level BPE, e.g.
      # RoBERTa's), or to a folder holding either
      vocab="minilm",
      format=fmt,
      max_length=128,
      # Unpadded packing: examples share rows, each its own segment (data/examples.py, every
      # format but NSP/SOP). On by default for the ModernBERT sizes, and in recipe=roberta|
      # modernbert; metrics.jsonl's pad_fraction says what share of each batch is padding.
      pack=modern_block and task == "none",
      short_seq_prob=0.1,  # segment_pair: BERT's share of shorter targets
      batch_size=128,  # global batch (sequences per optimizer micro-step)
      eval_split="validation",
      data_dir="",  # where the row shards are built ("" = <cache>/tfds; gs:// on a pod)
      source_data_dir="",  # tfds:<name> sources: their TFDS data_dir ("" = TFDS's default)
      cache_dir="",  # fetched artifacts ("" = $ENCODER_JAX_CACHE or ~/.cache/encoder_jax)
      worker_count=0,  # grain worker processes (0: threads only)
      # Every host builds its share of the rows once, with build_workers processes, into
      # array_record shards of shard_docs documents (data/shards.py); every host reads its
      # rows by index. NSP negatives come from the same shard. `python -m
      # encoder_jax.data.build` builds the same shards ahead and prints these data.* flags.
      build_workers=2,
      shard_docs=DOCS_PER_SHARD,
      # files: sources: every blank-line-separated block of a text file is a document (else
      # one document per file). ~1 document in 50 is held out for validation.
      blank_line_docs=False,
  ))

  config.objective = ml_collections.ConfigDict(dict(
      objective=objective,
      sentence_task=task,
      mask_rate=0.15,
      max_predictions=0,  # 0: derived (see the module docstring)
      # None: the objective's default (80/10/10 for MLM, ELECTRA's 85/15 for the others).
      mask_frac=ml_collections.config_dict.placeholder(float),
      random_frac=ml_collections.config_dict.placeholder(float),
      whole_word=False,
      # dynamic: a new mask each time a row is seen (RoBERTa); static: BERT's offline masks,
      # fixed per (example, epoch % dupe_factor), i.e. each mask seen epochs / dupe_factor times.
      masking="dynamic",
      dupe_factor=10,
      gen_hidden_frac=0.25,  # google-research/electra's generator_hidden_size
      gen_layers_frac=1.0,
      temperature=1.0,
      disc_weight=ml_collections.config_dict.placeholder(float),  # None: 50 for RTD
  ))

  config.optim = ml_collections.ConfigDict(dict(
      optimizer="adamw",
      # BERT-base 1e-4; ELECTRA-small 5e-4 (its repo default for small models).
      learning_rate=5e-4 if electra else 1e-4,
      b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
      schedule="linear", warmup_steps=10_000, total_steps=0, end_lr_frac=0.0,
      decay_frac=0.2, decay_shape="linear",  # schedule="wsd" only: its final decay
      clip_grad_norm=1.0, accumulation_steps=1, layer_decay=1.0,
      mu_dtype=ml_collections.config_dict.placeholder(str),
  ))

  config.train = ml_collections.ConfigDict(dict(
      steps=1_000_000,  # step calls (micro-batches); 0: derived from flops_budget
      # Intervals: 0 = never periodically; the end of a run always logs, saves and (with
      # eval_steps > 0) evaluates.
      log_every=100,  # metrics fetch + progress line + TensorBoard/metrics.jsonl
      eval_every=5_000,  # held-out evaluation
      eval_steps=20,  # batches per evaluation, the same batches every time (0: no evaluation)
      checkpoint_every=5_000,
      keep=3,  # newest checkpoints kept, plus one rollback checkpoint (see train/loop.py)
      # After a divergence: restart from this checkpoint instead of the newest (0: newest) ...
      resume_step=0,
      skip_batches=0,  # ... and skip the next this many batches of data (as PaLM did)
      flops_budget=0.0,  # stop once cumulative training FLOPs reach this (0: no budget)
      peak_flops=0.0,  # peak FLOP/s per device for MFU (0: by device kind; CPU measured)
      # A jax.profiler trace of steps profile_steps+1 .. profile_steps+profile_num_steps into
      # <workdir>/profile (TensorBoard's Profile tab); 0: none. Pick a step after the first
      # (which compiles), e.g. --config.train.profile_steps=10.
      profile_steps=0,
      profile_num_steps=3,
  ))

  if recipe == "roberta":
    roberta(config, args)
  elif recipe == "modernbert":
    modernbert.recipe(config)
  if args["runlocal"] == "True":
    runlocal(config, _choice("block", args["block"] or "modern", DEMO_BLOCKS))
  elif args["runlocal"] != "False":
    raise ValueError(f"runlocal={args['runlocal']!r}; give it bare or as True/False.")
  elif args["block"]:
    raise ValueError(f"block={args['block']} picks the demo recipe's block: add runlocal, or "
                     "set the block switches as --config.model.* flags.")
  if config.phase == 2:
    config.data.max_length = 512
    config.train.steps = 100_000
    config.optim.warmup_steps = 1_000
  return config


def roberta(config: ml_collections.ConfigDict, args: dict[str, str]) -> None:
  """RoBERTa's pre-training recipe (Liu et al. 2019, arXiv 1907.11692): Appendix Table 9
  ("Hyperparameters for pretraining RoBERTa-LARGE and RoBERTa-BASE") unless said otherwise.

    * tokenizer: byte-level BPE of 50K subword units (Section 4.4), cased. data.vocab defaults
      to `demo-bpe:50265`, a BPE of the released vocabulary's size trained on the demo corpus.
      For the released RoBERTa tokenizer (50,265 entries) pass the folder holding its two
      files, --config.data.vocab=/path/to/roberta-base (vocab.json + merges.txt; the path of
      that vocab.json works too); for your own corpus train one with
      `python -m encoder_jax.data.train_vocab --kind=bpe --vocab_size=50265 --input=...
      --out=<folder>`. Rows are `<s> A </s></s> B </s>` with no token types.
    * FULL-SENTENCES rows (Section 4.2, Table 2), no NSP; data.pack on (packing the short rows
      at document and corpus ends).
    * dynamic masking (Section 4.1) at BERT's rates: 15% of the tokens, 80/10/10 (Section 2.3).
    * batch 8K sequences of 512 tokens, 500k steps (Table 9; Section 5).
    * Adam b1 0.9, b2 0.98, eps 1e-6, weight decay 0.01; peak learning rate 6e-4 with 24k
      warm-up steps (base), 4e-4 with 30k (large, size=large), linear decay to 0.
    * dropout 0.1 on hidden states and attention probabilities (the `bert` dropout preset).
    * no gradient clipping (Table 9's 0.0; fairseq's RoBERTa config has clip_norm 0).
    * one token type (RoBERTa drops BERT's segment embedding: its released config has
      type_vocab_size 1), so a run exports as transformers' RobertaForMaskedLM.
  """
  if args["runlocal"] == "True":
    raise ValueError("recipe=roberta and runlocal are two recipes; choose one.")
  if config.phase != 1:
    raise ValueError("phase=2 is BERT's second phase; RoBERTa trains on rows of 512 "
                     "throughout (recipe=roberta, phase=1).")
  if config.objective.objective != "mlm" or config.objective.sentence_task != "none":
    raise ValueError("recipe=roberta trains MLM without a sentence task; drop objective=/nsp= "
                     "or use recipe=bert.")
  large = config.size == "large"
  config.data.update(dict(vocab=f"demo-bpe:{ROBERTA_VOCAB_SIZE}", max_length=512,
                          batch_size=8192, pack=True))
  config.model.type_vocab_size = 1
  config.objective.update(dict(mask_rate=0.15, masking="dynamic", whole_word=False))
  config.optim.update(dict(learning_rate=4e-4 if large else 6e-4, b1=0.9, b2=0.98, eps=1e-6,
                           weight_decay=0.01, schedule="linear",
                           warmup_steps=30_000 if large else 24_000, end_lr_frac=0.0,
                           clip_grad_norm=0.0))
  config.train.steps = 500_000


def runlocal(config: ml_collections.ConfigDict, block: str = "modern") -> None:
  """The main job's pre-training: a recipe that leaves the unigram plateau on 2 CPU cores.

  Each choice won a measurement on the demo corpus (held-out masked-token accuracy after the
  same number of training tokens; the measurements, with their dates and hosts, are in
  experiments/results/demo.md, "How the demo recipe was chosen"):
    * vocab "demo" (8,192 WordPiece ids trained on the demo text): BERT's 30,522 leave a tiny
      model too few targets per entry and most of its step in the vocabulary projection.
    * block "modern" (DEMO_BLOCK, since 2026-12-07): ModernBERT's block (RoPE, GeGLU FFN of
      344 = 2/3 of 512, so a step costs what it did; no biases; the embedding norm in place of
      layer 0's pre-norm; no token types), which transformers holds, so the main job ends
      with a checkpoint ModernBertForMaskedLM loads (encoder_jax.demo step 3). Measured
      against the block before it on this recipe: see experiments/results/demo.md.
    * block "alibi" (ALIBI_BLOCK, the recipe until 2026-12-07; grids (a)-(e) ran on it): 8
      ALiBi heads, whose steep heads attend to neighbours from step 0, which a learned
      position table alone takes millions of tokens to learn; no transformers class has it.
    * pre-LN, no dropout, AdamW lr 2e-3 (b2 0.98), 100 warm-up steps, linear decay.
    * mask_rate 0.2 (80/10/10); size tiny (2 x 128; wider costs 3x per token for less).
    * rows of 64 tokens, batch 16: the same accuracy per token as 8 x 128 in less time
      (attention is quadratic in the row), and the demo tasks read at most 64 tokens.
    * precision "auto" (bf16 matmul operands where the CPU has AVX-512 BF16 / AMX) and remat
      "full" on scanned layers: the fastest step on such CPUs at the same losses.
    * 15,000 steps: on the ALiBi block, the fewest after which the checkpoint's sentiment
      fine-tuning cleared a random init of its shape (beyond the seeds' spread), within ~10
      minutes of pre-training where bf16 matmuls run; a CPU without them takes ~2.4x as long.
      On the ModernBERT block (one run, 2026-12-07) POS clears random init by 4.5 points but
      sentiment does not (a random init of this block fine-tunes 1.5 points better).
  `python -m encoder_jax.demo --curve_of=<workdir>/pretrain` plots a run's curve.
  """
  if config.model.hidden_size % 8 == 0:
    config.model.num_heads = max(config.model.num_heads, 8)
  # position_init: a learned position table, where the block has one, starts sinusoidal
  config.model.update(dict(DEMO_BLOCKS[block], position_init="sinusoidal", scan_layers="True",
                           remat_policy="full"))
  if block == "modern":
    config.model.ffn_size = glu_ffn_size(config.model.ffn_size)
    # layer 0 reads the embedding norm's output only in a pre-LN block (norm=post keeps its own)
    config.model.first_attn_norm = not config.model.norm_first
  config.data.update(dict(vocab="demo", max_length=64, batch_size=16))
  config.objective.mask_rate = 0.2
  config.optim.update(dict(learning_rate=2e-3, b2=0.98, warmup_steps=100))
  config.train.update(dict(steps=15_000, log_every=100, eval_every=3000, eval_steps=64,
                           checkpoint_every=3000, keep=2))
