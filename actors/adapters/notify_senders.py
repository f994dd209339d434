"""Sending one notification to one sink: a signed webhook, Slack, or SMTP.

A sink's failure is an answer (``SendResult(delivered=False, ...)``), never an
exception: the sender records it and retries with backoff. Secrets come from
the environment when sent (``secret_env``, ``url_env``, ``password_env``) and
are masked in every error kept.
"""

from __future__ import annotations

import asyncio
import os
import smtplib
import ssl
import time
from email.message import EmailMessage

import aiohttp

from actors.domain.notify import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Notification,
    Sink,
    SlackSink,
    SmtpSink,
    WebhookSink,
    encode_payload,
    sign,
)
from actors.observability.secrets import MASKER
from actors.ports.notify import SendResult

# Bytes of a sink's answer kept in the attempt's record.
REPLY_BYTES = 500


class MissingSecret(Exception):
    """A sink names an environment variable this replica does not have."""


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise MissingSecret(f"environment variable {name} is not set on this replica")
    MASKER.add([value])
    return value


class NotificationSenders:
    """SinkSender for every kind, over one HTTP session."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def send(self, sink: Sink, notification: Notification, timeout: float) -> SendResult:
        try:
            if isinstance(sink, WebhookSink):
                return await self._webhook(sink, notification, timeout)
            if isinstance(sink, SlackSink):
                return await self._slack(sink, notification, timeout)
            return await asyncio.wait_for(
                asyncio.to_thread(_send_mail, sink, notification, timeout), timeout * 2
            )
        except MissingSecret as exc:
            return SendResult(delivered=False, error=str(exc))
        except TimeoutError:
            return SendResult(delivered=False, error=f"no answer within {timeout:g}s")
        except (aiohttp.ClientError, OSError, smtplib.SMTPException) as exc:
            return SendResult(delivered=False, error=MASKER.mask(f"{type(exc).__name__}: {exc}"))

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str], timeout: float
    ) -> SendResult:
        async with self._http().post(
            url,
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,
        ) as response:
            reply = (await response.content.read(REPLY_BYTES)).decode("utf-8", "replace")
            ok = 200 <= response.status < 300
            return SendResult(
                delivered=ok,
                status=response.status,
                reply=MASKER.mask(reply),
                error=None if ok else f"HTTP {response.status}",
            )

    async def _webhook(self, sink: WebhookSink, n: Notification, timeout: float) -> SendResult:
        body = encode_payload(n.payload())
        headers = {
            **sink.headers,
            "Content-Type": "application/json",
            "User-Agent": "claimd-notify",
            EVENT_HEADER: n.event.value,
            DELIVERY_HEADER: n.delivery_id,
            "Idempotency-Key": n.delivery_id,
        }
        if sink.secret_env:
            timestamp = int(time.time())
            headers[TIMESTAMP_HEADER] = str(timestamp)
            headers[SIGNATURE_HEADER] = sign(_env(sink.secret_env), timestamp, body)
        return await self._post(sink.url, body, headers, timeout)

    async def _slack(self, sink: SlackSink, n: Notification, timeout: float) -> SendResult:
        url = sink.url if sink.url is not None else _env(sink.url_env or "")
        body = encode_payload({"text": n.text()})
        return await self._post(url, body, {"Content-Type": "application/json"}, timeout)


def _send_mail(sink: SmtpSink, n: Notification, timeout: float) -> SendResult:
    """One mail, in a thread (smtplib blocks); its reply code kept."""
    message = EmailMessage()
    message["From"] = sink.sender
    message["To"] = ", ".join(sink.to)
    message["Subject"] = n.summary()
    message["Message-ID"] = f"<{n.delivery_id.replace(':', '.')}@claimd>"
    message.set_content(n.text())
    password = _env(sink.password_env) if sink.password_env else None
    context = ssl.create_default_context()
    smtp: smtplib.SMTP = (
        smtplib.SMTP_SSL(sink.host, sink.port, timeout=timeout, context=context)
        if sink.tls
        else smtplib.SMTP(sink.host, sink.port, timeout=timeout)
    )
    with smtp:
        if sink.starttls:
            smtp.starttls(context=context)
        if sink.user and password is not None:
            smtp.login(sink.user, password)
        refused = smtp.send_message(message)
        _code, reply = smtp.noop()
    if refused:
        return SendResult(delivered=False, error=f"recipients refused: {sorted(refused)}")
    return SendResult(delivered=True, status=250, reply=reply.decode("utf-8", "replace")[:200])
