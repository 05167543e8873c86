"""The fork server (``diffeqformer.forks``): a forked command behaves as the same command started afresh, ends
with whoever asked for it, and a request it cannot serve faithfully is declined (and then started afresh)."""

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from diffeqformer import forks

PROGRAM = """import os, sys, warnings
print("out", sys.argv[1:], os.environ.get("DIFFEQFORMER_FIGURES"), len(warnings.filters), flush=True)
print("err", file=sys.stderr, flush=True)
if sys.argv[1:2] == ["sleep"]:
    open("pid", "w").write(str(os.getpid()))
    import time
    time.sleep(60)
if sys.argv[1:2] == ["echo"]:
    print(sys.stdin.readline().strip().upper(), flush=True)
if sys.argv[1:2] == ["fail"]:
    raise ValueError("failed as asked")
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else None)
"""


def _server(folder: Path) -> forks.ForkServer:
    """A server with a small preload, its log in ``folder``, which gets ``prog.py`` (``PROGRAM``)."""
    (folder / "prog.py").write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if k not in forks.MAY_DIFFER}
    s = forks.ForkServer(env, folder / "forks.log", preload=("json",))
    assert s.ready(), (folder / "forks.log").read_text()
    return s


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One ``_server`` for this module's tests, and its folder."""
    folder = tmp_path_factory.mktemp("forks")
    s = _server(folder)
    yield s, folder
    s.close()


def _run(s, folder, args, env=None):
    """``python -m prog ARGS`` forked (stdout, stderr to files): the process, or why it was declined."""
    with (folder / "out").open("w") as out, (folder / "err").open("w") as err, open(os.devnull) as devnull:
        return forks.fork(s.address, ["-m", "prog", *args], s.env if env is None else env, folder,
                          (devnull.fileno(), out.fileno(), err.fileno()))


@pytest.mark.parametrize("args", [[], ["3"], ["fail"], ["a", "b"]])
def test_a_forked_command_exits_and_prints_as_a_fresh_one(server, args):
    s, folder = server
    env = {**s.env, "DIFFEQFORMER_FIGURES": str(folder / "figures")}  # may differ: read when used
    proc = _run(s, folder, args, env)
    assert isinstance(proc, forks.Forked), proc
    code = proc.wait(timeout=60)
    forked = ((folder / "out").read_text(), (folder / "err").read_text())
    fresh = subprocess.run([sys.executable, "-m", "prog", *args], env=env, cwd=folder, capture_output=True,
                           text=True, timeout=60)
    assert code == fresh.returncode == {"3": 3, "fail": 1}.get(args[0] if args else "", 0)
    assert forked[0] == fresh.stdout and f"out {args} {folder / 'figures'}" in forked[0]  # the same warning filters
    # a traceback names the interpreter's own frames differently (runpy's); its last line is the same
    assert forked[1].strip().splitlines()[-1] == fresh.stderr.strip().splitlines()[-1]


def test_a_request_with_another_environment_is_declined(server):
    s, folder = server
    why = _run(s, folder, [], {**s.env, "JAX_PLATFORMS": "gpu"})
    assert why == "its environment differs from the fork server's in JAX_PLATFORMS"
    assert _run(s, folder, [], {**s.env, "JPY_PARENT_PID": "1"}).wait(timeout=60) == 0  # read when used


def _gone(pid: int, within: float = 10.0) -> bool:
    end = time.time() + within
    while time.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return True  # ended, not yet reaped by the server
        time.sleep(0.05)
    return False


def _pid(folder: Path) -> int:
    for _ in range(400):
        if (folder / "pid").exists() and (folder / "pid").read_text():
            return int((folder / "pid").read_text())
        time.sleep(0.05)
    raise AssertionError("the forked command did not start")


def test_a_forked_command_is_killed_with_its_launcher_and_takes_its_signals(server):
    """The launcher (Jupyter's kernel command) stands in for the forked process: its exit code is the process's,
    SIGTERM is passed on, and a launcher killed (SIGKILL, which it cannot pass on) takes the process with it."""
    s, folder = server
    launch = [sys.executable, "-m", "diffeqformer.forks", "launch", "-m", "prog"]
    done = subprocess.run([*launch, "3"], env=s.env, cwd=folder, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout.startswith("out ['3']") and "not forked" not in done.stderr

    for sig, code in ((signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        (folder / "pid").unlink(missing_ok=True)
        launcher = subprocess.Popen([*launch, "sleep"], env=s.env, cwd=folder, stdout=subprocess.DEVNULL)
        pid = _pid(folder)
        assert pid != launcher.pid  # forked from the server, not the launcher itself
        launcher.send_signal(sig)
        assert launcher.wait(timeout=30) == code
        assert _gone(pid)


def test_without_a_server_the_launcher_starts_the_command_afresh(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if k != forks.ADDRESS}
    done = subprocess.run([sys.executable, "-m", "diffeqformer.forks", "launch", "-m", "prog", "3"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout.startswith("out ['3']") and done.stderr == "err\n"
    gone = {**env, forks.ADDRESS: str(tmp_path / "no-server")}  # named, but not there: said, then afresh
    done = subprocess.run([sys.executable, "-m", "diffeqformer.forks", "launch", "-m", "prog", "3"],
                          env=gone, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "started afresh, not forked: the fork server did not answer" in done.stderr


def test_popen_forks_with_pipes_where_a_server_is_named_and_else_starts_a_subprocess(server):
    """``forks.popen`` as F9's measurement uses it: standard input and output as pipes, standard error to a file."""
    s, folder = server
    for env, kind in ((s.env, forks.Forked), ({**s.env, "JAX_PLATFORMS": "gpu"}, subprocess.Popen),
                      ({k: v for k, v in s.env.items() if k != forks.ADDRESS}, subprocess.Popen)):
        with (folder / "err").open("w") as err, warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            proc = forks.popen(["-m", "prog", "echo"], err, env, folder)
        assert isinstance(proc, kind)
        out, _ = proc.communicate("hello\n")
        assert proc.returncode == 0 and out.splitlines()[-1] == "HELLO" and (folder / "err").read_text() == "err\n"
        assert [str(w.message) for w in said] == (
            ["-m prog: started afresh, not forked: its environment differs from the fork server's in JAX_PLATFORMS"]
            if env.get("JAX_PLATFORMS") == "gpu" else [])


def test_closing_the_server_ends_what_it_forked(tmp_path):
    s, folder = _server(tmp_path), tmp_path
    proc = _run(s, folder, ["sleep"])
    pid = _pid(folder)
    s.close()
    assert proc.wait(timeout=30) != 0 and _gone(pid)
    assert not Path(s.address).exists()


def test_a_server_that_failed_to_start_forks_nothing(tmp_path):
    s = forks.ForkServer(dict(os.environ), tmp_path / "forks.log", preload=("no_such_module_here",))
    try:
        assert not s.ready() and s.start(["-m", "json.tool"], s.env, tmp_path, (0, 1, 2)) is None
        assert "No module named 'no_such_module_here'" in (tmp_path / "forks.log").read_text()
    finally:
        s.close()
