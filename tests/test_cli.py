"""The commands' error reports: one line naming the input and the fix, no traceback unless
--verbose (encoder_jax/cli.py)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args, env_extra=None):
  env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
  env.pop("ENCODER_JAX_VERBOSE", None)
  return subprocess.run([sys.executable, "-m", "encoder_jax.main", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, code, error", [
    (["--config=configs/pretrain.py:size=huge"], 2,
     "error: bad flag: ValueError: size='huge'; choose one of ['base', "),
    (["--config=configs/pretrain.py", "--config.train.stepz=3"], 2,
     "error: bad flag --config.train.stepz=3: 'stepz' Did you mean \"steps\" instead of "),
    (["--config=configs/pretrain.py", "--config.train.steps=-5"], 1,
     "error: train.steps=-5: give a positive number of steps, or 0 to derive them from "),
    (["--config=configs/missing.py"], 2,
     "error: --config=configs/missing.py could not be loaded: [Errno 2] No such file"),
], ids=["config_argument", "config_key", "config_value", "config_file"])
def test_user_errors_are_one_line_without_traceback(tmp_path, args, code, error):
  got = _run("--mode=pretrain", f"--workdir={tmp_path}", *args)
  assert got.returncode == code, got.stderr
  lines = got.stderr.strip().splitlines()
  assert lines[0] == "encoder_jax.main: starting (importing JAX, reading the flags) ..."
  assert len(lines) == 3 and lines[1].startswith(error), got.stderr
  assert lines[2] == "(--verbose or ENCODER_JAX_VERBOSE=1 shows the traceback)"
  assert "Traceback" not in got.stdout + got.stderr


def test_verbose_shows_the_traceback(tmp_path):
  got = _run("--mode=pretrain", f"--workdir={tmp_path}", "--config=configs/pretrain.py",
             "--config.train.steps=-5", "--verbose")
  assert got.returncode == 1
  assert "Traceback (most recent call last)" in got.stderr and "ConfigError" in got.stderr
  assert got.stderr.strip().splitlines()[-1].startswith("error: train.steps=-5")


def test_mode_is_required(tmp_path):
  """A training command without --mode must not silently run something else (it once ran the
  MiniLM similarity demo): it stops at once, naming the modes."""
  got = _run(f"--workdir={tmp_path}", "--config=configs/pretrain.py:runlocal")
  assert got.returncode == 2, got.stderr
  lines = got.stderr.strip().splitlines()
  assert lines[1].startswith("error: --mode is required: --mode=pretrain ("), got.stderr
  assert "--mode=demo (" in lines[1]
  assert not any(tmp_path.iterdir()) and "cosine similarity" not in got.stdout
