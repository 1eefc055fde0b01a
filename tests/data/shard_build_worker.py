"""One JAX process of tests/data/test_multihost_build.py; not a test itself.

  python shard_build_worker.py PROCESS_ID NUM_PROCESSES PORT SOURCE DATA_DIR OUT_JSON

NUM_PROCESSES processes over `jax.distributed` (127.0.0.1) prepare the shards of SOURCE in
DATA_DIR as a trainer does (shards.prepare_shards: each its share, two barriers), then each
writes what it read back to OUT_JSON.<process id>.
"""
import json
import os
import sys

pid, nproc, port, source, data_dir, out = sys.argv[1:7]
pid, nproc = int(pid), int(nproc)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if nproc > 1:
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nproc,
                             process_id=pid, initialization_timeout=120)

from encoder_jax.data import examples, shards  # noqa: E402

cfg = examples.ExampleConfig(format="segment_pair", nsp=True, max_length=64, seed=5)
parts = shards.prepare_shards(source, "minilm", cfg, data_dir, workers=0, docs_per_shard=16,
                              blank_line_docs=True)
(folder, _), = parts
with open(f"{out}.{pid}", "w") as f:
  json.dump({"folder": folder, "pid": os.getpid(), "build": shards.read_index(folder)["build"],
             "rows": len(shards.ShardedRows(parts, "train"))}, f)
