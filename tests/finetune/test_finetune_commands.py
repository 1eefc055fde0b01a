"""The fine-tuning command documents every flag; configs/finetune.py covers every task."""
import json
import pathlib
import subprocess
import sys

import pytest

from encoder_jax.finetune import markdown_table, tasks

ROOT = pathlib.Path(__file__).resolve().parents[2]
from configs import finetune as finetune_config  # noqa: E402


def test_help_documents_every_flag():
  out = subprocess.run([sys.executable, "-m", "encoder_jax.finetune.main", "--help"],
                       capture_output=True, text=True, check=False, cwd=ROOT).stdout
  # (absl exits 1 after --help)
  for flag in ("--config", "--workdir", "--seeds", "--report"):
    line = next((l for l in out.splitlines() if l.strip().startswith(flag + ":")), None)
    assert line is not None and len(line.split(":", 1)[1].strip()) > 10, (flag, out)


def test_report_joins_finished_runs(tmp_path):
  summary = {"validation/accuracy": {"median": 0.9, "mean": 0.85, "std": 0.05, "n": 3}}
  for name in ("a", "b"):
    (tmp_path / name).mkdir()
    (tmp_path / name / "results.json").write_text(json.dumps(
        {"task": "rotten_tomatoes", "init": name, "runs": [{}] * 3, "summary": summary}))
  out = subprocess.run([sys.executable, "-m", "encoder_jax.finetune.main",
                        f"--report={tmp_path / 'a'},{tmp_path / 'b'}"],
                       capture_output=True, text=True, check=True, cwd=ROOT).stdout
  assert out.strip().splitlines()[2] == (
      "| rotten_tomatoes | a | 3 | 0.9000 (0.8500 ± 0.0500) |")
  assert markdown_table([json.loads((tmp_path / "a" / "results.json").read_text())]) in out


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_config_for_every_task(task):
  c = finetune_config.get_config(f"task={task},init=random,run=runlocal")
  assert tasks.get_task(c.task).name == task and c.epochs == 1
  if task.startswith("squad"):
    assert c.max_length == 384 and c.doc_stride == 128


def test_bad_config_arguments():
  with pytest.raises(ValueError, match="Bad config argument"):
    finetune_config.get_config("tsk=rte")
  with pytest.raises(ValueError, match="run="):
    finetune_config.get_config("run=fast")
  with pytest.raises(ValueError, match="unknown fine-tuning task"):
    tasks.get_task("glue/boolq")


def test_unprepared_tfds_data_says_how_to_prepare_it(tmp_path):
  with pytest.raises(FileNotFoundError, match="tfds build glue/rte --file_format=array_record"):
    tasks.read_split(tasks.get_task("glue/rte"), "train", data_dir=str(tmp_path))
