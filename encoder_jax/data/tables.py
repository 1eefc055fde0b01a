"""Today's corpora as shard sources: parquet files (pyarrow) and Hugging Face datasets.

  parquet:<glob>[,<glob>...][:<column>]    parquet files, local or gs://; one document per row,
                                           its text in <column> (default "text")
  hf:<path or name>[:<config>]:<split>[:<column>]
                                           a `datasets` dataset: a local `save_to_disk` folder
                                           (of a DatasetDict: <split> picks one; of a single
                                           Dataset: <split> only names it), a local folder of
                                           data files (e.g. a parquet tree
                                           data/train-*.parquet), or a hub name (the hub is
                                           the user's: this package never logs in; on a pod
                                           every host loads it into its own HF cache)

Document ids are stable, independent of where the data sits: `<file relative to the files'
common folder>#<row in that file>` for parquet, `<name>[/<config>]/<split>/<row>` for hf (the
folder's base name, or the hub name). The train/validation hash split and the token cache key
on them.

Memory: a parquet file is read a batch of rows at a time (ParquetFile.iter_batches, one row
group after another, only the text column, no pre-buffering), never whole; an hf dataset is
Arrow memory-mapped by `datasets` and read in batches of rows.

Bad input is one ValueError line naming the file or dataset and the fix: a missing column lists
the columns there are, a column that is not text says its type, an unreadable (e.g. truncated)
parquet file is named. Rows whose text is null or blank are skipped and counted
(ReadStats.empty_documents).
"""
import dataclasses
import functools
import os
import re
import sys
from collections.abc import Iterator

from etils import epath

from encoder_jax import paths
from encoder_jax.data import sources

DEFAULT_COLUMN = "text"
_BATCH_ROWS = 1024  # rows per batch read (a batch never spans row groups)


def _first_line(e: BaseException) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


# ---------------------------------------------------------------------------------- parquet


def parse_parquet_spec(rest: str) -> tuple[list[str], str]:
  """'<glob>[,<glob>...][:<column>]' (what follows 'parquet:') -> (globs, column)."""
  globs, column = sources.parse_files_spec(rest)
  return globs, column or DEFAULT_COLUMN


def _open_parquet(path: str):
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  # A local file by name (pyarrow reads it directly); an object through etils/gcsfs, whose
  # reads are ranged (pyarrow asks for the footer, then for each row group's column chunk).
  source = epath.Path(path).open("rb") if paths.is_uri(path) else path
  try:
    # pre_buffer=False: pyarrow 26 pre-buffers by default, which fetched the column chunks
    # of all row groups ahead (15 MiB of Arrow memory for a 14 MiB file of 40 row groups,
    # against 2 MiB without: tests/data/test_tables.py).
    return pq.ParquetFile(source, pre_buffer=False)
  except Exception as e:  # ArrowInvalid (not parquet), OSError (truncated): both "unreadable"
    raise ValueError(f"{path} is not a readable parquet file ({_first_line(e)}); replace or "
                     "remove it") from e


def _text_column(pf, path: str, column: str) -> None:
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  schema = pf.schema_arrow
  if column not in schema.names:
    raise ValueError(f"{path} has no column {column!r}; its columns are {schema.names}: name "
                     "the text column after the glob, e.g. 'parquet:<glob>:<column>'")
  kind = schema.field(column).type
  if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
          or pa.types.is_string_view(kind)):
    text = [f.name for f in schema if pa.types.is_string(f.type) or
            pa.types.is_large_string(f.type) or pa.types.is_string_view(f.type)]
    raise ValueError(f"{path}: column {column!r} holds {kind}, not text; its text columns are "
                     f"{text}: name one after the glob, e.g. 'parquet:<glob>:<column>'")


def _row_batches(pf, path: str, column: str) -> Iterator[list]:
  """The column's values, a batch of rows at a time; a read error names the file."""
  batches = pf.iter_batches(batch_size=_BATCH_ROWS, columns=[column], use_threads=False)
  while True:
    try:
      batch = next(batches)
    except StopIteration:
      return
    except Exception as e:  # a damaged row group: ArrowInvalid / OSError
      raise ValueError(f"{path} is not a readable parquet file ({_first_line(e)}); replace or "
                       "remove it") from e
    yield batch.column(0).to_pylist()


def parquet_texts(globs: list[str], column: str = DEFAULT_COLUMN,
                  stats: sources.ReadStats | None = None) -> Iterator[tuple[str, str]]:
  """(doc_id, text) of every row of the files, streamed a batch of rows at a time."""
  stats = stats if stats is not None else sources.ReadStats()
  files, root = sources.resolve_files(globs)
  for path in files:
    stats.files += 1
    pf = _open_parquet(path)
    _text_column(pf, path, column)
    if pf.metadata.num_rows == 0:
      stats.empty_files += 1
    rel, row = paths.relpath(path, root), 0
    for values in _row_batches(pf, path, column):
      for text in values:
        if isinstance(text, str) and text.strip():
          yield f"{rel}#{row}", text
        else:
          stats.empty_documents += 1
        row += 1


# --------------------------------------------------------------------------------------- hf


@dataclasses.dataclass(frozen=True)
class HFSpec:
  path: str              # a local folder, or a hub name
  config: str | None
  split: str
  column: str = DEFAULT_COLUMN

  @property
  def name(self) -> str:
    """The dataset's name in document ids: a folder's base name, or the hub name."""
    local = _is_local(self.path)
    base = os.path.basename(os.path.normpath(self.path)) if local else self.path
    return f"{base}/{self.config}" if self.config else base


_SPLIT = re.compile(r"train|validation|valid|val|test|dev|eval|evaluation|unsupervised|all")
_URI_HEAD = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
HF_FORM = "'hf:<path or name>[:<config>]:<split>[:<column>]'"


def parse_hf_spec(rest: str) -> HFSpec:
  """What follows 'hf:'. Two items after the path are <config>:<split> when the second names a
  split (train, validation, test, ...), else <split>:<column>; three are config, split and
  column (an empty config is the default one: 'hf:<path>::<split>:<column>')."""
  head = _URI_HEAD.match(rest)
  start = head.end() if head else 0
  path, *items = rest[start:].split(":")
  path = rest[:start] + path
  if not path or not 1 <= len(items) <= 3 or not all(items[-2:] if len(items) > 1 else items):
    raise ValueError(f"source 'hf:{rest}': expected {HF_FORM}, e.g. "
                     "'hf:wikimedia/wikipedia:20231101.en:train:text' or 'hf:my_dataset:train'")
  if len(items) == 1:
    return HFSpec(path, None, items[0])
  if len(items) == 3:
    return HFSpec(path, items[0] or None, items[1], items[2])
  first, second = (bool(_SPLIT.fullmatch(x)) for x in items)
  if first == second:
    raise ValueError(f"source 'hf:{rest}': cannot tell whether {items} is <config>:<split> or "
                     "<split>:<column>; write all three, 'hf:<path>:<config>:<split>:<column>' "
                     f"(an empty config for the default: 'hf:{path}::{items[0]}:<column>')")
  return HFSpec(path, items[0], items[1]) if second else HFSpec(path, None, items[0], items[1])


def _is_local(path: str) -> bool:
  return (paths.is_uri(path) or os.path.isabs(path) or path.startswith((".", "~"))
          or os.path.exists(path))


def quiet_progress_bars() -> None:
  """`datasets` and the hub draw tqdm bars; written into a log file they are escape codes."""
  if not sys.stderr.isatty():
    import datasets  # pylint: disable=g-import-not-at-top
    import huggingface_hub  # pylint: disable=g-import-not-at-top
    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()


@functools.lru_cache(maxsize=8)
def open_hf(spec: HFSpec):
  """The split of the dataset as a `datasets.Dataset` (memory-mapped Arrow), checked for its
  column. A folder `save_to_disk` wrote is loaded as it is; anything else through
  `load_dataset` (local data files, or the hub with the user's own access)."""
  import datasets  # pylint: disable=g-import-not-at-top
  quiet_progress_bars()
  where = f"hf dataset {spec.path!r}" + (f" config {spec.config!r}" if spec.config else "")
  local = _is_local(spec.path)
  if local and not epath.Path(spec.path).exists():
    raise FileNotFoundError(f"{where}: no such folder; give a `save_to_disk` folder, a folder "
                            "of data files, or a hub dataset name")
  saved = local and any((epath.Path(spec.path) / f).exists() for f in
                        ("dataset_dict.json", "state.json"))
  try:
    if saved:
      if spec.config:
        raise ValueError(f"{where}: a save_to_disk folder has no configs; write {HF_FORM} "
                         "without <config>")
      ds = datasets.load_from_disk(spec.path)
      if isinstance(ds, datasets.DatasetDict):
        if spec.split not in ds:
          raise ValueError(f"{where} has no split {spec.split!r}; its splits are {list(ds)}")
        ds = ds[spec.split]
    else:
      ds = datasets.load_dataset(spec.path, spec.config, split=spec.split)
  except ValueError:
    raise
  except Exception as e:  # the hub's and the loaders' own types: all mean "cannot open it"
    raise ValueError(f"cannot open {where} split {spec.split!r}: {_first_line(e)}") from e
  if spec.column not in ds.column_names:
    raise ValueError(f"{where} has no column {spec.column!r}; its columns are "
                     f"{ds.column_names}: name the text column last, {HF_FORM}")
  return ds


def hf_texts(spec: HFSpec, stats: sources.ReadStats | None = None
             ) -> Iterator[tuple[str, str]]:
  """(doc_id, text) of every row of the dataset's split, read in batches of rows."""
  stats = stats if stats is not None else sources.ReadStats()
  ds = open_hf(spec).select_columns([spec.column])
  row, name = 0, f"{spec.name}/{spec.split}"
  for batch in ds.iter(batch_size=_BATCH_ROWS):
    for text in batch[spec.column]:
      if isinstance(text, str) and text.strip():
        yield f"{name}/{row}", text
      else:
        stats.empty_documents += 1
      row += 1


def hf_data_files(spec: HFSpec) -> tuple[list[str], str]:
  """(the Arrow files that hold the dataset's split, its fingerprint): what identifies its
  data (shards.source_key hashes the files; the fingerprint when it has none, in memory)."""
  ds = open_hf(spec)
  return [f["filename"] for f in ds.cache_files], ds._fingerprint  # pylint: disable=protected-access
