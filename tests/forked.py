"""The tests' training commands, started from a process that has imported JAX, Levanter and the package once.

A test that trains runs the command a user types (``python -m diffeqformer.train ...``) in a process of its own, so
that a kill, an exit code and standard error are a process's. Python's start and its imports (JAX, Levanter and,
through it, transformers, wandb and pyarrow: some 4,300 modules) were about half of such a process's CPU time (4.2 of
8.4 s for a smoke training whose steps come from the compilation cache). So each test process starts a fork server
(``multiprocessing``'s ``forkserver``) that imports what the training modules import (``PRELOAD``), once; a command is
a process forked from it that runs the module (``runpy``, as ``python -m`` does) or the script (as ``python -c``), with
the command's arguments, its own standard output, standard error and exit code (a negative signal number when killed,
as ``subprocess`` reports it), and can be killed like any process.

What the server imported was imported with the server's environment, so a command whose environment or working
directory differ from those (``UNSHARED`` aside), or that is not ``python -m``/``-c``, runs as an ordinary
subprocess. The training modules themselves are not preloaded: ``python -m`` runs them as ``__main__``, which in a
process that had imported them already would register their config classes twice."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import resource
import runpy
import signal
import subprocess
import sys
import tempfile
import types
import warnings
from pathlib import Path

PRELOAD = ("forked", "equinox", "optax", "haliax", "levanter.adaptor.lora", "levanter.callbacks",
           "levanter.data.dataset", "levanter.eval", "levanter.models.gpt2", "levanter.models.lm_model",
           "levanter.optim.config", "levanter.tracker", "levanter.trainer", "diffeqformer.config",
           "diffeqformer.data.corpora", "diffeqformer.devices", "diffeqformer.trainer",
           "diffeqformer.model.transformer", "diffeqformer.runs")
"""What the fork server imports: what ``diffeqformer.train``, ``finetune`` and ``population`` import, not themselves."""

UNSHARED = frozenset({"PYTEST_CURRENT_TEST", "TRANSFORMERS_VERBOSITY", "_RJEM_MALLOC_CONF", "KMP_DUPLICATE_LIB_OK",
                      "HF_XET_HIGH_PERFORMANCE"})
"""Environment variables that may differ between the server and a forked command, which has them as asked: pytest's
name of the running test, and those that a process sets in its own environment as it runs, so that a test process
has them once a test in it has trained in-process or imported a library late, a fresh process sets them itself, and
the server may not have them: ``TRANSFORMERS_VERBOSITY`` (Levanter's trainer sets it to ``error`` when it starts; a
server without it imported transformers at its default verbosity, so a forked training can print a transformers
warning that a fresh one would not), ``_RJEM_MALLOC_CONF`` (polars' import: its allocator's settings),
``KMP_DUPLICATE_LIB_OK`` (scikit-learn's import, for Intel's OpenMP library, which nothing here loads) and
``HF_XET_HIGH_PERFORMANCE`` (lm-eval's import: the Hugging Face hub's download speed). Any other difference sends the
command to a subprocess, with a warning: slower, never another result."""

_server: dict = {}
"""The fork server of this process, once started: its ``context``, ``env`` and ``cwd``."""

CHILD_CPU_S = [0.0]
"""CPU seconds of the commands this process forked, ended or killed (conftest's cost records add them: a forked
command is the server's child, not this process's, so the operating system does not count it here)."""


def _context():
    if not _server:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOAD))
        # the server starts with this process's environment and folder (multiprocessing passes both on)
        env = {k: v for k, v in os.environ.items() if k not in UNSHARED}
        _server.update(context=context, env=env, cwd=os.getcwd())
    return _server["context"]


def _not_forkable(cmd: list[str], env: dict) -> str | None:
    """Why ``cmd`` with ``env`` cannot be forked from this process's server (None: it can)."""
    if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] not in ("-m", "-c"):
        return "not python -m or -c"
    _context()
    mine = {k: v for k, v in env.items() if k not in UNSHARED}
    changed = sorted(k for k in mine.keys() | _server["env"].keys() if mine.get(k) != _server["env"].get(k))
    if changed:  # slower, so it shows in pytest's warnings summary
        why = f"its environment differs from the fork server's in {', '.join(changed)}"
        warnings.warn(f"{' '.join(cmd[1:3])[:60]}: a subprocess, not forked: {why}", RuntimeWarning)
        return why
    if os.getcwd() != _server["cwd"]:
        return "it runs in another folder than the fork server"
    return None


def _child(cmd: list[str], env: dict, out: str, err: str, cpu: str) -> None:
    """In the forked process: standard output and error to ``out`` and ``err``, the command's environment and
    arguments, then the module or script, then the exit handlers a fresh interpreter runs at its end; its CPU seconds
    to ``cpu``. An exit code or uncaught exception ends it as multiprocessing ends a process (code 1 and the
    traceback on standard error for an exception)."""
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():  # XLA's threads and devices do not survive a fork
        raise RuntimeError("the fork server started JAX's backend while importing PRELOAD: forked commands are unsafe")
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.environ.clear()
    os.environ.update(env)
    try:
        if cmd[1] == "-m":
            sys.argv = [cmd[2], *cmd[3:]]  # runpy puts the module's path first
            runpy.run_module(cmd[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *cmd[3:]]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(cmd[2], "<string>", "exec"), main.__dict__)
    finally:
        atexit._run_exitfuncs()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        Path(cpu).write_text(str(usage.ru_utime + usage.ru_stime))


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds so far of the running process ``pid`` (user + system, from /proc), 0 where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class Forked:
    """A started command, forked (``start``) or a subprocess: ``pid``, ``poll()``, ``wait(timeout)``,
    ``send_signal(sig)``, ``kill()``, ``returncode``, what it has written to ``stdout()`` and ``stderr()`` so far,
    and ``close()`` (or a ``with`` block), which kills it if it still runs."""

    def __init__(self, cmd: list[str], env: dict | None = None):
        self._dir = tempfile.TemporaryDirectory(prefix="forked-")
        folder = Path(self._dir.name)
        self._out, self._err, self._cpu = folder / "out", folder / "err", folder / "cpu"
        self._out.touch()
        self._err.touch()
        self._counted = False
        env = dict(os.environ if env is None else env)
        self.not_forked = _not_forkable(cmd, env)
        """Why the command runs as a subprocess (None: it was forked)."""
        if self.not_forked is None:
            self._proc = _context().Process(target=_child, args=(cmd, env, str(self._out), str(self._err),
                                                                  str(self._cpu)))
            self._proc.start()
            self._sub = None
        else:
            with self._out.open("w") as out, self._err.open("w") as err:
                self._sub = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            self._proc = None
        self.pid = self._proc.pid if self._proc else self._sub.pid

    @property
    def forked(self) -> bool:
        return self._proc is not None

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode if self._proc else self._sub.returncode

    def poll(self) -> int | None:
        if self._sub:
            return self._sub.poll()
        self._proc.join(0)
        self._count()
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        if self._sub:
            return self._sub.wait(timeout)
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self._proc.name, timeout)
        self._count()
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc and self._proc.exitcode is None and not self._counted:
            CHILD_CPU_S[0] += _proc_cpu_s(self.pid)  # what it used before the signal ends it
            self._counted = True
        os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _count(self) -> None:
        if self._proc.exitcode is not None and not self._counted:
            self._counted = True
            try:
                CHILD_CPU_S[0] += float(self._cpu.read_text())
            except (OSError, ValueError):
                pass

    def stdout(self) -> str:
        return self._out.read_text(errors="replace")

    def stderr(self) -> str:
        return self._err.read_text(errors="replace")

    def close(self) -> None:
        """Kill the command if it still runs (a test that failed midway), then remove its output files."""
        if self.poll() is None:
            self.kill()
            self.wait()
        self._dir.cleanup()

    def __enter__(self) -> "Forked":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start(cmd: list[str], env: dict | None = None) -> Forked:
    """Start ``cmd`` (``[sys.executable, "-m" or "-c", ...]``) with ``env`` (default: this process's)."""
    return Forked(cmd, env)


def run(cmd: list[str], env: dict | None = None, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end, as ``subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)``
    does; killed and ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
    with start(cmd, env) as proc:  # past the timeout, wait raises and leaving kills it
        code = proc.wait(timeout)
        return subprocess.CompletedProcess(cmd, code, proc.stdout(), proc.stderr())
