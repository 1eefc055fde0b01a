"""Fine-tuning's one config boundary (encoder_jax.finetune.setup): finetune_and_evaluate reads
the ConfigDict once, through setup.build, and a typo fails there, before any work."""
import json
import math

import ml_collections
import pytest
import tensorflow_datasets as tfds

from configs import finetune as finetune_config
from encoder_jax.finetune import finetune_and_evaluate, run, setup


def _poison(c: ml_collections.ConfigDict) -> None:
  """Every value of the config made unusable: read after build, any of them breaks the run or
  changes what it records."""
  for key, value in list(c.items()):
    if isinstance(value, ml_collections.ConfigDict):
      _poison(value)
    elif isinstance(value, bool):
      c[key] = not value
    elif isinstance(value, int):
      c[key] = -7
    elif isinstance(value, float):
      c[key] = math.nan
    elif isinstance(value, str):
      c[key] = "/nonexistent/poison"


def test_the_run_reads_only_the_frozen_settings(tiny_config, tiny_vocab, tmp_path, monkeypatch):
  """A config poisoned right after setup.build (every key, the model overrides' too) runs
  exactly as built: its seeds, epochs, rows and encoder, and results.json records the config
  as it was built."""
  config = tiny_config("glue/sst2", tiny_vocab, dropout=False, seeds=2)
  built = json.loads(json.dumps(config.to_dict()))
  real = setup.build

  def build_then_poison(cfg):
    s = real(cfg)
    _poison(cfg)
    return s

  monkeypatch.setattr(setup, "build", build_then_poison)
  with tfds.testing.mock_data(num_examples=8):
    results = finetune_and_evaluate(config, str(tmp_path))
  assert config.epochs == -7 and config.model.hidden_size == -7  # (the poison took)
  assert [r["seed"] for r in results["runs"]] == [0, 1]
  assert all(len(r["history"]) == 1 for r in results["runs"])
  assert results["data_rows"] == {"train": 8, "validation": 8}
  assert results["model"]["hidden_size"] == 32 and results["task"] == "glue/sst2"
  recorded = json.loads((tmp_path / "results.json").read_text())["config"]
  assert recorded == built


@pytest.mark.parametrize("change, says", [
    (dict(epocs=2), "unknown fine-tuning config key 'epocs': did you mean 'epochs'?"),
    (dict(model=dict(hiden_dropout=0.0)),
     "unknown fine-tuning config key 'model.hiden_dropout': did you mean 'model.hidden_dropout'?"),
    (dict(pooling="mena"), "pooling='mena'; use cls or mean."),
    (dict(init="hf/runs/x"), "init='hf/runs/x'; use 'minilm', 'hf:<dir>' or 'ckpt:<dir>'"),
    (dict(export_embeddings="valdation"),
     "export_embeddings: rotten_tomatoes has no split 'valdation'; choose from"),
    (dict(seeds=0), "seeds=0: must be >= 1."),
    (dict(layer_decay=1.5), "layer_decay=1.5: must be in [0, 1]."),
    (dict(task="glue/sst"), "unknown fine-tuning task 'glue/sst'"),
])
def test_a_typo_fails_before_any_work(tmp_path, monkeypatch, change, says):
  """A key or value configs/finetune.py would not give (a script's ConfigDict takes any new
  key) fails in one line naming it and the fix, before a backbone or a split is read and
  before the workdir is made."""
  config = finetune_config.get_config("task=rotten_tomatoes,init=minilm")
  model = change.pop("model", {})
  with config.unlocked():
    config.update(change)
    config.model.update(model)
  monkeypatch.setattr(run, "_backbone", lambda b: pytest.fail("loaded a backbone"))
  with pytest.raises(ValueError, match=None) as e:
    finetune_and_evaluate(config, str(tmp_path / "out"))
  assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
  assert not (tmp_path / "out").exists()


def test_every_config_the_file_makes_builds():
  """configs/finetune.py's tasks and runs all pass the check (no key it sets is unknown)."""
  for arg in ("task=rotten_tomatoes,init=minilm", "task=brown_pos,init=random,run=small",
              "task=glue/mnli,init=minilm,run=cpu", "task=squad/v2.0,init=minilm,run=runlocal",
              "task=rotten_tomatoes,init=minilm,run=demo", "task=brown_pos,init=random,run=demo"):
    s = setup.build(finetune_config.get_config(arg))
    assert s.task.name == arg.split(",")[0].split("=")[1] and s.train.batch_size >= 1
