"""The replica `claimd run` starts: actors.replica on the production adapters.

Kept as the entry point's name; the replica itself lives in actors.replica
(composed from ports, in rooms), and its drivers in actors.replica.production.
"""

from actors.replica import Replica, Role, stop_bound
from actors.replica.lifecycle import EXIT_MARGIN_S, FORCED_EXIT_CODE, STOP_MARGIN_S
from actors.replica.production import ProductionAdapters

__all__ = [
    "EXIT_MARGIN_S",
    "FORCED_EXIT_CODE",
    "STOP_MARGIN_S",
    "ProductionAdapters",
    "Replica",
    "Role",
    "stop_bound",
]
