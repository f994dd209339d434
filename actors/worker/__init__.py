"""The worker: pull -> start -> execute -> complete -> ack.

Order is the guarantee: a run is recorded (complete, committed) before its
message is acked, so a crash between the two means a redelivery that finds
the run terminal and changes nothing. Starts and completions of concurrent
runs are batched into one statement each.

Rooms: ``actor`` (the loop, the stop, recovery after a crash), ``intake``
(fetching, and pausing while what it starts could not be kept), ``starting``
(a batch -> ``start_runs`` -> executions), ``executing`` (one attempt and its
verdict), ``completing`` (record, then ack), ``heartbeat`` (leases extended,
and whether the database calls get through), ``holding`` (the in-flight set
they share), ``settings``. The worker knows the inbox port, not the broker.
"""

from actors.worker.actor import Worker
from actors.worker.settings import WorkerSettings

__all__ = ["Worker", "WorkerSettings"]
