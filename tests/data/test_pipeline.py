"""grain loader: deterministic shuffle, host sharding (1/2/4 hosts), global batches, resume."""

import numpy as np
import pytest

from encoder_jax.data import examples, pipeline


class _IndexRows:
  """Rows that are just their index, to check the order and sharding logic exactly."""

  def __init__(self, n):
    self.n = n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    return {"row": np.int64(i)}


def _epoch(rows, seed, h, n, block=1):
  ds = pipeline.host_stream(rows, seed, h, n, num_epochs=1, block=block)
  return np.array([ds[i]["row"] for i in range(len(ds))])


@pytest.mark.parametrize("n_hosts,block", [(1, 1), (2, 1), (4, 1), (2, 8), (4, 5)])
def test_host_sharding_no_dup_no_drop(n_hosts, block):
  rows = _IndexRows(1003)  # not divisible by 2 or 4
  shards = [_epoch(rows, 7, h, n_hosts, block) for h in range(n_hosts)]
  union = np.concatenate(shards)
  assert len(union) == len(rows) and set(union.tolist()) == set(range(len(rows)))
  for i in range(n_hosts):
    for j in range(i + 1, n_hosts):
      assert not set(shards[i].tolist()) & set(shards[j].tolist())
  assert not np.array_equal(np.sort(shards[0]), shards[0])  # shuffled


def test_shuffle_is_seeded_and_new_each_epoch():
  rows = _IndexRows(500)
  a = pipeline.host_stream(rows, seed=3, num_epochs=2)
  first, second = [np.array([a[i]["row"] for i in range(k * 500, (k + 1) * 500)]) for k in (0, 1)]
  assert sorted(first) == sorted(second) == list(range(500)) and not np.array_equal(first, second)
  again = pipeline.host_stream(rows, seed=3, num_epochs=2)
  assert np.array_equal(first, [again[i]["row"] for i in range(500)])
  other = pipeline.host_stream(rows, seed=4, num_epochs=2)
  assert not np.array_equal(first, [other[i]["row"] for i in range(500)])


def _global_batches(rows, n_hosts, global_batch, steps, seed=0):
  per_host = []
  for h in range(n_hosts):
    loader = pipeline.Loader(rows, pipeline.LoaderConfig(global_batch, seed, process_index=h,
                                                         process_count=n_hosts, read_threads=1))
    it = iter(loader)
    per_host.append([next(it)["row"] for _ in range(steps)])
  # Hosts' rows concatenated in host order: exactly the global array's row order.
  return [np.concatenate([per_host[h][s] for h in range(n_hosts)]) for s in range(steps)]


def test_global_batch_and_its_row_order_are_independent_of_host_count():
  rows = _IndexRows(301)
  one = _global_batches(rows, 1, 16, 40)  # 40 steps: crosses two epoch boundaries
  for n in (2, 4):
    assert all(np.array_equal(a, b) for a, b in zip(one, _global_batches(rows, n, 16, 40)))
  with pytest.raises(ValueError, match="not divisible by process_count=3"):
    pipeline.Loader(rows, pipeline.LoaderConfig(16, process_count=3, process_index=0))


@pytest.fixture(scope="module")
def nsp_rows(demo_corpus, bert_tok):
  cfg = examples.ExampleConfig(format="segment_pair", nsp=True, max_length=128)
  return examples.Rows(demo_corpus, examples.make_plan(demo_corpus, cfg), cfg, bert_tok.cls_id,
                       bert_tok.sep_id, bert_tok.pad_id)


def test_batch_format(nsp_rows):
  it = iter(pipeline.Loader(nsp_rows, pipeline.LoaderConfig(8, process_index=1, process_count=2)))
  b = next(it)
  assert {k: (v.dtype.name, v.shape) for k, v in b.items()} == {
      "input_ids": ("int32", (4, 128)), "mask": ("bool", (4, 128)),
      "token_types": ("int32", (4, 128)), "segment_ids": ("int32", (4, 128)),
      "positions": ("int32", (4, 128)), "word_starts": ("bool", (4, 128)),
      "nsp_label": ("int32", (4,))}


@pytest.mark.parametrize("worker_count", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_iterator_restore_is_exact(nsp_rows, worker_count):
  cfg = pipeline.LoaderConfig(16, seed=5, process_index=0, process_count=2,
                              worker_count=worker_count)
  it = iter(pipeline.Loader(nsp_rows, cfg))
  for _ in range(7):
    next(it)
  state = it.get_state()
  assert state["step"] == 7
  expected = [next(it) for _ in range(5)]
  restored = iter(pipeline.Loader(nsp_rows, cfg))
  restored.set_state(dict(state))
  for want in expected:
    got = next(restored)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  other = iter(pipeline.Loader(nsp_rows, pipeline.LoaderConfig(32, seed=5)))
  with pytest.raises(ValueError, match="global_batch_size=16"):
    other.set_state(state)


def test_restore_on_another_host_count_continues_the_same_global_batches():
  """A state saved on 2 hosts, mid-way through the third epoch, restores on 1 and on 4 hosts:
  the global batches that follow are those of the uninterrupted run."""
  rows = _IndexRows(50)  # 6 global batches of 8 per epoch (+ 2 rows into the next)
  straight = _global_batches(rows, 1, 8, 25, seed=3)
  saved = []
  for h in range(2):
    it = iter(pipeline.Loader(rows, pipeline.LoaderConfig(8, 3, process_index=h,
                                                          process_count=2, read_threads=1)))
    for _ in range(15):
      next(it)
    saved.append(it.get_state())
  assert saved[0] == saved[1]  # one state for every host
  for n in (1, 4):
    per_host = []
    for h in range(n):
      it = iter(pipeline.Loader(rows, pipeline.LoaderConfig(8, 3, process_index=h,
                                                            process_count=n, read_threads=1)))
      it.set_state(dict(saved[0]))
      per_host.append([next(it)["row"] for _ in range(10)])
    for s in range(10):
      np.testing.assert_array_equal(np.concatenate([p[s] for p in per_host]), straight[15 + s],
                                    err_msg=f"{n} hosts, step {15 + s}")


def test_empty_dataset_is_an_error():
  with pytest.raises(ValueError, match="no rows"):
    pipeline.host_stream(_IndexRows(0), seed=0)


def test_finite_epochs_stop():
  rows = _IndexRows(100)
  for h in range(2):
    it = iter(pipeline.Loader(rows, pipeline.LoaderConfig(16, num_epochs=1, process_index=h,
                                                          process_count=2)))
    batches = list(it)
    assert len(batches) == 6 and it.get_state()["step"] == 6  # 50 rows per host: 6 x 8, 2 left


def test_pretrain_loader_end_to_end():
  ex = examples.ExampleConfig(format="segment_pair", nsp=True, dupe_factor=2, seed=1)
  loader = pipeline.pretrain_loader("demo", "minilm", example=ex, global_batch_size=8, seed=0,
                                    process_index=0, process_count=1)
  assert len(loader.rows) > 60_000  # two duplicated passes, each with its own draws
  b = next(iter(loader))
  assert b["input_ids"].shape == (8, 128) and b["nsp_label"].shape == (8,)
  assert (b["input_ids"][:, 0] == 101).all()
