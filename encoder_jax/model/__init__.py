"""Flax NNX encoder: config, attention, blocks, stack, heads, whole models."""
from encoder_jax.model.bert import BertForPreTraining, BertModel
from encoder_jax.model.config import SIZES, ModelConfig, model_config_for_size
from encoder_jax.model.encoder import Block, Embeddings, Encoder, EncoderOutput
from encoder_jax.model.heads import (ClassifierHead, MlmHead, NspHead, Pooler, RtdHead,
                                     SpanQaHead, TaggerHead, masked_mean, pool)

__all__ = [
    "BertForPreTraining", "BertModel", "Block", "ClassifierHead", "Embeddings", "Encoder",
    "EncoderOutput", "MlmHead", "ModelConfig", "NspHead", "Pooler", "RtdHead", "SIZES",
    "SpanQaHead", "TaggerHead", "masked_mean", "model_config_for_size", "pool",
]
