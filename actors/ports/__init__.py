"""Ports: what the actors need from the world, as typing.Protocol, by role.

The actors speak only to these; adapters (PostgreSQL, NATS JetStream,
executors, and the in-memory ones of actors.testing) implement them. A fake
that satisfies a port is fine for a unit test of an actor's logic, never as
the proof of the distributed behaviour.

- ``messages``: the values crossing the ports (dispatches, starts, completions, readings);
- ``errors``: what callers tell apart (an outage is waited out);
- ``stores``: the store by role (planning, claiming, the worker's, reaping, operating);
- ``dispatch``: the broker and the worker's inbox;
- ``execution``: the executor and the clocks (one that can jump says so).

Every name is exported here: ``from actors.ports import X`` is the way in.
"""

from actors.ports.dispatch import Broker, Delivery, Inbox, ReplicaBroker
from actors.ports.errors import InboxSilent, Outage, RecordRejected, StoreUnavailable
from actors.ports.execution import Callback, Clock, DatabaseTime, Executor, MovingClock
from actors.ports.messages import (
    ClusterReading,
    Completion,
    DispatchMessage,
    JobReading,
    JobState,
    Materialized,
    NotStarted,
    RejectedJob,
    StartedRun,
)
from actors.ports.stores import (
    ClaimingStore,
    OperatingStore,
    PlanningStore,
    ReapingStore,
    ReplicaStore,
    RunStore,
    WorkerStore,
)

__all__ = [
    "Broker",
    "Callback",
    "ClaimingStore",
    "Clock",
    "ClusterReading",
    "Completion",
    "DatabaseTime",
    "Delivery",
    "DispatchMessage",
    "Executor",
    "Inbox",
    "InboxSilent",
    "JobReading",
    "JobState",
    "Materialized",
    "MovingClock",
    "NotStarted",
    "OperatingStore",
    "Outage",
    "PlanningStore",
    "ReapingStore",
    "RecordRejected",
    "RejectedJob",
    "ReplicaBroker",
    "ReplicaStore",
    "RunStore",
    "StartedRun",
    "StoreUnavailable",
    "WorkerStore",
]
