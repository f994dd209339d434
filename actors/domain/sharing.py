"""One object for equal immutable values, so that 100,000 jobs do not each hold a copy.

Most jobs of a large config differ in their name and little else: thousands
share a cron expression and zone, and nearly all share the executor, the retry
policy and the durations. A Job then points at the one schedule (with its
parsed expression), the one executor and the one policy in use, rather than
each holding its own. Shared values are frozen, so sharing changes nothing
but memory; a value no job uses any more is forgotten (weak references).
"""

from __future__ import annotations

import weakref
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")

_SHARED: weakref.WeakValueDictionary[tuple[Any, ...], Any] = weakref.WeakValueDictionary()
# Field names per dataclass type: dataclasses.fields() builds its tuple on every
# call, and was 40% of decoding 100,000 stored definitions.
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(kind: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(kind))
    return names


def shared(value: T) -> T:
    """An equal value already in use, or ``value`` itself (then shared from now on).

    ``value`` is a frozen dataclass that supports weak references; one with an
    unhashable field (a mapping of environment variables, say) is returned as
    it is. The key is the type and the field values, never the value itself,
    so the entry goes when the last user of the value does.
    """
    if not is_dataclass(value) or isinstance(value, type):
        return value
    kind = type(value)
    key = (kind, *[getattr(value, name) for name in _field_names(kind)])
    try:
        found = _SHARED.get(key)
    except TypeError:  # an unhashable field
        return value
    if found is not None:
        same: T = found
        return same
    _SHARED[key] = value
    return value
