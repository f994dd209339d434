"""``python -m tests.chaos``: the fault-injection harness (see tests/chaos/harness.py)."""

import sys

from tests.chaos.harness import main

sys.exit(main())
