"""The package's process settings (``diffeqformer/__init__.py``): which processes run XLA's CPU kernels, which oneDNN's."""

import os
import subprocess
import sys

import pytest

import diffeqformer


def test_onednn_flag_is_added_once_and_can_be_turned_off():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    diffeqformer.use_onednn(env)
    assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {diffeqformer.ONEDNN_FLAG}"
    diffeqformer.use_onednn(env)
    assert env["XLA_FLAGS"].count("onednn") == 1

    empty = {}
    diffeqformer.use_onednn(empty)
    assert empty["XLA_FLAGS"] == diffeqformer.ONEDNN_FLAG

    off = {"DIFFEQFORMER_ONEDNN": "0"}
    diffeqformer.use_onednn(off)
    assert "XLA_FLAGS" not in off

    chosen = {"XLA_FLAGS": "--xla_cpu_experimental_onednn_custom_call=false"}
    diffeqformer.use_onednn(chosen)
    assert chosen["XLA_FLAGS"] == "--xla_cpu_experimental_onednn_custom_call=false"  # the user's choice stands

    measured = {}  # F9's measured steps: oneDNN as XLA's library, whose programs the compilation cache keeps
    diffeqformer.use_onednn(measured, cacheable=True)
    assert measured["XLA_FLAGS"] == diffeqformer.ONEDNN_CACHEABLE_FLAG
    diffeqformer.use_onednn(measured)
    assert measured["XLA_FLAGS"] == diffeqformer.ONEDNN_CACHEABLE_FLAG


def test_only_training_processes_take_the_flag(monkeypatch):
    """Importing the package changes nothing (an analysis in a notebook keeps XLA's kernels: F3's many tiny products
    ran slower with oneDNN's); ``python -m diffeqformer.train`` (which the workflow's training jobs run) gets the flag
    before its config is even read."""
    from diffeqformer import train

    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "DIFFEQFORMER_ONEDNN")}
    imported = subprocess.run([sys.executable, "-c", "import os, diffeqformer; print(os.environ.get('XLA_FLAGS'))"],
                              env=env, capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "None"

    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("DIFFEQFORMER_ONEDNN", raising=False)
    with pytest.raises(SystemExit, match="usage"):
        train.cli([])
    assert diffeqformer.ONEDNN_FLAG in os.environ["XLA_FLAGS"]
