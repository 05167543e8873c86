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


# The slowest test files, slowest first, by their seconds in a full two-worker run (`--durations`): test_train 381,
# test_levanter_trainer 346, test_population 286, test_finetune 271, test_solve 141, test_pipeline 113; every other file
# took under 80. `make test` hands whole files to its two workers (`--dist loadfile`) in collection order
# (`--no-loadscope-reorder`: xdist's own order, most tests first, collected these few-test files last, and the last
# of them ran alone on one worker for minutes). Slowest first, the two workers finish together (simulated from those
# durations: 949 s against 1054 s; half of their sum is 947 s).
SLOWEST_FILES = ("test_train.py", "test_levanter_trainer.py", "test_population.py", "test_finetune.py", "test_solve.py",
                 "test_pipeline.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FILES)))  # stable: else as collected
