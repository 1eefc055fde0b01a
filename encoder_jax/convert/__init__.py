"""Checkpoint conversion between HF transformers (safetensors) and encoder_jax: one converter
module per HF family (hf_bert, hf_roberta, hf_electra; the registry is load.FAMILIES), loading
of any source (load.py) and the export of a pre-training run (export.py)."""
from encoder_jax.convert.hf_bert import (export_hf_bert, hf_config_to_model_config,
                                         load_hf_bert, model_config_to_hf_config)
from encoder_jax.convert.hf_electra import (export_hf_electra, load_hf_electra,
                                            load_hf_electra_pair)
from encoder_jax.convert.hf_roberta import export_hf_roberta, load_hf_roberta

__all__ = ["export_hf_bert", "export_hf_electra", "export_hf_roberta",
           "hf_config_to_model_config", "load_hf_bert", "load_hf_electra",
           "load_hf_electra_pair", "load_hf_roberta", "model_config_to_hf_config"]
