"""A Python with torch already imported, for the CTest trainers.

Importing torch costs about 1.5 s of CPU (1.0 s of it loading libtorch's
native library), and the PyTorch tests start a trainer about a hundred
times: a third of the suite's CPU.  This module keeps one server process
that has imported torch; each trainer is a fork of it that runs the script
as `python3 SCRIPT ARGS...` would (runpy, `__name__ == "__main__"`, the
script's folder first on sys.path, the caller's working folder,
environment, stdin, stdout and stderr), so its trace is the same.  Forking
after `import torch` is what torch's own DataLoader workers do.

    python3 warm_python.py serve NAME [MODULE...]
                                         start the server (returns once it
                                         listens; it exits after 15 idle
                                         minutes or on `stop`), having
                                         imported the MODULEs (default:
                                         torch's, below)
    python3 warm_python.py stop NAME
    python3 warm_python.py exec SCRIPT ARGS...
                                         run `python3 -u SCRIPT ARGS...`
                                         through the server named by
                                         ACCUMCHECK_WARM_PYTHON: torchrun's
                                         workers (--no_python), which would
                                         each import torch again; signals
                                         it gets are passed to the trainer

NAME is a Linux abstract socket name (no file, no path-length limit);
CTest starts the server as a fixture (tests/pytorch/CMakeLists.txt)
named after the build folder, so two build folders never share one, and
passes NAME in ACCUMCHECK_WARM_PYTHON; the drivers call run() instead of
subprocess.run([sys.executable] + argv).  Without the variable, or when the
server cannot be reached, run() starts a fresh interpreter: the result is
the same, only slower.

The JAX cases (tests/jax/CMakeLists.txt) start one with `jax jax.numpy
optax flax.nnx keras`: importing them starts no thread of XLA's (its CPU
client and its thread pools start with the first computation), so a fork
is as safe as after `import torch`; serve() checks that no JAX backend
was started before it forks anything, and refuses (the trainers then
start fresh) when one was.  JAX reads its configuration (JAX_PLATFORMS,
the compilation cache's variables) and Keras its backend at import: the
server must be started with the environment its trainers are given.
"""
import atexit
import importlib
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

IDLE_SECONDS = 900


def _address(name):
    return "\0accumcheck-warm-python-" + name


def _connect(name):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_address(name))
    except OSError:
        conn.close()
        return None
    return conn


def _line(conn, buf):
    """The next reply line (and what follows it) from the server."""
    while b"\n" not in buf:
        chunk = conn.recv(64)
        if not chunk:
            raise RuntimeError("warm_python: the server closed the connection")
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    return int(line), rest


def _start(conn, argv, fds):
    """Sends the request; returns the trainer's pid and the unread reply."""
    sys.stdout.flush()
    sys.stderr.flush()
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)})
    socket.send_fds(conn, [request.encode() + b"\n"], fds)
    return _line(conn, b"")


def run(argv, capture_output=False, text=False, check=False):
    """subprocess.run([sys.executable] + argv, ...) through the warm server
    when ACCUMCHECK_WARM_PYTHON names one that answers."""
    name = os.environ.get("ACCUMCHECK_WARM_PYTHON")
    conn = _connect(name) if name else None
    if conn is None:
        return subprocess.run([sys.executable] + argv, capture_output=capture_output,
                              text=text, check=check)
    with conn, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        fds = [0, out.fileno() if capture_output else 1,
               err.fileno() if capture_output else 2]
        _, rest = _start(conn, argv, fds)
        code, _ = _line(conn, rest)
        outputs = [None, None]
        if capture_output:
            for i, f in enumerate((out, err)):
                f.seek(0)
                data = f.read()
                outputs[i] = data.decode() if text else data
    result = subprocess.CompletedProcess([sys.executable] + argv, code, *outputs)
    if check:
        result.check_returncode()
    return result


def run_here(argv, input=None, env=None, cwd=None, timeout=None):
    """subprocess.run([sys.executable] + argv, capture_output=True,
    text=True, input=, env=, cwd=, timeout=) as a fork of this process,
    the script run as the server's trainers run it (_child): for a caller
    that has imported torch already (the unit tests under pytest), a
    script that imports torch again costs its own work, not a fresh
    interpreter's 3 to 4 s of CPU.  A run past timeout is ended by
    SIGALRM (returncode -14), not raised."""
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err:
        if input is not None:
            fin.write(input.encode())
            fin.seek(0)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                if timeout:
                    signal.alarm(max(1, int(timeout + 0.999)))
                # The caller's sys.std* may be its own (pytest's capture):
                # the script writes to fds 0, 1, 2 as an interpreter's do.
                sys.stdin = open(0, closefd=False)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                request = {"argv": list(argv), "cwd": cwd or os.getcwd(),
                           "env": dict(os.environ if env is None else env)}
                _child(request, [os.dup(f.fileno()) for f in (fin, out, err)])
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        outputs = []
        for f in (out, err):
            f.seek(0)
            outputs.append(f.read().decode(errors="replace"))
    return subprocess.CompletedProcess([sys.executable] + list(argv),
                                       os.waitstatus_to_exitcode(status), *outputs)


def exec_(argv):
    """`python3 -u argv...` through the server (a fresh interpreter when
    none answers), as this process: the same exit code, and SIGTERM,
    SIGINT or SIGHUP sent to this process passed on to the trainer (what
    torchrun's agent sends its workers when one of them fails)."""
    name = os.environ.get("ACCUMCHECK_WARM_PYTHON")
    conn = _connect(name) if name else None
    if conn is None:
        os.execv(sys.executable, [sys.executable, "-u"] + argv)
    with conn:
        pid, rest = _start(conn, argv, [0, 1, 2])
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, _f: os.kill(pid, s))
        code, _ = _line(conn, rest)
    return code


def _child(request, fds):
    """The trainer: `python3 argv...` in this forked interpreter."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    code = 0
    interrupted = False
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            sys.path[0] = request["cwd"]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # what the interpreter would print, and exit 1
        traceback.print_exc()
        # ... and keep, for the atexit handlers (sys.last_value: a
        # recorder nobody closed sees the exception that ended the script).
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
        code = 1
        # The interpreter ends a script that a KeyboardInterrupt left by
        # SIGINT (the shell's 130), not exit 1.
        interrupted = isinstance(sys.last_value, KeyboardInterrupt)
    # What the interpreter does at exit that a script can see: wait for
    # its non-daemon threads, run the atexit handlers (multiprocessing's
    # and torch.distributed's finalizers, logging's flush), flush.  Not the
    # teardown of every module object: in a fork that writes every
    # reference count of torch's heap, copying it page by page (0.85 s).
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _handle(conn):
    """In a fork of the server: fork the trainer, wait for it, reply with
    its exit code (a signal's death: 128 + the signal, as a shell says)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not msg.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            os._exit(1)
        msg += more
    request = json.loads(msg)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _child(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(b"%d\n" % pid)  # for the client to pass signals on
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    conn.sendall(b"%d\n" % (code if code >= 0 else 128 - code))
    os._exit(0)


# torch (the point of the server), and what accumcheck_torch imports of
# torch's own (its capture and recorder set torch._dynamo's, _inductor's
# and _functorch's configuration): importing torch._dynamo costs about as
# much again as torch itself.  accumcheck_torch is not imported here: each
# trainer takes it from the tree it runs in.
TORCH_MODULES = ("torch", "torch.distributed", "torch.multiprocessing", "torch.nn",
                 "torch._dynamo", "torch._functorch.config", "torch._inductor.config")


def _started_jax_backends():
    """The JAX backends this process started (their clients own XLA's
    threads, which a fork would not copy): none after `import jax`."""
    if "jax" not in sys.modules:
        return []
    from jax._src import xla_bridge
    return sorted(getattr(xla_bridge, "_backends", {}) or {})


def serve(name, modules=TORCH_MODULES):
    for module in modules:
        importlib.import_module(module)
    started = _started_jax_backends()
    if started:
        print("warm_python: JAX's %s backend was started (XLA's threads) when %s were "
              "imported: no fork of it is safe; the trainers start a fresh interpreter each"
              % (", ".join(started), " ".join(modules)))
        return 0
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for _ in range(50):  # a server of an earlier run: stop it, take over
        try:
            listener.bind(_address(name))
            break
        except OSError:
            stop(name)
            time.sleep(0.1)
    else:
        print("warm_python: cannot listen on %r; the trainers start a fresh "
              "interpreter each" % name)
        return 0
    listener.listen(64)
    listener.settimeout(IDLE_SECONDS)
    # Detach: the CTest fixture that started us returns once we listen.
    if os.fork():
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    served = 0
    while True:
        _reap()
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            break
        conn.settimeout(None)
        peek = conn.recv(5, socket.MSG_PEEK)
        if peek == b"stop\n":
            _reap(wait_s=10)
            t = os.times()
            # The CPU of this server and of every trainer it forked (each
            # handler waited for its trainer, and was reaped here), which
            # CTest's own CPU does not include: `stop` prints it.
            conn.sendall(b"%d %.2f %.2f\n" % (served, t.user + t.children_user,
                                              t.system + t.children_system))
            conn.close()
            break
        if os.fork() == 0:
            listener.close()
            _handle(conn)
        served += 1
        conn.close()
    listener.close()
    return 0


def _reap(wait_s=0):
    """Reaps the finished handlers (their CPU, and their trainers', then
    counts in this process's children's); with wait_s, waits up to that
    long for the running ones."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)


def stop(name):
    conn = _connect(name)
    if conn:  # else not running: nothing to stop
        with conn:
            conn.sendall(b"stop\n")
            reply = b""
            while not reply.endswith(b"\n"):
                more = conn.recv(64)
                if not more:
                    break
                reply += more
        if reply.endswith(b"\n"):
            served, user, system = reply.split()
            user, system = float(user), float(system)
            print(f"warm_python: {int(served)} trainers forked; the server and its trainers used "
                  f"{user + system:.1f} s of CPU (user {user} s, system {system} s)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "exec":
        sys.exit(exec_(sys.argv[2:]))
    if len(sys.argv) < 3 or sys.argv[1] not in ("serve", "stop") or \
            (sys.argv[1] == "stop" and len(sys.argv) != 3):
        print("usage: warm_python.py serve NAME [MODULE...] | stop NAME | exec SCRIPT ARGS...",
              file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "stop":
        sys.exit(stop(sys.argv[2]))
    sys.exit(serve(sys.argv[2], sys.argv[3:] or TORCH_MODULES))
