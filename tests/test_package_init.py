"""The package's import-time settings (``diffeqformer/__init__.py``)."""

import diffeqformer


def test_onednn_flag_is_added_once_and_can_be_turned_off():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    diffeqformer._use_onednn(env)
    assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {diffeqformer.ONEDNN_FLAG}"
    diffeqformer._use_onednn(env)
    assert env["XLA_FLAGS"].count("onednn") == 1

    empty = {}
    diffeqformer._use_onednn(empty)
    assert empty["XLA_FLAGS"] == diffeqformer.ONEDNN_FLAG

    off = {"DIFFEQFORMER_ONEDNN": "0"}
    diffeqformer._use_onednn(off)
    assert "XLA_FLAGS" not in off

    chosen = {"XLA_FLAGS": "--xla_cpu_experimental_onednn_custom_call=false"}
    diffeqformer._use_onednn(chosen)
    assert chosen["XLA_FLAGS"] == "--xla_cpu_experimental_onednn_custom_call=false"  # the user's choice stands


def test_this_process_runs_with_the_flag():
    import os

    assert diffeqformer.ONEDNN_FLAG in os.environ["XLA_FLAGS"] or os.environ.get("DIFFEQFORMER_ONEDNN") == "0"
