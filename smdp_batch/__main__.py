"""``python -m smdp_batch``: the command line, as the ``smdp-batch`` console script runs it (:mod:`smdp_batch.console`)."""

import sys

from .console import main

sys.exit(main())
