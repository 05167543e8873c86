"""diffeqformer.dispatch: the batched example maps give the loader the examples Levanter's per-example maps give.
(FlatJit's training is compared with Levanter's named_jit in test_train.)"""

import asyncio

import jax
import jax.random as jrandom
import numpy as np
import pytest
from levanter.data.dataset import MappedAsyncDataset
from levanter.schedule import BatchSchedule

from diffeqformer import paths, train
from diffeqformer.dispatch import BatchedMap, batched_maps


def _train_set(config_name):
    config = train.load_config(paths.CONFIG / "smoke" / config_name)
    data = config.data.levanter_config()
    return data.train_set(config.model.max_Pos, BatchSchedule(4), key=jrandom.PRNGKey(3))


def _maps(dataset, found=None):
    found = [] if found is None else found
    if isinstance(dataset, (MappedAsyncDataset, BatchedMap)):
        found.append(type(dataset).__name__)
    for child in [getattr(dataset, "dataset", None), *getattr(dataset, "datasets", {}).values()]:
        if child is not None:
            _maps(child, found)
    return found


@pytest.mark.parametrize("config_name", ["diffeqformer.yaml", "synthetic_diffeqformer.yaml"])
def test_batched_maps_give_the_same_examples(config_name):
    plain, batched = _train_set(config_name), batched_maps(_train_set(config_name))
    assert _maps(plain).count("BatchedMap") == 0
    assert _maps(batched) == ["BatchedMap", "BatchedMap"], _maps(batched)  # NamedLmDataset and CausalLmDataset
    indices = [5, 0, 17, 3, 11, 2]
    expected = asyncio.run(plain.get_batch(indices))
    got = asyncio.run(batched.get_batch(indices))
    assert len(got) == len(expected) == len(indices)
    for a, b in zip(got, expected):
        assert jax.tree.structure(a) == jax.tree.structure(b)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            assert np.asarray(x).dtype == np.asarray(y).dtype
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert a.tokens.axes == b.tokens.axes
    assert asyncio.run(batched.get_batch([])) == []
