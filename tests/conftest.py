"""The three lanes, the fixtures they share, and what every test is checked for.

tests/unit       no broker, no Postgres, no model: `make test-fast`, under 60 s in all
tests/component  one service, or its parts in-process, against the real Tansu broker, embedded
                 PostgreSQL, built-in engine and Faust workers: `make test-component`
tests/e2e        the services together as a user runs them, killed and restarted, the real
                 agents, learning, the real engine as judge: `make test-e2e`
tests/fixtures   fixture plugins (registered below): the real services, started once a session
tests/support    helpers: processes of the stack, event factories, a judge stub

Every test fails when a service it ran logged a traceback it did not expect
(tests/support/service_logs.py), and shows the logs written while it ran when it fails.
The lanes run in parallel (pytest-xdist, `make test`): tests/support/schedule.py decides which
test process takes which module, heaviest first, from the durations the last run recorded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from claw_stream.embedded.supervisor import SHARED_CPU_ENV

# before anything loads torch (OpenMP reads it once): tests and the services they start share
# two cores with each other, as `claw-stream up`'s services do
for _name, _value in SHARED_CPU_ENV.items():
    os.environ.setdefault(_name, _value)

# skills change the prompts an engine sees once a user has taught one, and the services of a
# lane share one Postgres: only the tests of skills (tests/*/test_skills*.py) switch them on
os.environ.setdefault("CLAW_SKILLS__ENABLED", "false")

pytest.register_assert_rewrite("tests.support")

from tests.support import schedule, service_logs  # noqa: E402  (after the rewrite hook)

pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.postgres",
    "tests.fixtures.models",
    "tests.fixtures.gateway",
    "tests.fixtures.trainer",
]

TESTS = Path(__file__).resolve().parent
LANES = {"unit": TESTS / "unit", "component": TESTS / "component", "e2e": TESTS / "e2e"}
# every service and model fixture depends on one of these
SERVICES = {"broker", "own_broker", "postgres", "smollm2"}


def pytest_configure(config: pytest.Config) -> None:
    stray = sorted(p.relative_to(TESTS).as_posix() for p in TESTS.glob("*/test_*.py"))
    stray = [p for p in stray if p.split("/")[0] not in LANES] + [
        p.name for p in TESTS.glob("test_*.py")
    ]
    if stray:
        raise pytest.UsageError(
            f"tests/{', tests/'.join(stray)}: move into tests/unit (no broker, no Postgres, no"
            " model), tests/component or tests/e2e; helpers go to tests/support"
        )
    for lane in LANES:
        config.addinivalue_line("markers", f"{lane}: a test of the {lane} lane (its folder)")
    config.addinivalue_line(
        "markers",
        "expected_traceback(pattern, reason): a traceback matching `pattern` that a service"
        " this test runs is meant to log (tests/support/service_logs.py)",
    )
    schedule.configure(config)


def lane_of(item: pytest.Item) -> str:
    for lane, folder in LANES.items():
        if folder in item.path.parents:
            return lane
    raise pytest.UsageError(f"{item.nodeid} is in no lane")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test is marked with its lane; a unit test may use no service (checked, not hoped);
    the heaviest modules first (schedule.py)."""
    for item in items:
        lane = lane_of(item)
        item.add_marker(getattr(pytest.mark, lane))
        fixtures = set(getattr(item, "fixturenames", ()))
        if lane == "unit" and fixtures & SERVICES:
            raise pytest.UsageError(
                f"{item.nodeid} uses {', '.join(sorted(fixtures & SERVICES))}: a unit test uses"
                " no broker, Postgres or model; move it to tests/component"
            )
    items[:] = schedule.heaviest_first(items)


def _allowed(item: pytest.Item) -> list[tuple[re.Pattern[str], str]]:
    allowed = []
    for mark in item.iter_markers("expected_traceback"):
        reason = mark.kwargs.get("reason")
        assert reason, f"{item.nodeid}: expected_traceback needs a reason"
        allowed.append((re.compile(mark.args[0]), reason))
    return allowed


def _failure(found: list[tuple[str, str]]) -> str:
    shown = "\n\n".join(f"--- {service}\n{block}" for service, block in found[:5])
    more = f"\n\n(and {len(found) - 5} more)" if len(found) > 5 else ""
    return (
        f"{len(found)} traceback(s) in the logs of services this test ran; a healthy service"
        " logs none (expected ones: @pytest.mark.expected_traceback, or ALLOWED in"
        f" tests/support/service_logs.py, each with its reason):\n\n{shown}{more}"
    )


@pytest.fixture(scope="session", autouse=True)
def _logs_clean_at_the_end() -> Iterator[None]:
    """What services logged after the last test (while the session's fixtures stopped them)."""
    yield
    found = service_logs.new_tracebacks([])
    if found:
        pytest.fail(_failure(found), pytrace=False)


_SIZES = pytest.StashKey[dict[Path, int]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    schedule.before(item)
    item.stash[_SIZES] = service_logs.sizes()  # before its fixtures start anything


@pytest.fixture(autouse=True)
def _logs_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test fails when a service logged a traceback while it ran that it did not expect."""
    yield
    found = service_logs.new_tracebacks(_allowed(request.node))
    if found:
        pytest.fail(_failure(found), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that fails shows the end of every service log written while it ran."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and report.when in ("setup", "call", "teardown"):
        before = item.stash.get(_SIZES, {})
        for log in service_logs.written_since(before):
            report.sections.append((f"{log.name} log (its end)", service_logs.tail(log.path)))
