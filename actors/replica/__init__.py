"""One claimd replica, composed from ports, in rooms.

- ``replica``: the Replica: HTTP first, then the servers, then the actors; signals.
- ``wiring``: the actor set of a role on its ports, supervised, and the stop's order.
- ``lifecycle``: waiting for servers at start; the bounded stop and its watchdog.
- ``reload``: SIGHUP rereads the config file and applies its jobs.
- ``status``: /readyz, the status page's jobs and the cluster gauges, through the ports.
- ``port_bundle``: the bundle of ports a replica is built from (the PortBundle protocol);
  ``production`` builds it on PostgreSQL and NATS JetStream.
"""

from actors.replica.lifecycle import stop_bound
from actors.replica.port_bundle import PortBundle
from actors.replica.replica import Replica
from actors.replica.wiring import ReplicaPorts, Role, run_actors

__all__ = [
    "PortBundle",
    "Replica",
    "ReplicaPorts",
    "Role",
    "run_actors",
    "stop_bound",
]
