"""TritonServer's start-up: two distinct free ports, and a fresh pair when one was taken before the server bound it
(seen under CI: HTTP and gRPC were handed the same port and tritonserver exited "cannot listen")."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from smdp_batch.integrations import triton
from smdp_batch.integrations.triton import ModelSpec, TritonDistribution, TritonServer

# a stand-in for the tritonserver binary: its first start fails as a taken port does, its second serves readiness
FAKE = textwrap.dedent("""\
    #!{python}
    import http.server, os, sys
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "started-once")
    with open(os.path.join(os.path.dirname(marker), "ports"), "a") as fh:
        fh.write(args["http-port"] + "," + args["grpc-port"] + "\\n")
    if not os.path.exists(marker):
        open(marker, "w").close()
        print("The server cannot listen to HTTP requests and GRPC requests at the same address and port", flush=True)
        sys.exit(1)

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", int(args["http-port"])), Ready).serve_forever()
""")


def test_free_ports_are_distinct():
    for _ in range(50):
        ports = triton._free_ports(2)
        assert len(set(ports)) == 2 and all(p > 0 for p in ports)


def _fake_dist(folder: Path, body: str) -> TritonDistribution:
    server = folder / "tritonserver"
    server.write_text(body.format(python=sys.executable))
    server.chmod(0o755)
    return TritonDistribution(server, folder, folder, folder / "stub", "3.11")


def test_a_start_whose_port_was_taken_is_tried_again_on_fresh_ports(tmp_path, monkeypatch):
    monkeypatch.setattr(triton, "find_distribution", lambda: _fake_dist(tmp_path, FAKE))
    with TritonServer({"m": ModelSpec(4, 1000, (), {1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6})}, 1.0, start_timeout_s=30) as srv:
        tried = [tuple(line.split(",")) for line in (tmp_path / "ports").read_text().split()]
        assert len(tried) == 2 and tried[0] != tried[1]
        assert all(h != g for h, g in tried)
        assert srv.http_url == f"127.0.0.1:{tried[1][0]}"


def test_a_start_that_fails_for_another_reason_is_not_retried(tmp_path, monkeypatch):
    broken = f"#!{sys.executable}\nimport sys\nprint('error: unknown option', flush=True)\nsys.exit(1)\n"
    body = broken.replace("{", "{{").replace("}", "}}")
    monkeypatch.setattr(triton, "find_distribution", lambda: _fake_dist(tmp_path, body))
    srv = TritonServer({"m": ModelSpec(4, 1000, (), {1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6})}, 1.0, start_timeout_s=30)
    with pytest.raises(RuntimeError, match="(?s)exited with code 1 during start-up:.*unknown option"):
        srv.start()
    srv.cleanup()
