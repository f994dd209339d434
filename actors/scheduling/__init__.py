"""The scheduling actors: materializer, claimer, dispatcher, compensator, reaper.

One module each, speaking only to ports; ``supervisor`` restarts them with backoff,
``database_clock`` reads PostgreSQL's clock and measures this replica's skew.
Each is started by ``actors.replica.wiring``.
"""
