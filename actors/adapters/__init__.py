"""Adapters: the only code that knows PostgreSQL, NATS, processes and HTTP."""
