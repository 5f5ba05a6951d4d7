"""``python -m smdp_batch``: the command line (:mod:`smdp_batch.cli`)."""

import sys

from .cli import main

sys.exit(main())
