"""Config bad-input table: each mistake gives one clear error naming file, job and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from actors.config import ConfigError, ConfigErrors, LoadedConfig, load_config, parse_config
from actors.domain import (
    DEFAULT_DST,
    Catchup,
    CronSchedule,
    DstFold,
    DstGap,
    DstPolicy,
    IntervalSchedule,
    PythonSpec,
    ShellSpec,
)

PATH = "/etc/claimd/claimd.toml"
ROOT = Path(__file__).resolve().parents[2]
RUN = 'run = { shell = ["/bin/true"] }'


def job(body: str, name: str = "export") -> str:
    """A config text with one job whose table holds ``body``."""
    return f"[jobs.{name}]\n{textwrap.dedent(body).strip()}\n"


def single_error(text: str) -> ConfigError:
    """The one error a config text gives, whether raised (settings) or collected (a job)."""
    try:
        loaded = parse_config(text, PATH, env={})
    except ConfigError as exc:
        return exc
    assert len(loaded.errors) == 1, loaded.errors
    assert loaded.jobs == {}
    return loaded.errors[0]


# (id, config text, job named, field named, words the message must carry)
CASES: list[tuple[str, str, str | None, str | None, str]] = [
    ("toml-syntax", job(f'every = "1m"\n{RUN[:-1]}'), None, None, "not valid TOML"),
    ("toml-unquoted", job("every = 1m\n" + RUN), None, None, "not valid TOML"),
    (
        "duplicate-job",
        job(f'every = "1m"\n{RUN}') + job(f'every = "2m"\n{RUN}'),
        None,
        None,
        "not valid TOML: Cannot declare ('jobs', 'export') twice",
    ),
    (
        "invalid-cron",
        job(f'cron = "61 * * * *"\n{RUN}'),
        "export",
        "cron",
        "invalid cron expression '61 * * * *'",
    ),
    (
        "cron-four-fields",
        job(f'cron = "0 2 * *"\n{RUN}'),
        "export",
        "cron",
        "invalid cron expression",
    ),
    (
        "impossible-cron",
        job(f'cron = "0 0 30 2 *"\n{RUN}'),
        "export",
        "cron",
        "'0 0 30 2 *' never fires",
    ),
    (
        "unknown-zone",
        job(f'cron = "0 2 * * *"\ntimezone = "Europe/Berlinn"\n{RUN}'),
        "export",
        "timezone",
        "unknown time zone 'Europe/Berlinn'",
    ),
    (
        "unknown-zone-with-every",
        job(f'every = "1h"\ntimezone = "Mars/Olympus"\n{RUN}'),
        "export",
        "timezone",
        "unknown time zone 'Mars/Olympus'",
    ),
    (
        "cron-and-every",
        job(f'cron = "* * * * *"\nevery = "1m"\n{RUN}'),
        "export",
        "cron",
        "give exactly one of cron or every",
    ),
    ("neither-cron-nor-every", job(RUN), "export", "every", "give exactly one of cron or every"),
    ("cron-not-a-string", job(f"cron = 5\n{RUN}"), "export", "cron", "valid string"),
    (
        "zero-every",
        job(f'every = "0s"\n{RUN}'),
        "export",
        "every",
        "'0s' must be greater than zero",
    ),
    (
        "negative-every",
        job(f'every = "-30s"\n{RUN}'),
        "export",
        "every",
        "'-30s' must be greater than zero",
    ),
    (
        "every-without-unit",
        job(f'every = "30"\n{RUN}'),
        "export",
        "every",
        "'30' is not a duration",
    ),
    (
        "zero-timeout",
        job(f'every = "1m"\ntimeout = "0s"\n{RUN}'),
        "export",
        "timeout",
        "must be greater than zero",
    ),
    (
        "negative-timeout",
        job(f'every = "1m"\ntimeout = "-5m"\n{RUN}'),
        "export",
        "timeout",
        "must be greater than zero",
    ),
    (
        "negative-catchup-window",
        job(f'every = "1m"\ncatchup_window = "-1h"\n{RUN}'),
        "export",
        "catchup_window",
        "must be greater than zero",
    ),
    (
        "zero-starting-deadline",
        job(f'every = "1m"\nstarting_deadline = "0s"\n{RUN}'),
        "export",
        "starting_deadline",
        "must be greater than zero",
    ),
    (
        "negative-backoff",
        job(f'every = "1m"\nbackoff = {{ initial = "-1s" }}\n{RUN}'),
        "export",
        "backoff.initial",
        "must be greater than zero",
    ),
    (
        "huge-backoff",
        job(f'every = "1m"\nbackoff = {{ max = "99999d" }}\n{RUN}'),
        "export",
        "backoff.max",
        "longer than the maximum of 3650d",
    ),
    (
        "settings-zero-duration",
        '[claimd]\nack_wait = "0s"\n',
        None,
        "claimd.ack_wait",
        "'0s' must be greater than zero",
    ),
    (
        "settings-negative-duration",
        '[claimd]\nhorizon = "-2m"\n',
        None,
        "claimd.horizon",
        "'-2m' must be greater than zero",
    ),
    (
        "settings-huge-duration",
        '[claimd]\nhistory_retention = "99999d"\n',
        None,
        "claimd.history_retention",
        "longer than the maximum of 3650d",
    ),
    (
        "settings-duration-not-a-string",
        "[claimd]\nlease = 120\n",
        None,
        "claimd.lease",
        "valid string",
    ),
    (
        "unknown-job-key",
        job(f'every = "1m"\ntimout = "5m"\n{RUN}'),
        "export",
        "timout",
        "unknown key (a typo?)",
    ),
    (
        "unknown-claimd-key",
        '[claimd]\nleese = "300s"\n',
        None,
        "claimd.leese",
        "unknown key (a typo?)",
    ),
    (
        "unknown-run-key",
        job('every = "1m"\nrun = { shel = ["/bin/true"] }'),
        "export",
        "run.shel",
        "unknown key (a typo?)",
    ),
    (
        "unknown-backoff-key",
        job(f'every = "1m"\nbackoff = {{ inital = "1s" }}\n{RUN}'),
        "export",
        "backoff.inital",
        "unknown key (a typo?)",
    ),
    (
        "unknown-top-level-table",
        '[claimdd]\nlease = "300s"\n',
        None,
        "claimdd",
        "unknown top-level table",
    ),
    (
        "run-empty",
        job('every = "1m"\nrun = {}'),
        "export",
        "run",
        "give exactly one of shell, python or http",
    ),
    ("run-missing", job('every = "1m"'), "export", "run", "required"),
    (
        "two-executors",
        job('every = "1m"\nrun = { shell = ["/bin/true"], python = "m:f" }'),
        "export",
        "run",
        "give exactly one of shell, python or http (got shell, python)",
    ),
    (
        "three-executors",
        job(
            'every = "1m"\nrun = { shell = ["/bin/true"], python = "m:f", '
            'http = { url = "http://127.0.0.1:9/" } }'
        ),
        "export",
        "run",
        "(got shell, python, http)",
    ),
    (
        "string-shell-without-use-shell",
        job('every = "1m"\nrun = { shell = "echo hi" }'),
        "export",
        "run",
        "a string command needs use_shell = true",
    ),
    (
        "empty-argv",
        job('every = "1m"\nrun = { shell = [] }'),
        "export",
        "run",
        "shell needs at least the program to run",
    ),
    (
        "use-shell-on-python",
        job('every = "1m"\nrun = { python = "m:f", use_shell = true }'),
        "export",
        "run",
        "apply only to shell jobs",
    ),
    (
        "bad-python-target",
        job('every = "1m"\nrun = { python = "not a target" }'),
        "export",
        "run.python",
        "should match pattern",
    ),
    (
        "bad-http-url",
        job('every = "1m"\nrun = { http = { url = "ftp://host/x" } }'),
        "export",
        "run.http.url",
        "must start with http:// or https://",
    ),
    (
        "lease-invariant",
        '[claimd]\nlease = "10s"\nack_wait = "5s"\nmax_deliver = 5\n',
        None,
        "claimd.lease",
        "5s x 4 x 3 = 1m, but lease = 10s",
    ),
    (
        "huge-max-attempts",
        job(f'every = "1m"\nmax_attempts = {10**9}\n{RUN}'),
        "export",
        "max_attempts",
        "less than or equal to 100",
    ),
    (
        "zero-max-attempts",
        job(f'every = "1m"\nmax_attempts = 0\n{RUN}'),
        "export",
        "max_attempts",
        "greater than or equal to 1",
    ),
    (
        "huge-timeout",
        job(f'every = "1m"\ntimeout = "99999d"\n{RUN}'),
        "export",
        "timeout",
        "'99999d' is longer than the maximum of 3650d",
    ),
    (
        "timeout-beyond-timedelta",
        job(f'every = "1m"\ntimeout = "{"9" * 30}d"\n{RUN}'),
        "export",
        "timeout",
        "longer than the maximum of 3650d",
    ),
    (
        "huge-every",
        job(f'every = "99999d"\n{RUN}'),
        "export",
        "every",
        "longer than the maximum of 3650d",
    ),
    (
        "huge-max-deliver",
        f"[claimd]\nmax_deliver = {10**9}\n",
        None,
        "claimd.max_deliver",
        "less than or equal to 100",
    ),
    (
        "zero-python-processes",
        "[claimd]\npython_processes = 0\n",
        None,
        "claimd.python_processes",
        "greater than or equal to 1",
    ),
    (
        "bad-overlap",
        job(f'every = "1m"\noverlap = "sometimes"\n{RUN}'),
        "export",
        "overlap",
        "'allow', 'forbid' or 'queue'",
    ),
    (
        "bad-catchup",
        job(f'every = "1m"\ncatchup = "most"\n{RUN}'),
        "export",
        "catchup",
        "'all', 'latest' or 'none'",
    ),
    (
        "job-name-with-space",
        job(f'every = "1m"\n{RUN}', name='"nightly export"'),
        "nightly export",
        None,
        "a job name is 1-100 letters, digits, '_', '.', '-'",
    ),
    (
        "job-name-with-slash",
        job(f'every = "1m"\n{RUN}', name='"../etc"'),
        "../etc",
        None,
        "a job name is",
    ),
    (
        "job-name-too-long",
        job(f'every = "1m"\n{RUN}', name="x" * 101),
        "x" * 101,
        None,
        "a job name is 1-100",
    ),
    ("job-not-a-table", "[jobs]\nexport = 5\n", "export", None, "a job must be a table"),
    (
        "bad-http-setting",
        '[claimd]\nhttp = "localhost"\n',
        None,
        "claimd.http",
        "expected host:port",
    ),
    (
        "bad-config-poll",
        '[claimd]\nconfig_poll = "often"\n',
        None,
        "claimd.config_poll",
        "often",
    ),
    (
        "negative-config-version",
        "[claimd]\nconfig_version = -1\n",
        None,
        "claimd.config_version",
        "greater than or equal to 0",
    ),
    # dst: a fixed-time cron's policy at DST changes (docs/scheduling.md)
    (
        "dst-bad-gap",
        job(f'cron = "30 2 * * *"\ndst = {{ gap = "later" }}\n{RUN}'),
        "export",
        "dst.gap",
        "'shift' or 'skip'",
    ),
    (
        "dst-bad-fold",
        job(f'cron = "30 2 * * *"\ndst = {{ fold = "twice" }}\n{RUN}'),
        "export",
        "dst.fold",
        "'first', 'last' or 'both'",
    ),
    (
        "dst-unknown-key",
        job(f'cron = "30 2 * * *"\ndst = {{ folds = "both" }}\n{RUN}'),
        "export",
        "dst.folds",
        "unknown key",
    ),
    (
        "dst-on-a-wildcard-schedule",
        job(f'cron = "*/15 2 * * *"\ndst = {{ fold = "both" }}\n{RUN}'),
        "export",
        "dst",
        "has a wildcard minute or hour",
    ),
    (
        "dst-on-every",
        job(f'every = "1h"\ndst = {{ gap = "skip" }}\n{RUN}'),
        "export",
        "dst",
        "dst applies to cron schedules",
    ),
]


@pytest.mark.parametrize(
    ("text", "job_name", "field", "words"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_input_gives_one_clear_error(
    text: str, job_name: str | None, field: str | None, words: str
) -> None:
    err = single_error(text)
    assert err.path == PATH
    assert err.job == job_name
    assert err.field_name == field
    message = str(err)
    assert message.startswith(f"{PATH}: ")
    if job_name is not None:
        assert f"job {job_name!r}" in message
    if field is not None:
        assert f"field {field!r}" in message
    assert words in err.message
    # One error, one line: no pydantic dump, no traceback text.
    assert "\n" not in message
    assert "validation error" not in message


def test_a_dst_policy_is_read_into_the_schedule() -> None:
    loaded = parse_config(
        job(
            'cron = "30 2 * * *"\ntimezone = "Europe/Berlin"\n'
            f'dst = {{ gap = "skip", fold = "both" }}\n{RUN}'
        )
        + job(f'cron = "0 3 * * *"\n{RUN}', name="plain"),
        PATH,
        env={},
    )
    assert loaded.errors == []
    schedule = loaded.jobs["export"].schedule
    assert isinstance(schedule, CronSchedule)
    assert schedule.dst == DstPolicy(DstGap.SKIP, DstFold.BOTH)
    plain = loaded.jobs["plain"].schedule
    assert isinstance(plain, CronSchedule)
    assert plain.dst == DEFAULT_DST


def test_toml_errors_say_where() -> None:
    err = single_error(job('every = "1m"\n' + RUN) + job('every = "2m"\n' + RUN))
    assert "line 4" in str(err)


# -- a bad job never hides the good ones ---------------------------------------------------

MIXED = """
[jobs.first]
every = "30s"
run = { shell = ["/bin/echo", "one"] }

[jobs.broken]
cron = "0 0 30 2 *"
run = { shell = ["/bin/echo", "never"] }

[jobs.second]
cron = "0 2 * * *"
timezone = "Europe/Berlin"
run = { python = "tests.unit.jobfuncs:sync_job" }
"""


def test_one_bad_job_and_two_good_ones() -> None:
    loaded = parse_config(MIXED, PATH, env={})
    assert sorted(loaded.jobs) == ["first", "second"]
    assert len(loaded.errors) == 1
    err = loaded.errors[0]
    assert (err.job, err.field_name) == ("broken", "cron")
    assert isinstance(loaded.jobs["first"].schedule, IntervalSchedule)
    second = loaded.jobs["second"]
    assert isinstance(second.schedule, CronSchedule)
    assert second.schedule.timezone == "Europe/Berlin"
    assert second.executor == PythonSpec("tests.unit.jobfuncs:sync_job")
    # The caller may refuse the whole file (reload does): every error is listed.
    with pytest.raises(ConfigErrors) as info:
        loaded.raise_for_errors()
    assert str(info.value) == str(err)


def test_every_bad_job_gets_its_own_error() -> None:
    text = (
        job(f'cron = "61 * * * *"\n{RUN}', "a")
        + job(f'every = "1m"\nfoo = 1\n{RUN}', "b")
        + job(f'every = "1m"\n{RUN}', "c")
    )
    loaded = parse_config(text, PATH, env={})
    assert list(loaded.jobs) == ["c"]
    assert [(e.job, e.field_name) for e in loaded.errors] == [("a", "cron"), ("b", "foo")]
    assert str(ConfigErrors(loaded.errors)).splitlines() == [str(e) for e in loaded.errors]


# -- load_config: from a file --------------------------------------------------------------


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "claimd.toml"
    path.write_text(MIXED)
    loaded = load_config(path, env={})
    assert loaded.path == str(path)
    assert loaded.errors[0].path == str(path)
    assert str(loaded.errors[0]).startswith(f"{path}: job 'broken': field 'cron': ")


def test_load_config_duplicate_job_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(job('every = "1m"\n' + RUN) + job('every = "2m"\n' + RUN))
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.path == str(path)
    assert str(info.value).startswith(f"{path}: not valid TOML")
    assert "twice" in str(info.value)


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="cannot read") as info:
        load_config(path, env={})
    assert info.value.path == str(path)


def test_load_config_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[jobs.caf\xe9]\nevery = "1m"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        load_config(path, env={})
    assert info.value.path == str(path)


# -- what good input yields ----------------------------------------------------------------


def test_a_full_job_is_read_as_written() -> None:
    loaded = parse_config(
        textwrap.dedent("""
        [claimd]
        lease = "300s"
        ack_wait = "10s"
        max_deliver = 4
        http = "off"

        [jobs.nightly-export]
        cron = "0 2 * * *"
        timezone = "America/New_York"
        timeout = "15m"
        max_attempts = 5
        catchup = "latest"
        catchup_window = "6h"
        jitter = "30s"
        backoff = { initial = "2s", max = "1m", multiplier = 3.0 }
        run = { shell = "pg_dump > /tmp/{scheduled_date}.sql", use_shell = true, env = { A = "1" } }
    """),
        PATH,
        env={"CLAIMD_DATABASE_URL": "postgresql://db/x"},
    )
    assert loaded.errors == []
    settings = loaded.settings
    assert settings.database_url == "postgresql://db/x"  # the environment overrides
    assert (
        settings.lease.total_seconds(),
        settings.ack_wait.total_seconds(),
        settings.max_deliver,
    ) == (300, 10, 4)
    assert settings.http_port == -1
    j = loaded.jobs["nightly-export"]
    assert j.timeout.total_seconds() == 900
    assert j.max_attempts == 5
    assert j.catchup is Catchup.LATEST
    assert j.catchup_window.total_seconds() == 6 * 3600
    assert j.jitter.total_seconds() == 30
    assert (
        j.retry.initial.total_seconds(),
        j.retry.maximum.total_seconds(),
        j.retry.multiplier,
    ) == (2, 60, 3.0)
    assert j.executor == ShellSpec(
        argv=("pg_dump > /tmp/{scheduled_date}.sql",), env={"A": "1"}, use_shell=True
    )


@pytest.mark.parametrize("name", ["jobs.toml", "docker.toml"])
def test_shipped_examples_load_cleanly(name: str) -> None:
    loaded: LoadedConfig = load_config(ROOT / "config" / name, env={})
    assert loaded.errors == []
    assert loaded.jobs


def test_environment_overrides_the_file_and_an_error_names_the_variable() -> None:
    text = '[claimd]\ndatabase_url = "postgresql://file/db"\nhttp = "127.0.0.1:1"\n'
    env = {
        "CLAIMD_DATABASE_URL": "postgresql://env/db",
        "CLAIMD_HTTP": "off",
        "CLAIMD_NATS_TLS_CA": "ca.pem",
        "CLAIMD_NATS_URL": "",
    }  # empty: not an override
    settings = parse_config(text, PATH, env=env).settings
    assert (settings.database_url, settings.http_host, settings.http_port) == (
        "postgresql://env/db",
        "",
        -1,
    )
    assert settings.nats_tls_ca == "ca.pem"
    assert settings.nats_url == "nats://127.0.0.1:4222"
    err = single_error_env(text, {"CLAIMD_HTTP": "localhost"})
    assert err.field_name == "claimd.http"
    assert err.message == "from CLAIMD_HTTP: expected host:port or \"off\", got 'localhost'"


def single_error_env(text: str, env: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, PATH, env=env)
    return info.value


def _histograms_by_job(setting: str, jobs: int) -> bool:
    return parse_config(f"[claimd]\n{setting}\n", PATH, env={}).settings.histograms_by_job(jobs)


def test_job_histograms_unset_are_by_job_up_to_a_thousand_jobs_and_one_series_above() -> None:
    assert _histograms_by_job("", 1) is True
    assert _histograms_by_job("", 1_000) is True
    assert _histograms_by_job("", 1_001) is False
    assert _histograms_by_job("", 100_000) is False
    # As set, whatever the number of jobs.
    assert _histograms_by_job("job_histograms = true", 100_000) is True
    assert _histograms_by_job("job_histograms = false", 1) is False


def test_equal_job_tables_are_validated_once_yet_each_job_and_error_keeps_its_name() -> None:
    body = 'cron = "* * * * *"\nmax_attempts = N\nrun = { python = "m:f" }'
    loaded = parse_config(
        job(body.replace("N", "1"), "a")
        + job(body.replace("N", "1"), "b")
        + job(body.replace("N", "1.0"), "c")  # equal in Python, a float to the config
        + job(body.replace("N", "true"), "d")
        + job(body.replace("N", "0"), "e")
        + job(body.replace("N", "0"), "f"),
        PATH,
        env={},
    )
    assert sorted(loaded.jobs) == ["a", "b"]
    assert loaded.jobs["b"].name == "b"
    assert loaded.jobs["b"].max_attempts == 1
    assert loaded.jobs["b"].schedule is loaded.jobs["a"].schedule
    assert [(e.job, e.field_name) for e in loaded.errors] == [
        ("c", "max_attempts"),
        ("d", "max_attempts"),
        ("e", "max_attempts"),
        ("f", "max_attempts"),
    ]
    assert all(str(e).startswith(f"{PATH}: job '{e.job}'") for e in loaded.errors)


def test_inherit_env_is_read_checked_and_for_shell_jobs_only() -> None:
    loaded = parse_config(
        '[jobs.a]\nevery = "1m"\nrun = { shell = ["/bin/true"], inherit_env = ["HTTPS_PROXY"] }\n',
        "c.toml",
        env={},
    )
    assert not loaded.errors
    assert loaded.jobs["a"].executor.inherit_env == ("HTTPS_PROXY",)  # type: ignore[union-attr]
    bad = parse_config(
        '[jobs.b]\nevery = "1m"\nrun = { shell = ["/bin/true"], inherit_env = ["OK", "1-no"] }\n'
        '[jobs.c]\nevery = "1m"\nrun = { python = "m:f", inherit_env = ["HOME"] }\n',
        "c.toml",
        env={},
    )
    messages = {e.job: str(e) for e in bad.errors}
    assert "inherit_env: entry 2 is not a variable name" in messages["b"]
    assert "1-no" not in messages["b"]
    assert "apply only to shell jobs" in messages["c"]


def test_a_job_with_several_mistakes_reports_every_one_in_one_round() -> None:
    """A newcomer's job with three mistakes took three rounds of check-config: each
    field's error now comes at once, each naming the job and its field."""
    loaded = parse_config(
        '[jobs.report]\ncron = "61 * * * *"\ntimeout = "soon"\nbackoff = { initial = "x" }\n'
        'run = { shell = ["/bin/true"] }\n\n'
        '[jobs.typo]\nevery = "1m"\nmax_attempts = 0\nretries = 3\n'
        'run = { shell = ["/bin/true"] }\n\n'
        '[jobs.fine]\nevery = "1m"\nrun = { shell = ["/bin/true"] }\n',
        "jobs.toml",
        env={},
    )
    assert list(loaded.jobs) == ["fine"]
    found = [(e.job, e.field_name) for e in loaded.errors]
    assert found == [
        ("report", "cron"),
        ("report", "timeout"),
        ("report", "backoff.initial"),
        ("typo", "max_attempts"),
        ("typo", "retries"),
    ], [str(e) for e in loaded.errors]
