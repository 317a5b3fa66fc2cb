"""Which test process runs what, when a lane runs in parallel (pytest-xdist), and the durations
that decide it.

A module is one unit of work: its module-scoped services (a worker, a gateway, an engine) start
once, in the process that runs it. A module listed in SPLIT is one unit a test: its tests
mostly wait (on a worker's timeouts, a trainer's steps), and spread over the processes they
finish sooner, each process that takes one starting the module's services for itself. The
heaviest units go first, by the durations measured before; a process still busy with a long
unit is handed the lightest unit as its next one, so that no heavy unit waits behind another
(an xdist process must know its next test before it runs the current one, so it always holds
two).

A fresh clone schedules by tests/durations.json (measured in one whole run here, kept in the
repository); every run then writes the durations it measured into the test cache, which later
runs on that machine go by, the repository's file untouched."""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Any

import pytest

from .paths import CACHE

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
MEASURED = CACHE / "durations.json"
UNKNOWN_S = 5.0  # a test not yet measured
# the queued work, in seconds, beyond which a busy process is handed the lightest unit
BUSY_S = 20.0

# Modules that keep both cores busy on their own (measured alone: 1.3-1.8 cores for 0.5-4
# minutes: SmolLM2 answering, judging and training beside each other) form one unit, run one
# after the other in one process: two of them at once took each past its deadlines. The other
# processes of the run yield to it (nice YIELD): beside the others at equal priority these
# four took 929 s instead of 530 s alone, and the lane as long.
ONE_AT_A_TIME = {
    "tests/e2e/test_openclaw_first_conversation.py",
    "tests/e2e/test_tenant_learning.py",
    "tests/e2e/test_replay.py",
    "tests/e2e/test_console.py",
    "tests/e2e/test_up.py",
    "tests/e2e/test_judge_live.py",
}
YIELD = 5
# modules whose tests are units of their own
SPLIT = {
    "tests/component/test_trainer.py",
    "tests/e2e/test_broker_loss.py",
    "tests/e2e/test_gated_serving.py",
    "tests/e2e/test_gateway_durability.py",
    "tests/e2e/test_postgres_outage.py",
}

_durations: dict[str, float] | None = None


def durations() -> dict[str, float]:
    global _durations
    if _durations is None:
        _durations = {}
        for path in (DURATIONS, MEASURED):
            with contextlib.suppress(OSError, ValueError):
                _durations.update(json.loads(path.read_text()))
    return _durations


def estimate(nodeid: str) -> float:
    return durations().get(nodeid, UNKNOWN_S)


def unit_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    if module in ONE_AT_A_TIME:
        return "one at a time"
    return nodeid if module in SPLIT else module


_yielded = False


def before(item: pytest.Item) -> None:
    """In a run's test processes (xdist's), one that runs anything but the one-at-a-time unit
    yields to the process that runs it, for good: the services its tests start inherit it."""
    global _yielded
    if _yielded or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if unit_of(item.nodeid) != "one at a time" and any(
        unit_of(i.nodeid) == "one at a time" for i in item.session.items
    ):
        os.nice(YIELD)
        _yielded = True


def heaviest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """Units in order of their recorded duration, the heaviest first; a unit's tests keep
    their order."""
    units: dict[str, list[pytest.Item]] = OrderedDict()
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)
    order = sorted(units, key=lambda u: -sum(estimate(i.nodeid) for i in units[u]))
    return [item for unit in order for item in units[unit]]


# --- the scheduler -----------------------------------------------------------------------


def configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Plugin(), "claw-schedule")


class _Plugin:
    def __init__(self) -> None:
        self.measured: dict[str, float] = defaultdict(float)
        self.failed: set[str] = set()  # a failed test's time (a timeout, say) says little

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        return _heaviest_first_scheduler(config, log)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.measured[report.nodeid] += report.duration
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.measured:
            return  # an xdist worker: the controller records what every worker measured
        measured = {k: round(v, 2) for k, v in self.measured.items() if k not in self.failed}
        merged = {**durations(), **measured}
        MEASURED.parent.mkdir(parents=True, exist_ok=True)
        MEASURED.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


def _heaviest_first_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class HeaviestFirst(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            assert self.workqueue
            queued = sum(
                estimate(nodeid)
                for unit in self.assigned_work.get(node, {}).values()
                for nodeid, done in unit.items()
                if not done
            )
            scope = (
                next(iter(self.workqueue)) if queued < BUSY_S else next(reversed(self.workqueue))
            )
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some(
                [collection.index(nodeid) for nodeid, done in work_unit.items() if not done]
            )

    config.option.loadscopereorder = False  # the collection's order is the one to keep
    return HeaviestFirst(config, log)
