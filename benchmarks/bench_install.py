"""The core install as the README's first command does it, timed: a fresh venv in a temp folder, ``pip install -e .``
(core dependencies only), its size, then the first ``smdp-batch solve`` (numba compiles the kernels) and a
second one (kernels from numba's on-disk cache).

    python benchmarks/bench_install.py [--no-editable] [--pip-cache]

pip's cache is off by default (a fresh machine has none); numba's cache goes to the temp folder, so the
first solve compiles even though this checkout's own venv has compiled the kernels before.  Takes 1–2 min.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], env: dict, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds, proc


def _du_mb(path: Path) -> int:
    return int(subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-editable", action="store_true", help="pip install REPO instead of pip install -e REPO")
    ap.add_argument("--pip-cache", action="store_true", help="let pip use its cache (default: --no-cache-dir)")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (its path is printed)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="smdp-install-"))
    venv, work = tmp / "venv", tmp / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["NUMBA_CACHE_DIR"] = str(tmp / "numba-cache")  # cold, as after a fresh clone
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    rows = []
    try:
        t_venv, _ = _run([sys.executable, "-m", "venv", str(venv)], env, work)
        rows.append(("python3 -m venv .venv", t_venv, f"{_du_mb(venv)} MB"))
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        pip += [] if args.pip_cache else ["--no-cache-dir"]
        pip += [str(REPO)] if args.no_editable else ["-e", str(REPO)]
        t_pip, _ = _run(pip, env, work)
        size = _du_mb(venv)
        rows.append((f"pip install {'' if args.no_editable else '-e '}. (core)", t_pip, f"venv {size} MB (du -sm)"))
        solve = [str(venv / "bin" / "smdp-batch"), "solve"]
        t1, p1 = _run(solve, env, work)
        compiled = "compiling kernels" in p1.stderr
        rows.append(("smdp-batch solve (first)", t1, "numba compiled the kernels" if compiled else "no compile line"))
        t2, _ = _run(solve, env, work)
        rows.append(("smdp-batch solve (second)", t2, "kernels from numba's cache"))
        freeze = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"],
                                env=env, capture_output=True, text=True).stdout.split()
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"core install of {REPO} on {platform.node() or 'this machine'}: Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, pip cache {'on' if args.pip_cache else 'off'}")
    print(f"installed: {', '.join(freeze)}")
    print("| step | seconds | notes |\n|---|---|---|")
    for step, seconds, note in rows:
        print(f"| {step} | {seconds:.1f} | {note} |")
    print(f"core install: {t_pip:.0f} s, {size} MB; first solve {t1:.1f} s, then {t2:.1f} s")
    if args.keep:
        print(f"kept: {tmp}")


if __name__ == "__main__":
    main()
