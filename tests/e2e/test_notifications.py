"""Notifications through real `claimd run` replicas and real receivers (issue 26).

An aiohttp receiver checks every webhook's HMAC signature and counts what it
accepted by delivery id; an aiosmtpd server receives the mails. A failing job
gives one ``failed`` and, once fixed, one ``recovered``; with the replica that
was sending SIGKILLed mid-request and a receiver that answers 500 three times,
each event is accepted once and its attempts are on record (the killed one as
lost); a job whose instant passed its deadline while the replicas were stopped
gives one ``missed``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from email import message_from_bytes
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from actors.domain.notify import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    verify,
)
from tests.e2e.helpers import (
    ClaimdProcess,
    child_env,
    eventually,
    http_port_of,
    query,
    scrape_metrics,
)
from tests.e2e.test_cli import run_config
from tests.e2e.test_operator_cli import claimd
from tests.integration.helpers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

SECRET = "hook-secret-of-the-test"


class Receiver:
    """A webhook receiver: checks the signature, answers 500 to the first ``fail_first``
    requests (holding the first until ``release_first`` when ``hold_first``)."""

    def __init__(self, fail_first: int = 0, hold_first: bool = False) -> None:
        self.fail_first = fail_first
        self.hold_first = hold_first
        self.requests: list[dict[str, Any]] = []
        self.accepted: Counter[str] = Counter()
        self.first_arrived = asyncio.Event()
        self.release_first = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        timestamp = request.headers.get(TIMESTAMP_HEADER, "")
        signed = verify(SECRET, timestamp, body, request.headers.get(SIGNATURE_HEADER, ""))
        fresh = timestamp.isdigit() and abs(time.time() - int(timestamp)) < 300
        payload = json.loads(body)
        index = len(self.requests)
        self.requests.append({"payload": payload, "signed": signed and fresh})
        assert payload["delivery_id"] == request.headers[DELIVERY_HEADER]
        if not (signed and fresh):
            return web.Response(status=401)
        if index == 0 and self.hold_first:
            self.first_arrived.set()
            await self.release_first.wait()
        if index < self.fail_first:
            return web.Response(status=500, text="receiver down")
        self.accepted[payload["delivery_id"]] += 1
        return web.Response(status=200, text="ok")

    def events(self) -> Counter[str]:
        """Accepted notifications by event."""
        return Counter(d.rpartition(":")[2] for d in self.accepted)


@asynccontextmanager
async def serving(receiver: Receiver) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        receiver.release_first.set()
        await runner.cleanup()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Callable[..., ClaimdProcess]]:
    started: list[ClaimdProcess] = []

    def start(config: Path, label: str) -> ClaimdProcess:
        process = ClaimdProcess(
            ["run", "--config", str(config)], tmp_path, label, env=child_env(OPS_HOOK_SECRET=SECRET)
        )
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.kill()


def notify_toml(url: str, extra_sinks: str = "") -> str:
    return f"""
[notify]
default = ["ops"]
lease = "6s"
timeout = "3s"
backoff = "100ms"
backoff_max = "300ms"
interval = "200ms"

[notify.ops]
kind = "webhook"
url = "{url}"
secret_env = "OPS_HOOK_SECRET"
{extra_sinks}
"""


async def attempts_of(schema_url: str, event: str) -> list[tuple[str, int | None]]:
    rows = await query(
        schema_url,
        "SELECT a.outcome, a.status FROM notification_attempts a "
        "JOIN notification_outbox o ON o.id = a.outbox_id "
        "WHERE o.event = $1 ORDER BY a.attempt",
        event,
    )
    return [(r["outcome"], r["status"]) for r in rows]


async def unsent(schema_url: str) -> int:
    rows = await query(
        schema_url, "SELECT count(*) AS n FROM notification_outbox WHERE state <> 'sent'"
    )
    return int(rows[0]["n"])


async def test_failed_then_recovered_once_each_through_a_sigkill_and_three_500s(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    replicas: Callable[..., ClaimdProcess],
) -> None:
    marker = tmp_path / "fixed"
    receiver = Receiver(fail_first=3, hold_first=True)
    async with serving(receiver) as url:
        jobs = notify_toml(url) + (
            '\n[jobs.flaky]\nevery = "1s"\nmax_attempts = 1\ntimeout = "10s"\n'
            'notify_on = ["failed", "recovered"]\n'
            f'run = {{ shell = "test -f {marker}", use_shell = true }}\n'
        )
        config = run_config(tmp_path / "claimd.toml", schema_url, nats_url, deployment, jobs)
        pair = {p.pid: p for p in (replicas(config, "a"), replicas(config, "b"))}

        await asyncio.wait_for(receiver.first_arrived.wait(), 60)
        # The replica holding the row's lease is the one sending: SIGKILL it mid-request.
        (row,) = await query(
            schema_url, "SELECT lease_owner FROM notification_outbox WHERE state = 'sending'"
        )
        sender_pid = int(row["lease_owner"].split(":")[1])
        pair[sender_pid].proc.kill()  # type: ignore[union-attr]
        pair[sender_pid].proc.wait(10)  # type: ignore[union-attr]
        receiver.release_first.set()

        async def failed_accepted() -> bool:
            return receiver.events()["failed"] == 1

        await eventually(failed_accepted, timeout=60, what="the failed notification accepted")
        marker.touch()

        async def recovered_and_settled() -> bool:
            return receiver.events()["recovered"] == 1 and await unsent(schema_url) == 0

        await eventually(recovered_and_settled, timeout=60, what="recovered, nothing left")

    for replica in pair.values():
        crashes = replica.events("actor crashed; restarting")
        assert not [c for c in crashes if c.get("name") == "notifier"], crashes
    # Once per event: one failed for the whole failing streak, one recovered.
    assert receiver.events() == Counter({"failed": 1, "recovered": 1})
    assert set(receiver.accepted.values()) == {1}
    assert all(r["signed"] for r in receiver.requests)
    # Every attempt on record: the killed sender's lost, the receiver's two 500s, then 200.
    assert await attempts_of(schema_url, "failed") == [
        ("lost", None),
        ("failed", 500),
        ("failed", 500),
        ("delivered", 200),
    ]
    assert await attempts_of(schema_url, "recovered") == [("delivered", 200)]
    assert len(receiver.requests) == 5

    # The same record through `claimd notifications`, as an operator reads it.
    listed = await claimd("notifications", "flaky", "--database-url", schema_url, "--json")
    assert listed.code == 0, listed.err
    shown = {n["event"]: n for n in json.loads(listed.out)}
    assert shown.keys() == {"failed", "recovered"}
    assert [a["outcome"] for a in shown["failed"]["attempt_log"]] == [
        "lost",
        "failed",
        "failed",
        "delivered",
    ]
    assert shown["failed"]["state"] == "sent"
    # And through the API of the replica that survived.
    (survivor,) = [p for pid, p in pair.items() if pid != sender_pid]
    port = http_port_of(survivor)
    assert port is not None
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/api/notifications?job=flaky&limit=5") as response,
    ):
        assert response.status == 200
        served = {n["event"]: n for n in await response.json()}
    assert served.keys() == {"failed", "recovered"}
    assert [(a["outcome"], a["status"]) for a in served["failed"]["attempt_log"]] == [
        ("lost", None),
        ("failed", 500),
        ("failed", 500),
        ("delivered", 200),
    ]
    # And in the survivor's metrics: its two 500s and its delivery of failed.
    samples = scrape_metrics(port)
    sent = 'claimd_notifications_sent_total{{event="failed",outcome="{}",sink="ops"}}'
    assert samples[sent.format("failed")] == 2
    assert samples[sent.format("delivered")] == 1
    table = (await claimd("notifications", "--database-url", schema_url)).out
    assert "attempt 1: lost" in table
    assert "attempt 4: delivered 200" in table


class Mailbox:
    """aiosmtpd's handler: every mail it was given."""

    def __init__(self) -> None:
        self.mails: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.mails.append(envelope.content)
        return "250 Message accepted for delivery"


async def test_an_instant_missed_while_the_replicas_were_stopped_gives_one_missed(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    replicas: Callable[..., ClaimdProcess],
) -> None:
    controller_module = pytest.importorskip("aiosmtpd.controller")
    mailbox = Mailbox()
    smtp = controller_module.Controller(mailbox, hostname="127.0.0.1", port=free_port())
    smtp.start()
    receiver = Receiver()
    try:
        async with serving(receiver) as url:
            mail_sink = (
                f'\n[notify.mail]\nkind = "smtp"\nhost = "127.0.0.1"\nport = {smtp.port}\n'
                'from = "claimd@example.test"\nto = ["ops@example.test"]\n'
            )
            jobs = notify_toml(url, mail_sink) + (
                '\n[jobs.daily]\nevery = "12s"\ndeadline = "2s"\nnotify = ["ops", "mail"]\n'
                'notify_on = ["missed"]\nrun = { shell = ["true"] }\n'
            )
            config = run_config(tmp_path / "claimd.toml", schema_url, nats_url, deployment, jobs)
            first = replicas(config, "first")

            async def succeeded_once() -> bool:
                try:
                    rows = await query(
                        schema_url, "SELECT count(*) AS n FROM job_runs WHERE state = 'succeeded'"
                    )
                except asyncpg.UndefinedTableError:
                    return False  # not migrated yet
                return int(rows[0]["n"]) >= 1

            await eventually(succeeded_once, timeout=60, what="the job's first success")
            first.terminate()
            assert await first.wait(30) == 0
            (last,) = await query(
                schema_url,
                "SELECT max(scheduled_at) + interval '12 s' AS next FROM job_runs "
                "WHERE state = 'succeeded'",
            )
            missed_instant = last["next"]

            async def past_its_deadline() -> bool:
                (row,) = await query(
                    schema_url,
                    "SELECT now() > $1::timestamptz + interval '2.5 s' AS past",
                    missed_instant,
                )
                return bool(row["past"])

            await eventually(past_its_deadline, timeout=30, what="the next instant's deadline")
            replicas(config, "second")

            async def told() -> bool:
                return receiver.events()["missed"] == 1 and len(mailbox.mails) == 1

            await eventually(told, timeout=60, what="the missed notification and its mail")

            async def settled() -> bool:
                return await unsent(schema_url) == 0

            await eventually(settled, timeout=30, what="nothing left to send")
    finally:
        smtp.stop()

    (row,) = await query(
        schema_url,
        "SELECT r.scheduled_at FROM notification_outbox o JOIN job_runs r ON r.id = o.run_id "
        "WHERE o.event = 'missed' AND o.sink = 'ops'",
    )
    assert row["scheduled_at"] == missed_instant
    assert receiver.events() == Counter({"missed": 1})
    (mail,) = mailbox.mails
    message = message_from_bytes(mail)
    assert "daily missed its deadline" in message["Subject"]
    assert message["To"] == "ops@example.test"


async def test_a_run_past_its_bound_gives_one_too_long_on_a_slack_webhook(
    tmp_path: Path,
    schema_url: str,
    nats_url: str,
    deployment: str,
    replicas: Callable[..., ClaimdProcess],
) -> None:
    posts: list[dict[str, Any]] = []

    async def slack(request: web.Request) -> web.Response:
        posts.append(await request.json())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/services/T0/B0/x", slack)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    chat = f"http://127.0.0.1:{runner.addresses[0][1]}/services/T0/B0/x"
    try:
        jobs = notify_toml("http://127.0.0.1:9/unused") + (
            f'\n[notify.chat]\nkind = "slack"\nurl = "{chat}"\n'
            '\n[jobs.slowpoke]\nevery = "1h"\ntimeout = "30s"\ntoo_long = "1s"\n'
            'notify = ["chat"]\nnotify_on = ["too_long"]\nrun = { shell = ["sleep", "4"] }\n'
        )
        config = run_config(tmp_path / "claimd.toml", schema_url, nats_url, deployment, jobs)
        replicas(config, "a")
        replicas(config, "b")

        async def triggered() -> bool:
            # Refused (exit 3 or 4) until a replica has migrated and written the job.
            result = await claimd("trigger", "slowpoke", "--database-url", schema_url)
            return result.code == 0

        await eventually(triggered, timeout=60, what="a manual run of slowpoke", interval=0.5)

        async def told_and_done() -> bool:
            rows = await query(
                schema_url,
                "SELECT count(*) AS n FROM job_runs WHERE state = 'succeeded'",
            )
            return len(posts) >= 1 and int(rows[0]["n"]) >= 1 and await unsent(schema_url) == 0

        await eventually(told_and_done, timeout=60, what="too_long sent and the run finished")
    finally:
        await runner.cleanup()

    (post,) = posts
    assert "job slowpoke is running too long" in post["text"]
    (run,) = await query(
        schema_url, "SELECT id::text AS id FROM job_runs WHERE state = 'succeeded'"
    )
    assert f"run_id: {run['id']}" in post["text"]
