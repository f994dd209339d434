"""The ``[claimd]`` table: process settings, parsed once into their real types.

One pydantic model is both the schema and the value the rest of claimd reads:
durations arrive as timedelta, the NATS servers as one comma-separated string,
the API tokens read from their file or variable. The environment overrides a
few settings (:data:`ENV_OVERRIDES`), applied in :meth:`Settings.from_table`
only; the checks across fields (API tokens, the lease invariant and the timeout
budget) run once, after the fields.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Annotated, Any, Literal, Self

from pydantic import (
    Field,
    GetCoreSchemaHandler,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import core_schema

from actors.config.errors import ConfigError, FieldProblem, StrictModel, first_error_field
from actors.config.tokens import TOKEN_FIELDS, read_api_tokens
from actors.domain import (
    DEFAULT_LEASE,
    ClaimdError,
    LeaseSettings,
    TimeoutBudget,
    check_timeout_budget,
    defaults,
    format_duration,
    parse_duration,
)
from actors.observability import redact
from actors.observability.tracing import missing_for


def _parse_duration(text: str, allow_zero: bool = False) -> timedelta:
    try:
        return parse_duration(text, allow_zero=allow_zero)
    except ClaimdError as exc:
        # pydantic reports only ValueError as a field error; anything else
        # would escape without the file and field.
        raise ValueError(str(exc)) from None


class _DurationText:
    """Pydantic marker: a string such as "500ms", "30s", "2h", "1d", parsed once."""

    def __init__(self, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        # A number without a unit is refused as "not a valid string", before parsing.
        return core_schema.no_info_after_validator_function(
            lambda text: _parse_duration(text, self.allow_zero),
            core_schema.str_schema(strict=True),
            serialization=core_schema.plain_serializer_function_ser_schema(format_duration),
        )


Duration = Annotated[timedelta, _DurationText()]
DurationOrZero = Annotated[timedelta, _DurationText(allow_zero=True)]

# Setting -> the environment variable that overrides it (when set and not empty).
ENV_OVERRIDES = {
    "database_url": "CLAIMD_DATABASE_URL",
    "nats_url": "CLAIMD_NATS_URL",
    "nats_tls_ca": "CLAIMD_NATS_TLS_CA",
    "http": "CLAIMD_HTTP",
    "allowed_hosts": "CLAIMD_ALLOWED_HOSTS",
    "tracing": "CLAIMD_TRACING",
}
# job_histograms unset: the run histograms are by job for configs up to this many jobs.
JOB_HISTOGRAMS_UP_TO = 1_000
_NATS_SCHEMES = ("nats", "tls", "ws", "wss")
MODULE_NAME = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*"


class Settings(StrictModel):
    """Validated process settings."""

    database_url: str = "postgresql://localhost/claimd"
    # One server, or several of one cluster: a list, or one string separated by
    # commas; kept as one comma-separated string (see nats_servers).
    nats_url: str = "nats://127.0.0.1:4222"
    nats_tls_ca: str | None = None
    deployment: str = Field(default="claimd", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # The lease's three: the domain's defaults (actors.domain.defaults), checked at import.
    lease: Duration = DEFAULT_LEASE.lease
    ack_wait: Duration = DEFAULT_LEASE.ack_wait
    max_deliver: int = Field(default=DEFAULT_LEASE.max_deliver, ge=1, le=100)
    # host:port (port 0 picks a free port), or "off" to serve nothing.
    http: str = "127.0.0.1:8780"
    claim_batch: int = Field(default=500, ge=1, le=10_000)
    # Claimed and not yet started, cluster-wide: at least the runs of the
    # largest instant (they are claimed ahead together), and few enough that
    # they all start within a lease at the rate the workers execute them.
    max_claimed: int = Field(default=20_000, ge=1, le=1_000_000)
    worker_concurrency: int = Field(default=64, ge=1, le=10_000)
    # Python runs at once (async ones on the job event loop in the replica, sync ones
    # waiting for a warm process), not in the slots above: a herd of them does not
    # queue behind shell jobs.
    worker_async_concurrency: int = Field(
        default=defaults.WORKER_ASYNC_CONCURRENCY, ge=1, le=100_000
    )
    # Warm child processes kept for sync python attempts, and the most that run at
    # once (each runs many attempts in turn, killed only at a timeout or when it
    # dies). Unset: worker_concurrency.
    python_processes: int | None = Field(default=None, ge=1, le=10_000)
    claim_interval: Duration = parse_duration("200ms")
    # A run is claimed up to this long before it is due and held by its worker
    # until its instant (start lag without polling's floor); "0s": only due runs.
    # At most lease / 8, and a term of the lease invariant (actors.domain.lease).
    # Unset: DEFAULT_CLAIM_AHEAD (5s), or less where that would not fit (see effective_claim_ahead).
    claim_ahead: DurationOrZero | None = None
    # Wake the claimer at the next due instant and when a run becomes pending
    # (PostgreSQL LISTEN/NOTIFY), not only every claim_interval. Off behind a
    # pooler that cannot LISTEN (pgbouncer in transaction mode).
    claim_wake: bool = True
    materialize_interval: Duration = parse_duration("1s")
    reap_interval: Duration = parse_duration("1s")
    horizon: Duration = parse_duration("2m")
    shutdown_grace: Duration = parse_duration("30s")
    duplicate_window: Duration = parse_duration("2m")
    history_retention: Duration = parse_duration("30d")
    # How often the replica looks at its config file: a changed file (its
    # content, read through the path, so a ConfigMap's symlink swap counts) is
    # reloaded as SIGHUP reloads it; "0s": never (SIGHUP only). The replica
    # reports its file's digest to the database at the same pace (at least
    # every 5s): docs/rollout.md.
    config_poll: DurationOrZero = parse_duration("2s")
    # The config's own version number, if the deployment keeps one: a file with
    # a lower one than the generation in force is refused, a higher one is a
    # rollout forward even to jobs seen before (docs/rollout.md).
    config_version: int | None = Field(default=None, ge=0, le=2**62)
    # claimd_start_lag_seconds and claimd_run_duration_seconds by job (34 series
    # a job); false: one series each for all jobs, without the claimd_job label
    # (for thousands of jobs: /metrics is then about a quarter of the size).
    # Unset: by job up to JOB_HISTOGRAMS_UP_TO jobs, one series above (see
    # histograms_by_job).
    job_histograms: bool | None = None
    # Bearer tokens (docs/http-api.md, "The HTTP face"): a file of lines
    # "NAME TOKEN [SCOPE]" (scope read or operate, default operate; or one bare
    # token), the name of an environment variable holding an operate token
    # (named "api") and one holding a read token (named "read"). Once any is
    # configured every read needs a token too; without any, reads are open and
    # the API is read-only.
    api_token_file: str | None = None
    api_token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    api_read_token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # /metrics asks for a read token too (once tokens are configured); false:
    # open to whoever reaches the port, as /healthz and /readyz always are.
    metrics_token: bool = False
    # Host header names HTTP answers besides the loopback ones (localhost,
    # 127.0.0.1, [::1]) and the address a connection arrived on; others get
    # 421 (DNS rebinding). A list, or names separated by commas.
    allowed_hosts: list[str] = Field(default_factory=list)
    # Connections served at once: at most a quarter of the file limit
    # (RLIMIT_NOFILE); past it the oldest connection still sending its request
    # headers is closed. A request's headers must arrive within
    # http_header_timeout, its body within http_body_timeout.
    http_max_connections: int = Field(default=512, ge=8, le=100_000)
    http_header_timeout: Duration = parse_duration("10s")
    http_body_timeout: Duration = parse_duration("30s")
    # The stream's copies in a JetStream cluster: 1 for one server, 3 for a cluster.
    stream_replicas: int = Field(default=1, ge=1, le=5)
    # Derived from the lease when not given (see actors.domain.lease.TimeoutBudget).
    statement_timeout: Duration | None = None
    publish_timeout: Duration | None = None
    # OpenTelemetry traces of runs (docs/observability.md#traces): "otlp" exports
    # them as the OTEL_* variables say (needs the claimd[otlp] extra); "none": off.
    tracing: Literal["none", "otlp"] = "none"
    # Python modules whose @claimd.job functions are jobs (docs/python-jobs.md):
    # imported at load, again at a reload (jobs, not settings: a reload applies them).
    modules: list[str] = Field(default_factory=list)
    # (name, token) pairs read at load time; the name is who the API records as the actor.
    _api_tokens: tuple[tuple[str, str, str], ...] = PrivateAttr(default=())

    @classmethod
    def from_table(
        cls, path: str, raw: dict[str, Any], env: dict[str, str], *, read_tokens: bool = True
    ) -> Settings:
        """The ``[claimd]`` table with the environment's overrides, or one ConfigError.

        ``read_tokens=False``: the API tokens are left unread (none): a command
        that checks a file for another process, whose environment holds them.
        """
        overrides = {name: env[var] for name, var in ENV_OVERRIDES.items() if env.get(var)}
        try:
            return cls.model_validate(
                {**raw, **overrides}, context={"env": env, "read_tokens": read_tokens}
            )
        except ValidationError as exc:
            loc, msg = first_error_field(exc)
            setting = (loc or "").split(".")[0]
            if setting in overrides:
                msg = f"from {ENV_OVERRIDES[setting]}: {msg}"
            raise ConfigError(path, msg, field_name=f"claimd.{loc}" if loc else "claimd") from None

    @field_validator("nats_url", mode="before")
    @classmethod
    def _nats_servers(cls, value: Any) -> Any:
        """Several NATS URLs (a list or comma-separated) -> one comma-separated string."""
        if isinstance(value, str):
            urls = value.split(",")
        elif isinstance(value, list) and all(isinstance(u, str) for u in value):
            urls = value
        else:
            raise ValueError("expected a server URL, a list of them, or URLs separated by commas")
        urls = [u.strip() for u in urls]
        if not urls or not all(urls):
            raise ValueError(
                "give one or more server URLs (a list, or separated by commas), none empty"
            )
        for url in urls:
            scheme, sep, rest = url.partition("://")
            if not sep or scheme not in _NATS_SCHEMES or not rest.rpartition("@")[2]:
                raise ValueError(
                    f"{redact(url)!r} is not a NATS server URL (nats://host:port, tls://host:port)"
                )
        return ",".join(urls)

    @field_validator("tracing")
    @classmethod
    def _tracing_installed(cls, value: str) -> str:
        extra = missing_for(value)
        if extra is not None:
            raise ValueError(f"tracing = {value!r} needs the {extra} extra: pip install '{extra}'")
        return value

    @field_validator("modules")
    @classmethod
    def _module_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(MODULE_NAME, name):
                raise ValueError(f"{name!r} is not a module name (such as billing.jobs)")
        return list(dict.fromkeys(value))

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_names(cls, value: Any) -> Any:
        """Names separated by commas (CLAIMD_ALLOWED_HOSTS) or a list; lowercase, no port."""
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("expected a list of host names, or names separated by commas")
        names = [v.strip().lower() for v in value if v.strip()]
        for name in names:
            if not re.fullmatch(r"\*|\[[0-9a-f:.]+\]|[a-z0-9_.-]+", name):
                raise ValueError(f"{name!r} is not a host name (no port, no scheme)")
        return names

    @field_validator("http")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, _, port = value.rpartition(":")
        if value != "off" and (not host or not port.isdigit()):
            raise ValueError(f'expected host:port or "off", got {value!r}')
        return value

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo) -> Self:
        context = info.context or {}
        if context.get("read_tokens", True):
            self._api_tokens = read_api_tokens(
                {name: getattr(self, name) for name in TOKEN_FIELDS},
                context.get("env", os.environ),
            )
        try:
            # The redelivery rule, then every deadline of the budget inside the lease.
            check_timeout_budget(self.timeouts)
        except ClaimdError as exc:
            field_name = "claim_ahead" if str(exc).startswith("claim_ahead") else "lease"
            raise FieldProblem(field_name, str(exc)) from None
        return self

    @property
    def http_host(self) -> str:
        return "" if self.http == "off" else self.http.rpartition(":")[0]

    @property
    def http_port(self) -> int:
        """The port to serve on: 0 picks a free port; -1 ("off") serves nothing."""
        return -1 if self.http == "off" else int(self.http.rpartition(":")[2])

    @property
    def api_tokens(self) -> tuple[tuple[str, str, str], ...]:
        """(name, token, scope); the name is who the API records as the actor."""
        return self._api_tokens

    def histograms_by_job(self, jobs: int) -> bool:
        """Whether the run histograms are by job, for a config of ``jobs`` jobs.

        As set; unset, by job up to JOB_HISTOGRAMS_UP_TO jobs only. Above it the
        histograms by job would be most of /metrics (34 of a job's ~50 series:
        330 MB a scrape at 100,000 jobs), past what a Prometheus scrape takes.
        """
        if self.job_histograms is not None:
            return self.job_histograms
        return jobs <= JOB_HISTOGRAMS_UP_TO

    @property
    def lease_settings(self) -> LeaseSettings:
        return LeaseSettings(lease=self.lease, ack_wait=self.ack_wait, max_deliver=self.max_deliver)

    @property
    def effective_claim_ahead(self) -> timedelta:
        """``claim_ahead`` as set; unset, the default where it fits, else what does.

        At most an eighth of the lease (what a worker may hold) and half of
        what the lease leaves over the other terms of its invariant: settings
        that fit before claim_ahead existed still load, with a shorter one.
        """
        if self.claim_ahead is not None:
            return self.claim_ahead
        return self._budget(timedelta(0)).claim_ahead_that_fits()

    @property
    def timeouts(self) -> TimeoutBudget:
        """Every database and broker deadline, derived from the lease."""
        return self._budget(self.effective_claim_ahead)

    def _budget(self, claim_ahead: timedelta) -> TimeoutBudget:
        return TimeoutBudget.from_settings(
            self.lease,
            self.ack_wait,
            self.max_deliver,
            statement_timeout=self.statement_timeout,
            publish_timeout=self.publish_timeout,
            claim_ahead=claim_ahead,
        )

    @property
    def nats_servers(self) -> list[str]:
        """The NATS server URLs (``nats_url`` keeps them comma-separated)."""
        return self.nats_url.split(",")

    @property
    def stream(self) -> str:
        return f"CLAIMD_{self.deployment}"

    @property
    def subject(self) -> str:
        return f"claimd.{self.deployment}.runs"
