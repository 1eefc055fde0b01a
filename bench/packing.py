r"""Packed vs padded rows: tokens of text per second through the real train step, interleaved.

  python -m bench.packing                    # doc_sentences and sentence_pair, T=128, batch 16
  python -m bench.packing --formats=sentence_pair --max_length=512 --rounds=9

The same model (ModernBERT's block, recipe=modernbert's 30% MLM and AdamW; width and depth
from the flags) trains on the same examples of the demo corpus two ways: `padded`, one example
a row (data.pack=False), and `packed`, several examples a row, each its own segment
(data.pack=True). Rows come from the trainer's own row shards and loader
(setup.make_loader); the batches are read ahead of the timing, so the step alone is timed.
Both variants run one compiled step (equal shapes), each from the same initial state.

Speed is tokens of *text* per second: the tokens of a batch that are neither padding nor a
special ([CLS], [SEP]), over the step's wall time; a padded row computes its pad positions all
the same, which is what packing recovers. Rounds alternate the order (padded packed, packed
padded, ...) so a shared machine's drift hits both alike; the table has per-variant medians
and the median of the per-round ratios packed / padded, the figure to quote. Beside it, the same
ratio per CPU second of this process (XLA's threads included), which other processes on a
shared machine disturb less than the wall clock. Writes the printout to
bench/results/packing_<date>.txt.
"""
from __future__ import annotations

import datetime
import os
import pathlib
import statistics
import time

from absl import app, flags

_FORMATS = flags.DEFINE_list("formats", ["doc_sentences", "sentence_pair"],
                             "Row formats to compare packed vs padded.")
_T = flags.DEFINE_integer("max_length", 128, "Tokens per row.")
_B = flags.DEFINE_integer("batch_size", 16, "Rows per step.")
_SHAPE = flags.DEFINE_list("model", ["4", "256", "4", "384"],
                           "num_layers, hidden_size, num_heads, ffn_size of the ModernBERT block.")
_WINDOW = flags.DEFINE_integer("local_window", 64, "Sliding window of the local layers.")
_VOCAB = flags.DEFINE_string("vocab", "demo", "data.vocab (the demo WordPiece by default).")
_ROUNDS = flags.DEFINE_integer("rounds", 7, "Interleaved rounds.")
_STEPS = flags.DEFINE_integer("steps", 8, "Timed steps per variant per round.")
_OUT = flags.DEFINE_string("out", "", "Where the printout goes (default "
                           "bench/results/packing_<date>.txt; '-' for none).")

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def make_config(fmt: str, pack: bool):
  from configs import pretrain  # pylint: disable=g-import-not-at-top
  config = pretrain.get_config("recipe=modernbert,precision=fp32")
  layers, hidden, heads, ffn = (int(x) for x in _SHAPE.value)
  config.model.update(dict(num_layers=layers, hidden_size=hidden, num_heads=heads,
                           ffn_size=ffn, local_window=_WINDOW.value))
  config.data.update(dict(vocab=_VOCAB.value, format=fmt, pack=pack, max_length=_T.value,
                          batch_size=_B.value))
  config.optim.update(dict(warmup_steps=10, decay_frac=0.1))
  config.train.steps = 1000
  return config


def text_tokens(batch, special_ids) -> int:
  import numpy as np  # pylint: disable=g-import-not-at-top
  return int((batch["mask"].astype(bool) & ~np.isin(batch["input_ids"], special_ids)).sum())


def variant(fmt: str, pack: bool, n_batches: int):
  """(config, batches on device, their text tokens each, their pad share)."""
  import jax  # pylint: disable=g-import-not-at-top
  from encoder_jax.train import setup  # pylint: disable=g-import-not-at-top
  config = make_config(fmt, pack)
  loader = setup.make_loader(config, "train")
  it = iter(loader)
  host = [next(it) for _ in range(n_batches)]
  specials = list(loader.tokenizer.special_ids)
  pad = 1.0 - sum(b["mask"].sum() for b in host) / (n_batches * _B.value * _T.value)
  rows = loader.rows  # every row of the split: its pad share, from the records' lengths
  corpus_pad = 1.0 - len(rows.real_ids(range(len(rows)))) / (len(rows) * _T.value)
  return (config, loader.tokenizer, [jax.device_put(b) for b in host],
          [text_tokens(b, specials) for b in host], float(pad), (len(rows), corpus_pad))


def build_step(config, tok):
  from encoder_jax.train import loop, setup, step as step_lib  # pylint: disable=g-import-not-at-top
  from encoder_jax.train.optim import OptimConfig, build_optimizer  # pylint: disable=g-import-not-at-top
  cfg = setup.model_config(config, tok.vocab_size, pad_id=tok.pad_id)
  obj = setup.objective_config(config, tok)
  od = config.optim.to_dict() | {"total_steps": config.train.steps}
  parts = build_optimizer(OptimConfig.from_dict(od), num_layers=cfg.num_layers)
  tr, init = step_lib.create(cfg, obj, parts.tx, parts.schedule, config.seed)
  return step_lib.make_train_step(tr), (lambda: loop.initial_state(init)), cfg


def run_format(fmt: str, say) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  runs = {}
  for name, pack in (("padded", False), ("packed", True)):
    runs[name] = dict(zip(("config", "tok", "batches", "text", "pad", "rows"),
                          variant(fmt, pack, _STEPS.value)))
  step, init, cfg = build_step(runs["padded"]["config"], runs["padded"]["tok"])
  t0 = time.perf_counter()
  for r in runs.values():
    r["state"] = init()
    r["state"], m = step(r["state"], r["batches"][0])
    jax.block_until_ready(m)
  say(f"\n{fmt}, T={_T.value}, batch {_B.value}: compiled + first steps in "
      f"{time.perf_counter() - t0:.1f} s; {cfg.num_layers} x {cfg.hidden_size}, "
      f"{cfg.num_heads} heads, FFN {cfg.ffn_size} (GeGLU), window {cfg.local_window}, "
      f"vocab {cfg.vocab_size}")
  rates = {name: [] for name in runs}
  for rnd in range(_ROUNDS.value):
    for name in (("padded", "packed") if rnd % 2 == 0 else ("packed", "padded")):
      r = runs[name]
      t, cpu = time.perf_counter(), time.process_time()
      for b in r["batches"]:
        r["state"], m = step(r["state"], b)
      jax.block_until_ready(m)
      wall, cpu = time.perf_counter() - t, time.process_time() - cpu
      rates[name].append((sum(r["text"]) / wall, len(r["batches"]) / wall,
                          sum(r["text"]) / cpu))
  ratios = [pk[0] / pd[0] for pk, pd in zip(rates["packed"], rates["padded"])]
  cpu_ratios = [pk[2] / pd[2] for pk, pd in zip(rates["packed"], rates["padded"])]
  for name, r in runs.items():
    tps = statistics.median(x[0] for x in rates[name])
    sps = statistics.median(x[1] for x in rates[name])
    n_rows, corpus_pad = r["rows"]
    say(f"  {name:6s} pad share {r['pad']:.3f} ({corpus_pad:.3f} over all {n_rows} rows), "
        f"{sum(r['text']) / len(r['text']):5.0f} text tokens a batch | {tps:7.0f} text "
        f"tokens/s, {1e3 / sps:6.1f} ms a step (medians of {_ROUNDS.value} rounds)")
  fill = sum(runs["packed"]["text"]) / sum(runs["padded"]["text"])
  say(f"  packed / padded text tokens/s: median x{statistics.median(ratios):.2f} (rounds: "
      + ", ".join(f"{x:.2f}" for x in ratios) + f"); per CPU second of this process: "
      f"x{statistics.median(cpu_ratios):.2f} (rounds: "
      + ", ".join(f"{x:.2f}" for x in cpu_ratios) + f"); their text tokens a batch alone: "
      f"x{fill:.2f}")


def main(argv):
  del argv
  out = _OUT.value or str(RESULTS / f"packing_{datetime.date.today().isoformat()}.txt")
  lines = []

  def say(line: str) -> None:
    print(line, flush=True)
    lines.append(line)

  say(f"python -m bench.packing {datetime.datetime.now().isoformat(timespec='minutes')}, "
      f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
  for fmt in _FORMATS.value:
    run_format(fmt, say)
  say(f"load average {os.getloadavg()[0]:.1f} at the end (a shared machine: ratios, taken in "
      "the same rounds, are the figures to quote)")
  if out != "-":
    pathlib.Path(out).write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
  app.run(main)
