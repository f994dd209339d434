"""Notifications without I/O: the config's sinks and policies, the signature, the notifier.

The outbox's rules are PostgreSQL's (tests/integration/test_notifications.py);
the whole path through replicas and real receivers is tests/e2e/test_notifications.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from actors.config import ConfigError, parse_config
from actors.config.notify import NotifyConfig
from actors.domain.notify import (
    DEFAULT_EVENTS,
    Notification,
    NotifyEvent,
    NotifyPolicy,
    Sink,
    WebhookSink,
    encode_payload,
    retry_delay,
    sign,
    verify,
)
from actors.observability.secrets import MASKER
from actors.ports.notify import NotificationRecord, OutboxFigures, SendResult
from actors.scheduling.notifier import Notifier

SINKS = """
[notify]
default = ["ops"]

[notify.ops]
kind = "webhook"
url = "https://hooks.example/claimd"
secret_env = "OPS_HOOK_SECRET"

[notify.mail]
kind = "smtp"
host = "smtp.example"
port = 587
from = "claimd@example.test"
to = ["ops@example.test"]
starttls = true
user = "claimd"
password_env = "SMTP_PASSWORD"

[notify.chat]
kind = "slack"
url_env = "SLACK_URL"
"""
JOB = '\n[jobs.{name}]\nevery = "1m"\nrun = {{ shell = ["true"] }}\n{extra}\n'


def config(extra_jobs: str = "", sinks: str = SINKS, env: dict[str, str] | None = None) -> object:
    text = sinks + JOB.format(name="plain", extra="") + extra_jobs
    return parse_config(text, "claimd.toml", env=env or {})


def job(name: str, extra: str) -> str:
    return JOB.format(name=name, extra=extra)


def test_sinks_defaults_and_each_jobs_policy() -> None:
    loaded = config(
        job("nightly", 'notify = ["ops", "mail"]\nfailure_tolerance = 3\nrealert = "6h"\n')
        + job("slow", 'too_long = "30m"\ndeadline = "2h"\n')
        + job("silent", "notify = []\n")
    )
    notify = loaded.notify  # type: ignore[attr-defined]
    assert sorted(notify.sinks) == ["chat", "mail", "ops"]
    policies = {p.job: p for p in notify.policies(loaded.jobs)}  # type: ignore[attr-defined]
    assert set(policies) == {"plain", "nightly", "slow"}  # silent turned the default off
    assert policies["plain"] == NotifyPolicy(
        "plain", ("ops",), DEFAULT_EVENTS, deadline=timedelta(hours=1)
    )
    assert policies["nightly"].sinks == ("ops", "mail")
    assert policies["nightly"].failure_tolerance == 3
    assert policies["nightly"].realert == timedelta(hours=6)
    # A bound given is an event asked for.
    assert NotifyEvent.TOO_LONG in policies["slow"].events
    assert policies["slow"].deadline == timedelta(hours=2)
    # The notification keys are not the job's definition: its fingerprint is unchanged.
    assert loaded.jobs["nightly"].executor == loaded.jobs["plain"].executor  # type: ignore[attr-defined]


def test_no_notify_table_notifies_nobody() -> None:
    loaded = parse_config(JOB.format(name="plain", extra=""), "claimd.toml", env={})
    assert loaded.notify.policies(loaded.jobs) == []


@pytest.mark.parametrize(
    ("sinks", "extra", "expected"),
    [
        (
            SINKS,
            job("x", 'notify = ["pager"]\n'),
            "job 'x': field 'notify': no sink [notify.pager]",
        ),
        (
            SINKS,
            job("x", 'notify_on = ["exploded"]\n'),
            "job 'x': field 'notify_on': unknown event",
        ),
        (SINKS, job("x", "failure_tolerance = 0\n"), "job 'x': field 'failure_tolerance'"),
        (SINKS, job("x", 'realert = "soon"\n'), "job 'x': field 'realert'"),
        (
            SINKS,
            job("x", 'notify_on = ["too_long"]\n'),
            "job 'x': field 'too_long': notify_on names too_long",
        ),
    ],
)
def test_a_bad_job_key_rejects_that_job_naming_it(sinks: str, extra: str, expected: str) -> None:
    loaded = config(extra, sinks)
    assert "x" not in loaded.jobs  # type: ignore[attr-defined]
    (error,) = loaded.errors  # type: ignore[attr-defined]
    assert str(error).startswith("claimd.toml: ")
    assert expected in str(error)


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('[notify.ops]\nkind = "pager"\n', "field 'notify.ops.kind': expected one of webhook"),
        ('[notify.ops]\nkind = "webhook"\n', "field 'notify.ops.url'"),
        ('[notify.ops]\nkind = "webhook"\nurl = "ftp://x"\n', "must start with http"),
        (
            '[notify.ops]\nkind = "webhook"\nurl = "https://x"\nsecret = "s"\n',
            "field 'notify.ops.secret': unknown key for a webhook sink",
        ),
        (
            '[notify.ops]\nkind = "webhook"\nurl = "https://x"\nsecret_env = "sk_live_abcdef"\n',
            "field 'notify.ops.secret_env'",
        ),
        ('[notify.ops]\nkind = "slack"\n', "give exactly one of url or url_env"),
        (
            '[notify.m]\nkind = "smtp"\nhost = "h"\nfrom = "a@b"\nto = ["nobody"]\n',
            "field 'notify.m.to': expected a list of e-mail addresses",
        ),
        ('[notify]\ndefault = ["ops"]\n', "field 'notify.default': no sink [notify.ops]"),
        ('[notify]\nlease = "5s"\ntimeout = "10s"\n', "field 'notify.lease': must be at least"),
        ("[notify]\nretries = 3\n", "field 'notify.retries': unknown key"),
    ],
)
def test_a_bad_sink_or_setting_is_one_line_naming_the_field(table: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(table + JOB.format(name="plain", extra=""), "claimd.toml", env={})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("claimd.toml: ")
    assert expected in message
    assert "sk_live_abcdef" not in message


def test_the_sinks_secrets_are_masked() -> None:
    config(env={"OPS_HOOK_SECRET": "hook-secret-value", "SMTP_PASSWORD": "mail-password-x"})
    assert MASKER.mask("sig hook-secret-value pw mail-password-x") == "sig *** pw ***"


def test_the_signature_covers_the_timestamp_and_the_body() -> None:
    body = encode_payload({"event": "failed", "job": "x"})
    signature = sign("s3cret", 1700000000, body)
    assert signature.startswith("sha256=")
    assert verify("s3cret", "1700000000", body, signature)
    assert not verify("s3cret", "1700000001", body, signature)  # a replay with a new time
    assert not verify("s3cret", "1700000000", body + b" ", signature)
    assert not verify("other", "1700000000", body, signature)
    assert not verify("s3cret", "not a time", body, signature)


def test_retries_back_off_exponentially_to_a_ceiling() -> None:
    delays = [retry_delay(n, timedelta(seconds=5), timedelta(minutes=1)) for n in range(1, 7)]
    assert [d.total_seconds() for d in delays] == [5, 10, 20, 40, 60, 60]


# --- the notifier on fakes ---------------------------------------------------------------


def notification(n: int, sink: str = "ops", attempt: int = 1) -> Notification:
    return Notification(
        id=n,
        run_id=f"run-{n}",
        job="nightly",
        event=NotifyEvent.FAILED,
        sink=sink,
        attempt=attempt,
        claim_epoch=attempt,
        scheduled_at=datetime(2026, 1, 1, 2, tzinfo=UTC),
        run_state="failed",
        run_attempt=3,
        error="exit 1",
    )


class FakeStore:
    def __init__(self, due: list[Notification], fenced: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.due = due
        self.fenced = fenced
        self.synced: list[list[NotifyPolicy]] = []
        self.recorded: list[tuple[int, SendResult, timedelta]] = []

    async def sync_policies(self, policies: Sequence[NotifyPolicy]) -> None:
        self.synced.append(list(policies))

    async def judge_verdicts(self, limit: int) -> int:
        return 0

    async def scan_missed(self, lookback: timedelta) -> int:
        return 0

    async def scan_too_long(self) -> int:
        return 0

    async def recover_expired(self, max_attempts: int) -> int:
        return 0

    async def claim(self, sender: str, limit: int, lease: timedelta) -> list[Notification]:
        batch, self.due = self.due[:limit], self.due[limit:]
        return batch

    async def record(
        self,
        sender: str,
        n: Notification,
        result: SendResult,
        retry_in: timedelta,
        max_attempts: int,
    ) -> str | None:
        self.recorded.append((n.id, result, retry_in))
        if n.id in self.fenced:
            return None
        return "sent" if result.delivered else "pending"

    async def figures(self) -> OutboxFigures:
        return OutboxFigures(pending=len(self.due), oldest_s=0.0, dead=0)

    async def list(self, job: str | None, limit: int) -> list[NotificationRecord]:
        return []


class FakeSenders:
    def __init__(self, answers: dict[int, SendResult]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, int]] = []

    async def send(self, sink: Sink, n: Notification, timeout: float) -> SendResult:
        self.sent.append((sink.name, n.id))
        return self.answers.get(n.id, SendResult(delivered=True, status=200))

    async def close(self) -> None:
        pass


async def test_the_notifier_sends_records_and_backs_off() -> None:
    notify = NotifyConfig(
        sinks={"ops": WebhookSink("ops", "https://hooks.example")}, default_sinks=("ops",)
    )
    store = FakeStore(
        [
            notification(1),
            notification(2, attempt=3),
            notification(3, sink="gone"),
            notification(4),
        ],
        fenced={4},
    )
    senders = FakeSenders({2: SendResult(delivered=False, status=500, error="HTTP 500")})
    jobs = {"nightly"}
    notifier = Notifier(store, senders, "me", lambda: (notify, jobs), asyncio.Event())
    assert await notifier.tick() == 4
    assert sorted(senders.sent) == [("ops", 1), ("ops", 2), ("ops", 4)]
    recorded = {n: (result, retry) for n, result, retry in store.recorded}
    assert recorded[1][0].delivered
    # The third attempt failed: the next waits 5 s x 2^2.
    assert recorded[2][1] == timedelta(seconds=20)
    # A sink this replica's config does not have is a recorded failure, not a crash.
    assert not recorded[3][0].delivered
    assert "no sink [notify.gone]" in (recorded[3][0].error or "")
    # The policies were written once; the same config is not written again, a reload's is.
    await notifier.tick()
    assert [[p.job for p in synced] for synced in store.synced] == [["nightly"]]
    jobs = {"nightly", "weekly"}
    await notifier.tick()
    assert [sorted(p.job for p in synced) for synced in store.synced][-1] == ["nightly", "weekly"]


class SilentSenders(FakeSenders):
    """A sink that never answers."""

    async def send(self, sink: Sink, n: Notification, timeout: float) -> SendResult:
        self.sent.append((sink.name, n.id))
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_stop_abandons_a_slow_send_to_its_lease_instead_of_waiting_for_it() -> None:
    notify = NotifyConfig(sinks={"ops": WebhookSink("ops", "https://hooks.example")})
    store = FakeStore([notification(1)])
    senders = SilentSenders({})
    stop = asyncio.Event()
    notifier = Notifier(store, senders, "me", lambda: (notify, set()), stop)
    task = asyncio.create_task(notifier.run())

    async def sending() -> None:
        while not senders.sent:
            await asyncio.sleep(0)

    await asyncio.wait_for(sending(), 5)
    stop.set()
    await asyncio.wait_for(task, 5)
    # Nothing recorded: the row stays leased and another sender records the attempt lost.
    assert store.recorded == []


def test_judge_verdict_tolerance_streak_realert_and_recovery() -> None:
    from actors.domain.notify import Streak, judge_verdict

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    policy = NotifyPolicy("j", ("ops",), failure_tolerance=2, realert=timedelta(hours=1))
    streak, owed = judge_verdict(policy, Streak(), True, t0)
    assert owed is None  # 1 failure < tolerance 2
    streak, owed = judge_verdict(policy, streak, True, t0)
    assert owed is NotifyEvent.FAILED
    streak, owed = judge_verdict(policy, streak, True, t0 + timedelta(minutes=30))
    assert owed is None  # the same streak, before the realert
    streak, owed = judge_verdict(policy, streak, True, t0 + timedelta(hours=1))
    assert owed is NotifyEvent.FAILED
    streak, owed = judge_verdict(policy, streak, False, t0 + timedelta(hours=2))
    assert (streak, owed) == (Streak(), NotifyEvent.RECOVERED)
    # A success after unnotified failures recovers nothing.
    streak, _ = judge_verdict(policy, Streak(), True, t0)
    assert judge_verdict(policy, streak, False, t0)[1] is None
