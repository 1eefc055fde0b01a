"""Fine-tuning and evaluation: task heads on pre-trained (or imported, or random) encoders.

  tasks.py     the tasks (demo sentiment and POS, nine GLUE tasks, SQuAD v1.1/v2.0): reading
               from TFDS, encoding, scoring
  squad.py     SQuAD windows (doc stride, max context), span labels, answer extraction
  metrics.py   accuracy, F1, MCC, Pearson/Spearman, tagging accuracy, official SQuAD EM/F1
  backbone.py  FinetuneModel (Encoder + head), built from a loaded (or random) encoder
               (encoder_jax.train.pretrained loads minilm, hf:<dir>, ckpt:<run>)
  setup.py     the config read once: every key checked (a typo fails before any work),
               frozen Settings that everything below reads
  trainer.py   one seed: AdamW + LLRD + warm-up, freezing, epochs, dev selection, test
  run.py       finetune_and_evaluate(config, workdir): seeds, results JSON/markdown, export
  main.py      the command: python -m encoder_jax.finetune.main --help
Config: configs/finetune.py.
"""
from encoder_jax.finetune.run import finetune_and_evaluate, markdown_table

__all__ = ["finetune_and_evaluate", "markdown_table"]
