"""Suite-wide test settings."""

import fcntl

import pytest


@pytest.fixture(autouse=True)
def _servers_take_turns(request, tmp_path_factory):
    """Tests marked ``servers`` (real Triton / Ray Serve / HTTP servers on 127.0.0.1, timed) run one at a time
    across the xdist workers: two at once (each server's processes and a load generator) starve each other on
    a 2-core machine and stretch the latencies they measure.  A lock file in the directory the workers share
    (pytest's base temp) does it; xdist's own ``--dist loadgroup`` no longer groups on pytest ≥ 9.2
    (pytest-xdist issue 1386).  Tests marked ``cpu_heavy`` (a minute of one core's work) take the same turn, so
    they never starve a server test's replica and load generator either."""
    if request.node.get_closest_marker("servers") is None and request.node.get_closest_marker("cpu_heavy") is None:
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "real-servers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
