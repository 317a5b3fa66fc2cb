"""The two lanes and the fixtures they share.

tests/unit         no broker, no Postgres, no model: `make test-fast`, under 60 s in all
tests/integration  the real Tansu broker, embedded PostgreSQL, built-in engine, Faust workers
tests/fixtures     fixture plugins (registered below): the real services, started once a session
tests/support      helpers: processes of the stack, event factories, a judge stub
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.support")

from tests.support.service_logs import LOGS, tail  # noqa: E402  (after the rewrite hook)

pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.postgres",
    "tests.fixtures.models",
    "tests.fixtures.gateway",
]

TESTS = Path(__file__).resolve().parent
LANES = (TESTS / "unit", TESTS / "integration")
# every service and model fixture depends on one of these
SERVICES = {"broker", "own_broker", "postgres", "smollm2"}
MODEL = "smollm2"


def pytest_configure(config: pytest.Config) -> None:
    stray = sorted(p.name for p in TESTS.glob("test_*.py"))
    if stray:
        raise pytest.UsageError(
            f"tests/{', tests/'.join(stray)}: move into tests/unit (no broker, no Postgres,"
            " no model) or tests/integration; helpers go to tests/support"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a model is `slow`; a unit test may use no service (checked, not hoped)."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if MODEL in fixtures:
            item.add_marker(pytest.mark.slow)
        if LANES[0] in item.path.parents and fixtures & SERVICES:
            raise pytest.UsageError(
                f"{item.nodeid} uses {', '.join(sorted(fixtures & SERVICES))}: a unit test uses"
                " no broker, Postgres or model; move it to tests/integration"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that fails shows the logs of the broker and Postgres it used."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and report.when in ("setup", "call"):
        for fixture in sorted(set(getattr(item, "fixturenames", ())) & set(LOGS)):
            report.sections.append((f"{fixture} log (its end)", tail(LOGS[fixture])))
