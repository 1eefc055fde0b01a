"""Pre-training and fine-tuning with everything on gs://, against a GCS API on 127.0.0.1.

The corpus is three text files in gs://bucket/corpus (data.source=files:<gs glob>), the
tokenized corpus is built into data_dir=gs://bucket/tfds, and every run's workdir is
gs://bucket/<run>. A run killed with SIGKILL after its first checkpoint resumes from the
bucket and ends bit for bit where the uninterrupted run ends (state, data iterator,
metrics.jsonl row for row); fine-tuning then starts from that gs:// checkpoint, and
`encoder_jax.convert.export` turns it into a local HF folder (checksums verified: a damaged
checkpoint is skipped, or refused when asked for by step). The tiny trainer config is
tests/train's (loop_helpers.tiny_config).
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import sys

from etils import epath
from flax import nnx
import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from encoder_jax import paths
from encoder_jax.convert import export
from encoder_jax.data.vocab import resolve_vocab
from encoder_jax.finetune import finetune_and_evaluate
from encoder_jax.train import checkpoint, loop, pretrained, setup
from loop_helpers import (DOCS, N, ROOT, assert_bitwise_equal, budget_for,
                          eval_rows, restore,
                          run_subprocess, tiny_config, train_rows, wait_for)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(gcs, tmp_path_factory):
  base = tmp_path_factory.mktemp("gcs_loop")  # local: the driver and its marker
  bucket = epath.Path(gcs["root"])
  for i, text in enumerate(DOCS):
    (bucket / "corpus" / f"doc{i}.txt").write_text(text + "\n")
  env = {"base": base, "source": f"files:{bucket}/corpus/doc*.txt",
         "data_dir": f"{bucket}/tfds", "bucket": bucket}
  return env


@pytest.fixture(scope="module")
def straight(env):
  config = tiny_config(env)
  config.train.flops_budget = budget_for(config, 2 * N)
  workdir = f"{env['bucket']}/straight"
  summary = loop.train_and_evaluate(config, workdir)
  return dict(config=config, workdir=workdir, summary=summary)


def test_a_run_on_a_bucket_writes_its_files_there(env, straight):
  s, wd = straight["summary"], epath.Path(straight["workdir"])
  assert s["steps"] == 2 * N and s["checkpoints"] == [N, 2 * N]
  assert json.loads((wd / "summary.json").read_text())["steps"] == 2 * N
  assert json.loads((wd / "config.json").read_text())["data"]["source"] == env["source"]
  assert sorted(train_rows(wd)) == [4, 8, 12] and sorted(eval_rows(wd)) == [N, 2 * N]
  assert any(p.name.startswith("events.out") for p in (wd / "tensorboard").iterdir())
  for step in (N, 2 * N):
    assert checkpoint.verify(wd / "checkpoints" / str(step)) is None
  # The row shards were built once and published to the bucket's data_dir, index last.
  infos = list(epath.Path(env["data_dir"]).glob("pretrain_shards/*/index.json"))
  assert len(infos) == 1, infos
  assert not (ROOT / "gs:").exists() and not pathlib.Path("gs:").exists()  # no local "gs:/"


def test_sigkill_then_resume_from_the_bucket_is_bit_exact(env, straight):
  config, workdir = straight["config"], f"{env['bucket']}/killed"
  proc, marker = run_subprocess(env, config, workdir, hang_after=N + 2)  # inherits the GCS env
  sealed = epath.Path(workdir) / "checkpoints" / str(N) / checkpoint.CHECKSUMS
  wait_for(lambda: os.path.exists(marker) and sealed.exists(), proc, timeout=400)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait(timeout=30) == -signal.SIGKILL
  assert max(train_rows(workdir)) == N + 2  # the row of step 8: lost work past step 6

  summary = loop.train_and_evaluate(config, workdir)
  assert summary["resumed_from"] == N and summary["steps"] == 2 * N
  want, got = train_rows(straight["workdir"]), train_rows(workdir)
  assert sorted(got) == sorted(want) and all(got[s] == want[s] for s in want)
  assert eval_rows(workdir) == eval_rows(straight["workdir"])
  a, data_a, _ = restore(straight["workdir"], 2 * N, config)
  b, data_b, _ = restore(workdir, 2 * N, config)
  assert_bitwise_equal(a, b)  # step, params, optimizer state
  assert data_a == data_b and data_a["step"] == 2 * N


def test_finetune_from_the_gcs_checkpoint(env, straight):
  workdir = straight["workdir"]
  bb = pretrained.load_backbone(f"ckpt:{workdir}")
  assert bb.source == f"ckpt:{workdir}/checkpoints/{2 * N}"
  # read from the run's gs:// config.json
  assert bb.vocab == resolve_vocab(straight["config"].data.vocab)
  state, _, _ = restore(workdir, 2 * N, straight["config"])
  want = jax.tree.leaves(state.params["bert"]["encoder"])
  got = jax.tree.leaves(bb.encoder)
  assert len(got) == len(want)
  for x, y in zip(got, want):
    np.testing.assert_array_equal(x, np.asarray(y))

  from configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  c = finetune_config.get_config(f"task=glue/sst2,init=ckpt:{workdir}")
  c.update(dict(max_length=32, length_bucket=0, epochs=1, batch_size=4, eval_batch_size=8,
                seeds=1, log_every=1, cache_dir="", data_dir=""))
  out = f"{env['bucket']}/finetune"
  with tfds.testing.mock_data(num_examples=8):
    results = finetune_and_evaluate(c, out)
  saved = json.loads((epath.Path(out) / "results.json").read_text())
  assert saved["backbone"] == bb.source and saved["summary"] == json.loads(
      json.dumps(results["summary"]))
  assert (epath.Path(out) / "results.md").read_text().startswith("| task | init | seeds |")


TEXTS = ["Call me Ishmael.", "The state of our union is strong, and growing."]


def test_export_from_the_bucket_to_hf(env, straight, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  workdir, config = straight["workdir"], straight["config"]
  with pytest.raises(ValueError, match="export writes a local folder"):
    export.export_run(workdir, f"{env['bucket']}/hf")
  out = tmp_path / "hf"
  written = export.export_run(workdir, out)  # the newest checkpoint: 2N
  assert [(w.folder, w.auto_class) for w in written] == [(out, "AutoModelForMaskedLM")]
  hf, info = transformers.AutoModelForMaskedLM.from_pretrained(out, local_files_only=True,
                                                               output_loading_info=True)
  assert type(hf).__name__ == "BertForMaskedLM"  # tiny_config: no NSP
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
  batch = tok(TEXTS, padding="max_length", max_length=16, truncation=True, return_tensors="np")
  names = ("input_ids", "attention_mask", "token_type_ids")
  with torch.no_grad():
    ref = hf.eval()(**{k: torch.tensor(batch[k]) for k in names}).logits.numpy()
  # What the run's own model computes from its checkpoint at 2N.
  state, _, _ = restore(workdir, 2 * N, config)
  ours = nnx.merge(setup.build(config).trainer.graphdef_eval, state.params)
  # the run pads its token table to 128 rows (model.vocab_pad_multiple); HF has vocab_size
  logits = np.asarray(ours(*(batch[k] for k in names))[0])[..., :hf.config.vocab_size]
  mask = batch["attention_mask"].astype(bool)
  assert np.abs(logits[mask] - ref[mask]).max() <= 1e-5


def test_export_skips_or_refuses_a_damaged_checkpoint(env, straight, tmp_path):
  src, run = epath.Path(straight["workdir"]), epath.Path(f"{env['bucket']}/damaged")
  paths.copy_tree(src / "checkpoints", run / "checkpoints")
  (run / "config.json").write_text((src / "config.json").read_text())
  newest = run / "checkpoints" / str(2 * N)
  sums = json.loads((newest / checkpoint.CHECKSUMS).read_text())["files"]
  victim = max((r for r in sums if r.startswith("state/")), key=lambda r: sums[r]["size"])
  data = bytearray((newest / victim).read_bytes())
  data[len(data) // 2] ^= 1  # one flipped bit, same size
  (newest / victim).write_bytes(bytes(data))

  with pytest.raises(checkpoint.CheckpointError,
                     match=f"checkpoint {2 * N} in .* is damaged: {re.escape(victim)} does not "
                     "match its sha256"):
    export.export_run(run, tmp_path / "asked", step=2 * N)
  assert not (tmp_path / "asked").exists()

  out = tmp_path / "hf"  # the command, as a user runs it: the newest good checkpoint (N)
  proc = subprocess.run([sys.executable, "-m", "encoder_jax.convert.export", f"--workdir={run}",
                         f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (f"export: skipping checkpoint {2 * N} in {run}/checkpoints: {victim} does "
          "not match its sha256") in proc.stdout, proc.stdout[-3000:]
  assert f"export: restoring checkpoint {N} " in proc.stdout
  assert f"export: wrote {out}: BertForMaskedLM" in proc.stdout
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  exported = load_file(out / "model.safetensors")["bert.embeddings.word_embeddings.weight"]
  token = lambda step: np.asarray(jax.tree.leaves(restore(src, step, straight["config"])[0]
                                                  .params["bert"]["encoder"]["embeddings"]
                                                  ["token"])[0])[:len(exported)]
  np.testing.assert_array_equal(exported, token(N))  # (the table's padding rows not exported)
  assert not np.array_equal(exported, token(2 * N))
  assert newest.exists() and not (run / "checkpoints_set_aside").exists()  # left as it was
