r"""Peak memory of the train step: XLA's compiled memory analysis and the process RSS.

  python -m bench.memory                                # base B8x128 MLM+NSP, remat none/dots/full
  python -m bench.memory --size=mini --batch_size=32 --remat_policies=none --nohf

Two views:
  * compiled: `jit(step).lower(...).compile().memory_analysis()` from abstract shapes, per
    remat policy (fresh process each, bench/compile_time.py): arguments (params + optimizer
    state + batch), outputs, the part of the outputs aliased to donated arguments, and XLA's
    temporary buffers (activations kept for the backward pass, gradients, ...). With donation
    the new state reuses the old one's buffers, so the step needs about arguments + temp.
  * RSS: peak resident memory of a process that built the state and ran steps (our step with
    the first remat policy, and HF torch BertForPreTraining on the same batches), which adds
    the runtime, compiled code and the Python heap.
"""
from __future__ import annotations


from absl import app, flags

from bench import compile_time, systems

_SIZE = flags.DEFINE_string("size", "base", "Model size.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Batch size.")
_SEQ = flags.DEFINE_integer("seq_len", 128, "Tokens per row.")
_REMATS = flags.DEFINE_list("remat_policies", ["none", "dots", "full"],
                            "Remat policies to analyse (compiled view).")
_HF = flags.DEFINE_bool("hf", True, "Also measure HF torch's RSS.")
_RSS = flags.DEFINE_bool("rss", True, "Run steps in worker processes and read their RSS.")
_STEPS = flags.DEFINE_integer("steps", 2, "Steps before reading the RSS.")

GiB = 2 ** 30


def main(argv):
  del argv
  base = dict(system="ours", size=_SIZE.value, batch_size=_BATCH.value, seq_len=_SEQ.value,
              objective="mlm", nsp=True)
  print(f"compiled memory analysis, {_SIZE.value} MLM+NSP step B{_BATCH.value}x{_SEQ.value}, fp32")
  head = (f"{'remat':14s} {'arguments':>10s} {'outputs':>8s} {'aliased':>8s} {'temp':>8s} "
          f"{'args+temp':>10s} {'code':>6s}  (GiB)")
  rows = []
  for remat in _REMATS.value:
    m = compile_time.compile_in_subprocess(dict(base, remat_policy=remat))
    rows.append((remat, m))
    print(f"  {remat}: temp {m['temp_bytes'] / GiB:.2f} GiB (compile {m['compile_wall']:.0f} s)")
  print(head)
  print("-" * len(head))
  for remat, m in rows:
    print(f"{remat:14s} {m['argument_bytes'] / GiB:10.2f} {m['output_bytes'] / GiB:8.2f} "
          f"{m['alias_bytes'] / GiB:8.2f} {m['temp_bytes'] / GiB:8.2f} "
          f"{(m['argument_bytes'] + m['temp_bytes']) / GiB:10.2f} "
          f"{(m['generated_code_bytes'] or 0) / GiB:6.3f}")
  if not _RSS.value:
    return
  batches = systems.load_batches(_BATCH.value, _SEQ.value, n=2)
  specs = {"ours": systems.StepSpec(remat_policy=_REMATS.value[0], **base)}
  if _HF.value:
    specs["hf"] = systems.StepSpec(**dict(base, system="hf"))
  print(f"\nprocess RSS after {_STEPS.value} steps (each system alone in its own process)")
  for name, spec in specs.items():
    b = systems.hf_batches(batches, _SEQ.value) if spec.system == "hf" else batches
    with systems.Worker(spec, b) as w:
      w.run(_STEPS.value)
      info = w.info()
    print(f"  {spec.label:40s} peak RSS {info['peak_rss'] / GiB:6.2f} GiB, "
          f"now {info.get('rss', 0) / GiB:6.2f} GiB")


if __name__ == "__main__":
  app.run(main)
