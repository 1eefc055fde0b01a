"""encoder_jax.finetune.pool: fine-tuning jobs in single-core worker processes.

The workers must be pinned to distinct cores (the speed-up depends on it), return results in
job order whatever order they finish in, surface a job's error, and give the same numbers as
running the jobs in this process (a single-core XLA program computes what the two-thread one
does). Also here: eval_dev=False, which the demo's one-epoch reference jobs use.
"""
import os
import time

import pytest

from encoder_jax.finetune import finetune_and_evaluate, pool


def _where(config, workdir):
  time.sleep(config["sleep"])
  return {"job": workdir, "cores": sorted(os.sched_getaffinity(0)), "pid": os.getpid()}


def _fails(config, workdir):
  if config["fail"]:
    raise ValueError(f"job {workdir} failed on purpose")
  return {"job": workdir}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cores")
def test_workers_are_pinned_to_distinct_cores_and_results_keep_job_order():
  # The first job finishes last, so completion order differs from job order.
  jobs = [({"sleep": 1.5}, "a"), ({"sleep": 0.0}, "b"), ({"sleep": 0.0}, "c")]
  done = []
  out = pool.run_jobs(jobs, 2, on_done=lambda i, r: done.append(i), fn=_where)
  assert [r["job"] for r in out] == ["a", "b", "c"]
  assert done[-1] == 0 and sorted(done) == [0, 1, 2]
  assert all(len(r["cores"]) == 1 for r in out)
  by_pid = {r["pid"]: r["cores"][0] for r in out}
  assert len(by_pid) == 2 and len(set(by_pid.values())) == 2  # two workers, two cores
  assert os.getpid() not in by_pid


def test_a_failing_job_raises_its_error():
  with pytest.raises(ValueError, match="job y failed on purpose"):
    pool.run_jobs([({"fail": False}, "x"), ({"fail": True}, "y")], 2, fn=_fails)
  with pytest.raises(ValueError, match="job y failed on purpose"):
    pool.run_jobs([({"fail": False}, "x"), ({"fail": True}, "y")], 1, fn=_fails)


def test_pool_gives_the_numbers_of_in_process_runs_and_eval_dev_false(tiny_config, tmp_path):
  # Real review snippets (the demo task), a tiny random encoder over BERT's vocab.
  def config(seed, **changes):
    c = tiny_config("rotten_tomatoes", "minilm", dropout=False, max_train_examples=64,
                    max_eval_examples=32, max_length=32, epochs=2, batch_size=16,
                    learning_rate=3e-3, log_every=100, seed=seed, **changes)
    c.model.update(vocab_size=30522, num_layers=1)
    return c
  jobs = [(config(0, eval_dev=False), str(tmp_path / "a")), (config(1), str(tmp_path / "b"))]
  parallel = pool.run_jobs(jobs, 2)
  here = [finetune_and_evaluate(c, str(tmp_path / f"{d}_here")) for c, d in jobs]
  for p, h in zip(parallel, here):
    assert p["summary"] == h["summary"]
    assert p["runs"][0]["test"] == h["runs"][0]["test"]
  no_dev, dev = here[0]["runs"][0], here[1]["runs"][0]
  # eval_dev=False: no dev pass at all, the last epoch is kept, test still scored.
  assert no_dev["dev"] == {} and all(h["dev"] == {} for h in no_dev["history"])
  assert no_dev["best_epoch"] == 2 and no_dev["select"] == "last epoch"
  assert set(no_dev["test"]) == {"accuracy", "f1", "score"}
  assert not any(k.startswith("validation/") for k in here[0]["summary"])
  assert set(dev["dev"]) == {"validation"} and len(dev["history"][0]["dev"]) == 1
