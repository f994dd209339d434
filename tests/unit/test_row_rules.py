"""Each row rule is a predicate in actors/domain/row_rules.py and a SQL fragment of the
same name in statements/row_rules.py (their agreement is tests/contract/test_row_rules.py)."""

from __future__ import annotations

import inspect

from actors.adapters.postgres.statements import row_rules as sql
from actors.domain import row_rules as domain

# Fragments that are part of a predicate named otherwise.
PARTS = {"OVERLAP_FORBIDDEN_JOB": "overlap_forbidden"}


def test_every_fragment_has_its_predicate_and_every_predicate_its_fragment() -> None:
    fragments = {n for n, v in vars(sql).items() if n.isupper() and isinstance(v, str)}
    predicates = {
        n
        for n, v in vars(domain).items()
        if inspect.isfunction(v) and v.__module__ == domain.__name__ and not n.startswith("_")
    }
    assert {PARTS.get(f, f.lower()) for f in fragments} == predicates
    for name in predicates:
        assert name.upper() in (getattr(domain, name).__doc__ or ""), name


def test_aliased_renames_only_the_alias() -> None:
    assert sql.aliased(sql.JOB_OPEN, j="p") == "p.enabled AND NOT p.paused"
    assert sql.aliased("jj.x AND j.y", j="d") == "jj.x AND d.y"
