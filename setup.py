"""encoder_jax: BERT / RoBERTa / ELECTRA encoder pre-training in JAX + Flax NNX.

Versions are pinned to a set that installs together on Python 3.11 with `pip check` clean
(README, "Decisions a successor needs"). Flax NNX's API moves between minor releases, so do not
loosen the flax pin without running the test-suite.
"""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "tensorflow-datasets==4.9.10",
    "grain==0.2.18",
    "array-record==0.8.6",
    "ml-collections==1.1.0",
    "absl-py==2.5.1",
    "filelock==4.3.1",  # one builder of a TFDS dataset at a time across processes
    "numpy==2.4.6",
    "scipy==1.17.1",  # jax needs it anyway; the fine-tuning Spearman ranks with it
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "tensorboardX==2.6.5",  # writes the event files (tensorboard's own writer needs TF)
    "tensorboard==2.21.0",  # reads them: `bash run.sh tb <workdir>` serves a run's curves
    "matplotlib==3.11.2",
    "sentencex==1.0.32",  # sentence splitter (Rust, Wikimedia): ~1000x faster than pysbd here
    "importlib-resources==7.1.0",  # tfds builders need it (etils.epath) and do not declare it
    # gs:// workdirs, corpora and TFDS data_dirs (encoder_jax.paths): etils.epath reaches GCS
    # through fsspec + gcsfs. A runtime requirement, not an extra: buckets are how pod runs
    # keep their checkpoints, and a missing gcsfs would only fail once the job has started.
    "fsspec==2026.9.0",
    "gcsfs==2026.10.1",
    # Today's corpora as shard sources (encoder_jax/data/tables.py): parquet files read by row
    # group (pyarrow), HF datasets (save_to_disk folders, parquet trees, hub names) through
    # the `datasets` library.
    "pyarrow==26.0.1",
    "datasets==5.2.0",
]

TEST_REQUIRES = [
    "pytest==9.2.0",
    "pytest-xdist==3.8.0",
    "chex==0.1.92",
    "scikit-learn==1.9.1",  # fine-tuning metric cross-checks (never imported by the package)
    # Parity only (never imported by the package): the CPU wheel of torch. An unpinned
    # `torch` pulls a multi-GB CUDA build.
    "torch==2.13.0",
    "transformers==5.24.0",
    # A GCS JSON API on 127.0.0.1 for the gs:// end-to-end tests (tests/gcs); no network.
    "gcp-storage-emulator==2026.7.19",
    "ruff==0.17.5",  # lint (pyproject.toml), run by .ci/run before the tests
]

setup(
    name="encoder_jax",
    version="0.1.0",
    description="BERT-style encoder pre-training (MLM, ELECTRA, NSP) in JAX/Flax NNX",
    python_requires=">=3.11",
    # configs/ and experiments/ are packages too, so `from configs import pretrain` works from
    # any directory once installed (no sys.path edits); bench/ is not installed: its scripts
    # run from the repository root as `python -m bench.<script>`.
    packages=find_packages(include=["encoder_jax", "encoder_jax.*", "configs", "experiments"]),
    package_data={"encoder_jax.data": ["vocabs/*.txt"]},  # the committed demo vocab
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES},
    entry_points={"console_scripts": ["encoder-jax=encoder_jax.main:run"]},
)
