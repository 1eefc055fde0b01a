"""Shared by test_loop.py and test_recovery.py: a tiny trainer config on a three-document
corpus, and drivers that run the trainer in a fresh process (to kill it, signal it, or inject
a fault into the checkpoint writer)."""
import os
import pathlib
import subprocess
import sys
import time

from etils import epath
import jax
import numpy as np

from encoder_jax.train import checkpoint, metrics_io, setup

ROOT = pathlib.Path(__file__).resolve().parents[1]
from configs import pretrain  # noqa: E402

N = 6  # checkpoint interval; the straight run is 2N steps
PERF_KEYS = {"time", "step_time_s", "tokens_per_s", "real_tokens_per_s", "flops_per_s",
             "flops_per_s_per_device", "mfu"}

DOCS = [
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no "
    "money in my purse, and nothing particular to interest me on shore, I thought I would "
    "sail about a little and see the watery part of the world. It is a way I have of driving "
    "off the spleen and regulating the circulation. Whenever I find myself growing grim "
    "about the mouth, then I account it high time to get to sea as soon as I can.",
    "Mr. Speaker, Mr. Vice President, members of Congress, my fellow Americans. The state of "
    "our union is strong. Our economy is growing, and our people are at work. We have more "
    "to do, and we will do it together. Tonight I ask you to join me in this work.",
    "The Fulton County Grand Jury said Friday an investigation of the recent primary "
    "election produced no evidence that any irregularities took place. The jury further said "
    "in term-end presentments that the City Executive Committee deserves the praise and "
    "thanks of the City of Atlanta for the manner in which the election was conducted.",
]

# Runs a config in a fresh process. After `hang_after` step calls it writes `marker` and
# sleeps, like a worker caught mid-run by the scheduler's SIGKILL. With `term_at` it sends
# itself SIGTERM during that call and writes the time to `marker` (a preemption mid-step).
DRIVER = """
import json, os, signal, sys, time
import ml_collections
from encoder_jax.train import loop, step as step_lib
cfg_path, workdir, hang_after, term_at, marker = sys.argv[1:]
config = ml_collections.ConfigDict(json.load(open(cfg_path)))
real = step_lib.make_train_step
def make(*args, **kwargs):
  f, calls = real(*args, **kwargs), [0]
  def step(state, batch):
    calls[0] += 1
    if calls[0] > int(hang_after) > 0:
      open(marker, "w").close()
      time.sleep(3600)
    if calls[0] == int(term_at):
      with open(marker, "w") as m:
        m.write(repr(time.time()))
      os.kill(os.getpid(), signal.SIGTERM)
    return f(state, batch)
  return step
step_lib.make_train_step = make
loop.train_and_evaluate(config, workdir)
"""

# The command itself (encoder_jax.main, through encoder_jax.cli), with an optional fault in
# Orbax's writer: creating a temporary folder whose path contains FAULT raises EACCES, as an
# unwritable or vanished directory does for a non-root user. (The function is Orbax's
# internal one: if Orbax renames it, this fails loudly with an AttributeError.)
CLI_DRIVER = """
import errno, sys, time
from orbax.checkpoint._src.path import atomicity
fault = sys.argv.pop(1)
real = atomicity._create_tmp_directory
async def faulty(makedir, tmp_dir, **kwargs):
  if fault and fault in str(tmp_dir):
    print(f"FAULT {time.time()}", flush=True)
    raise PermissionError(errno.EACCES, "Permission denied", str(tmp_dir))
  return await real(makedir, tmp_dir, **kwargs)
atomicity._create_tmp_directory = faulty
from encoder_jax import main
main.run()
"""

CONFIG_FILE = """
import json, ml_collections
def get_config():
  return ml_collections.ConfigDict(json.load(open({path!r})))
"""


def make_env(base: pathlib.Path) -> dict:
  for i, text in enumerate(DOCS):
    (base / f"doc{i}.txt").write_text(text + "\n")
  return {"base": base, "source": f"files:{base}/doc*.txt", "data_dir": str(base / "tfds")}


def tiny_config(env, **train):
  # fp32 pinned: the default precision=auto takes bf16 matmuls on a CPU with AVX-512 BF16 and
  # fp32 on one without, and the trainer tests' tolerances must not depend on the host.
  config = pretrain.get_config("size=tiny,precision=fp32")
  config.model.update(dict(num_layers=1, hidden_size=32, num_heads=2, ffn_size=64,
                           max_positions=32))
  config.data.update(dict(source=env["source"], data_dir=env["data_dir"], max_length=32,
                          batch_size=4, eval_split="train"))  # too small for a validation split
  config.optim.update(dict(learning_rate=3e-3, warmup_steps=2, total_steps=2 * N))
  # log_every does not divide checkpoint_every: a resumed run's rows must still match.
  config.train.update(dict(steps=1000, log_every=4, eval_every=N, eval_steps=2,
                           checkpoint_every=N, keep=5, flops_budget=0.0, peak_flops=1e11))
  config.train.update(train)
  return config


def budget_for(config, steps):
  """A FLOP budget that the run reaches exactly at `steps`."""
  return (steps - 0.5) * setup.build(config).flops_per_step


def _child_env():
  # PYTHONPATH: the child imports the encoder_jax under test, not whichever one is installed.
  # (The compilation cache it inherits from tests/conftest.py, through os.environ.)
  return dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(ROOT)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)).rstrip(os.pathsep))


def run_subprocess(env, config, workdir, hang_after=0, term_at=0):
  """The driver on `workdir` (local or gs://); the marker file is local, beside the config."""
  cfg_path = env["base"] / f"{os.path.basename(workdir)}.json"
  cfg_path.write_text(config.to_json())
  (env["base"] / "driver.py").write_text(DRIVER)
  marker = str(cfg_path.with_suffix(".marker"))
  proc = subprocess.Popen([sys.executable, str(env["base"] / "driver.py"), str(cfg_path),
                           str(workdir), str(hang_after), str(term_at), marker], cwd=ROOT,
                          env=_child_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  return proc, marker


def run_cli(env, config, workdir, fault=""):
  """encoder_jax.main --mode=pretrain on `config`, with a writer fault at paths containing
  `fault`; stdout and stderr are merged, unbuffered, so lines can be read as they come."""
  name = os.path.basename(workdir)
  (env["base"] / f"{name}.json").write_text(config.to_json())
  cfg_py = env["base"] / f"{name}_config.py"
  cfg_py.write_text(CONFIG_FILE.format(path=str(env["base"] / f"{name}.json")))
  (env["base"] / "cli_driver.py").write_text(CLI_DRIVER)
  # Without a fault, the command exactly as a user runs it (the driver imports Orbax first).
  command = [str(env["base"] / "cli_driver.py"), fault] if fault else ["-m", "encoder_jax.main"]
  return subprocess.Popen(
      [sys.executable, "-u", *command, "--mode=pretrain", f"--config={cfg_py}",
       f"--workdir={workdir}"], cwd=ROOT, env=_child_env(), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, proc, timeout=240.0):
  deadline = time.time() + timeout
  while not predicate():
    if proc.poll() is not None:
      raise AssertionError(f"the run exited ({proc.returncode}) early:\n{proc.stdout.read()}")
    if time.time() > deadline:
      proc.kill()
      raise AssertionError(f"timed out:\n{proc.stdout.read()}")
    time.sleep(0.05)


def train_rows(workdir):
  rows = [r for r in metrics_io.read_jsonl(epath.Path(workdir) / "metrics.jsonl")
          if r["split"] == "train"]
  return {r["step"]: {k: v for k, v in r.items() if k not in PERF_KEYS} for r in rows}


def eval_rows(workdir):
  rows = metrics_io.read_jsonl(epath.Path(workdir) / "metrics.jsonl")
  return {r["step"]: {k: v for k, v in r.items() if k not in PERF_KEYS} for r in rows
          if r["split"] == "eval"}


def restore(workdir, step, config):
  s = setup.build(config)
  ckpt = checkpoint.Checkpointer(epath.Path(workdir) / "checkpoints")
  state, data, meta = ckpt.restore(step, jax.eval_shape(s.init_fn))
  ckpt.close()
  return state, data, meta


def assert_bitwise_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert jax.tree.structure(a) == jax.tree.structure(b) and len(la) == len(lb)
  for x, y in zip(la, lb):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()
