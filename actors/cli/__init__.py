"""The `claimd` command: ``main`` (dev, run, migrate, check-config, logging options)
and ``operator`` (the operator's commands: what ran, what failed, actions).
"""
