"""NATS over TLS: a tls:// URL with the CA that signed the server's certificate."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from actors.adapters.embedded import EmbeddedNats, free_port, nats_server_binary, wait_for_port
from actors.adapters.nats import JetStreamBroker, decode
from actors.ports import DispatchMessage

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def tls_nats(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A nats-server with JetStream and TLS; yields (tls:// URL, CA file)."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=claimd test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=tmp_path,
    )
    (tmp_path / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        cwd=tmp_path,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.cnf",
        "-out",
        "server.pem",
        cwd=tmp_path,
    )
    port = free_port()
    server = EmbeddedNats(tmp_path / "nats", port)
    server.store_dir.mkdir(parents=True)
    server.process = subprocess.Popen(
        [
            nats_server_binary(),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "-js",
            "-sd",
            str(server.store_dir),
            "--tls",
            "--tlscert",
            str(tmp_path / "server.pem"),
            "--tlskey",
            str(tmp_path / "server.key"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"tls://127.0.0.1:{port}", tmp_path / "ca.pem"
    finally:
        server.stop()


async def test_dispatch_over_tls_with_the_ca(tls_nats: tuple[str, Path]) -> None:
    url, ca = tls_nats
    deployment = f"tls{uuid.uuid4().hex[:8]}"
    broker = await JetStreamBroker.connect(
        url, f"CLAIMD_{deployment}", f"claimd.{deployment}.runs", tls_ca=str(ca)
    )
    try:
        await broker.ensure_stream(timedelta(minutes=1))
        await broker.ensure_consumer(timedelta(seconds=5), 3, 100)
        message = DispatchMessage(
            run_id=str(uuid.uuid4()),
            epoch=1,
            job="j",
            scheduled_at=datetime.now(UTC),
            attempt=1,
            deployment=deployment,
        )
        assert await broker.publish_many([message]) == [None]
        sub = await broker.pull_subscription()
        (got,) = await sub.fetch(1, timeout=5)
        assert decode(got.data, deployment) == message
        await got.ack()
    finally:
        await broker.close()


async def test_tls_without_the_ca_never_connects(tls_nats: tuple[str, Path]) -> None:
    """The server's certificate is verified: unknown CA, no connection (it keeps retrying)."""
    url, _ = tls_nats
    connecting = asyncio.ensure_future(JetStreamBroker.connect(url, "CLAIMD_x", "claimd.x.runs"))
    done, _ = await asyncio.wait({connecting}, timeout=5)
    if done and connecting.exception() is None:
        await connecting.result().close()
        pytest.fail("connected without the CA")
    connecting.cancel()
