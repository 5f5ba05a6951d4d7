"""Real servers: Triton (the binary PyTriton ships) and Ray Serve, running a time-scaled stub model under
bounded load on 127.0.0.1, measured against the simulator on the same arrival stream.

Optional extras: ``pip install -e ".[triton]"`` (nvidia-pytriton) and ``".[ray]"`` (ray[serve]); nothing
here is imported by the rest of the package.
"""
