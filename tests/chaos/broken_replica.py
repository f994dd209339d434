"""``python -m tests.chaos.broken_replica [FAULTS] [claimd's options] run --config FILE``

`claimd run` on the broken adapters of tests/chaos/broken.py: the entry point the
harness (and the integration tests that need a crash or a missing guard) start
instead of `claimd` when they ask for a fault. The rest of the command line is
claimd's own, and the replica stops and exits exactly as `claimd run` does.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import uuid
from pathlib import Path

from actors.cli import main as cli
from actors.cli import process
from actors.config import ConfigError, load_config
from actors.observability import configure_logging
from actors.replica import Replica, Role
from tests.chaos.broken import BrokenPorts, Faults


def build_parser() -> argparse.ArgumentParser:
    """claimd's parser, with the faults as options before the command."""
    parser = cli.build_parser()
    parser.prog = "python -m tests.chaos.broken_replica"
    faults = parser.add_argument_group("faults (tests only; see tests/chaos/broken.py)")
    faults.add_argument("--skip-epoch-guard", action="store_true")
    faults.add_argument("--exit-after-complete", type=int, default=0, metavar="N")
    faults.add_argument("--publish-fail-every", type=int, default=0, metavar="N")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one broken replica; its exit status is `claimd run`'s."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "run":
        parser.error("broken builds exist for `run` only")
    configure_logging(args.log_level.upper(), args.log_format)
    try:
        loaded = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.pid_file:
        Path(args.pid_file).write_text(f"{os.getpid()}\n")
    faults = Faults(
        skip_epoch_guard=args.skip_epoch_guard,
        exit_after_complete=args.exit_after_complete,
        publish_fail_every=args.publish_fail_every,
    )
    # The same shape as a production replica's id (the harness reads pids, not ids).
    replica_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    replica = Replica(
        Path(args.config),
        loaded,
        Role(args.role),
        replica_id=replica_id,
        bundle=BrokenPorts(loaded.settings, replica_id, faults=faults),
    )
    return process.run_replica(replica)


if __name__ == "__main__":
    sys.exit(main())
