"""Levanter's Trainer with less Python work per step: a cheaper call of its compiled training step (``FlatJit``), the
checkpoint filtered only when one is written (``Trainer``), and the data's per-example maps batched (``BatchedMap``).

Levanter jits the training step with Haliax's ``named_jit``, which on every call partitions the whole train state
into arrays and the rest, hashes the rest, infers the output's shardings and combines the output back: Python walks
over a tree of a few hundred arrays, a sizeable part of a small model's step on a CPU. ``FlatJit`` does that once
per argument structure and calls a ``jax.jit`` of the flat list of arrays; the traced computation is the step's own,
so a step computes what Levanter's computes, bit for bit (``tests/test_train.py`` compares the trained parameters).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import equinox as eqx
import haliax as hax
import jax
import jax.tree_util as jtu
import numpy as np
from haliax.partitioning import ResourceMapping, infer_resource_partitions
from levanter.callbacks import LambdaCallback, ProgressEvent, progress_event_scope
from levanter.data.dataset import AsyncDataset, MappedAsyncDataset, PermutationDataset
from levanter.data.mixture import MixtureDataset
from levanter.data.text.datasets import CausalLmDataset, NamedLmDataset
from levanter.trainer import Trainer as LevanterTrainer


@dataclass
class _Compiled:
    """One argument structure's jitted function, and the output's structure and non-array leaves (known once traced)."""

    jitted: Callable
    out_treedef: Any = None
    out_mask: tuple = ()
    out_static: tuple = ()


def _split(leaves) -> tuple[tuple, list, tuple]:
    """Flattened leaves as (which are arrays, the arrays, the other leaves)."""
    mask = tuple(eqx.is_array(x) for x in leaves)
    return (mask, [x for x, a in zip(leaves, mask) if a], tuple(x for x, a in zip(leaves, mask) if not a))


def _merge(mask, arrays, static) -> list:
    """The inverse of ``_split``."""
    arrays, static = iter(arrays), iter(static)
    return [next(arrays) if a else next(static) for a in mask]


class FlatJit:
    """``named_jit(fn, axis_resources=mapping, out_axis_resources=mapping, donate_args=(True,))`` for a function
    of three arguments whose first (the train state) is donated, with its per-call work done once per argument
    structure (see the module's docstring)."""

    def __init__(self, fn: Callable, mapping: ResourceMapping | None):
        self.fn = fn
        self.mapping = mapping
        self._cache: dict[Any, _Compiled] = {}
        functools.update_wrapper(self, fn)

    def __call__(self, state, *rest):
        donated_leaves, donated_tree = jtu.tree_flatten(state)
        kept_leaves, kept_tree = jtu.tree_flatten(rest)
        donated_mask, donated, donated_static = _split(donated_leaves)
        kept_mask, kept, kept_static = _split(kept_leaves)
        key = (donated_tree, donated_mask, donated_static, kept_tree, kept_mask, kept_static)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._cache[key] = self._compile(state, rest, key)
        with self._mapped():
            out = compiled.jitted(donated, kept)
        return jtu.tree_unflatten(compiled.out_treedef, _merge(compiled.out_mask, out, compiled.out_static))

    def _mapped(self):
        return hax.axis_mapping(self.mapping) if self.mapping is not None else contextlib.nullcontext()

    def _compile(self, state, rest, key) -> _Compiled:
        donated_tree, donated_mask, donated_static, kept_tree, kept_mask, kept_static = key

        def flat(donated, kept):
            state = jtu.tree_unflatten(donated_tree, _merge(donated_mask, donated, donated_static))
            rest = jtu.tree_unflatten(kept_tree, _merge(kept_mask, kept, kept_static))
            leaves, compiled.out_treedef = jtu.tree_flatten(self.fn(state, *rest))
            compiled.out_mask, arrays, compiled.out_static = _split(leaves)
            return arrays

        flat.__name__ = getattr(self.fn, "__name__", "train_step")
        kwargs = {}
        if self.mapping is not None:  # as named_jit: the output's shardings from the mapping, when there is one
            with self._mapped():
                shape = eqx.filter_eval_shape(self.fn, state, *rest)
                # a leaf Haliax gives no sharding (None) is left to XLA, as named_jit leaves it
                kwargs["out_shardings"] = _array_leaves(shape, infer_resource_partitions(shape, self.mapping))
        compiled = _Compiled(jax.jit(flat, donate_argnums=0, **kwargs))
        return compiled


def _array_leaves(shape, resources) -> list:
    """The sharding of each array leaf of ``shape`` (``filter_eval_shape``'s output), in flattening order."""
    leaves, treedef = jtu.tree_flatten(shape, is_leaf=lambda x: isinstance(x, hax.NamedArray))
    per_leaf = treedef.flatten_up_to(resources)  # Haliax gives a NamedArray one sharding, that of its array
    arrays = [x.array if isinstance(x, hax.NamedArray) else x for x in leaves]
    return [r for x, r in zip(arrays, per_leaf) if isinstance(x, jax.ShapeDtypeStruct)]


@dataclass
class _Saveable:
    """The state a checkpoint would hold, computed only when a checkpoint is written (see ``Trainer``)."""

    state: Any


class Trainer(LevanterTrainer):
    """Levanter's ``Trainer``, its training step called through ``FlatJit`` and its checkpoint hook filtering the
    train state only when a checkpoint is written (everything else is Levanter's).

    Levanter's hook computes ``TrainerState.saveable_state`` (a mask over the whole state and a filter with it) after
    every step, before its checkpointer decides whether to save. Here the hook hands the checkpointer a ``_Saveable``
    of the state, and its ``save_checkpoint`` computes Levanter's ``saveable_state`` from it: the same checkpoint."""

    @cached_property
    def _jit_train_step_fn(self):
        return FlatJit(self._train_step, self.parameter_axis_mapping)

    @cached_property
    def _jit_train_step_fn_no_hook(self):
        return FlatJit(functools.partial(self._train_step, _no_hooks=True), self.parameter_axis_mapping)

    def _add_default_hooks(self):
        super()._add_default_hooks()
        hooks = [h for h in self.hooks.hooks if getattr(getattr(h.fn, "fn", None), "__name__", "") == "checkpoint_hook"]
        if len(hooks) != 1:  # Levanter's hooks changed: keep its own
            return
        checkpointer = self._checkpointer
        save = checkpointer.save_checkpoint

        def save_checkpoint(tree, *args, **kwargs):
            return save(tree.state.saveable_state if isinstance(tree, _Saveable) else tree, *args, **kwargs)

        def checkpoint_hook(info, force=False):  # Levanter's, the state to save computed when it is saved
            with progress_event_scope(
                info.emit_event, ProgressEvent.CHECKPOINT_STARTED, ProgressEvent.CHECKPOINT_FINISHED
            ):
                checkpointer.on_step(tree=_Saveable(info.state), step=info.step, force=force)

        checkpointer.save_checkpoint = save_checkpoint
        hooks[0].fn = LambdaCallback(checkpoint_hook)


_MAPS = (CausalLmDataset, NamedLmDataset)


class BatchedMap(AsyncDataset):
    """A Levanter ``MappedAsyncDataset`` (its function of one example, no extra arguments) computed for a whole
    batch at once: one jitted, vmapped call and one copy to the host, in place of the one jitted call per example of
    Levanter's ``CausalLmDataset`` and ``NamedLmDataset``, in the loader's thread that shares the interpreter with the
    training loop. The examples are the same, array for array (integer and 0/1 arithmetic), as host arrays.
    The batch crosses the jitted call as plain arrays, never as a named array with an axis it does not name: Haliax
    builds one only with its shape checks off, a process-wide switch that the training thread may turn back on."""

    def __init__(self, mapped: MappedAsyncDataset):
        super().__init__()
        self.dataset = mapped.dataset
        self._fn = mapped.fn
        self._batched: dict = {}  # the examples' tree structure -> (the jitted map of their leaves, its output's)

    def _compiled(self, example):
        structure = jax.tree.structure(example)
        if structure not in self._batched:
            def leaves(xs):
                return jax.tree.leaves(self._fn(jax.tree.unflatten(structure, xs)))

            out = jax.tree.structure(jax.eval_shape(self._fn, example))
            self._batched[structure] = (jax.jit(jax.vmap(leaves)), out)
        return self._batched[structure]

    async def async_len(self) -> int:
        return await self.dataset.async_len()

    async def final_length_is_known(self) -> bool:
        return await self.dataset.final_length_is_known()

    def is_finite(self) -> bool:
        return self.dataset.is_finite()

    async def current_len(self):
        return await self.dataset.current_len()

    async def get_batch(self, indices):
        items = await self.dataset.get_batch(indices)
        if not items:
            return []
        batched, out = self._compiled(items[0])
        stacked = [np.stack([np.asarray(x) for x in xs]) for xs in zip(*map(jax.tree.leaves, items))]
        host = [np.asarray(x) for x in batched(stacked)]
        return [jax.tree.unflatten(out, [x[i] for x in host]) for i in range(len(items))]

    async def getitem_async(self, index: int):
        return (await self.get_batch([index]))[0]


def batched_maps(dataset):
    """``dataset`` (a Levanter training set: ``NamedLmDataset`` over a mixture of permuted ``CausalLmDataset``)
    with each per-example map without extra arguments replaced by a ``BatchedMap``; the datasets between them
    (mixtures, permutations) are rebuilt around the replaced ones in place. Anything else is left as it is."""
    if type(dataset) in _MAPS and not dataset._extra_args and not dataset._extra_kwargs:
        return BatchedMap(_rewired(dataset))
    return _rewired(dataset)


def _rewired(dataset):
    if isinstance(dataset, MixtureDataset):
        dataset.datasets = {name: batched_maps(d) for name, d in dataset.datasets.items()}
    elif isinstance(dataset, (PermutationDataset, MappedAsyncDataset)):
        dataset.dataset = batched_maps(dataset.dataset)
    return dataset
