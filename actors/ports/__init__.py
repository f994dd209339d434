"""Ports: what the actors need from the world, as typing.Protocol, by role.

The actors speak only to these; adapters (PostgreSQL, NATS JetStream,
executors, and the in-memory ones of actors.testing) implement them. A fake
that satisfies a port is fine for a unit test of an actor's logic, never as
the proof of the distributed behaviour.

- ``messages``: the values crossing the ports (dispatches, starts, completions, readings);
- ``errors``: what callers tell apart (an outage is waited out);
- ``stores``: the store by role (planning, claiming, the worker's, reaping, operating);
- ``operator``: the operator side's store (its reads and its recorded actions);
- ``dispatch``: the broker and the worker's inbox;
- ``execution``: the executor and the clocks (one that can jump says so).

Every name is exported here: ``from actors.ports import X`` is the way in.
"""

from actors.ports.dispatch import Broker, Delivery, Inbox, ReplicaBroker, settle_quietly
from actors.ports.errors import InboxSilent, Outage, RecordRejected, StoreUnavailable
from actors.ports.execution import (
    Callback,
    Clock,
    Closing,
    DatabaseTime,
    Executor,
    MovingClock,
    Preparing,
)
from actors.ports.live_output import OutputChunk, OutputFeed, OutputFollow
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
from actors.ports.operator import (
    Action,
    ActionRecord,
    ActiveRun,
    AttemptRecord,
    Caller,
    Cancelled,
    HistoryReader,
    JobOverview,
    JobRecord,
    OperatorActions,
    OperatorStore,
    PausedSpan,
    Recorded,
    Records,
    RejectedRecord,
    Resumed,
    RunDetail,
    RunFilter,
    RunListing,
    RunRow,
    SchemaMissing,
    StoreRefused,
    Unchanged,
    UnknownJob,
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
    "Action",
    "ActionRecord",
    "ActiveRun",
    "AttemptRecord",
    "Broker",
    "Callback",
    "Caller",
    "Cancelled",
    "ClaimingStore",
    "Clock",
    "Closing",
    "ClusterReading",
    "Completion",
    "DatabaseTime",
    "Delivery",
    "DispatchMessage",
    "Executor",
    "HistoryReader",
    "Inbox",
    "InboxSilent",
    "JobOverview",
    "JobReading",
    "JobRecord",
    "JobState",
    "Materialized",
    "MovingClock",
    "NotStarted",
    "OperatingStore",
    "OperatorActions",
    "OperatorStore",
    "Outage",
    "OutputChunk",
    "OutputFeed",
    "OutputFollow",
    "PausedSpan",
    "PlanningStore",
    "Preparing",
    "ReapingStore",
    "RecordRejected",
    "Recorded",
    "Records",
    "RejectedJob",
    "RejectedRecord",
    "ReplicaBroker",
    "ReplicaStore",
    "Resumed",
    "RunDetail",
    "RunFilter",
    "RunListing",
    "RunRow",
    "RunStore",
    "SchemaMissing",
    "StartedRun",
    "StoreRefused",
    "StoreUnavailable",
    "Unchanged",
    "UnknownJob",
    "WorkerStore",
    "settle_quietly",
]
