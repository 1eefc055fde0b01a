"""The main job's fine-tuning jobs, for it (encoder_jax.demo) and for the experiments that score
checkpoints the same way (experiments/crossing.py, experiments/sentiment_probe.py): one demo
task fine-tuned from one backbone with configs/finetune.py's `run=demo` settings, and the reuse
of a finished job whose config is unchanged.
"""
from __future__ import annotations

import json
import pathlib

INIT_LABELS = {"pretrained": "this run's checkpoint", "random": "random init, same shape",
               "minilm": "all-MiniLM-L6-v2"}


def job_config(task: str, init: str, pretrain_dir: pathlib.Path, seeds: int):
  """The main job's fine-tuning config of one (task, backbone): pretrained (the checkpoint in
  pretrain_dir), random (a random init of its shape) or minilm."""
  from configs import finetune as finetune_cfg  # pylint: disable=g-import-not-at-top
  ckpt = f"ckpt:{pretrain_dir / 'checkpoints'}"
  spec = {"pretrained": ckpt, "random": "random", "minilm": "minilm"}[init]
  config = finetune_cfg.get_config(f"task={task},init={spec},run=demo")
  with config.unlocked():
    config.seeds = seeds
    if init == "random":
      config.random_like = ckpt
  return config


def finished(config, workdir: pathlib.Path) -> dict | None:
  """The results of a finished job with exactly this config, if workdir holds one."""
  done = workdir / "results.json"
  if done.exists():
    old = json.loads(done.read_text())
    if old.get("config") == json.loads(json.dumps(config.to_dict(), default=str)):
      return old
  return None
