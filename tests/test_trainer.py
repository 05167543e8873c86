"""diffeqformer.trainer: the batched example maps give the loader the examples Levanter's per-example maps give.
(FlatJit's training is compared with Levanter's named_jit in test_train.)"""

import asyncio

import jax
import jax.numpy as jnp
import jax.random as jrandom
import numpy as np
import pytest
from levanter.data.dataset import MappedAsyncDataset
from levanter.schedule import BatchSchedule

from diffeqformer import config as configs
from diffeqformer import paths
from diffeqformer.trainer import BatchedMap, FlatJit, batched_maps


def _train_set(config_name):
    config = configs.load_config(paths.CONFIG / "smoke" / config_name)
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


def test_batched_maps_build_no_named_array_of_another_shape(monkeypatch):
    """Haliax turns its shape checks off while JAX rebuilds a tree, with a process-wide switch that the training
    loop's thread can turn back on while the loader's thread is midway. The batched maps build only named arrays of
    their axes' shape, so they give the examples with the checks on throughout."""
    import contextlib

    import haliax.core

    monkeypatch.setattr(haliax.core, "enable_shape_checks", lambda enabled: contextlib.nullcontext(True))
    batched = batched_maps(_train_set("diffeqformer.yaml"))
    got = asyncio.run(batched.get_batch([5, 0, 17]))
    assert [x.tokens.array.shape for x in got] == [(x.tokens.axes[0].size,) for x in got] and len(got) == 3


def test_flat_jit_compiles_once_per_structure():
    calls = []

    def step(state, batch, kwargs):
        calls.append(1)  # runs when traced only
        return state * 2, {"x": batch["x"] + state.sum(), "tag": "static", "n": kwargs["n"]}

    f = FlatJit(step, None)
    for _ in range(3):
        state, out = f(jnp.ones(3), {"x": jnp.zeros(2)}, {"n": 4})
    np.testing.assert_array_equal(np.asarray(state), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(np.asarray(out["x"]), [3.0, 3.0])
    assert out["tag"] == "static" and out["n"] == 4
    assert len(calls) == 1 and len(f._cache) == 1
    f(jnp.ones(3), {"x": jnp.zeros(2)}, {"n": 5})  # another static value: another program
    f(jnp.ones(4), {"x": jnp.zeros(2)}, {"n": 4})  # another shape: jax.jit retraces, the structure is the same
    assert len(f._cache) == 2 and len(calls) == 3


def test_flat_jit_keeps_the_shardings_it_knows_when_a_leaf_has_none(monkeypatch):
    """A leaf of the output to which Haliax gives no sharding is left to XLA, as named_jit leaves it; the other leaves
    keep the shardings of the mapping (all of them were dropped when one had none)."""
    import haliax as hax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from diffeqformer import trainer

    Embed = hax.Axis("embed", 4)
    infer = trainer.infer_resource_partitions

    def without_the_plain_leaf(tree, mapping):
        resources = infer(tree, mapping)
        return resources[0], {**resources[1], "plain": None}

    monkeypatch.setattr(trainer, "infer_resource_partitions", without_the_plain_leaf)
    with hax.partitioning.set_mesh(Mesh(np.asarray(jax.devices()[:1]), ("data",))):
        state, out = FlatJit(lambda s, b, k: (s * 2, {"plain": b + 1}), {"embed": "data"})(
            hax.ones(Embed), jnp.ones(3), {})
    assert isinstance(state.array.sharding, NamedSharding) and state.array.sharding.spec == PartitionSpec("data")
    np.testing.assert_array_equal(np.asarray(out["plain"]), [2.0, 2.0, 2.0])
