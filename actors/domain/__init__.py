"""The pure core of claimd: jobs, runs, schedules, policies and the lease invariant.

Imports only the standard library (zoneinfo included; cron expressions are
parsed by our own actors.domain.cron); an import-linter contract keeps it so.
"""

from actors.domain import defaults
from actors.domain.attempts import UNREADABLE_RETRY, AttemptVerdict, decide_attempt
from actors.domain.cron import CronExpression, parse_cron
from actors.domain.definitions import (
    DEFINITION_VERSION,
    DecodedJobs,
    UnreadableDefinition,
    decode_job,
    encode_job,
)
from actors.domain.durations import format_duration, human_duration, parse_duration
from actors.domain.errors import (
    ClaimdError,
    IllegalTransition,
    InvalidDuration,
    InvalidSchedule,
    LeaseInvariantViolated,
)
from actors.domain.jobs import (
    Catchup,
    ExecutorSpec,
    HttpSpec,
    Job,
    Overlap,
    PythonSpec,
    RetryPolicy,
    ShellSpec,
    executor_to_dict,
)
from actors.domain.lease import (
    DEFAULT_CLAIM_AHEAD,
    DEFAULT_LEASE,
    DEFAULT_TIMEOUTS,
    LeaseSettings,
    TimeoutBudget,
    check_lease_invariant,
    check_timeout_budget,
)
from actors.domain.planning import (
    FAR_AHEAD,
    MIN_ON_TIME,
    NextPlan,
    Plan,
    PlannedRun,
    next_plan,
    plan_materialization,
    plan_until_removal,
)
from actors.domain.refusals import SkipReason, StartRefusal, refusal_of
from actors.domain.runs import (
    TERMINAL_STATES,
    ClaimedRun,
    ExecutionResult,
    Outcome,
    RunContext,
    RunState,
    check_transition,
)
from actors.domain.schedule import (
    CronSchedule,
    IntervalSchedule,
    Schedule,
    take,
)
from actors.domain.sharing import shared
from actors.domain.zones import DEFAULT_DST, DstFold, DstGap, DstNote, DstPolicy, load_zone

__all__ = [
    "DEFAULT_CLAIM_AHEAD",
    "DEFAULT_DST",
    "DEFAULT_LEASE",
    "DEFAULT_TIMEOUTS",
    "DEFINITION_VERSION",
    "FAR_AHEAD",
    "MIN_ON_TIME",
    "TERMINAL_STATES",
    "UNREADABLE_RETRY",
    "AttemptVerdict",
    "Catchup",
    "ClaimdError",
    "ClaimedRun",
    "CronExpression",
    "CronSchedule",
    "DecodedJobs",
    "DstFold",
    "DstGap",
    "DstNote",
    "DstPolicy",
    "ExecutionResult",
    "ExecutorSpec",
    "HttpSpec",
    "IllegalTransition",
    "IntervalSchedule",
    "InvalidDuration",
    "InvalidSchedule",
    "Job",
    "LeaseInvariantViolated",
    "LeaseSettings",
    "NextPlan",
    "Outcome",
    "Overlap",
    "Plan",
    "PlannedRun",
    "PythonSpec",
    "RetryPolicy",
    "RunContext",
    "RunState",
    "Schedule",
    "ShellSpec",
    "SkipReason",
    "StartRefusal",
    "TimeoutBudget",
    "UnreadableDefinition",
    "check_lease_invariant",
    "check_timeout_budget",
    "check_transition",
    "decide_attempt",
    "decode_job",
    "defaults",
    "encode_job",
    "executor_to_dict",
    "format_duration",
    "human_duration",
    "load_zone",
    "next_plan",
    "parse_cron",
    "parse_duration",
    "plan_materialization",
    "plan_until_removal",
    "refusal_of",
    "shared",
    "take",
]
