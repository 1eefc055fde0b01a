"""The real trainer (`python -m encoder_jax.main --mode=pretrain`) as 2 processes x 4 CPU devices
(jax.distributed over 127.0.0.1, mesh (2, 2, 2) over both) on a sharded row corpus, SIGKILLed
part-way, restarted, preempted by a SIGTERM that reaches one process only, and restarted again,
equals 1 process x 8 devices run straight through: metrics.jsonl row for row and the final
parameters.

On the way it checks what only process 0 does: it alone builds the shards (the other waits at
a barrier), writes config.json, metrics.jsonl, TensorBoard and summary.json (no row twice),
and on a restart sets the damaged newest checkpoint aside so that both processes restore the
previous good one. And that a SIGTERM to one process stops both after the same step, saved:
a process stopping alone would wait in the save's collectives while the other runs the next
step's (a hang; with gloo, an abort).
"""
import json
import os
import signal
import subprocess
import sys
import time

from etils import epath
import jax
import numpy as np
import pytest

from encoder_jax.train import checkpoint, setup, sharding
from loop_helpers import CONFIG_FILE, ROOT, eval_rows, tiny_config, train_rows
from multihost_helpers import free_port, xla_flags

pytestmark = pytest.mark.slow

STEPS, SAVE_EVERY, LOG_EVERY, EVAL_EVERY = 12, 2, 3, 4
HANG_AFTER = 5  # the first run hangs in its 6th step call: checkpoints 2 and 4 are sealed
MESH = "2,2,2"  # (data, fsdp, tensor) over the 8 devices of both processes
TIMEOUT = 240  # seconds, for any one run

WORDS = ("whale ship sea captain harbor storm sail island rope deck anchor wave night "
         "morning crew voyage compass wind north south").split()

# encoder_jax.main as a user runs it, with the train step wrapped: after the first N calls
# write MARKER, then with "hang" sleep for good (a process caught mid-run by the scheduler's
# SIGKILL; checkpoints saved before go on being written and sealed by their own threads); with
# "slow" every call takes 0.5 s more (so that a signal lands mid-run).
DRIVER = """
import sys, time
from encoder_jax.train import step as step_lib
mode, n, marker = sys.argv.pop(1), int(sys.argv.pop(1)), sys.argv.pop(1)
real = step_lib.make_train_step
def make(*args, **kwargs):
  f, calls = real(*args, **kwargs), [0]
  def step(state, batch):
    calls[0] += 1
    if calls[0] > n:
      open(marker, "w").close()
      time.sleep(3600 if mode == "hang" else 0)
    time.sleep(0.5 if mode == "slow" else 0)
    return f(state, batch)
  return step
step_lib.make_train_step = make
from encoder_jax import main
sys.exit(main.run())
"""


def _write_corpus(folder, n_docs=16, seed=0):
  folder.mkdir()
  rng = np.random.default_rng(seed)
  for i in range(n_docs):
    sents = [" ".join(rng.choice(WORDS, rng.integers(4, 10))).capitalize() + "."
             for _ in range(rng.integers(3, 8))]
    (folder / f"d{i:02d}.txt").write_text(" ".join(sents) + "\n")


def _env(base, devices):
  return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices),
              PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


class _Procs(list):
  """The processes of one start of the trainer, their output in files under `base`."""

  def __init__(self, base, cfg_py, workdir, nproc, driver=()):
    super().__init__()
    port = free_port()
    for i in range(nproc):
      command = ["-m", "encoder_jax.main"]
      if driver:  # (mode, n, marker of process i)
        command = [str(base / "driver.py"), driver[0], str(driver[1]), f"{driver[2]}.{i}"]
      dist = ([] if nproc == 1 else
              ["--distributed=explicit", f"--coordinator_address=127.0.0.1:{port}",
               f"--num_processes={nproc}", f"--process_id={i}"])
      log = base / f"{workdir.name}.{time.time():.3f}.{i}.log"
      with open(log, "w") as out:
        p = subprocess.Popen(
            [sys.executable, "-u", *command, "--mode=pretrain", f"--config={cfg_py}",
             f"--workdir={workdir}", *dist], cwd=ROOT, env=_env(base, 8 // nproc), stdout=out,
            stderr=subprocess.STDOUT)
      p.log = log
      self.append(p)

  @staticmethod
  def output(p) -> str:
    return p.log.read_text()[-4000:]

  def finish(self, timeout=TIMEOUT):
    """Waits for every process to exit 0; fails as soon as one exits otherwise (the others
    would wait for it in a collective)."""
    deadline = time.time() + timeout
    while any(p.poll() is None for p in self):
      for p in self:
        assert p.returncode in (None, 0), self.output(p)
      if time.time() > deadline:
        raise AssertionError(f"timed out after {timeout} s:\n{self.output(self[0])}")
      time.sleep(0.1)
    for p in self:
      assert p.returncode == 0, self.output(p)

  def wait_for(self, predicate, timeout=TIMEOUT):
    deadline = time.time() + timeout
    while not predicate():
      for p in self:
        if p.poll() is not None:
          raise AssertionError(f"a process exited ({p.returncode}) early:\n{self.output(p)}")
      if time.time() > deadline:
        raise AssertionError(f"timed out:\n{self.output(self[0])}")
      time.sleep(0.05)

  def kill(self):
    for p in self:
      if p.poll() is None:
        p.kill()
    for p in self:
      p.wait(timeout=30)


def _steps(workdir):
  return sorted(int(d.name) for d in (workdir / "checkpoints").iterdir() if d.name.isdigit())


def _restore_params(config, workdir, step):
  """The parameters of checkpoint `step`, restored in this process (8 devices) onto MESH."""
  s = setup.build(config)
  abstract, _ = sharding.sharded_abstract_state(s.init_fn, sharding.mesh_from_config(MESH))
  ckpt = checkpoint.Checkpointer(epath.Path(workdir) / "checkpoints", async_save=False)
  try:
    state, data, _ = ckpt.restore(step, abstract)
  finally:
    ckpt.close()
  assert int(state.step) == step and int(data["step"]) == step
  return {jax.tree_util.keystr(p): np.asarray(x)
          for p, x in jax.tree_util.tree_leaves_with_path(state.params)}


def _damage(step_dir):
  """Flips one byte of the largest file of a sealed checkpoint."""
  files = [f for f in step_dir.rglob("*") if f.is_file() and f.name != checkpoint.CHECKSUMS]
  f = max(files, key=lambda f: f.stat().st_size)
  data = bytearray(f.read_bytes())
  data[len(data) // 2] ^= 0xFF
  f.write_bytes(bytes(data))


def _keys(workdir):
  return [(r["step"], r["split"]) for r in map(
      json.loads, (workdir / "metrics.jsonl").read_text().splitlines())]


def _assert_rows_close(a, b):
  """Rows {step: {key: value}} equal, numbers within 1e-5 relative; the largest difference."""
  assert sorted(a) == sorted(b)
  worst = 0.0
  for step in a:
    assert sorted(a[step]) == sorted(b[step]), step
    for k, x in a[step].items():
      y = b[step][k]
      if isinstance(x, (int, float)) and not isinstance(x, bool):
        rel = abs(x - y) / max(abs(y), 1e-12)
        assert rel <= 1e-5, (step, k, x, y)
        worst = max(worst, rel)
      else:
        assert x == y, (step, k, x, y)
  return worst


def test_two_processes_killed_preempted_and_resumed_equal_one_straight_run(tmp_path):
  t0 = time.time()
  base = tmp_path
  _write_corpus(base / "text")
  config = tiny_config({"source": f"files:{base}/text/*.txt", "data_dir": str(base / "tfds")},
                       steps=STEPS, log_every=LOG_EVERY, eval_every=EVAL_EVERY, eval_steps=1,
                       checkpoint_every=SAVE_EVERY, keep=2)
  config.mesh = MESH
  config.data.update(dict(batch_size=8, build_workers=0, shard_docs=4))
  config.optim.total_steps = STEPS
  (base / "config.json").write_text(config.to_json())
  cfg_py = base / "config.py"
  cfg_py.write_text(CONFIG_FILE.format(path=str(base / "config.json")))
  (base / "driver.py").write_text(DRIVER)
  two, one = base / "two", base / "one"
  procs = []
  try:
    # 1. Two processes until both hang after step HANG_AFTER, checkpoint 4 sealed: SIGKILL.
    procs = _Procs(base, cfg_py, two, 2, driver=("hang", HANG_AFTER, base / "hung"))
    sealed = two / "checkpoints" / "4" / checkpoint.CHECKSUMS
    procs.wait_for(lambda: sealed.exists() and all(
        (base / f"hung.{i}").exists() for i in range(2)))
    procs.kill()
    t_killed = time.time()
    assert _steps(two) == [2, 4]
    built = list((base / "tfds" / "pretrain_shards").glob("*/index.json"))
    assert len(built) == 1
    # Each process built its share of the shards; process 0 is host 0.
    build = json.loads(built[0].read_text())["build"]
    assert build["pid"] == procs[0].pid
    assert [h["pid"] for h in build["per_host"]] == [procs[0].pid, procs[1].pid]
    shard_files = {f: f.stat().st_mtime_ns for f in built[0].parent.iterdir()}

    # 2. Checkpoint 4 damaged: the restart sets it aside and resumes from 2. SIGTERM to
    # process 1 alone, after its first step: both stop after the same step and save it.
    _damage(two / "checkpoints" / "4")
    procs = _Procs(base, cfg_py, two, 2, driver=("slow", 1, base / "stepped"))
    procs.wait_for(lambda: (base / "stepped.1").exists())
    procs[1].send_signal(signal.SIGTERM)
    procs.finish()
    aside = two / "checkpoints_set_aside" / "4"
    assert "does not match its sha256" in (aside / "why.txt").read_text()
    out0, out1 = procs.output(procs[0]), procs.output(procs[1])
    assert "checkpoint 4 is damaged" in out0 and f"steps 2 -> {STEPS}" in out0
    assert "checkpoint 4 is damaged" not in out1  # (process 0 reports, once)
    summary = json.loads((two / "summary.json").read_text())
    stopped = summary["steps"]
    assert summary["stop_reason"] == "preempted" and 3 <= stopped < STEPS, summary
    assert f"SIGTERM: saved step {stopped}" in out0
    assert _steps(two)[-1] == stopped
    assert (two / "checkpoints" / str(stopped) / checkpoint.CHECKSUMS).exists()
    assert max(s for s, _ in _keys(two)) <= stopped

    # 3. The plain command again, on to STEPS.
    procs = _Procs(base, cfg_py, two, 2)
    procs.finish()
    assert f"steps {stopped} -> {STEPS}" in procs.output(procs[0])

    # 4. One process x 8 devices, same global batch and mesh, straight through.
    procs = _Procs(base, cfg_py, one, 1)
    procs.finish()
  finally:
    _Procs.kill(procs)  # (leftovers of a failed stage)
  # The shards were built once, by the first run's process 0; the later runs only read them.
  assert {f: f.stat().st_mtime_ns for f in built[0].parent.iterdir()} == shard_files
  assert all(t < t_killed * 1e9 for t in shard_files.values())

  # Process 0 alone wrote the run's files: each (step, split) once, config.json once.
  keys = _keys(two)
  assert len(keys) == len(set(keys)), keys
  assert keys == _keys(one)
  assert [s for s, split in keys if split == "train"] == [3, 6, 9, 12]
  assert sorted(f.name for f in two.glob("config*.json")) == ["config.json"]
  assert json.loads((two / "config.json").read_text())["mesh"] == MESH
  summary = json.loads((two / "summary.json").read_text())
  straight = json.loads((one / "summary.json").read_text())
  assert summary["stop_reason"] == "steps" and summary["resumed_from"] == stopped
  # keep=2 pruned the same checkpoints (the rollback one kept) on both sides
  for key in ("steps", "checkpoints", "rollback_checkpoint", "num_params"):
    assert summary[key] == straight[key], key
  assert _steps(two) == summary["checkpoints"]
  # the wall time of the earlier starts came back from the checkpoints' meta
  assert summary["total_wall_s"] > summary["wall_s"]
  # one TensorBoard event file per start (process 0's)
  assert len(list((two / "tensorboard").iterdir())) == 3
  assert len(list((one / "tensorboard").iterdir())) == 1

  train_rel = _assert_rows_close(train_rows(two), train_rows(one))
  eval_rel = _assert_rows_close(eval_rows(two), eval_rows(one))
  p2, p1 = _restore_params(config, two, STEPS), _restore_params(config, one, STEPS)
  assert sorted(p2) == sorted(p1)
  param_diff = max(float(np.abs(p2[k] - p1[k]).max()) for k in p1)
  print(f"\n2x4 devices, killed at step {HANG_AFTER + 1}, resumed from 2, preempted at "
        f"{stopped}, resumed, vs 1x8 straight: max rel diff train rows {train_rel:.1e}, eval "
        f"rows {eval_rel:.1e}; max param diff {param_diff:.1e}; {time.time() - t0:.0f} s")
  assert param_diff <= 1e-5
