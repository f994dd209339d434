"""The operator's side of the `claimd` command (registered by actors.cli)."""

from actors.cli.operator.commands import EXIT_CODES, OneLineParser, register
from actors.cli.operator.connect import database_url, forget_dev_endpoints, record_dev_endpoints

__all__ = [
    "EXIT_CODES",
    "OneLineParser",
    "database_url",
    "forget_dev_endpoints",
    "record_dev_endpoints",
    "register",
]
