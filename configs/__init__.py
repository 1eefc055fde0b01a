"""ml_collections config files: pretrain.py (pre-training) and finetune.py (fine-tuning), and
the parser of their `file.py:key=value,...` arguments."""
import re


def parse_arg(arg: str | None, *, flags: tuple[str, ...] = (), commas_in: tuple[str, ...] = (),
              **defaults) -> dict[str, str]:
  """'size=mini,norm=pre' -> {'size': 'mini', 'norm': 'pre'} over `defaults`.

  A comma starts a new pair only before a known key (or a bare flag), so the values of the keys
  in `commas_in` may hold commas (a checkpoint path such as a grid point folder
  `objective=mlm,seed=0`). `flags` may be given bare ("runlocal" means runlocal=True). Unknown
  keys raise a ValueError naming the valid ones.
  """
  out = dict(defaults)
  starts = "|".join(map(re.escape, sorted(set(defaults) | set(flags), key=len, reverse=True)))
  for part in filter(None, re.split(rf",(?=(?:{starts})(?:=|,|$))", arg or "")):
    key, sep, value = part.partition("=")
    if not sep and key in flags:
      sep, value = "=", "True"
    if sep and key in defaults and "," in value and key not in commas_in:
      part = value.split(",", 1)[1]  # the piece that starts no known key
    elif sep and key in defaults:
      out[key] = value
      continue
    raise ValueError(f"Bad config argument {part!r}: use key=value with key in "
                     f"{sorted(defaults)}.")
  return out
