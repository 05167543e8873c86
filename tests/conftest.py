"""Strict numerics for every test: no implicit dtype or rank promotion, float32, fixed keys."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import itertools  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_x64", False)


@pytest.fixture
def getkey():
    """Call getkey() for a fresh PRNG key; the sequence is the same in every run."""
    counter = itertools.count()
    return lambda: jax.random.PRNGKey(next(counter))
