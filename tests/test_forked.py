"""tests/forked.py: a command forked from the tests' fork server ends as the same command in a fresh interpreter does
(exit code, standard output and error, arguments, environment, a kill), and one it cannot fork runs as a subprocess."""

import os
import signal
import subprocess
import sys
import time

import forked
import pytest

SCRIPT = """
import os, sys
print("args", sys.argv[1:], os.environ.get("FORKED_TEST_VALUE"), __name__)
print("to stderr", file=sys.stderr)
if sys.argv[1] == "raise":
    1 / 0
if sys.argv[1] == "message":
    raise SystemExit("the one line")
sys.exit(int(sys.argv[1]))
"""


def _both(args, env=None):
    """The same command forked and in a fresh interpreter: (forked, fresh) CompletedProcesses."""
    cmd = [sys.executable, "-c", SCRIPT, *args]
    fresh = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    return forked.run(cmd, env), fresh


@pytest.mark.parametrize("args", [["0"], ["3", "b"], ["message"], ["raise"]])
def test_a_forked_script_ends_as_in_a_fresh_interpreter(args):
    mine, fresh = _both(args)
    assert mine.returncode == fresh.returncode == {"0": 0, "3": 3}.get(args[0], 1)
    assert mine.stdout == fresh.stdout == f"args {args} None __main__\n"
    assert mine.stderr.startswith("to stderr\n") and fresh.stderr.startswith("to stderr\n")
    if args[0] == "message":
        assert mine.stderr == fresh.stderr == "to stderr\nthe one line\n"
    if args[0] == "raise":
        assert mine.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
        assert fresh.stderr.rstrip().endswith("ZeroDivisionError: division by zero")


def test_a_module_runs_as_python_m_runs_it(tmp_path):
    data = tmp_path / "data.json"
    data.write_text('{"b": 1, "a": [2]}')
    cmd = [sys.executable, "-m", "json.tool", "--sort-keys", "--compact", str(data)]
    proc = forked.start(cmd)
    assert proc.forked, proc.not_forked
    assert proc.wait(60) == 0 and proc.stdout() == '{"a":[2],"b":1}\n'
    proc.close()


def test_a_command_with_another_environment_runs_as_a_subprocess():
    env = {**os.environ, "FORKED_TEST_VALUE": "x"}
    with pytest.warns(RuntimeWarning, match="differs from the fork server's in FORKED_TEST_VALUE"):
        proc = forked.start([sys.executable, "-c", SCRIPT, "0"], env)
    assert not proc.forked  # a module imported by the server may have read the variable
    assert proc.wait(60) == 0 and proc.stdout() == "args ['0'] x __main__\n"
    proc.close()
    same = forked.start([sys.executable, "-c", SCRIPT, "0"])
    assert same.forked, same.not_forked
    assert same.wait(60) == 0
    same.close()


def test_a_forked_command_is_killed_like_a_process():
    with forked.start([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]) as proc:
        deadline = time.time() + 60
        while proc.stdout() != "started\n" and time.time() < deadline:
            assert proc.poll() is None
            time.sleep(0.01)
        assert proc.forked, proc.not_forked
        assert proc.stdout() == "started\n"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL == proc.returncode


def test_a_forked_command_past_its_timeout_is_killed():
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
