"""The grain loader: deterministic shuffle, per-host sharding, batching, prefetch, resumable state.

  loader = pretrain_loader(source="demo", vocab="minilm", split="train",
                           example=ExampleConfig(format="full_sentences", max_length=128),
                           global_batch_size=256)      # process index/count from jax
  # rows built in parallel into array_record shards (shards.py), read by index; at scale:
  loader = pretrain_loader(source="mix:files:wiki/*.jsonl:text@0.8+files:books/*.txt@0.2",
                           build_workers=16, data_dir="gs://bucket/data", ...)
  it = iter(loader)
  batch = next(it)          # this host's share: dict of numpy arrays [B_host, T] (see below)
  state = it.get_state()    # {"step": ..., ...}: JSON-able, save it with the checkpoint
  it.set_state(state)       # continue exactly where the saved iterator was

Order. The rows of a plan are shuffled by `seed` with a different permutation each epoch
(grain's index shuffle: random access, no buffer), epochs follow each other, and the stream is
dealt to hosts in blocks of the per-host batch b: host h of n takes stream positions
[k*n*b + h*b, k*n*b + (h+1)*b) for k = 0, 1, ... So within every epoch the hosts' rows are
disjoint and together are all rows, and global batch s is stream positions [s*B, (s+1)*B)
*in order* whatever the number of hosts: host h's rows are rows [h*b, (h+1)*b) of the global
batch, exactly where `jax.make_array_from_process_local_data` places them. Row-keyed
randomness on device (one masking key per batch row) is therefore identical on 1 or n hosts.
The state is just the step, so
a run saved on 4 hosts resumes on 2 (same global batch) with the same global batches.
With `num_epochs` set, the last incomplete batch is dropped (fewer than B rows).

Batch (per host, B_host = global_batch_size / process_count, T = max_length):
  input_ids    int32 [B, T]  [CLS] A [SEP] (B [SEP]), pad_id after
  mask         bool  [B, T]  True on real tokens
  token_types  int32 [B, T]  0 for [CLS] A [SEP], 1 for B [SEP], 0 on pads
  segment_ids  int32 [B, T]  1..k per packed example, 0 on pads (attention stays inside one id)
  positions    int32 [B, T]  position ids, restarting at 0 for every packed example
  word_starts  bool  [B, T]  True where a word begins (whole-word masking); False on specials
  nsp_label    int32 [B]     with nsp / sop only: 0 = B follows A (in order), 1 = random (swapped)
  example_id   int32 [B]     with example_ids=True only: the row's index in the plan
  epoch        int32 [B]     with example_ids=True only: the pass over the rows it comes from
                             (static masking keys its masks on (example_id, epoch % dupe_factor))
The share of a batch's B x T positions that are padding (mask False) is what packing
(ExampleConfig.pack) saves; the train step reports it per batch as `pad_fraction`
(objectives/pretraining.pad_fraction) and the trainer logs it in every metrics.jsonl row, with
real_tokens_per_s (the non-pad tokens per second) beside tokens_per_s (positions).
"""
import dataclasses

from absl import flags
import grain
import numpy as np

from encoder_jax.data import examples, shards, tokenizer
from encoder_jax.data.vocab import resolve_vocab


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
  global_batch_size: int
  seed: int = 0
  num_epochs: int | None = None  # None: repeat forever
  process_index: int = 0
  process_count: int = 1
  read_threads: int = 2          # grain ReadOptions threads
  prefetch: int = 8              # batches buffered ahead (thread prefetch)
  worker_count: int = 0          # >0: grain multiprocess prefetch with this many processes
  example_ids: bool = False      # add example_id and epoch to every row (static masking)

  def per_host_batch_size(self) -> int:
    if self.global_batch_size % self.process_count:
      raise ValueError(f"global_batch_size={self.global_batch_size} is not divisible by "
                       f"process_count={self.process_count}; each host needs an equal share")
    if not 0 <= self.process_index < self.process_count:
      raise ValueError(f"process_index={self.process_index} not in [0, {self.process_count})")
    return self.global_batch_size // self.process_count


def host_stream(rows, seed: int, process_index: int = 0, process_count: int = 1,
                num_epochs: int | None = None, block: int = 1,
                example_ids: bool = False) -> grain.MapDataset:
  """This host's rows in stream order (before batching): shuffle per epoch, repeat, deal
  blocks of `block` rows (the per-host batch) round-robin to hosts. With `example_ids`, each
  row also carries its plan index and the epoch (pass over the rows) it was drawn in."""
  if len(rows) == 0:
    raise ValueError("the dataset has no rows; refusing to iterate an empty stream")
  num_rows = len(rows)
  ds = grain.MapDataset.source(rows)
  if example_ids:
    ds = ds.map_with_index(lambda i, row: row | {"example_id": np.int32(i % num_rows)})
  ds = ds.shuffle(seed=seed)
  ds = ds.repeat(num_epochs)  # shuffle sees epoch = index // len: a new permutation each epoch
  if example_ids:  # the global stream position, before dealing to hosts
    ds = ds.map_with_index(lambda j, row: row | {"epoch": np.int32(j // num_rows)})
  if process_count == 1:
    return ds
  b, n, h = block, process_count, process_index
  rounds, rest = divmod(len(ds), n * b)
  local_len = rounds * b + min(max(rest - h * b, 0), b)

  def position(j: int) -> int:  # j-th local row -> stream position (random access, no copy)
    k, r = divmod(j, b)
    return (k * n + h) * b + r
  return grain.MapDataset.range(local_len).map(lambda j: ds[position(j)])


class BatchIterator:
  """Iterator over host batches with a host-count-independent, JSON-able state."""

  def __init__(self, loader: "Loader", step: int = 0):
    self._loader = loader
    self._start(step)

  def _start(self, step: int):
    self.step = step
    self._it = iter(self._loader.dataset(step))

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = next(self._it)
    self.step += 1
    return batch

  def get_state(self) -> dict:
    cfg = self._loader.cfg
    return {"step": self.step, "seed": cfg.seed, "global_batch_size": cfg.global_batch_size,
            "num_rows": len(self._loader.rows)}

  def set_state(self, state: dict):
    cfg = self._loader.cfg
    for key, mine in (("seed", cfg.seed), ("global_batch_size", cfg.global_batch_size),
                      ("num_rows", len(self._loader.rows))):
      if key in state and state[key] != mine:
        raise ValueError(f"iterator state was saved with {key}={state[key]} but this loader has "
                         f"{key}={mine}; the restored stream would differ")
    self._start(int(state["step"]))


class Loader:
  """Batches of `rows` (any random-access source of row dicts) for this host."""

  def __init__(self, rows, cfg: LoaderConfig, tokenizer=None):
    self.rows, self.cfg = rows, cfg
    self.batch_size = cfg.per_host_batch_size()
    # The tokenizer the rows were made with (vocab size, special ids); None for other rows.
    self.tokenizer = tokenizer

  def dataset(self, start_step: int = 0) -> grain.IterDataset:
    cfg = self.cfg
    ds = host_stream(self.rows, cfg.seed, cfg.process_index, cfg.process_count, cfg.num_epochs,
                     block=self.batch_size, example_ids=cfg.example_ids)
    ds = ds.batch(self.batch_size, drop_remainder=True)[start_step:]
    it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=cfg.read_threads,
                                                 prefetch_buffer_size=cfg.prefetch))
    if cfg.worker_count > 0:
      # grain's worker processes read absl flags; outside absl.app (tests, notebooks) they
      # are unparsed and reading them raises, so take the defaults.
      if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
      it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.worker_count))
    return it_ds

  def __iter__(self) -> BatchIterator:
    return BatchIterator(self)


def batch_spec(example: examples.ExampleConfig, global_batch_size: int,
               example_ids: bool = False) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """{key: (shape, dtype)} of the global batches `pretrain_loader` yields for these settings
  (the table in the module docstring), without building a corpus: what an ahead-of-time
  compile of the train step needs (encoder_jax.train.compile_check)."""
  B = global_batch_size
  spec = {k: ((B, *v.shape), v.dtype) for k, v in examples.empty_row(example.max_length, 0).items()}
  if example.nsp or example.sop:
    spec["nsp_label"] = ((B,), np.dtype(np.int32))
  if example_ids:
    spec |= {k: ((B,), np.dtype(np.int32)) for k in ("example_id", "epoch")}
  return spec


def pretrain_loader(source: str = "demo", vocab: str = "minilm", split: str = "train",
                    example: examples.ExampleConfig = examples.ExampleConfig(),
                    global_batch_size: int = 32, seed: int = 0, num_epochs: int | None = None,
                    process_index: int | None = None, process_count: int | None = None,
                    data_dir=None, cache_dir=None, worker_count: int = 0,
                    prefetch: int = 8, example_ids: bool = False, build_workers: int = 2,
                    shard_docs: int = examples.DOCS_PER_SHARD,
                    source_data_dir: str | None = None, blank_line_docs: bool = False) -> Loader:
  """Builds (once) the source's row shards and returns this host's loader over them.

  The rows are built by `build_workers` processes into array_record shards of `shard_docs`
  documents under `data_dir` (shards.py) and read by index, never whole: the same path for the
  demo and for a web-scale mixture ('mix:...'). source_data_dir: where a tfds:<name> source's
  dataset lives (None: TFDS's default). blank_line_docs: a files: text file holds one document
  per blank-line-separated block. process_index / process_count default to
  jax.process_index() / jax.process_count().
  """
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index, process_count = jax.process_index(), jax.process_count()
  tok = tokenizer.load(resolve_vocab(vocab, cache_dir))
  parts = shards.prepare_shards(source, vocab, example, data_dir, cache_dir,
                                workers=build_workers, docs_per_shard=shard_docs,
                                blank_line_docs=blank_line_docs,
                                source_data_dir=source_data_dir)
  return Loader(shards.ShardedRows(parts, split),
                LoaderConfig(global_batch_size, seed, num_epochs, process_index, process_count,
                             worker_count=worker_count, prefetch=prefetch,
                             example_ids=example_ids), tokenizer=tok)
