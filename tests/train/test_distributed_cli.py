"""`python -m encoder_jax.main --distributed=explicit ...` on CPU: jax.distributed starts before
anything initialises a backend, and config.mesh=auto then spans the processes (one device
each, data-parallel), as two local processes show."""
import json
import subprocess
import sys

from multihost_helpers import ROOT, child_env, free_port

# The entry point's own flag handling and init_distributed, then the mesh "auto" gives.
_SCRIPT = """
import json, sys
from absl import flags
from encoder_jax import main
flags.FLAGS(["main", "--mode=pretrain", "--distributed=explicit", "--num_processes=2",
             "--process_id=" + sys.argv[1], "--coordinator_address=127.0.0.1:" + sys.argv[2]])
main.init_distributed()
import jax
from encoder_jax.train import sharding
mesh = sharding.mesh_from_config("auto")
print(json.dumps({"shape": dict(mesh.shape), "processes": sorted(
    d.process_index for d in mesh.devices.flat), "process_count": jax.process_count()}))
"""


def test_explicit_distributed_starts_and_auto_mesh_spans_the_processes():
  port = str(free_port())
  env = child_env(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen([sys.executable, "-c", _SCRIPT, str(i), port], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in (0, 1)]
  outs = []
  for p in procs:
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out[-3000:]
    outs.append(json.loads(out.strip().splitlines()[-1]))
  for o in outs:
    # two fake devices per process, but "auto" takes one per process: data=2 across processes
    assert o == {"shape": {"data": 2, "fsdp": 1, "tensor": 1}, "processes": [0, 1],
                 "process_count": 2}
