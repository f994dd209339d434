"""Test support: faults the harness asks for, installed at start-up. Never in a hot path."""
