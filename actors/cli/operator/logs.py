"""`claimd logs RUN_ID|JOB [-f]`: a run's output, kept or live.

Without ``-f``: each attempt's kept tail (from the database or the API). With
``-f``: the run's output as it is printed, followed through a replica's API
(GET /api/runs/{run_id}/output/stream, Server-Sent Events) until the run ends;
exit 0 when it succeeded, 1 otherwise. A JOB names its current run: the one
running (or claimed), else its latest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp

from actors.cli.operator import render
from actors.cli.operator.connect import ENDPOINTS_FILE, Backend, _token, open_backend
from actors.cli.operator.options import Commands, connection
from actors.cli.operator.reads import _is_run_id
from actors.cli.operator.running import EXIT_CODES, fail
from actors.http.openapi import BY_ID
from actors.operator import BadInput, NotFound, OperatorError, Unavailable

HELP = "a run's output: each attempt's kept tail, or (-f) its lines as they are printed"


async def current_run(backend: Backend, target: str) -> str:
    """``target`` if it is a run id, else the job's run running now, else its latest."""
    if _is_run_id(target):
        return target
    page = _plain(await backend.get("runs", job=target, states=["running", "claimed"], limit=1))
    if not page["runs"]:
        page = _plain(await backend.get("runs", job=target, limit=1))
    if not page["runs"]:
        raise NotFound(f"job {target!r} has no run yet")
    return str(page["runs"][0]["id"])


def _plain(answer: Any) -> Any:
    """A read model (either backend answers with one) as JSON values."""
    return answer.model_dump(mode="json") if hasattr(answer, "model_dump") else answer


def kept(run: dict[str, Any]) -> str:
    """Each attempt's kept tail under a line naming it."""
    parts = []
    for attempt in run.get("attempts", []):
        head = f"--- attempt {attempt['attempt']} ({attempt['outcome']}) ---"
        parts.append(head + "\n" + (attempt.get("output_tail") or "(no output kept)"))
    return "\n".join(parts) if parts else f"(run {run['id']} has not started: {run['state']})"


def api_url(args: argparse.Namespace) -> str:
    """The API to follow through: --url, CLAIMD_URL, or the running `claimd dev`'s."""
    url = getattr(args, "url", None) or os.environ.get("CLAIMD_URL")
    if url:
        return str(url)
    path = Path(getattr(args, "dev_dir", ".claimd")) / ENDPOINTS_FILE
    try:
        recorded = json.loads(path.read_text()).get("http_url")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if not recorded:
        raise BadInput(
            "logs -f follows a run through a replica's API: give --url (or CLAIMD_URL), "
            "or run `claimd dev` in this directory"
        )
    return str(recorded)


async def follow(url: str, token: str | None, run_id: str, timeout: float) -> int:
    """Print the run's output as the stream sends it; the exit status of its end."""
    path = BY_ID["streamRunOutput"].path.format(run_id=run_id)
    headers = {"Accept": "text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    client_timeout = aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=timeout)
    try:
        async with (
            aiohttp.ClientSession(timeout=client_timeout) as session,
            session.get(url.rstrip("/") + path, headers=headers) as response,
        ):
            if response.status != 200:
                raise _refusal(response.status, await response.text(), url)
            return await _print_events(response)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise Unavailable(f"cannot reach the claimd API at {url}: {exc!r}") from None


def _refusal(status: int, body: str, url: str) -> OperatorError:
    try:
        message = json.loads(body).get("error")
    except (ValueError, AttributeError):
        message = None
    kind = {404: NotFound, 400: BadInput}.get(status, Unavailable)
    return kind(f"{message or 'no message'} (HTTP {status} from {url})")


async def _print_events(response: aiohttp.ClientResponse) -> int:
    buffer = b""
    event, data = "message", ""
    async for piece in response.content.iter_any():
        buffer += piece
        while b"\n" in buffer:
            raw, buffer = buffer.split(b"\n", 1)
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()
            elif not line and data:
                done = _show(event, json.loads(data))
                if done is not None:
                    return done
                event, data = "message", ""
    print("claimd: the stream closed before the run ended", file=sys.stderr)
    return 1


def _show(event: str, data: dict[str, Any]) -> int | None:
    if event == "output":
        sys.stdout.write(render.terminal_safe(str(data.get("text", ""))))
        sys.stdout.flush()
    elif event == "notice":
        print(f"claimd: {render.terminal_safe(str(data.get('text', '')))}", file=sys.stderr)
    elif event == "end":
        state = data.get("state")
        print(f"claimd: run ended: {state}", file=sys.stderr)
        return 0 if state == "succeeded" else 1
    return None


async def _logs(args: argparse.Namespace) -> int:
    try:
        backend = await open_backend(args)
        try:
            run_id = await current_run(backend, args.target)
            if not args.follow:
                run = _plain(await backend.get("run", run_id=run_id))
                if args.json:
                    print(json.dumps(run["attempts"], indent=2))
                else:
                    print(render.terminal_safe(kept(run)))
                return 0
        finally:
            await backend.close()
        return await follow(api_url(args), _token(args), run_id, args.connect_timeout)
    except OperatorError as exc:
        return fail(str(exc).strip() or type(exc).__name__, exc.exit)


def add_logs(commands: Commands) -> None:
    """`claimd logs`: its own handler (-f prints as the stream goes, not one answer)."""
    p = commands.sub.add_parser(
        "logs",
        allow_abbrev=False,
        help=HELP,
        description=__doc__,
        epilog=f"exit status{EXIT_CODES}",
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("target", metavar="RUN_ID|JOB")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="print the lines as they are printed, until the run ends (through the API)",
    )
    connection(p)

    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(_logs(args))
        except KeyboardInterrupt:
            return 130

    p.set_defaults(func=run, open_store=commands.open_store)
