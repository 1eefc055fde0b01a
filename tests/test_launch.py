"""The launchers start what they claim: one JAX process per GPU under SLURM, each on its own
GPU, and multi-host initialisation on TPU pods with a Python the project supports."""
import pathlib
import re
import subprocess

import pytest
from jax._src import clusters  # JAX's own cluster detection, used by --distributed=auto

LAUNCH = pathlib.Path(__file__).resolve().parents[1] / "launch"


def sbatch_options(path: pathlib.Path) -> dict[str, str]:
  return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", path.read_text(), re.M))


@pytest.mark.parametrize("script", ["slurm_gpu.sbatch", "tpu_pod.sh", "local.sh"])
def test_scripts_parse(script):
  subprocess.run(["bash", "-n", str(LAUNCH / script)], check=True)


def test_slurm_runs_one_process_per_gpu_and_jax_gives_each_its_own(monkeypatch):
  opts = sbatch_options(LAUNCH / "slurm_gpu.sbatch")
  per_node = int(opts["ntasks-per-node"])
  assert per_node == int(opts["gpus-per-node"]) == 8, opts
  assert "gpus-per-task" not in opts  # would renumber each task's GPU to 0
  text = (LAUNCH / "slurm_gpu.sbatch").read_text()
  assert re.search(r"srun .*encoder_jax\.main --mode=pretrain", text)
  assert "--distributed=auto" in text

  nodes = 2
  seen = []
  for procid in range(nodes * per_node):  # what srun sets for each task of a 2-node job
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[017-018]",
           "SLURM_NTASKS": str(nodes * per_node), "SLURM_PROCID": str(procid),
           "SLURM_LOCALID": str(procid % per_node), "SLURM_STEP_NUM_NODES": str(nodes)}
    for k, v in env.items():
      monkeypatch.setenv(k, v)
    coord, n, pid, local = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, None, None, None)
    assert coord.startswith("gpu017:") and n == nodes * per_node and pid == procid
    assert local == [procid % per_node]  # this task's GPU, one of the node's 8 visible GPUs
    seen.append((procid // per_node, local[0]))
  assert len(set(seen)) == nodes * per_node  # every (node, GPU) driven by exactly one process


def test_tpu_pod_initialises_the_slice_with_python_3_11():
  text = (LAUNCH / "tpu_pod.sh").read_text()
  train = text[text.index("  train)"):text.index("  delete)")]
  assert "--mode=pretrain" in train and "--distributed=auto" in train
  install = text[text.index("  install)"):text.index("  train)")]
  assert re.search(r"uv==\$UV_VERSION", install)
  assert re.search(r"UV_VERSION=\$\{UV_VERSION:-\d+\.\d+\.\d+\}", text)
  assert "--python 3.11" in install and "python3 -m venv" not in install


def test_tpu_pod_plans_the_layout_of_the_slice_it_creates():
  """`tpu_pod.sh plan` runs mesh=auto's search (encoder_jax.train.layout) for $ACCEL's TPU
  topology on this machine; an accelerator it cannot name is refused with the fix."""
  import os
  env = dict(os.environ, PROJECT="p", ZONE="z", TPU="t", DRY_RUN="1")
  for accel, topo in (("v5litepod-16", "v5e:4x4"), ("v5p-8", "v5p:2x2x1"), ("v4-32", "v4:2x2x4")):
    out = subprocess.run(["bash", str(LAUNCH / "tpu_pod.sh"), "plan", "size=base,nsp=nsp",
                          "--config.data.batch_size=8192"], env=dict(env, ACCEL=accel),
                         capture_output=True, text=True, check=True).stdout
    assert "-m encoder_jax.train.layout" in out and f"--tpu_topology={topo}" in out, out
    assert "--config.data.batch_size=8192" in out
  bad = subprocess.run(["bash", str(LAUNCH / "tpu_pod.sh"), "plan", "size=base"],
                       env=dict(env, ACCEL="v9-1"), capture_output=True, text=True)
  assert bad.returncode != 0 and "TOPOLOGY=" in bad.stderr
  # the train command leaves the mesh to the config's default (mesh=auto)
  text = (LAUNCH / "tpu_pod.sh").read_text()
  assert "--config.mesh" not in text[text.index("  train)"):text.index("  delete)")]
