"""The one reader of a pre-training run folder: its config, its Setup, its vocab, which
checkpoint counts, and that checkpoint's parameters on one device.

  run = RunDir.find("runs/x")      # the workdir, its checkpoints/, a checkpoints/<step> folder
                                   # or that step's state/ folder; local or gs://
  run.config, run.setup, run.vocab # config.json as the trainer wrote it, setup.build of it,
                                   # the vocab.txt it names (resolved)
  step = run.good_step(report=print)   # the step folder named, or the newest that verifies
  model = run.model(step)          # the pre-training model (eval mode) with that step's params

Export (encoder_jax.convert.export), fine-tuning and init_from (train/pretrained.py) read
runs only through this class, so they agree on what a folder holds: the model is rebuilt from
the whole recorded config (every ModelConfig field, those that leave no trace in a parameter
shape included: activation, position_bias, norm eps, ...), never guessed from the shapes.

Layout (what encoder_jax.train.loop writes):
  <workdir>/config.json                       the config of the newest checkpoints
  <workdir>/checkpoints/<step>/state          TrainState(step, params, opt_state), Orbax
  <workdir>/checkpoints/<step>/checksums.json size + sha256 of every file: the seal
A folder without config.json is refused in one line naming what it lacks: the parameters
alone do not say how to compute with them.

Which checkpoint counts is one rule, `newest_good`: the newest step whose files match their
checksums; a folder without checksums.json (its save never finished, or an older encoder_jax
wrote it) does not count. The trainer applies it too (train/checkpoint.py
Checkpointer.newest_good), in its writer's role: it moves the damaged folders aside, where a
reader here only reports them and leaves them for the run to deal with when it resumes.
"""
from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
from typing import Any, Callable, Iterable, Sequence

from etils import epath
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from encoder_jax import paths
from encoder_jax.data.vocab import resolve_vocab
from encoder_jax.model import vocab_padding
from encoder_jax.objectives import pretraining
from encoder_jax.train import setup as setup_lib

CONFIG_FILE = setup_lib.CONFIG_FILE  # where the trainer records its config
CHECKPOINTS = "checkpoints"
STATE = "state"  # the TrainState item of a checkpoint step folder
CHECKSUMS = "checksums.json"


class CheckpointError(ValueError):
  """A checkpoint that cannot be used (damaged, or not matching the run); names step and file."""


# ------------------------------------------------------------------------------ checksums


def _sha256(path: epath.Path) -> str:
  # Not hashlib.file_digest: it needs readinto(), which tf.io.gfile's files (what epath opens
  # gs:// with wherever TensorFlow is importable) do not have.
  h = hashlib.sha256()
  with path.open("rb") as f:
    while chunk := f.read(1 << 22):
      h.update(chunk)
  return h.hexdigest()


def hash_all(step_dir: epath.Path, rels: Sequence[str]) -> list[str]:
  """sha256 of each file `rels` under `step_dir`, in order."""
  # hashlib releases the GIL on large buffers: a few threads hash several files at once.
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    return list(pool.map(lambda rel: _sha256(step_dir / rel), rels))


def verify(step_dir: str | epath.PathLike) -> str | None:
  """None if every file of the step folder matches its checksum, else what is wrong (a line)."""
  step_dir = epath.Path(step_dir)
  try:
    sums = json.loads((step_dir / CHECKSUMS).read_text())["files"]
  except FileNotFoundError:
    return f"no {CHECKSUMS} (its save never completed, or an older encoder_jax wrote it)"
  except (ValueError, KeyError, TypeError) as e:
    return f"{CHECKSUMS} is unreadable ({type(e).__name__}: {e})"
  problems = []
  for rel, want in sorted(sums.items()):
    path = step_dir / rel
    if not path.exists():
      problems.append(f"{rel} is missing")
    elif (size := path.stat().length) != want["size"]:
      problems.append(f"{rel} has {size} bytes, {want['size']} were written (truncated or "
                      "overwritten)")
  if not problems:
    for rel, got in zip(sorted(sums), hash_all(step_dir, sorted(sums))):
      if got != sums[rel]["sha256"]:
        problems.append(f"{rel} does not match its sha256 (changed bytes)")
  if not problems:
    return None
  more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
  return problems[0] + more


def newest_good(directory: epath.Path, steps: Iterable[int], *, below: int | None = None,
                on_damaged: Callable[[int, str], None]) -> int | None:
  """THE rule for which checkpoint counts: the newest of `steps` (below `below`, if given)
  whose folder in `directory` verifies; `on_damaged(step, problem)` is called for each newer
  one that does not (the trainer moves it aside, a reader reports it). None if none does."""
  for step in sorted(steps, reverse=True):
    if below is not None and step >= below:
      continue
    problem = verify(directory / str(step))
    if problem is None:
      return step
    on_damaged(step, problem)
  return None


def step_folders(ckpt_dir: epath.Path) -> list[int]:
  """The steps with a folder in `ckpt_dir` (sealed or not), oldest first. Orbax's temporary
  folders of a save in flight carry a suffix, so they are not among them."""
  return sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit() and p.is_dir())


# ------------------------------------------------------------------------------ the reader


class RunDir:
  """A pre-training run's workdir, read-only (a run may be read while it trains)."""

  def __init__(self, workdir: epath.Path, step: int | None = None):
    self.workdir, self.step = workdir, step  # step: the checkpoint folder the user named

  @classmethod
  def find(cls, path: str | epath.PathLike) -> RunDir:
    """The run at `path`: its workdir, the workdir's checkpoints/, checkpoints/<step> or
    checkpoints/<step>/state (the last two name that step). Raises FileNotFoundError naming
    what is missing."""
    given = p = paths.absolute(path)
    if not p.exists():
      raise FileNotFoundError(f"{given} does not exist; give a pre-training workdir (it holds "
                              f"{CONFIG_FILE} and {CHECKPOINTS}/) or one of its "
                              f"{CHECKPOINTS}/<step> folders.")
    step = None
    if p.name == STATE and p.parent.name.isdigit():
      p = p.parent
    if p.name.isdigit() and p.parent.name == CHECKPOINTS:
      step, p = int(p.name), p.parent.parent
    elif p.name == CHECKPOINTS:
      p = p.parent
    if not (p / CONFIG_FILE).is_file():
      lacks = [CONFIG_FILE] + ([f"{CHECKPOINTS}/"] if not (p / CHECKPOINTS).is_dir() else [])
      raise FileNotFoundError(
          f"{given} is not (in) a pre-training run: {p} lacks {' and '.join(lacks)}, which "
          "`encoder_jax.main --mode=pretrain` writes into its workdir (the config says how to "
          "compute with the parameters); give that workdir or one of its "
          f"{CHECKPOINTS}/<step> folders.")
    return cls(p, step)

  @property
  def config_file(self) -> epath.Path:
    return self.workdir / CONFIG_FILE

  @property
  def checkpoints(self) -> epath.Path:
    return self.workdir / CHECKPOINTS

  @functools.cached_property
  def config(self) -> ml_collections.ConfigDict:
    try:
      return ml_collections.ConfigDict(json.loads(self.config_file.read_text()))
    except ValueError as e:
      raise ValueError(f"{self.config_file} is not the JSON config the trainer writes "
                       f"({type(e).__name__}: {e}).") from None

  @functools.cached_property
  def setup(self) -> setup_lib.Setup:
    """setup.build of the recorded config, for this platform (a recorded "auto" resolves
    here; the layer layout the trainer settled is recorded, so parameter trees match)."""
    return setup_lib.build(self.config)

  @property
  def model_cfg(self):
    return self.setup.model_cfg

  @functools.cached_property
  def vocab(self) -> str:
    """The vocab.txt the run tokenizes with (data.vocab resolved: 'minilm', 'demo', a path)."""
    return resolve_vocab(self.config.data.vocab, self.config.data.cache_dir or None)

  # --------------------------------------------------------------------------- checkpoints
  def good_step(self, step: int | None = None, *,
                report: Callable[[str], None] = print) -> int:
    """`step` (default: the folder `find` was given, else the newest that verifies) once its
    files match their checksums. Damaged newer ones are reported and skipped, left in place
    (the run sets them aside when it resumes); a damaged step that was asked for is refused."""
    step = self.step if step is None else step
    ckpt_dir = self.checkpoints
    if not ckpt_dir.is_dir():
      raise FileNotFoundError(f"{self.workdir} has no {CHECKPOINTS}/ folder: the run has not "
                              "saved a checkpoint yet.")
    steps = step_folders(ckpt_dir)
    if step is not None:
      if step not in steps:
        raise ValueError(f"step {step} has no checkpoint in {ckpt_dir}; available: {steps}.")
      if problem := verify(ckpt_dir / str(step)):
        raise CheckpointError(f"checkpoint {step} in {ckpt_dir} is damaged: {problem}. Choose "
                              f"another step (available: {steps}).")
      return step
    damaged = []

    def skip(s: int, problem: str) -> None:
      damaged.append(f"{s}: {problem}")
      report(f"skipping checkpoint {s} in {ckpt_dir}: {problem}")

    found = newest_good(ckpt_dir, steps, on_damaged=skip)
    if found is None:
      raise CheckpointError(f"{ckpt_dir} holds no checkpoint whose checksums verify" +
                            (f" (newest, {damaged[0]})." if damaged else " (it is empty)."))
    return found

  def params(self, step: int) -> nnx.State:
    """The parameters of checkpoint `step` on this host's first device, whatever mesh the
    run used (Orbax reshards on read); the step and the optimizer state are not read."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                            jax.eval_shape(self.setup.init_fn))
    # Only the `params` subtree (partial_restore): the step and the moments (2x the parameters
    # under AdamW) stay on disk.
    target = {"params": abstract.params}
    item = self.checkpoints / str(step) / STATE
    try:
      # Read-only: no CheckpointManager, which would clean up (delete) a save in flight.
      with ocp.PyTreeCheckpointer() as reader:
        return reader.restore(item, args=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True))["params"]
    except Exception as e:  # pylint: disable=broad-except
      first = (str(e).strip().splitlines() or [""])[0]
      raise CheckpointError(
          f"checkpoint {step} in {self.checkpoints} does not restore into the model of "
          f"{self.config_file} ({type(e).__name__}: {first}); its files match their "
          "checksums, so that config.json no longer describes it.") from e

  def model(self, step: int, **numerics: Any) -> nnx.Module:
    """The run's pre-training model (BertForPreTraining or ElectraModel) with the parameters
    of checkpoint `step`, in eval mode. `numerics`: ModelConfig fields to compute with
    instead of the run's (dtype="float32", ...); ones that change a parameter's shape fail,
    except vocab_pad_multiple=1: the token table and MLM biases without their padding rows
    (what an export writes: a HF model has exactly vocab_size rows)."""
    s = self.setup
    graphdef, params = s.trainer.graphdef_eval, self.params(step)
    if numerics:
      cfg = s.model_cfg.replace(**numerics)
      abstract = nnx.eval_shape(lambda: pretraining.build_model(cfg, s.obj, rngs=nnx.Rngs(0)))
      abstract.eval()
      graphdef, _ = nnx.split(abstract, nnx.Param)
      if cfg.padded_vocab_size != s.model_cfg.padded_vocab_size:
        params = vocab_padding.unpad_vocab(params, cfg.padded_vocab_size)
    return nnx.merge(graphdef, params)

  def pure_params(self, step: int) -> dict[str, Any]:
    """params(step) as nested dicts of host numpy arrays."""
    return jax.tree.map(np.asarray, nnx.to_pure_dict(self.params(step)))
