"""The ``smdp-batch`` console entry: the command runs in a child process, so that Ctrl-C and SIGTERM act at once.

Contract: SIGINT (Ctrl-C) ends a command with exit code 130 and the line ``smdp-batch: interrupted``,
SIGTERM with 143 and ``smdp-batch: terminated``, within a second, leaving no partial output file.

Why a child process.  A Python signal handler runs only between bytecodes, so a signal that lands
inside a long compiled call — a numba kernel, numpy's text parser, LLVM compiling a kernel on a cold
cache — waits until that call returns, which can be seconds.  The parent here imports nothing heavy
and sits in a 50 ms polling loop, so it acts at once:

1. it forwards the signal to the child, whose handler (:func:`smdp_batch.cli.main`) unwinds every
   ``finally``, removes the temporary files of its outputs (:mod:`smdp_batch.files`) and exits 130 / 143
   with its one line, skipping the interpreter's teardown (whose finalizers could print after it); it records
   its exit code in the journal before that line and keeps the interrupted traceback to the exit, so that what
   the signal left half built is never freed (it crashed the process after the line) and no crash after the
   line can make the parent print it again;
2. if the child is still running :data:`GRACE_S` seconds later (stuck in a compiled call), the parent
   kills it and its descendants, removes the temporary files and folders the child recorded in its
   journal (a pipe: :func:`smdp_batch.files.journal`), prints the line and exits 130 / 143 itself.

Outputs are renamed into place only at the end of a command, with the signals blocked for the
renames, so a kill either leaves the previous files or the new complete ones.  Where ``os.fork`` is
missing (Windows) the command runs in this process, with the in-process handlers only.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time


__all__ = ["main", "GRACE_S"]

#: seconds the child gets to clean up after a forwarded signal before it is killed
GRACE_S = 0.45  # the exit must come within 1 s on a loaded machine: kill, clean-up and exit take the rest
_POLL_S = 0.05
_LINES: dict[int, str] = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def _child(journal_fd: int, argv: list[str] | None, mask) -> int:
    from .files import JOURNAL_ENV, Terminated, outcome, quiet_interrupts

    received: list[int] = []

    def first_signal(signum, frame):  # the first one unwinds; a repeat must not interrupt the cleanup
        for s in _LINES:
            signal.signal(s, signal.SIG_IGN)
        received.append(int(signum))
        raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated()

    def unraisable(info, default=sys.unraisablehook):  # an interrupt swallowed by a callback is not news
        if not isinstance(info.exc_value, (KeyboardInterrupt, Terminated)):
            default(info)

    sys.unraisablehook = unraisable
    sys.excepthook = quiet_interrupts(sys.excepthook)
    for s in _LINES:
        signal.signal(s, first_signal)
    os.environ[JOURNAL_ENV] = f"{os.getpid()}:{journal_fd}"
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal held since the fork is raised here: caught below
        from .cli import main as run  # the imports take a moment: a signal here must not print a traceback

        code = run(argv)
    except BaseException as e:
        # a signal during the imports, or between the command's own handlers and its return; or the signal turned
        # into an error of its own by an extension's import (numba's _devicearray: ImportError, no chain)
        signum = (signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM if isinstance(e, Terminated)
                  else received[0] if received else None)
        if signum is None:
            if not isinstance(e, Exception):
                raise
            code = _internal(e)  # a broken installation (the command line cannot even be imported): one line
        else:
            held = e  # noqa: F841 - kept to the exit (os._exit): freeing it may crash (see cli._hold)
            gc.disable()
            outcome(128 + int(signum))  # the supervisor learns the outcome before anything can crash
            code = _say(signum)
    for s in _LINES:  # the command is done (its outputs in place, or none): a signal now changes nothing
        signal.signal(s, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    outcome(code)  # should the teardown hang or crash, the command still exits with this code
    if code in (128 + int(signal.SIGINT), 128 + int(signal.SIGTERM)):
        _leave_now(code)
    return code


def _leave_now(code: int) -> None:
    """End an interrupted child without the interpreter's teardown: a signal that landed inside a half-built
    extension object (LLVM compiling a numba kernel) leaves finalizers that print "Exception ignored …" at
    teardown, after the command's last line.  The exit handlers still run (a runtime's background solver
    process is stopped by one), then the process leaves with ``code``."""
    import atexit

    sys.unraisablehook = lambda info: None  # after the command's last line nothing more is news
    try:
        atexit._run_exitfuncs()
    except BaseException:  # an exit handler interrupted or failing must not change the outcome
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _internal(e: BaseException) -> int:
    """One line for a command line that cannot even be imported (a broken installation); exit 70."""
    text = " ".join(str(e).split())[:500]
    sys.stderr.write(f"smdp-batch: error: internal error: {type(e).__name__}: {text} (please report)\n")
    return 70


def _say(signum: int) -> int:
    try:
        sys.stderr.write(f"smdp-batch: {_LINES[signum]}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return 128 + int(signum)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty where it cannot be read)."""
    children: dict[int, list[int]] = {}
    try:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as fh:
                        fields = fh.read().rsplit(b")", 1)[1].split()
                    children.setdefault(int(fields[1]), []).append(int(name))
                except (OSError, IndexError, ValueError):
                    continue
    except OSError:
        return []
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _done_code(journal: bytes) -> int | None:
    """The exit code the child recorded when its command finished, or None."""
    for line in journal.decode("utf-8", "surrogateescape").split("\0"):
        if line[:1] == "=" and line[1:].lstrip("-").isdigit():
            return int(line[1:])
    return None


def _clean(journal: bytes) -> None:
    """Remove the temporary files and folders the child created and did not resolve (see files.journal)."""
    files: dict[str, bool] = {}
    folders: list[str] = []
    for line in journal.decode("utf-8", "surrogateescape").split("\0"):
        if len(line) < 2:
            continue
        op, path = line[0], line[1:]
        if op == "+":
            files[path] = True
        elif op == "-":
            files.pop(path, None)
        elif op == "d":
            folders.append(path)
    for path in files:
        try:
            os.unlink(path)
        except OSError:
            pass
    for path in reversed(folders):
        try:
            os.rmdir(path)  # only when left empty
        except OSError:
            pass


def _supervise(pid: int, journal_fd: int, mask) -> int:
    import select

    received: list[int] = []

    def forward(signum, frame):
        if not received:
            received.append(signum)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for s in _LINES:
        signal.signal(s, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    journal = bytearray()
    deadline = None
    done: int | None  # a pid from waitpid, then the journal's exit code
    while True:
        ready, _, _ = select.select([journal_fd], [], [], _POLL_S)
        if ready:
            try:
                journal += os.read(journal_fd, 65536)
            except OSError:
                pass
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if received and deadline is None:
            deadline = time.monotonic() + GRACE_S
        if deadline is not None and time.monotonic() > deadline:
            victims = _descendants(pid)
            for p in [pid, *victims]:
                try:
                    os.kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            os.waitpid(pid, 0)
            journal += _drain(journal_fd)
            done = _done_code(bytes(journal))
            if done is not None:  # stuck in its teardown, after the command had finished
                return done
            _clean(bytes(journal))
            return _say(received[0])
    journal += _drain(journal_fd)
    done = _done_code(bytes(journal))
    if os.WIFEXITED(status) or done is not None:
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else done
        if received and code not in (0, 128 + received[0]):
            _clean(bytes(journal))
        return code  # type: ignore[return-value]  # done is set when the child did not exit normally
    _clean(bytes(journal))
    signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL
    if received or signum in _LINES:
        return _say(received[0] if received else signum)
    name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
    sys.stderr.write(f"smdp-batch: error: the command was killed by {name}"
                     f"{' (out of memory?)' if signum == signal.SIGKILL else ''}\n")
    return 128 + int(signum)


def _drain(fd: int) -> bytes:
    out = bytearray()
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``smdp-batch``); returns the exit code."""
    if not hasattr(os, "fork"):
        from .cli import main as run

        return run(argv)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(_LINES))  # no signal falls between fork and handlers
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        return _child(w, argv, old)
    os.close(w)
    return _supervise(pid, r, old)
