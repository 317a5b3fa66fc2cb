"""Run the test lanes, each in parallel processes; print what each ran and how long it took;
keep README's figures in step with the run.

    python -m tests.lanes                 unit, component, e2e, one after the other (`make test`)
    python -m tests.lanes component e2e   some of them
    python -m tests.lanes --accept-fewer  a lane may run fewer tests than README says

The lanes run one after the other. While the unit lane runs (it needs no model), the test
cache is warmed: SmolLM2 pulled and the coding agents installed (tests/support/warm.py). Run
beside each other, the component and e2e lanes took longer than one after the other (32 min
for the whole `.ci/run` against 23-25): two cores were shared by five test processes and the
services each started, and the e2e lane's SmolLM2 tests, which keep both cores busy one after
the other (tests/support/schedule.py), are the run's critical path.

Each lane's pytest gets a --basetemp of its own (a second pytest on the machine deletes the
first one's temp folders otherwise), and writes its output to a file that is printed when the
lane ends. The test count never goes down silently: a lane that ran fewer tests than README's
table says fails the run, naming the lane, unless --accept-fewer says it is meant; after a
whole run that passed, README's table holds this run's figures."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TABLE = re.compile(r"(<!-- lanes -->\n)(.*?)(<!-- /lanes -->)", re.S)


@dataclass(frozen=True)
class Lane:
    name: str
    processes: int  # pytest-xdist's -n: 2 cores here, and most tests of a lane wait
    holds: str


LANES = {
    lane.name: lane
    for lane in (
        Lane("unit", 2, "pure logic: no broker, no Postgres, no model"),
        Lane(
            "component",
            2,
            "one service, or its parts in-process, against the real broker, Postgres, engine"
            " and Faust workers",
        ),
        Lane(
            "e2e",
            2,
            "`claw-stream up`, services killed and restarted under traffic, the real agents,"
            " learning, the real engine as judge",
        ),
    )
}


@dataclass
class Result:
    lane: str
    passed: int
    failed: int
    skipped: int
    wall_s: float
    code: int

    @property
    def ran(self) -> int:
        return self.passed + self.failed


class Run:
    """One lane's pytest, started now; its output goes to a file."""

    def __init__(self, lane: Lane, temp: Path, extra: list[str]):
        self.lane = lane
        self.junit = temp / f"{lane.name}.xml"
        self.output = temp / f"{lane.name}.log"
        command = [
            sys.executable,
            "-m",
            "pytest",
            f"tests/{lane.name}",
            "-n",
            str(lane.processes),
            "--basetemp",
            str(temp / lane.name),
            "--junitxml",
            str(self.junit),
            *extra,
        ]
        # a lane's ports are its own, should a lane's processes outlive it
        env = {**os.environ, "CLAW_TEST_PORT_BLOCK": str(list(LANES).index(lane.name))}
        print(f"=== {lane.name} lane started: {' '.join(command[1:])}", flush=True)
        self.started = time.monotonic()
        with self.output.open("wb") as out:
            self.proc = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait(self) -> Result:
        code = self.proc.wait()
        wall = time.monotonic() - self.started
        print(f"\n=== {self.lane.name} lane ({wall:.0f} s):", flush=True)
        sys.stdout.write(self.output.read_text(errors="replace"))
        sys.stdout.flush()
        passed = failed = skipped = 0
        if self.junit.is_file():
            for suite in ET.parse(self.junit).getroot().iter("testsuite"):
                tests, skips = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
                bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
                passed += tests - skips - bad
                failed += bad
                skipped += skips
        return Result(self.lane.name, passed, failed, skipped, wall, code)


def run_lanes(names: list[str], temp: Path, extra: list[str]) -> dict[str, Result]:
    """The lanes one after the other, the test cache warmed while the first runs."""
    with (temp / "warm.log").open("wb") as out:
        warm = subprocess.Popen(
            [sys.executable, "-m", "tests.support.warm"],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    results = {}
    for name in names:
        results[name] = Run(LANES[name], temp, extra).wait()
    if warm.wait() != 0:
        print(f"warming the test cache failed:\n{(temp / 'warm.log').read_text()[-3000:]}")
    return results


def recorded() -> dict[str, int]:
    """README's count of tests per lane."""
    found = TABLE.search(README.read_text())
    if not found:
        return {}
    counts = {}
    for row in found.group(2).splitlines():
        cells = [c.strip(" `") for c in row.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] in LANES and cells[2].isdigit():
            counts[cells[0]] = int(cells[2])
    return counts


def table(results: dict[str, Result]) -> str:
    rows = [
        "| lane | what it holds | tests | wall time here |",
        "|---|---|---|---|",
    ]
    for name, lane in LANES.items():
        r = results[name]
        rows.append(
            f"| `{name}` | {lane.holds} | {r.ran} | {r.wall_s / 60:.1f} min"
            f" ({lane.processes} processes) |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("lanes", nargs="*", help=f"of {', '.join(LANES)} (all by default)")
    parser.add_argument("--accept-fewer", action="store_true")
    args, extra = parser.parse_known_args(argv)
    names = args.lanes or list(LANES)
    unknown = set(names) - set(LANES)
    if unknown:
        parser.error(f"no lane {', '.join(sorted(unknown))}; the lanes: {', '.join(LANES)}")
    temp = Path(tempfile.mkdtemp(prefix="claw-lanes-"))
    started = time.monotonic()
    results = run_lanes(names, temp, extra)
    before = recorded()
    print(f"\n=== lanes ({time.monotonic() - started:.0f} s in all)")
    problems = []
    for name in names:
        r = results[name]
        was = before.get(name)
        change = "" if was is None else f" (README: {was})"
        print(
            f"{name:>9}: {r.passed} passed, {r.failed} failed, {r.skipped} skipped"
            f" in {r.wall_s:.0f} s{change}"
        )
        if r.code != 0:
            problems.append(f"the {name} lane failed (pytest exit {r.code})")
        if was is not None and r.ran < was and not args.accept_fewer:
            problems.append(
                f"the {name} lane ran {r.ran} tests, README says {was}: a test was removed or"
                " no longer collected; if that is meant, run with --accept-fewer"
            )
    for problem in problems:
        print(f"FAILED: {problem}")
    if not problems and set(results) == set(LANES) and not extra:
        text = README.read_text()
        if TABLE.search(text):
            README.write_text(TABLE.sub(lambda m: m.group(1) + table(results) + m.group(3), text))
            print(f"README's lane table holds this run's figures ({README.name})")
    if os.environ.get("CLAW_LANES_KEEP_TEMP") is None:
        shutil.rmtree(temp, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
