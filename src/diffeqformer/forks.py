"""Processes forked from one process that has imported what they import.

Each notebook the pipeline executes takes two processes: Papermill's (``pipeline.processes.execute_notebook_child``)
and the notebook's kernel; F9's notebook starts more, which measure training steps (``analysis.ablations``). Started
afresh, each imported its libraries again: JAX, Levanter (and through it transformers, wandb and pyarrow),
matplotlib, seaborn and the package's analysis modules, Papermill and Jupyter's client. For a notebook that only reads
its runs' results that was most of its CPU time (measurements page). So the pipeline starts one ``ForkServer``, which
imports these once (``PRELOAD``), and these processes are forked from it: Papermill's by the pipeline
(``ForkServer.start``), the kernel by Papermill, through a launcher (``forked_kernel_manager``: a small process that
asks the server for a fork and stands in for it, so that Jupyter's client signals, waits for and kills it as it does
a kernel it started itself), F9's by the kernel (``popen``, which the server's address reaches through the
environment, ``ADDRESS``).

A forked process has its own arguments (``python -m`` semantics), environment, working folder, standard streams and
exit code, and is killed when whoever asked for it goes away (the server watches the request's connection) or the
server's parent ends. It starts with no JAX backend (the server never starts one) and no compiled program. What the
server imported, it imported with its environment: a request whose environment differs from the server's beyond
``MAY_DIFFER`` is not forked, and its command runs as a fresh process instead."""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
import warnings
from pathlib import Path
from typing import Mapping, Sequence

ADDRESS = "DIFFEQFORMER_FORK_SERVER"
"""Environment variable naming the server's socket; set for the processes the pipeline starts while it runs one."""

PRELOAD = ("papermill", "nbclient", "jupyter_client.manager", "ipykernel.ipkernel", "ipykernel.zmqshell",
           "ipykernel.control", "ipykernel.heartbeat", "ipykernel.shellchannel", "ipykernel.parentpoller",
           "IPython.core.shellapp", "matplotlib.pyplot", "seaborn", "pandas", "jax", "diffeqformer.config",
           "diffeqformer.runs", "diffeqformer.finetune", "diffeqformer.analysis.ablations",
           "diffeqformer.analysis.attribution", "diffeqformer.analysis.downstream", "diffeqformer.analysis.inference",
           "diffeqformer.analysis.perplexity", "diffeqformer.analysis.schematic", "diffeqformer.analysis.spectra",
           "diffeqformer.analysis.trajectories", "diffeqformer.data.synthetic", "diffeqformer.report.figures")
"""What the server imports: what Papermill's process and the notebooks import (their imports, and the modules those
load on first use, such as ``runs.load_model``'s). Not ``ipykernel.kernelapp``, whose kernel reads its parent's pid
from the environment as it is imported (``JPY_PARENT_PID``), nor ``matplotlib_inline``'s backend, which attaches
itself to the kernel it finds at its import, nor the modules the forked processes run (``python -m`` runs a module
afresh, as ``__main__``): each imports these itself, in a few milliseconds."""

INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
"""The matplotlib backend a kernel chooses (ipykernel sets ``MPLBACKEND`` at its start when unset; matplotlib reads it
at its import, which in a forked kernel happened in the server)."""

MAY_DIFFER = frozenset({"DIFFEQFORMER_FIGURES", "JPY_PARENT_PID", "JPY_SESSION_NAME", "MPLBACKEND", "CLICOLOR",
                        "CLICOLOR_FORCE", "FORCE_COLOR", "GIT_PAGER", "PAGER", "TERM", "PYDEVD_USE_FRAME_EVAL",
                        "PYTEST_CURRENT_TEST", "TRANSFORMERS_VERBOSITY", "_RJEM_MALLOC_CONF", "KMP_DUPLICATE_LIB_OK",
                        "HF_XET_HIGH_PERFORMANCE", "DIFFEQFORMER_PIPELINE_PID"})
"""Environment variables in which a forked process may differ from the server, which has them as asked: read when
used, never at an import (a notebook's figures folder, Jupyter's names of a kernel's parent and notebook, what a
kernel sets for the programs it runs: colours, pager, terminal, its debugger's mode; pytest's name of the running
test, the pipeline's pid for ``processes.exit_with_parent``), or set by a process in its own
environment as it imports a library, so that one process has them and another not yet: transformers' verbosity
(the package's ``__init__``), polars' allocator (``_RJEM_MALLOC_CONF``), scikit-learn's OpenMP switch, the Hugging
Face hub's download speed (lm-eval's import)."""

PARENT_PID = "DIFFEQFORMER_PIPELINE_PID"
"""``processes.PARENT_PID``: a forked process's parent is the server, so the server puts its own pid there."""


# -------------------------------------------------------------------------------------------------- the server

_FILTERS: list = []
"""The server's warning filters before it silenced Python's warning about forking a process with threads."""


def serve(address: str, preload: Sequence[str]) -> None:
    """The server (``python -m diffeqformer.forks serve ADDRESS MODULE...``): import ``preload``, listen on the Unix
    socket ``address``, print ``ready``, then fork a process for each request until the process that started it
    ends (its children are killed then). Single-threaded: a process with threads must not fork."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the pipeline's to handle: it ends us
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # ended (ForkServer.close): kill what it forked first
    # Python warns at each fork of a process with threads other than its own: here no Python thread but the
    # libraries' native ones, which prepare for a fork (jemalloc's background threads, OpenBLAS's workers: both
    # re-initialise in the child through their at-fork handlers; polars' spill cleaner, which nothing forked uses)
    _FILTERS.extend(warnings.filters)  # a forked process gets them back (_child)
    warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded", category=DeprecationWarning)
    parent = os.getppid()
    os.environ.setdefault("MPLBACKEND", INLINE_BACKEND)
    env = dict(os.environ)
    for name in preload:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    wake_r, wake_w = os.pipe()  # SIGCHLD wakes the loop
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    children: dict[int, socket.socket] = {}  # pid -> the connection of whoever asked for it
    print("ready", flush=True)
    try:
        while os.getppid() == parent:
            for key, _ in selector.select(timeout=1.0):
                if key.data == "request":
                    _fork(listener, env, children, selector, closing=(listener, selector, wake_r, wake_w))
                elif key.data == "child":
                    os.read(wake_r, 4096)
                else:  # the asker's connection ended (it never sends more): it is gone, so is its process
                    selector.unregister(key.fileobj)
                    _kill(key.data)
            _reap(children, selector)
    finally:
        for pid in children:
            _kill(pid)


def _kill(pid: int) -> None:
    """SIGKILL a forked process and what it started (its process group, ``_child``'s ``setsid``)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # not yet a group of its own
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _reap(children: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    """Tell the asker of each process that has ended its exit code (``subprocess``'s: negative when killed)."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        try:
            selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        try:
            conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
        except OSError:
            pass
        conn.close()


def _fork(listener: socket.socket, env: Mapping[str, str], children: dict[int, socket.socket],
          selector: selectors.BaseSelector, closing: tuple) -> None:
    """Read one request (its standard streams, then its argv, environment and folder as JSON) and fork its process,
    or answer why not (``fresh <reason>``)."""
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        conn.settimeout(30)
        head, fds, _, _ = socket.recv_fds(conn, 4, 3)
        size = struct.unpack("!I", head)[0]
        payload = b""
        while len(payload) < size:
            chunk = conn.recv(size - len(payload))
            if not chunk:
                raise OSError("the request ended early")
            payload += chunk
        request = json.loads(payload)
        why = _not_forkable(request, env, len(fds))
        if why:
            conn.sendall(f"fresh {why}\n".encode())
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            _child(request, fds, conn, closing + tuple(children.values()))
        children[pid] = conn
        selector.register(conn, selectors.EVENT_READ, pid)
        conn.sendall(f"pid {pid}\n".encode())
    except (OSError, ValueError, struct.error) as err:
        print(f"fork server: a request failed: {err}", file=sys.stderr, flush=True)
        conn.close()
    finally:
        for fd in fds:
            os.close(fd)


def _not_forkable(request: Mapping, env: Mapping[str, str], streams: int) -> str | None:
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():  # XLA's threads and devices do not survive a fork
        return "the fork server has started JAX's backend"
    if threading.active_count() > 1:
        return "the fork server runs Python threads"
    if streams != 3:
        return f"the request passed {streams} standard streams, not 3"
    argv = request["argv"]
    if len(argv) < 2 or argv[0] != "-m":
        return "not a python -m command"
    asked = request["env"]
    changed = sorted(k for k in asked.keys() | env.keys() if k not in MAY_DIFFER and asked.get(k) != env.get(k))
    if changed:
        return f"its environment differs from the fork server's in {', '.join(changed)}"
    return None


def _child(request: Mapping, fds: Sequence[int], conn: socket.socket, closing: tuple) -> None:
    """In the forked process: the asker's standard streams, environment, folder and arguments, a process group of
    its own (as Jupyter starts a kernel), then ``python -m`` on the module; ends the process with its exit code."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        warnings.filters[:] = _FILTERS
        warnings._filters_mutated()  # as warnings.filterwarnings does after it changes the list
        server = os.getppid()
        conn.close()
        for thing in closing:
            os.close(thing) if isinstance(thing, int) else thing.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.setsid()
        cwd = request["cwd"]
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(request["env"])
        if PARENT_PID in os.environ:
            os.environ[PARENT_PID] = str(server)
        sys.path[0] = cwd  # as python -m has it
        code = _run_module(request["argv"][1], request["argv"][2:])
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _run_module(module: str, args: Sequence[str]) -> int:
    """``python -m module args`` in this process, to its exit code, with the end of an interpreter: its threads
    joined, its exit handlers run, its streams flushed."""
    sys.argv = [module, *args]  # runpy puts the module's path first
    try:
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
        if not isinstance(exit_.code, int) and exit_.code is not None:
            print(exit_.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    return code


# -------------------------------------------------------------------------------------------------- the askers


class Forked:
    """A process forked by the server: ``pid``, ``returncode``, ``poll()``, ``wait(timeout)``, ``send_signal(sig)``,
    ``terminate()``, ``kill()``, as ``subprocess.Popen`` has them. Its exit code comes over ``conn``, the request's
    connection (``buffer``: what was read of it already); a server gone without saying it counts as a kill."""

    def __init__(self, conn: socket.socket, pid: int, buffer: bytes = b""):
        self._conn = conn
        self._buffer = buffer
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = self.stdout = None
        """Pipes to its standard input and from its standard output, where ``popen`` made them (text)."""

    def communicate(self, input: str | None = None) -> tuple[str | None, None]:
        """As ``subprocess.Popen.communicate`` with pipes: ``input`` written, standard input closed, standard output
        read to its end, then the exit awaited."""
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        out = self.stdout.read() if self.stdout is not None else None
        if self.stdout is not None:
            self.stdout.close()
        self.wait()
        return out, None

    def wait(self, timeout: float | None = None) -> int:
        while self.returncode is None:
            if b"\n" in self._buffer:
                line = self._buffer.split(b"\n", 1)[0].decode()
                self.returncode = int(line.split()[1]) if line.startswith("exit ") else -signal.SIGKILL
            elif not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            elif chunk := self._conn.recv(256):
                self._buffer += chunk
            else:
                self.returncode = -signal.SIGKILL
            if self.returncode is not None:
                self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.wait(0)
            except subprocess.TimeoutExpired:
                pass
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork(address: str, argv: Sequence[str], env: Mapping[str, str], cwd: str | Path,
         streams: Sequence[int] = (0, 1, 2)) -> Forked | str:
    """Ask the server at ``address`` for ``python *argv`` with ``env`` in ``cwd`` on the file descriptors
    ``streams`` (standard input, output, error): the forked process, or why it was not forked."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    buffer = b""
    try:
        conn.connect(address)
        payload = json.dumps({"argv": list(argv), "env": dict(env), "cwd": str(cwd)}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(payload))], list(streams))
        conn.sendall(payload)
        while b"\n" not in buffer and (chunk := conn.recv(256)):
            buffer += chunk
    except OSError as err:
        conn.close()
        return f"the fork server did not answer ({err})"
    answer, _, rest = buffer.decode().partition("\n")
    if not answer.startswith("pid "):
        conn.close()
        return answer.removeprefix("fresh ").strip() or "the fork server closed the request"
    return Forked(conn, int(answer.split()[1]), rest.encode())


def popen(argv: Sequence[str], stderr, env: Mapping[str, str] | None = None, cwd: str | Path | None = None):
    """``python *argv`` with pipes to its standard input and from its standard output (text) and its standard error
    to the open file ``stderr``, as ``subprocess.Popen`` starts it: forked from the server that ``ADDRESS`` in
    ``env`` (default: this process's environment) names, where one runs and accepts it (``Forked``), else a
    subprocess (with a warning that says why, where a server was named)."""
    env = dict(os.environ if env is None else env)
    cwd = os.getcwd() if cwd is None else cwd
    if env.get(ADDRESS):
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            proc = fork(env[ADDRESS], argv, env, cwd, (in_r, out_w, stderr.fileno()))
        finally:
            os.close(in_r)
            os.close(out_w)
        if isinstance(proc, Forked):
            proc.stdin, proc.stdout = os.fdopen(in_w, "w"), os.fdopen(out_r, "r")
            return proc
        os.close(in_w)
        os.close(out_r)
        warnings.warn(f"{' '.join(argv[:2])}: started afresh, not forked: {proc}", RuntimeWarning, stacklevel=2)
    return subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            text=True, env=env, cwd=cwd)


class ForkServer:
    """The server, started by the pipeline (``python -m diffeqformer.forks serve``) with ``env`` as every
    process it forks will have it, importing ``preload`` (default ``PRELOAD``); ``start`` forks a command from it,
    ``address`` names it to the processes the pipeline starts (``ADDRESS``), ``close`` ends it and every process it
    forked. Started in the background: the first ``start`` waits for its imports."""

    def __init__(self, env: Mapping[str, str], log: Path, preload: Sequence[str] | None = None):
        # a folder of its own under the system's temporary one: a Unix socket's path has at most 107 bytes
        self._folder = tempfile.mkdtemp(prefix="diffeqformer-forks-")
        self.address = os.path.join(self._folder, "socket")
        self.env = {**env, ADDRESS: self.address, "MPLBACKEND": env.get("MPLBACKEND", INLINE_BACKEND)}
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as err:
            self._proc = subprocess.Popen([sys.executable, "-m", __name__, "serve", self.address,
                                           *(PRELOAD if preload is None else preload)],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                          env=self.env, cwd=os.getcwd(), text=True)
        self._ready: bool | None = None
        self._lock = threading.Lock()

    def ready(self, timeout: float = 600.0) -> bool:
        """Whether the server is up (waits for its imports the first time, at most ``timeout`` seconds); False if it
        died or did not get there (then it is ended)."""
        with self._lock:
            if self._ready is None:
                up = select.select([self._proc.stdout], [], [], timeout)[0]
                self._ready = bool(up) and self._proc.stdout.readline().strip() == "ready"
                if not self._ready:
                    self.close()
            return self._ready and self._proc.poll() is None

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | Path,
              streams: Sequence[int]) -> Forked | None:
        """``python *argv`` forked from the server (None where it is not up or declines the request: the reason is
        written to the server's log)."""
        if not self.ready():
            return None
        proc = fork(self.address, argv, env, cwd, streams)
        if isinstance(proc, Forked):
            return proc
        with self.log.open("a") as log:
            print(f"{' '.join(argv[:2])}: started afresh, not forked: {proc}", file=log, flush=True)
        return None

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait()
        self._proc.stdout.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def launch(argv: Sequence[str]) -> None:
    """``python -m diffeqformer.forks launch -m MODULE ARGS...``: run ``python -m MODULE ARGS`` forked from
    the server that ``ADDRESS`` names, standing in for it (its exit code; SIGINT and SIGTERM passed on to it; this
    process killed, the server kills it); without a server, or where the server declines, exec it afresh."""
    address = os.environ.get(ADDRESS)
    proc = fork(address, argv, os.environ, os.getcwd()) if address else "no fork server"
    if not isinstance(proc, Forked):
        if address:
            print(f"{' '.join(argv[:2])}: started afresh, not forked: {proc}", file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable, *argv])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: proc.send_signal(signum))  # os.kill only: no read of the connection
    code = proc.wait()
    sys.exit(code if code >= 0 else 128 - code)


def forked_kernel_manager():
    """Jupyter's ``KernelManager`` whose kernels start through ``launch`` (forked from the server ``ADDRESS``
    names, where one runs): for Papermill's ``kernel_manager_class``."""
    from jupyter_client.manager import KernelManager

    class ForkedKernelManager(KernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            cmd = super().format_kernel_cmd(extra_arguments)
            if os.environ.get(ADDRESS) and cmd[1:3] == ["-m", "ipykernel_launcher"]:
                return [cmd[0], "-m", __name__, "launch", *cmd[1:]]
            return cmd

    return ForkedKernelManager


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], sys.argv[3:])
    elif sys.argv[1:2] == ["launch"]:
        launch(sys.argv[2:])
    else:
        raise SystemExit("usage: python -m diffeqformer.forks serve ADDRESS | launch -m MODULE ARGS...")
