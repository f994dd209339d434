"""Helpers for the observability tests: a private nats-server, HTTP probes, log lines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from actors.adapters.embedded import (
    EmbeddedUnavailable,
    free_port,
    nats_server_binary,
    wait_for_port,
)
from tests.e2e.helpers import ClaimdProcess


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., ClaimdProcess]]:
    """Start `claimd` subprocesses; whatever is still running at teardown is killed."""
    started: list[ClaimdProcess] = []

    def start(
        *args: str, label: str | None = None, env: dict[str, str] | None = None
    ) -> ClaimdProcess:
        process = ClaimdProcess(list(args), tmp_path, label or f"claimd{len(started)}")
        if env:
            process.env.update(env)
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.kill()


@dataclass
class PrivateNats:
    """A nats-server of the test's own (JetStream on), to stop, freeze and restart by pid."""

    store: Path
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    frozen: bool = False

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> PrivateNats:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    nats_server_binary(),
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-js",
                    "-sd",
                    str(self.store),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for_port(self.port)
        return self

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
        self.frozen = False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.frozen:
            self.thaw()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[PrivateNats]:
    try:
        nats_server_binary()
    except EmbeddedUnavailable as exc:
        pytest.skip(f"no nats-server binary for a private server: {exc}")
    server = PrivateNats(tmp_path / "nats-store", free_port(), tmp_path / "nats-server.log")
    yield server.start()
    server.stop()


async def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET: an HTTP error status is returned, not raised; 0 when
    nothing answered (refused, or no answer within ``timeout``)."""

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            return 0, repr(exc)

    return await asyncio.to_thread(get)


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as JSON; fails naming the first line that is not one object."""
    events = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"stderr line {number} is not JSON: {line[:300]!r}") from None
        assert isinstance(event, dict), f"stderr line {number} is not an object: {line[:300]!r}"
        events.append(event)
    return events


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Samples of a /metrics page keyed by (name, labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return samples


def sample(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    """The value of exactly the series ``name{labels}``, None when absent."""
    return samples.get((name, frozenset(labels.items())))
