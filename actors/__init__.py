"""claimd: a distributed cron scheduler.

At-least-once delivery plus idempotent recording: every due run is recorded
once and executed effectively once. The import package is called ``actors``
after the design card: the scheduler is a handful of supervised actors.
"""

__version__ = "0.1.0"
