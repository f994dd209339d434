"""The operator API's tokens, read from the file or the variables the ``[claimd]`` settings name.

A token is read when the config loads, so that a missing file, an unset
variable or a short token stops the load with the field that named it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from actors.config.errors import FieldProblem

MIN_TOKEN_LENGTH = 16
# What a token allows: "read" every read of the API, the page's data and the
# run output; "operate" those and the actions (trigger, pause, ...).
TOKEN_SCOPES = ("read", "operate")
# The settings that name a token: a file of them, or a variable holding one.
TOKEN_FIELDS = ("api_token_file", "api_token_env", "api_read_token_env")


def read_api_tokens(
    fields: Mapping[str, str | None], env: Mapping[str, str]
) -> tuple[tuple[str, str, str], ...]:
    """The API tokens the settings' ``fields`` (:data:`TOKEN_FIELDS`) name, as (name, token,
    scope), read now so that a bad one stops the load."""
    tokens: list[tuple[str, str, str]] = []

    def add(name: str, token: str, field_name: str, scope: str = "operate") -> None:
        if len(token) < MIN_TOKEN_LENGTH:
            # The message names the token's name, never the token.
            raise FieldProblem(
                field_name,
                f"the API token named {name!r} is shorter than "
                f"{MIN_TOKEN_LENGTH} characters (make one with "
                "`openssl rand -hex 32`)",
            )
        tokens.append((name, token, scope))

    token_file = fields.get("api_token_file")
    if token_file:
        field_name = "api_token_file"
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise FieldProblem(field_name, f"cannot read {token_file}: {reason}") from None
        lines = [
            line.split()
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        for number, parts in enumerate(lines, 1):
            if len(parts) == 1 and len(lines) == 1:
                parts = ["api", parts[0]]
            if len(parts) == 2:
                parts.append("operate")
            if len(parts) != 3 or parts[2] not in TOKEN_SCOPES:
                raise FieldProblem(
                    field_name,
                    f"{token_file} line {number}: expected NAME TOKEN [read|operate] "
                    "(or a file holding one bare token)",
                )
            add(parts[0], parts[1], field_name, parts[2])
    for field_name, name, scope in (
        ("api_token_env", "api", "operate"),
        ("api_read_token_env", "read", "read"),
    ):
        variable = fields.get(field_name)
        if variable:
            value = env.get(variable, "").strip()
            if not value:
                raise FieldProblem(
                    field_name, f"the environment variable {variable} is not set or empty"
                )
            add(name, value, field_name, scope)
    return tuple(tokens)
