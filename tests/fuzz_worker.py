"""Worker for tests/test_fuzz_cli.py: reads one JSON case per stdin line ({"argv": [...], "cwd": dir}),
runs smdp_batch.cli.main(argv) in-process with stdout/stderr captured, and answers one JSON line
(rc, stderr, elapsed, peak RSS in KiB).  Started once under an address-space limit (RLIMIT_AS)."""

import contextlib
import io
import json
import os
import resource
import sys
import time
import traceback


def main() -> None:
    from smdp_batch.cli import main as cli_main

    out = sys.__stdout__
    for line in sys.stdin:
        case = json.loads(line)
        os.chdir(case["cwd"])
        so, se = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
                rc = cli_main(case["argv"])
        except BaseException:  # noqa: BLE001 - report what escaped main
            rc = -1
            se.write("Traceback (escaped main)\n" + traceback.format_exc())
        out.write(json.dumps({"rc": rc, "stderr": se.getvalue()[-4000:], "elapsed": time.perf_counter() - t0,
                              "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
