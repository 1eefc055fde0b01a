"""The main job's report (encoder_jax.demo): the learning curve and the verdicts it prints."""
import json
import subprocess
import sys

import pytest

from encoder_jax import demo


def _run_dir(tmp_path, accs):
  """A pre-training workdir as the trainer leaves it: config.json and metrics.jsonl with a
  train row every 100 steps (0.1 s a step) and an eval row every 1,000."""
  (tmp_path / "config.json").write_text(json.dumps({"data": {"batch_size": 8,
                                                             "max_length": 128}}))
  rows, t0 = [], 1000.0
  for step in range(100, 100 * 10 * len(accs) + 1, 100):
    rows.append(dict(step=step, split="train", time=t0 + 0.1 * step, step_time_s=0.1, loss=6.0))
    if step % 1000 == 0:
      acc = accs[step // 1000 - 1]
      rows.append(dict(step=step, split="eval", time=t0 + 0.1 * step + 2.0, mlm_accuracy=acc,
                       mlm_loss=6.0 - 10 * acc, mlm_at_mask_accuracy=acc - 0.05,
                       unigram_accuracy=0.056, unigram_loss=6.7))
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return tmp_path


def test_learning_curve_tokens_minutes_and_the_25_percent_line(tmp_path):
  curve = demo.learning_curve(_run_dir(tmp_path, [0.16, 0.21, 0.26, 0.27]))
  assert [c["step"] for c in curve] == [1000, 2000, 3000, 4000]
  assert curve[1]["tokens"] == 2000 * 8 * 128
  # minutes count from the first step: the first train row (step 100) minus 100 x 0.1 s
  assert curve[0]["minutes"] == pytest.approx((0.1 * 1000 + 2.0) / 60)
  assert curve[2]["nats_below_unigram"] == pytest.approx(6.7 - (6.0 - 2.6))
  text = "\n".join(demo.curve_lines(curve))
  assert "reached at step 3000 (3.07M tokens" in text
  assert "not reached" in "\n".join(demo.curve_lines(curve[:2]))
  demo.plot_curve(curve, tmp_path / "curve.png", "t")
  assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def _ft(lo, hi):
  return {"summary": {"test/accuracy": {"median": (lo + hi) / 2, "min": lo, "max": hi}}}


@pytest.mark.parametrize("pre,verdict", [((0.80, 0.82), "above"), ((0.70, 0.79), "overlapping"),
                                         ((0.60, 0.65), "below")])
def test_report_compares_the_checkpoint_with_random_init_by_range(pre, verdict):
  text = demo.report({"steps": 10, "final_eval": {}},
                     {"brown_pos": {"pretrained": _ft(*pre), "random": _ft(0.75, 0.78)}}, 3)
  assert f"Checkpoint vs random init: {verdict}" in text
  assert "| this run's checkpoint |" in text and "| random init, same shape |" in text


def test_a_finished_run_evaluated_again_adds_no_point_to_the_curve(tmp_path):
  run = _run_dir(tmp_path, [0.16, 0.21])
  rows = (run / "metrics.jsonl").read_text().splitlines()
  again = dict(json.loads(rows[-1]), time=99999.0)  # the re-run's eval of the last step
  assert again["split"] == "eval" and again["step"] == 2000
  (run / "metrics.jsonl").write_text("\n".join(rows + [json.dumps(again)]) + "\n")
  curve = demo.learning_curve(run)
  assert [c["step"] for c in curve] == [1000, 2000]
  assert curve[-1]["minutes"] == pytest.approx((0.1 * 2000 + 2.0) / 60)  # the original row


# ---------------------------------------------------------------- step 3: the transformers export

@pytest.fixture(scope="module")
def modern_run(tmp_path_factory):
  """A 2-step run of the demo recipe's block (configs/pretrain.py runlocal's model switches) at
  the trainer tests' tiny width, on their corpus."""
  import loop_helpers  # pylint: disable=g-import-not-at-top
  from configs import pretrain  # pylint: disable=g-import-not-at-top
  from encoder_jax.train import loop  # pylint: disable=g-import-not-at-top
  env = loop_helpers.make_env(tmp_path_factory.mktemp("demo_export_env"))
  config = loop_helpers.tiny_config(env, steps=2, checkpoint_every=2, eval_every=0)
  block = {k: v for k, v in pretrain.get_config("runlocal").model.items()
           if k in pretrain.DEMO_BLOCK or k == "norm_first"}
  # two layers: layer 1 attends within the recipe's window (16 of the rows' 32 tokens)
  config.model.update(dict(block, num_layers=2, hidden_dropout=0.0, attention_dropout=0.0))
  workdir = tmp_path_factory.mktemp("demo_export") / "pretrain"
  loop.train_and_evaluate(config, str(workdir))
  return workdir


@pytest.mark.parity
def test_the_demo_ends_with_a_checkpoint_transformers_reloads(modern_run, capsys):
  """Step 3 writes <workdir>/hf as ModernBertForMaskedLM and prints transformers' reload check
  (logits within 1e-5); a re-run replaces its own export, and a folder holding anything else
  is left as it is."""
  import re  # pylint: disable=g-import-not-at-top
  pytest.importorskip("transformers")
  workdir = modern_run.parent
  first = demo.export_checkpoint(modern_run, workdir, None)
  printed = capsys.readouterr().out
  assert first["exported"] and first["hf_class"] == ["ModernBertForMaskedLM"]
  assert "config.json" in first["files"] and "model.safetensors" in first["files"]
  check = [l for l in printed.splitlines() if l.startswith("[3/3] export: reload check: ")]
  assert len(check) == 1 and first["reload_check"] == [check[0].removeprefix("[3/3] ")]
  assert float(re.search(r"difference\| (\S+)", check[0]).group(1)) <= 1e-5, check
  assert "AutoModelForMaskedLM" in "\n".join(demo.export_lines(first))
  # the demo run again: its own export is replaced by a new one of the same checkpoint
  again = demo.export_checkpoint(modern_run, workdir, first)
  assert again["exported"] and again["files"] == first["files"]
  # ... but not a folder that holds something the export did not write
  (workdir / "hf" / "notes.txt").write_text("mine")
  kept = demo.export_checkpoint(modern_run, workdir, again)
  assert not kept["exported"] and (workdir / "hf" / "notes.txt").read_text() == "mine"
  assert "left " in capsys.readouterr().out


def test_without_transformers_the_demo_prints_the_command_that_checks(modern_run, tmp_path,
                                                                       capsys, monkeypatch):
  import importlib.util  # pylint: disable=g-import-not-at-top
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name in ("torch", "transformers") else real(name))
  record = demo.export_checkpoint(modern_run, tmp_path, None)
  out = capsys.readouterr().out
  assert record["exported"] and record["reload_check"] == []
  assert (f"bash run.sh python -m encoder_jax.convert.export --workdir={modern_run} "
          f"--out={tmp_path / 'hf_checked'}") in out
  assert "Reload check not run" in "\n".join(demo.export_lines(record))


def test_the_main_job_can_import_export_with_its_flags_defined():
  """The demo's step 3 imports convert.export after defining its own flags (--workdir among
  them): export's flags exist only when it runs as a command, or the import fails as it did
  (DuplicateFlagError: 'workdir' defined twice)."""
  code = ("from encoder_jax import demo; demo._define_flags(); "
          "from encoder_jax.convert import export; print(export.export_run.__name__)")
  got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert got.returncode == 0 and got.stdout.strip() == "export_run", got.stderr[-2000:]
