"""Checkpoint conversion between HF transformers (safetensors) and encoder_jax."""
from encoder_jax.convert.hf_bert import (export_hf_bert, hf_config_to_model_config,
                                         load_hf_bert, model_config_to_hf_config)
from encoder_jax.convert.hf_electra import (export_hf_electra, load_hf_electra,
                                            load_hf_electra_pair)

__all__ = ["export_hf_bert", "export_hf_electra", "hf_config_to_model_config", "load_hf_bert",
           "load_hf_electra", "load_hf_electra_pair", "model_config_to_hf_config"]
