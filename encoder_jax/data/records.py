"""The row record of the pre-training shards: one array_record record per row.

Layout (encode_row / decode_row): int32 header [n real tokens, k packed examples, label, id
width], the n ids (uint16, or int32 for vocabularies past 65,535), the k example lengths
(uint16), word starts and token types as bit arrays. Decoding gives back exactly the fixed-
length dict `examples.Rows` makes (about 2.3 bytes per real token instead of 18 per position).
"""
import numpy as np

from encoder_jax.data import examples

HEADER = 4  # int32: n, k, label, id width in bytes


def encode_row(row: dict[str, np.ndarray]) -> bytes:
  """A row of examples.Rows -> compact bytes (only its n real tokens)."""
  n = int(row["mask"].sum())
  seg = row["segment_ids"][:n]
  k = int(seg.max()) if n else 0
  lens_K = np.bincount(seg, minlength=k + 1)[1:].astype(np.uint16)
  ids = row["input_ids"][:n]
  width = 2 if n == 0 or int(ids.max()) < 1 << 16 else 4
  label = int(row["nsp_label"]) if "nsp_label" in row else -1
  return b"".join([
      np.array([n, k, label, width], np.int32).tobytes(),
      ids.astype(np.uint16 if width == 2 else np.int32).tobytes(),
      lens_K.tobytes(),
      np.packbits(row["word_starts"][:n]).tobytes(),
      np.packbits(row["token_types"][:n].astype(bool)).tobytes()])


def decode_row(data: bytes, max_length: int, pad_id: int,
               with_label: bool) -> dict[str, np.ndarray]:
  """`encode_row`'s bytes -> the fixed-length dict (see examples.Rows)."""
  n, k, label, width = (int(x) for x in np.frombuffer(data, np.int32, HEADER))
  at = 4 * HEADER
  ids = np.frombuffer(data, np.uint16 if width == 2 else np.int32, n, at)
  at += n * width
  lens_K = np.frombuffer(data, np.uint16, k, at).astype(np.int64)
  at += 2 * k
  nb = (n + 7) // 8
  word_starts = np.unpackbits(np.frombuffer(data, np.uint8, nb, at), count=n).astype(bool)
  types = np.unpackbits(np.frombuffer(data, np.uint8, nb, at + nb), count=n)
  row = examples.empty_row(max_length, pad_id)
  row["input_ids"][:n] = ids
  row["mask"][:n] = True
  row["token_types"][:n] = types
  row["word_starts"][:n] = word_starts
  starts_K = np.concatenate([[0], np.cumsum(lens_K)[:-1]]).astype(np.int64)
  row["segment_ids"][:n] = np.repeat(np.arange(1, k + 1), lens_K)
  row["positions"][:n] = np.arange(n) - np.repeat(starts_K, lens_K)
  if with_label:
    row["nsp_label"] = np.int32(label)
  return row


def real_ids(data: bytes) -> np.ndarray:
  """The n real token ids of a record, without decoding the rest (what unigram counting
  needs)."""
  n, _, _, width = (int(x) for x in np.frombuffer(data, np.int32, HEADER))
  return np.frombuffer(data, np.uint16 if width == 2 else np.int32, n, 4 * HEADER)
