"""Test-wide JAX settings: 8 fake CPU devices and strict rank promotion.

XLA_FLAGS must be set before jax is imported anywhere, so it lives here (pytest imports
conftest.py first).
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
