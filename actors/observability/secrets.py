"""The secrets this replica knows, and the one masker that scrubs them from every text.

Built at config load (``actors.config``: every job's ``secret_env`` and
``secret_headers`` values, the API tokens, the passwords in the database and
NATS URLs) and grown at run time by the secrets an execution resolves. Every
text claimd stores or serves passes through :data:`MASKER`: output tails,
errors, tracebacks (the executors' edge), config errors, log lines.

A tail is cut at its edges: a secret whose end was cut off (its prefix at the
end of the text) or whose start was (its suffix at the start) is masked too
(:meth:`Masker.mask_tail`), from ``MIN_SECRET_LENGTH`` characters on.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

MASK = "***"
# Shorter values are not masked: masking "a" or "on" would shred every text
# (and a secret that short protects nothing).
MIN_SECRET_LENGTH = 4

# Prefixes of well-known credential formats, for names that look like a value.
_SECRET_PREFIXES = (
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "pk_live_",
    "ghp_",
    "gho_",
    "ghs_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "AKIA",
    "ASIA",
    "eyJ",
)


class Masker:
    """Replaces every known secret by ``***``; safe to grow from several threads."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: frozenset[str] = frozenset()
        self._pattern: re.Pattern[str] | None = None
        self.add(values)

    def add(self, values: Iterable[str]) -> None:
        """Know these values too (short ones are ignored)."""
        new = {v for v in values if v and len(v) >= MIN_SECRET_LENGTH}
        if new <= self._values:
            return
        with self._lock:
            merged = self._values | new
            # Longest first: a secret that contains another is masked whole.
            ordered = sorted(merged, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(v) for v in ordered))
            self._values = merged

    def knows(self, value: str) -> bool:
        return value in self._values

    def __len__(self) -> int:
        return len(self._values)

    def mask(self, text: str) -> str:
        """``text`` with every whole occurrence of a known secret replaced."""
        pattern = self._pattern
        if pattern is None or not text:
            return text
        return pattern.sub(MASK, text)

    def mask_tail(self, text: str) -> str:
        """:meth:`mask`, and a secret cut at either edge of ``text`` masked too."""
        text = self.mask(text)
        if not text or not self._values:
            return text
        cut_end = 0
        cut_start = 0
        # A cut secret of MIN_SECRET_LENGTH or more characters contains the
        # text's first (or last) MIN_SECRET_LENGTH characters: a cheap filter.
        head = text[:MIN_SECRET_LENGTH]
        last = text[-MIN_SECRET_LENGTH:]
        for value in self._values:
            # The longest proper prefix of the value that ends the text...
            cut_end = _longest_cut(text, value, last, cut_end, at_end=True)
            # ... and the longest proper suffix that starts it.
            cut_start = _longest_cut(text, value, head, cut_start, at_end=False)
        if cut_end:
            text = text[:-cut_end] + MASK
        if cut_start and cut_start <= len(text) - (len(MASK) if cut_end else 0):
            text = MASK + text[cut_start:]
        return text


def _longest_cut(text: str, value: str, edge: str, longest: int, *, at_end: bool) -> int:
    """The longest proper prefix of ``value`` that ends ``text`` (``at_end``), or proper
    suffix that starts it, if longer than ``longest`` (else ``longest``): ``edge`` is
    the text's MIN_SECRET_LENGTH characters on that side, in any such cut."""
    if edge not in value:
        return longest
    for k in range(min(len(value) - 1, len(text)), max(longest, MIN_SECRET_LENGTH - 1), -1):
        if text.endswith(value[:k]) if at_end else text.startswith(value[-k:]):
            return k
    return longest


MASKER = Masker()


def url_secrets(url: str) -> list[str]:
    """The credentials in a URL (or several, comma-separated): passwords and NATS tokens."""
    found: list[str] = []
    for one in url.split(","):
        try:
            parts = urlsplit(one.strip())
            password = parts.password
            username = parts.username
        except ValueError:
            continue
        if password:
            found += [password, unquote(password)]
        elif username and parts.scheme in ("nats", "tls", "ws", "wss"):
            found += [username, unquote(username)]  # nats://TOKEN@host
        for key, _, value in (p.partition("=") for p in parts.query.split("&")):
            if key.lower() in ("password", "sslpassword", "token") and value:
                found += [value, unquote(value)]
    return found


def looks_like_secret(name: str) -> bool:
    """Whether text written where a variable name belongs looks like a credential.

    A known secret, a well-known token prefix, or a long mix of lower-case
    letters and digits (variable names are UPPER_SNAKE by custom). Such a
    name is never quoted in an error.
    """
    if MASKER.knows(name) or name.startswith(_SECRET_PREFIXES):
        return True
    has_digit = any(c.isdigit() for c in name)
    has_lower = any(c.islower() for c in name)
    return len(name) >= 12 and has_digit and has_lower


__all__ = ["MASK", "MASKER", "MIN_SECRET_LENGTH", "Masker", "looks_like_secret", "url_secrets"]
