"""In-memory adapters: the ports without servers, for the actors' unit tests and one whole
replica in memory (see actors.testing.memory).

No production module imports this package (an import-linter contract says so), and
nothing here is a fault: the chaos harness's broken builds live in tests/chaos/broken.py.
"""
