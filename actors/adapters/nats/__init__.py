"""NATS JetStream: the dispatch channel (nats-py).

One stream per deployment with work-queue retention; one durable pull
consumer that every worker shares (explicit ack, ack_wait, max_deliver).
"""

from actors.adapters.nats.broker import (
    CONSUMER,
    PUBLISH_WINDOW,
    JetStreamBroker,
    StreamSettingsRefused,
)
from actors.adapters.nats.codec import (
    MAX_MESSAGE_BYTES,
    MESSAGE_VERSION,
    PoisonMessage,
    decode,
    delivery_count,
    encode,
)
from actors.adapters.nats.connection import NATS_HEALTH

__all__ = [
    "CONSUMER",
    "MAX_MESSAGE_BYTES",
    "MESSAGE_VERSION",
    "NATS_HEALTH",
    "PUBLISH_WINDOW",
    "JetStreamBroker",
    "PoisonMessage",
    "StreamSettingsRefused",
    "decode",
    "delivery_count",
    "encode",
]
