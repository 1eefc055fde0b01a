"""A pre-training run as HF transformers folders (export.py:
`python -m encoder_jax.convert.export --workdir=<run> --out=<dir>`), and each HF family's load
and export functions in one import.

The families themselves (reading and writing HF folders, which runs each can hold) are
encoder_jax.hf, below the trainer, which reads `init_from` HF folders through them; export
reads runs (encoder_jax.train.run_dir), so this package sits above the trainer."""
from encoder_jax.hf.bert import (export_hf_bert, hf_config_to_model_config, load_hf_bert,
                                 model_config_to_hf_config)
from encoder_jax.hf.electra import export_hf_electra, load_hf_electra, load_hf_electra_pair
from encoder_jax.hf.roberta import export_hf_roberta, load_hf_roberta

__all__ = ["export_hf_bert", "export_hf_electra", "export_hf_roberta",
           "hf_config_to_model_config", "load_hf_bert", "load_hf_electra",
           "load_hf_electra_pair", "load_hf_roberta", "model_config_to_hf_config"]
