"""Config errors, located by file, job and field, and how pydantic's errors become them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from actors.domain import ClaimdError
from actors.observability.secrets import MASKER


class ConfigError(ClaimdError):
    """One problem in a config file, located by file, job and field."""

    def __init__(
        self, path: str, message: str, *, job: str | None = None, field_name: str | None = None
    ) -> None:
        self.path = path
        self.job = job
        self.field_name = field_name
        # Every secret the replica knows is masked, wherever the text came from.
        self.message = message = MASKER.mask(message)
        where = path
        if job is not None:
            where += f": job {job!r}"
        if field_name is not None:
            where += f": field {field_name!r}"
        super().__init__(f"{where}: {message}")

    def masked(self) -> ConfigError:
        """The same error, masked again (with the secrets known since it was made)."""
        return ConfigError(self.path, self.message, job=self.job, field_name=self.field_name)

    def each(self) -> list[ConfigError]:
        """Every problem this error stands for (one; a job's several: :class:`JobErrors`)."""
        return [self]


class JobErrors(ConfigError):
    """Every problem of one job at once, so a job with three mistakes takes one round.

    Itself the first of them (a caller that wants one error gets it); ``each()``
    gives them all, in the order the file would be fixed.
    """

    def __init__(self, errors: list[ConfigError]) -> None:
        first = errors[0]
        super().__init__(first.path, first.message, job=first.job, field_name=first.field_name)
        self.errors = errors

    def each(self) -> list[ConfigError]:
        return list(self.errors)


class ConfigErrors(ClaimdError):
    """Several problems at once; ``str()`` lists each on its own line."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class FieldProblem(ValueError):
    """A check across several fields that names the one field to blame.

    Raised inside a model validator, whose errors pydantic locates at the model;
    :func:`first_error_field` reads the field from here instead.
    """

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field_name = field_name


class StrictModel(BaseModel):
    # Unknown keys are errors: a typo must never be silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


_VARIABLE_MAPS = ("secret_env", "secret_headers", "inherit_env")


def first_error_field(exc: ValidationError) -> tuple[str | None, str]:
    """The first error of a validation: the dotted field it names and our words for it."""
    return _field_and_words(exc.errors()[0])


def error_fields(exc: ValidationError) -> list[tuple[str | None, str]]:
    """Every error of a validation, each as :func:`first_error_field` words it (once each)."""
    seen: list[tuple[str | None, str]] = []
    for err in exc.errors():
        found = _field_and_words(err)
        if found not in seen:
            seen.append(found)
    return seen


def _field_and_words(err: Any) -> tuple[str | None, str]:
    parts = [str(p) for p in err["loc"]]
    for key in _VARIABLE_MAPS:
        # A key of these tables may be a secret pasted in the wrong place:
        # the error names the table, never the key.
        if key in parts:
            parts = parts[: parts.index(key) + 1]
    loc = ".".join(parts) or None
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key (a typo?); remove it or check the spelling"
    elif err["type"] == "value_error" and "error" in err.get("ctx", {}):
        problem = err["ctx"]["error"]
        msg = str(problem)  # our own words, without "Value error, "
        if isinstance(problem, FieldProblem):
            loc = problem.field_name
    return loc, msg
