"""Output files: what ``-o`` may point at, outputs that would overwrite inputs, and atomic writes.

Semantics of an output path (:func:`check_output`):

* a regular file, or a path that does not exist yet: written atomically — a temporary file
  ``.<name>.XXXX<suffix>`` in the same folder, renamed onto the path when complete;
* a symlink to a regular file: the link's *target* is rewritten atomically (temporary file beside the
  target, renamed onto the target); the link stays a link;
* a dangling symlink: refused (the target is not created: a link left dangling is more often a
  mistake than an invitation to create a file somewhere else);
* anything else — a directory, FIFO, character or block device, socket — refused with one line
  naming the path and what it is (nothing is opened, so a FIFO without a reader never hangs).

File mode: a new file gets ``0o666 & ~umask`` (not the 0600 of a bare ``mkstemp``, so a server
running as another user can read a table); replacing an existing regular file keeps that file's
permission bits.  Ownership is not carried over (the writer owns the new file).  Replacing a file
that has other hard links gives this name a new file; the other names keep the old content.

Several outputs of one command (:func:`atomic_outputs`): inside ``with atomic_outputs() as plan``,
:meth:`OutputPlan.prepare` validates every output (and checks them against the command's inputs
and each other) and creates each output's temporary file before any work; every later
:func:`atomic_output` of one of those paths writes its temporary file, and the renames happen only
when the block ends without an exception.  On any exception (including ``KeyboardInterrupt`` and
the CLI's SIGTERM) every temporary file is removed and a folder the plan created is removed again,
so a failed command leaves no output behind.  Only a rename failing during the final commit (which
needs no space and was checked to be allowed) could leave the outputs renamed before it in place.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError

__all__ = ["Target", "check_output", "check_output_dir", "same_file", "check_collisions", "validate_outputs",
           "OutputPlan", "current_plan",
           "atomic_outputs", "atomic_output", "Terminated", "quiet_interrupts", "journal", "outcome", "JOURNAL_ENV"]

#: set by the console entry (:mod:`smdp_batch.console`) in the process that runs a command: ``"PID:FD"``
JOURNAL_ENV = "SMDP_BATCH_JOURNAL"


class Terminated(BaseException):
    """Raised by the CLI's SIGTERM handler so that every ``finally`` and context manager cleans up."""


def quiet_interrupts(hook):
    """``sys.excepthook`` that stays silent for an interrupt: a C extension whose import our signal handler
    interrupted prints the exception through ``PyErr_Print`` (numba's ``_devicearray``) before raising an
    error of its own, which would put a traceback above the command's one line.  Anything else goes to
    ``hook``."""

    def excepthook(kind, value, tb):
        if not isinstance(value, (KeyboardInterrupt, Terminated)):
            hook(kind, value, tb)

    return excepthook


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_UMASK_LOCK = threading.Lock()


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


@dataclass(frozen=True)
class Target:
    """One validated output: the path as the user gave it, the file actually replaced, its final mode."""

    flag: str  # the option as named in messages ("-o", "--csv", "--plot"; "" for a library call)
    path: str  # as the user spelled it
    target: str  # absolute path renamed onto (a symlink's resolved target)
    mode: int  # permission bits of the written file

    @property
    def label(self) -> str:
        return f"{self.flag} {self.path}" if self.flag else str(self.path)


def _writable_folder(folder: str, label: str, pending: Iterable[str] = ()) -> None:
    if os.path.abspath(folder) in {os.path.abspath(p) for p in pending}:
        return
    if not os.path.isdir(folder):
        raise InputError(f"{label}: output folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{label}: output folder {folder!r} is not writable")


def check_output(path: str | os.PathLike, flag: str = "-o", pending_dirs: Iterable[str] = (),
                 follow_symlinks: bool = True) -> Target:
    """Validate one output file (see the module docstring) without opening it; raise a one-line InputError.

    ``pending_dirs``: folders that do not exist yet but will be created before writing (tables' -o DIR).
    ``follow_symlinks=False`` (a name the command derives, such as ``-o``'s sidecar ``FILE.json``, which the
    user never named): a symlink there is refused, never written through; a link that appears after this
    check is replaced by the rename, not followed.
    """
    path = os.fspath(path)
    label = f"{flag} {path}" if flag else str(path)
    if not str(path):
        raise InputError(f"{flag or 'output'} needs a file name")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise InputError(f"{label}: a part of the path is not a folder") from None
    except OSError as e:
        raise InputError(f"{label}: {e.strerror}") from None
    target = os.path.abspath(path)
    if st is not None and stat.S_ISLNK(st.st_mode) and not follow_symlinks:
        raise InputError(f"{label} is a symlink (to {os.readlink(path)}); this name is derived from another "
                         "output and is never written through a link — remove the link or choose another name")
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            target = os.path.realpath(path, strict=True)
            st = os.stat(target)
        except FileNotFoundError:
            raise InputError(f"{label} is a dangling symlink (to {os.readlink(path)}); remove it or create its target") from None
        except OSError as e:
            raise InputError(f"{label} is a symlink that cannot be followed ({e.strerror})") from None
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{label} is a symlink to {_kind(st.st_mode)} ({target}); write to a regular file")
    if st is None:
        if str(path).endswith(os.sep) or os.path.basename(target) in ("", ".", ".."):
            raise InputError(f"{label} names a folder; give a file name")
        mode = 0o666 & ~_umask()
    elif stat.S_ISREG(st.st_mode):
        if not os.access(target, os.W_OK):
            raise InputError(f"{label} is not writable")
        mode = stat.S_IMODE(st.st_mode)
    else:
        raise InputError(f"{label} is {_kind(st.st_mode)}; write to a regular file")
    _writable_folder(os.path.dirname(target), label, pending_dirs)
    return Target(flag, str(path), target, mode)


def check_output_dir(path: str | os.PathLike, flag: str = "-o") -> bool:
    """Validate a folder to write into; True when it exists already (else its parent must be writable)."""
    path = os.fspath(path)
    label = f"{flag} {path}" if flag else str(path)
    if os.path.isdir(path):  # follows a symlink to a folder
        if not os.access(path, os.W_OK | os.X_OK):
            raise InputError(f"{label}: folder is not writable")
        return True
    if os.path.lexists(path):
        try:
            mode = os.stat(path).st_mode
            what = "a regular file" if stat.S_ISREG(mode) else _kind(mode)
        except OSError:
            what = "a dangling symlink"
        raise InputError(f"{label} is {what}, not a folder")
    _writable_folder(os.path.dirname(os.path.abspath(path)), label)
    return False


def _identity(path: str) -> tuple[str, tuple[int, int] | None]:
    real = os.path.realpath(path)
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return real, None
    return real, (st.st_dev, st.st_ino)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """The same file: equal resolved paths (``./a`` and ``a``, symlinks) or, both existing, equal (st_dev, st_ino)."""
    ra, ia = _identity(os.fspath(a))
    rb, ib = _identity(os.fspath(b))
    return ra == rb or (ia is not None and ia == ib)


def check_collisions(targets: Sequence[Target], inputs: Iterable[tuple[str, str]] = ()) -> None:
    """Refuse an output that is one of the inputs (``(role, path)`` pairs) or another output."""
    inputs = [(role, p) for role, p in inputs if p]
    for t in targets:
        for role, p in inputs:
            if same_file(t.target, p):
                raise InputError(f"{t.label} is also the input {role}; writing it would destroy the input — "
                                 "write the output to another file")
    for i, a in enumerate(targets):
        for b in targets[i + 1:]:
            if same_file(a.target, b.target):
                raise InputError(f"{a.label} and {b.label} are the same file; give each output its own path")


def validate_outputs(outputs: Iterable[tuple[str, str | None] | tuple[str, str | None, bool]], inputs: Iterable[tuple[str, str]] = (),
                     folder: tuple[str, str, Sequence[str]] | None = None) -> tuple[list[Target], list[str]]:
    """Validate ``outputs`` (``(flag, path)`` pairs, None skipped) and ``folder`` (``(flag, dir, file names)``:
    files the command writes into a folder, created if missing) against ``inputs`` (``(role, path)``) and
    each other; return the targets and the folders still to create.  Creates nothing.  An output may be
    ``(flag, path, False)``: a derived name, checked with ``follow_symlinks=False``."""
    given: list[tuple[Any, ...]] = [(o[0], os.fspath(o[1]), *o[2:]) for o in outputs if o[1] is not None]
    pending: list[str] = []
    if folder is not None:
        dflag, dpath, names = folder
        if not check_output_dir(dpath, dflag):
            pending.append(os.fspath(dpath))
        given += [(dflag, os.path.join(dpath, n)) for n in names]
    targets = [check_output(o[1], o[0], pending, *o[2:]) for o in given]
    check_collisions(targets, inputs)
    return targets, pending


def current_plan() -> OutputPlan | None:
    """The innermost :func:`atomic_outputs` block's plan, if any."""
    return _PLANS[-1] if _PLANS else None


@dataclass
class _Entry:
    target: Target
    tmp: str
    written: bool = False


@dataclass
class OutputPlan:
    """The outputs of one command, written to temporary files and renamed together at the end."""

    entries: dict[str, _Entry] = field(default_factory=dict)
    made_dirs: list[str] = field(default_factory=list)
    committed: bool = False  # every output renamed into place (a signal held during the renames may follow)

    def prepare(self, outputs: Iterable[tuple[str, str | None] | tuple[str, str | None, bool]], inputs: Iterable[tuple[str, str]] = (),
                folder: tuple[str, str, Sequence[str]] | None = None) -> list[Target]:
        """:func:`validate_outputs`, then create the missing folder and every output's temporary file."""
        targets, pending = validate_outputs(outputs, inputs, folder)
        for d in pending:
            os.mkdir(d)
            journal("d", d)
            self.made_dirs.append(d)
        for t in targets:
            self.reserve(t)
        return targets

    def reserve(self, target: Target, suffix: str | None = None) -> _Entry:
        key = os.path.abspath(target.path)
        if key in self.entries:
            return self.entries[key]
        if suffix is None:
            suffix = os.path.splitext(target.target)[1] or ".tmp"
        folder, name = os.path.split(target.target)
        with _signals_held():  # a signal cannot fall between creating the file and recording it
            try:
                fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=suffix)
            except OSError as e:
                raise InputError(f"cannot write {target.label}: {e.strerror}") from None
            os.close(fd)
            journal("+", tmp)
            entry = self.entries[key] = _Entry(target, tmp)
        return entry

    def lookup(self, path: str | os.PathLike) -> _Entry | None:
        return self.entries.get(os.path.abspath(os.fspath(path)))

    def commit(self) -> None:
        """Rename every written temporary file onto its target; remove the unused ones.  SIGINT and
        SIGTERM wait until the renames are done (then act), so a signal never splits the commit."""
        entries = list(self.entries.values())
        with _signals_held():
            try:
                for e in entries:
                    if e.written:
                        os.chmod(e.tmp, e.target.mode)
                        os.replace(e.tmp, e.target.target)
                        journal("-", e.tmp)
                    else:
                        _unlink(e.tmp)
            except BaseException as err:
                self.rollback()
                if isinstance(err, OSError):
                    raise InputError(f"cannot write {e.target.label}: {err.strerror or err}") from None
                raise
            self.entries.clear()
            self.made_dirs.clear()
            self.committed = True

    def rollback(self) -> None:
        """Remove every temporary file, then every folder this plan created (when left empty)."""
        for e in self.entries.values():
            _unlink(e.tmp)
        self.entries.clear()
        for d in reversed(self.made_dirs):
            with contextlib.suppress(OSError):
                os.rmdir(d)
        self.made_dirs.clear()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Block SIGINT and SIGTERM in this thread for the block (where the platform allows)."""
    import signal

    held = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    journal("-", path)


def _journal_fd() -> int | None:
    """The journal's descriptor where this process is the console's command process (see :func:`journal`)."""
    pid, _, fd = os.environ.get(JOURNAL_ENV, "").partition(":")
    return int(fd) if pid.isdigit() and fd.isdigit() and int(pid) == os.getpid() else None


def journal(op: str, path: str) -> None:
    """Tell the console's supervisor about a temporary file (``+`` created, ``-`` gone) or a created folder
    (``d``), so that it can remove them if it must kill this process; a no-op elsewhere.

    The journal is a pipe named by :data:`JOURNAL_ENV` as ``PID:FD``; only that process writes to it
    (a subprocess inheriting the variable does not own the descriptor)."""
    fd = _journal_fd()
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, f"{op}{os.path.abspath(path)}\0".encode("utf-8", "surrogateescape"))


def outcome(code: int) -> bool:
    """Tell the console's supervisor the command's exit code (``=CODE``), as soon as it is decided: should the
    process crash afterwards (a finalizer of an object a signal left half built), the supervisor still ends
    with that code and does not print the command's last line a second time.  Whether this process is the
    console's command process (False elsewhere: nothing is written)."""
    fd = _journal_fd()
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, f"={int(code)}\0".encode())
    return fd is not None


_PLANS: list[OutputPlan] = []


@contextlib.contextmanager
def atomic_outputs() -> Iterator[OutputPlan]:
    """Collect the outputs written inside the block; commit them together at its end, remove them all on error."""
    plan = OutputPlan()
    _PLANS.append(plan)
    try:
        yield plan
    except BaseException:
        plan.rollback()
        raise
    else:
        plan.commit()
    finally:
        _PLANS.remove(plan)


def _write_error(err: OSError, entry: _Entry) -> InputError:
    text = str(err.strerror or err).replace(entry.tmp, entry.target.path)
    return InputError(f"cannot write {entry.target.label}: {' '.join(text.split())}")


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, suffix: str = ".tmp", flag: str = "",
                  follow_symlinks: bool = True) -> Iterator[str]:
    """Yield a temporary path to write ``path``'s content to.

    Inside :func:`atomic_outputs` the rename waits for the end of that block (the path's temporary
    file from :meth:`OutputPlan.prepare` is reused); outside, the path is validated here and the
    temporary file renamed onto it as soon as the block ends.  On an exception the temporary file is
    removed and ``path`` is untouched.
    """
    plan = _PLANS[-1] if _PLANS else None
    if plan is not None:
        entry = plan.lookup(path) or plan.reserve(check_output(path, flag, (), follow_symlinks), suffix)
        entry.written = False
        try:
            yield entry.tmp
        except OSError as e:
            raise _write_error(e, entry) from None
        entry.written = True
        return
    own = OutputPlan()
    entry = own.reserve(check_output(path, flag, (), follow_symlinks), suffix)
    try:
        yield entry.tmp
        entry.written = True
    except OSError as e:
        own.rollback()
        raise _write_error(e, entry) from None
    except BaseException:
        own.rollback()
        raise
    own.commit()
