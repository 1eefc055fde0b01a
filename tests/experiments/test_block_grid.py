"""Grid (f), BERT's block vs ModernBERT's at equal FLOPs (experiments.grids.old_vs_new_block):
the arms differ in the block switches and the FFN's width only, the FLOPs they add up to are
equal by a count written here from the matmul shapes, and the new arm is the block HF's
ModernBERT holds."""
import pytest

from configs.pretrain import glu_ffn_size
from experiments import grids
from experiments.grid import flops_per_step

# The fields in which the two arms may differ: the block switches (model.config's block
# section) and the gated FFN's width.
BLOCK_FIELDS = {"position_bias", "learned_positions", "position_init", "rope", "rope_theta",
                "rope_theta_local", "glu", "activation", "norm", "norm_bias", "linear_bias",
                "first_attn_norm", "embedding_norm", "layer_norm_eps", "type_vocab_size",
                "local_window", "global_every", "ffn_size"}


def _flat(config) -> dict:
  out = {}
  for section, value in config.to_dict().items():
    if isinstance(value, dict):
      out.update({f"{section}.{k}": v for k, v in value.items()})
    else:
      out[section] = value
  return out


@pytest.mark.parametrize("scale", grids.SCALES)
def test_arms_differ_in_the_block_only_at_equal_flops(scale):
  g = grids.get_grid("old_vs_new_block", scale)
  assert grids.GRIDS["old_vs_new_block"] is grids.old_vs_new_block
  assert list(dict.fromkeys(p.labels["block"] for p in g.points)) == ["bert", "modern"]
  seeds = 2 if scale != "base" else 1
  assert len(g.points) == 2 * seeds
  by_seed = {}
  for p in g.points:
    by_seed.setdefault(p.labels.get("seed", "0"), {})[p.labels["block"]] = p
  for arms in by_seed.values():
    old, new = arms["bert"], arms["modern"]
    a, b = _flat(old.config()), _flat(new.config())
    differ = {k.split(".", 1)[1] for k in a if a[k] != b[k]}
    assert differ <= BLOCK_FIELDS, differ - BLOCK_FIELDS
    assert {"rope", "glu", "linear_bias", "norm_bias", "learned_positions", "ffn_size"} <= differ
    # equal tokens: the same steps of the same rows
    assert old.steps == new.steps and a["data.batch_size"] == b["data.batch_size"]
    assert a["data.max_length"] == b["data.max_length"]
    cfg = old.config().model
    # Equal FLOPs by the FFN's width: 2 FLOPs a multiply-add, x3 for forward and backward, over
    # every token of every layer; the plain FFN has 2 d x F matrices, the gated one 3.
    tokens = a["data.batch_size"] * a["data.max_length"]
    f_old, f_new = a["model.ffn_size"], b["model.ffn_size"]
    ffn = lambda mats, f: 6 * tokens * cfg.num_layers * mats * cfg.hidden_size * f
    assert new.flops_per_step - old.flops_per_step == pytest.approx(
        ffn(3, f_new) - ffn(2, f_old), rel=1e-9)
    assert new.flops_per_step == pytest.approx(old.flops_per_step, rel=5e-3)
    assert new.flops_per_step == flops_per_step(new.config())
    assert f_new == {512: 344, 1024: 680, 3072: 2048}[f_old]


def test_demo_arms_are_berts_block_and_modernberts():
  """The old arm has none of the block switches (pre-LN BERT with a learned position table);
  the new one is exactly what HF ModernBERT computes (it exports), windows aside."""
  from encoder_jax.hf import modernbert as hf_modernbert
  from encoder_jax.model.config import bert_block_departures
  from encoder_jax.train.setup import model_config
  points = {p.labels["block"]: p for p in grids.old_vs_new_block("demo").points
            if p.labels["seed"] == "1"}
  old = model_config(points["bert"].config(), 8192)
  new = model_config(points["modern"].config(), 8192)
  assert not bert_block_departures(old) and old.position_bias == "none" and old.norm_first
  assert hf_modernbert.represents(new) is None and hf_modernbert.represents(old)
  assert points["modern"].config().seed == 1
  assert points["modern"].config().objective.objective == "mlm"


def test_glu_ffn_size_keeps_the_ffns_flops():
  for f in (512, 1024, 3072, 4096):
    g = glu_ffn_size(f)
    assert g % 8 == 0 and abs(3 * g - 2 * f) <= 12
