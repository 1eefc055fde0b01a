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
  assert lines[0].startswith("encoder_jax.main: starting (importing JAX, reading the flags")
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
  assert "--mode=similarity (" in lines[1]
  assert not any(tmp_path.iterdir()) and "cosine similarity" not in got.stdout


def test_the_old_demo_mode_says_where_it_went(tmp_path):
  """"demo" means the main job only (python -m encoder_jax.demo); main's old --mode=demo, the
  MiniLM similarity table, is --mode=similarity, and says so in one line."""
  got = _run("--mode=demo", f"--workdir={tmp_path}")
  assert got.returncode == 2 and "cosine similarity" not in got.stdout
  assert ("error: --mode=demo is now --mode=similarity (the MiniLM similarity table; the main "
          "job, pre-training + fine-tuning + comparison, is `python -m encoder_jax.demo`)."
          ) in got.stderr, got.stderr
  got = _run("--mode=train", f"--workdir={tmp_path}")
  assert got.returncode == 2 and "--mode='train'; choose one of pretrain, similarity" in got.stderr


def test_an_unknown_config_key_lists_the_keys_at_its_level(tmp_path):
  got = _run("--mode=pretrain", f"--workdir={tmp_path / 'run'}", "--config=configs/pretrain.py",
             "--config.train.foo=1")
  assert got.returncode == 2, got.stderr
  line = got.stderr.strip().splitlines()[1]
  assert line.startswith("error: bad flag --config.train.foo=1: train has no key 'foo'; its "
                         "keys: checkpoint_every, eval_every, eval_steps, "), line
  got = _run("--mode=pretrain", f"--workdir={tmp_path / 'run'}", "--config=configs/pretrain.py",
             "--config.bogus.steps=1")
  assert "the config has no key 'bogus'; its keys: " in got.stderr and "optim" in got.stderr
  assert not (tmp_path / "run").exists()


def test_a_workdir_that_is_a_file_is_refused_and_a_failed_start_leaves_no_workdir(tmp_path):
  afile = tmp_path / "notes.txt"
  afile.write_text("mine\n")
  got = _run("--mode=pretrain", f"--workdir={afile}", "--config=configs/pretrain.py:size=tiny")
  assert got.returncode == 2 and afile.read_text() == "mine\n"
  assert f"error: --workdir={afile} is a file; give a folder" in got.stderr
  # A start that fails (here: a vocab that does not exist) removes the workdir it created ...
  new = tmp_path / "runs" / "x"
  got = _run("--mode=pretrain", f"--workdir={new}", "--config=configs/pretrain.py:size=tiny",
             "--config.data.vocab=/nonexistent/vocab.txt")
  assert got.returncode == 1 and "vocab '/nonexistent/vocab.txt'" in got.stderr, got.stderr
  assert not new.exists(), list(new.rglob("*"))
  # ... but never a folder that was there before, nor one that holds anything
  mine = tmp_path / "mine"
  mine.mkdir()
  _run("--mode=pretrain", f"--workdir={mine}", "--config=configs/pretrain.py:size=tiny",
       "--config.data.vocab=/nonexistent/vocab.txt")
  assert mine.is_dir()


ENTRY_POINTS = ["encoder_jax.main", "encoder_jax.demo", "encoder_jax.finetune.main",
                "encoder_jax.data.build", "encoder_jax.data.train_vocab",
                "encoder_jax.data.fetch", "encoder_jax.convert.export",
                "encoder_jax.train.compile_check", "experiments.run", "experiments.crossing",
                "experiments.layer_grads", "experiments.rtd_identity",
                "experiments.sentiment_probe"]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_exits_0_and_explains_every_flag(module):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  got = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert got.returncode == 0, got.stdout[-1000:] + got.stderr[-2000:]
  assert "--" in got.stdout and "Traceback" not in got.stderr


def test_library_info_goes_to_the_log_file_not_the_terminal(tmp_path):
  """Orbax / TFDS / absl INFO records reach the command's log file only; the terminal keeps
  the command's own lines and warnings, and no terminal escape code reaches a redirected
  stream."""
  cache = tmp_path / "cache"
  code = (
      "from absl import logging\n"
      "from encoder_jax import cli\n"
      "def main(argv):\n"
      "  logging.info('library-style info line')\n"  # absl INFO from this (non-package) file
      "  logging.warning('a warning everyone sees')\n"
      "  print('own output line')\n"
      "cli.run(main, 'probe')\n")
  (tmp_path / "probe.py").write_text(code)
  got = subprocess.run([sys.executable, str(tmp_path / "probe.py")], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), ENCODER_JAX_CACHE=str(cache)),
                       capture_output=True, text=True, timeout=300)
  assert got.returncode == 0, got.stderr
  terminal = got.stdout + got.stderr
  assert "own output line" in terminal and "a warning everyone sees" in terminal
  assert "library-style info line" not in terminal
  (log,) = (cache / "logs").glob("probe-*.log")
  assert "library-style info line" in log.read_text()
  assert "\x1b[" not in terminal


def test_the_packages_own_info_lines_reach_the_terminal_plainly():
  import logging  # pylint: disable=g-import-not-at-top
  from encoder_jax import cli  # pylint: disable=g-import-not-at-top
  own = logging.LogRecord("absl", logging.INFO, os.path.join("x", "encoder_jax", "train",
                                                             "setup.py"), 1, "note", (), None)
  lib = logging.LogRecord("absl", logging.INFO, os.path.join("x", "orbax", "checkpoint",
                                                             "manager.py"), 1, "lib", (), None)
  warn = logging.LogRecord("absl", logging.WARNING, own.pathname, 1, "careful", (), None)
  assert cli._OwnInfo().filter(own) and not cli._OwnInfo().filter(lib)
  assert not cli._OwnInfo().filter(warn)  # (warnings go through absl's handler, once)
