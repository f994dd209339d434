"""What an operator's request can end in besides success, with its HTTP status and exit code."""

from __future__ import annotations


class OperatorError(Exception):
    """An answer that is not a success; ``status`` is the HTTP status, ``exit`` the CLI's."""

    status = 400
    exit = 2


class BadInput(OperatorError):
    """A malformed argument: a time, a run id, a state, a limit."""


class Unprocessable(OperatorError):
    """Well-formed but impossible: a reversed range, a range too large."""

    status = 422


class NotFound(OperatorError):
    """No such job or run."""

    status = 404
    exit = 3


class Unauthorized(OperatorError):
    """An action without the right bearer token."""

    status = 401


class Forbidden(OperatorError):
    """An action on an API that has no token configured (read-only)."""

    status = 403


class Unavailable(OperatorError):
    """The database (or the replica's API) cannot be reached."""

    status = 503
    exit = 4


class NothingToDo(OperatorError):
    """The action changed nothing (the run is finished, the instant has a row...)."""

    status = 409
    exit = 3
