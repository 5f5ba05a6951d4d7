"""Suite-wide test settings."""

import ast
import contextlib
import fcntl
from pathlib import Path

import pytest

#: The markers of the tests that take turns (below) and run together on one xdist worker.
TURN_MARKERS = ("servers", "cpu_heavy")


def turn_taking_tests() -> set[str]:
    """"tests/FILE::FUNCTION" of every test marked with one of TURN_MARKERS, read from the sources: xdist's
    controller schedules before (and without) collecting, so it cannot ask the items for their markers.
    ``tests/test_architecture.py`` checks this equals what collection marks."""
    out = set()
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and any(
                    any(ast.unparse(d).replace("()", "").endswith(f"mark.{m}") for m in TURN_MARKERS)
                    for d in node.decorator_list):
                out.add(f"tests/{path.name}::{node.name}")
    return out


def pytest_xdist_make_scheduler(config, log):
    """Every turn-taking test on one worker (one work unit, in collection order), every other test a unit of its
    own: while they waited for the lock below, a worker stood idle (90 s in one run of the suite)."""
    from xdist.scheduler import LoadScopeScheduling

    grouped = turn_taking_tests()

    class TurnTakersTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "turn-takers" if nodeid.split("[", 1)[0] in grouped else nodeid

    return TurnTakersTogether(config, log)


@pytest.fixture(autouse=True)
def _servers_take_turns(request, tmp_path_factory):
    """Tests marked ``servers`` (real Triton / Ray Serve / HTTP servers on 127.0.0.1, timed) run one at a time
    across the xdist workers: two at once (each server's processes and a load generator) starve each other on
    a 2-core machine and stretch the latencies they measure.  The scheduler above puts them on one worker; a lock
    file in the directory the workers share (pytest's base temp) holds the rule wherever they run (xdist's own
    ``--dist loadgroup`` no longer groups on pytest ≥ 9.2: pytest-xdist issue 1386).  Tests marked ``cpu_heavy``
    (a minute of one core's work) take the same turn, so they never starve a server test's replica and load
    generator either.  Tests marked ``exclusive`` (a server timed live at real speed: a p99, an outside delay) run with nothing beside them:
    every other test holds a shared lock that they take exclusively."""
    base = tmp_path_factory.getbasetemp().parent
    turn = any(request.node.get_closest_marker(m) is not None for m in TURN_MARKERS)
    alone = request.node.get_closest_marker("exclusive") is not None
    with contextlib.ExitStack() as held:
        if turn:  # always before the shared lock: no worker waits on one while holding the other's turn
            held.enter_context(_flock(base / "real-servers.lock", fcntl.LOCK_EX))
        held.enter_context(_flock(base / "exclusive.lock", fcntl.LOCK_EX if alone else fcntl.LOCK_SH))
        yield


@contextlib.contextmanager
def _flock(path, how):
    with open(path, "a") as f:
        fcntl.flock(f, how)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
