"""Two processes building the same TFDS dataset at once both succeed (tasks.build_once).

Without the lock TFDS's final rename fails in whichever process finishes second; this test
holds both builds inside `_generate_examples` at the same time to make that race certain.
"""
import pathlib
import subprocess
import sys
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import pathlib, sys, time
    import numpy as np
    import tensorflow_datasets as tfds
    from encoder_jax.data import tasks

    go = pathlib.Path({data_dir!r}) / "go"

    class Racy(tfds.core.GeneratorBasedBuilder):
      VERSION = tfds.core.Version("1.0.0")

      def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {{"x": tfds.features.Scalar(dtype=np.int64)}}))

      def _split_generators(self, dl_manager):
        return {{"train": self._generate_examples()}}

      def _generate_examples(self):
        pathlib.Path({data_dir!r}, "started-" + sys.argv[1]).touch()
        deadline = time.time() + 20  # both builds inside the generator at once (if unlocked)
        while not go.exists() and time.time() < deadline:
          time.sleep(0.05)
        for i in range(10):
          yield i, {{"x": i}}

    tasks.build_once(Racy(data_dir={data_dir!r}, file_format="array_record"))
    print("rows", len(tfds.data_source("racy", data_dir={data_dir!r}, split="train")))
""")


def test_concurrent_builds_of_one_dataset_both_succeed(tmp_path):
  script = tmp_path / "build.py"
  script.write_text(SCRIPT.format(root=str(ROOT), data_dir=str(tmp_path)))
  procs = [subprocess.Popen([sys.executable, str(script), str(i)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  # Release the builders once one is generating and the other had time to reach its lock (or,
  # without a lock, its own generator).
  deadline = time.time() + 120
  while not list(tmp_path.glob("started-*")) and time.time() < deadline:
    time.sleep(0.1)
  time.sleep(3.0)
  (tmp_path / "go").touch()
  outs = [p.communicate(timeout=300)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
    assert "rows 10" in out, out[-3000:]
  # With the lock only one process generated; the other found the dataset ready.
  assert len(list(tmp_path.glob("started-*"))) == 1
