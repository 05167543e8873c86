"""Strict numerics for every test: no implicit dtype or rank promotion, float32, fixed keys; one persistent
compilation cache for the whole test run."""

import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One JAX persistent compilation cache for every process of a test run: both pytest workers, the trainings and
# notebooks the tests start (they inherit the variable; train.use_compilation_cache reads it) and the smoke workflow
# after them. A program that several tests compile (the smoke model's training step, a tiny model's forward pass) is
# compiled once and loaded since; `make test` keeps the folder, so a second run compiles only what changed.
CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                              str(Path(__file__).resolve().parents[1] / "_build" / "test-jax-cache"))
# XLA's own CPU kernels in the trainings the tests start: JAX's persistent cache cannot store a program compiled with
# oneDNN's custom calls (``diffeqformer.ONEDNN_FLAG``: writing the entry fails with std::bad_alloc), so with them every
# training process compiled its steps anew. test_package_init and test_workflow_jobs check that training processes take
# the flag when the variable is unset; benchmarks/cpu_kernels.py measures both kernels and prints whether each caches.
os.environ.setdefault("DIFFEQFORMER_ONEDNN", "0")
# XLA compiles with little optimisation (JAX's jax_disable_most_optimizations: LLVM at level 0, its expensive passes
# off), in the test processes and in every process they start: the tests' programs are small and run a few times, so
# compiling them was most of their cost; optimised or not, they compute what they compute (the tests check values to
# their tolerances, and bit for bit where two runs of the same compiled program are compared). Measured: a quarter
# of the CPU time of the compile-heavy test files (Measurements page, "A fresh `make test`"). The one test of what an
# optimisation level changes (test_levanter_trainer, a fresh state) turns the switch off for itself. `make book` is
# untouched.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import itertools  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_x64", False)
jax.config.update("jax_compilation_cache_dir", CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # as train.use_compilation_cache


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, request):
    """The smoke DiffEqFormer (``config/smoke/diffeqformer.yaml``, seed 0, 20 steps) trained once for the whole test
    run by ``python -m diffeqformer.train``, as a user runs it: ``<folder>/run``, with the config file beside it as
    ``<folder>/pretrain.yaml`` (the fine-tunings name it as their pretraining). test_train checks the run itself and
    test_finetune fine-tunes it. The pytest workers share it (the first to ask trains it, under a file lock, in the
    folder above both workers' own); tests only read it."""
    import sys

    import forked

    from filelock import FileLock

    from diffeqformer import paths

    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):  # an xdist worker: every worker's base folder is below the run's one
        root = root.parent
    folder = root / "smoke-run"
    with FileLock(str(root / "smoke-run.lock")):
        if not (folder / "run" / "complete.json").exists():
            folder.mkdir(exist_ok=True)
            config = folder / "pretrain.yaml"
            config.write_text((paths.CONFIG / "smoke" / "diffeqformer.yaml").read_text())
            cmd = [sys.executable, "-m", "diffeqformer.train", "--config", str(config), "--run_dir", str(folder / "run")]
            out = forked.run(cmd, {**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=900)
            assert out.returncode == 0, out.stderr[-3000:]
    return folder / "run"


@pytest.fixture(autouse=True)
def _environment_as_it_was():
    """Every test leaves ``os.environ`` as it found it. Code that a test runs in-process sets variables for itself and
    the processes it starts (the workflow jobs' GLIBC_TUNABLES and XLA_PYTHON_CLIENT_PREALLOCATE, train's
    LEVANTER_CE_XLA_FAST_BWD on a GPU), and these stayed in the worker for every later test and every process those
    started."""
    before = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    yield
    now = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    if now != before:
        for k in now.keys() - before.keys():
            del os.environ[k]
        os.environ.update(before)


@pytest.fixture
def getkey():
    """Call getkey() for a fresh PRNG key; the sequence is the same in every run."""
    counter = itertools.count()
    return lambda: jax.random.PRNGKey(next(counter))


# The slowest test files, slowest first, by their CPU seconds in a full two-worker run (DIFFEQFORMER_TEST_COSTS,
# benchmarks/test_costs.py, 2026-11-28): test_population 534, test_train 513, test_levanter_trainer 321, test_finetune
# 252, test_trajectories 199, test_ablations 152, test_pipeline 147, test_model 133; every other file took under 111
# (2830 in all). `make test` hands whole files to its two workers (`--dist loadfile`) in collection order
# (`--no-loadscope-reorder`: xdist's own order, most tests first, collected these few-test files last, and the last
# of them ran alone on one worker for minutes). Slowest first, the two workers finish together.
SLOWEST_FILES = ("test_population.py", "test_train.py", "test_levanter_trainer.py", "test_finetune.py",
                 "test_trajectories.py", "test_ablations.py", "test_workflow_plan.py", "test_model.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FILES)))  # stable: else as collected


# ------------------------------------------------------------------------------------------- what each test costs

COSTS = os.environ.get("DIFFEQFORMER_TEST_COSTS")
"""A file to append one JSON line per test to (``benchmarks/test_costs.py`` sums them by file): the process that ran
it (an xdist worker, or ``main``), when it ended (Unix time), its wall seconds,
the CPU seconds of the test's process and of the processes it started and waited for (the commands it forked,
``forked``, included), and the seconds XLA spent
compiling in the test's process (JAX's compile events). Unset: nothing is recorded."""

if COSTS:
    import json  # noqa: E402
    import time  # noqa: E402

    from jax import monitoring  # noqa: E402
    from jax._src import dispatch  # noqa: E402

    _compiled = {"s": 0.0, "n": 0, "trace_s": 0.0}

    def _on_duration(event, seconds, **_):
        if event == dispatch.BACKEND_COMPILE_EVENT:
            _compiled["s"] += seconds
            _compiled["n"] += 1
        elif event in (dispatch.JAXPR_TRACE_EVENT, dispatch.JAXPR_TO_MLIR_MODULE_EVENT):
            _compiled["trace_s"] += seconds

    monitoring.register_event_duration_secs_listener(_on_duration)

    import forked  # noqa: E402

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        before, start, compiled, forked_s = os.times(), time.perf_counter(), dict(_compiled), forked.CHILD_CPU_S[0]
        yield
        after = os.times()
        record = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "end": time.time(),
                  "wall_s": time.perf_counter() - start,
                  "cpu_s": after.user + after.system - before.user - before.system,
                  "children_cpu_s": (after.children_user + after.children_system
                                     - before.children_user - before.children_system
                                     + forked.CHILD_CPU_S[0] - forked_s),
                  "compile_s": _compiled["s"] - compiled["s"], "compiles": _compiled["n"] - compiled["n"],
                  "trace_s": _compiled["trace_s"] - compiled["trace_s"]}
        with open(COSTS, "a") as f:
            f.write(json.dumps(record) + "\n")
