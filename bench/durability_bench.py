"""Exactly once under load: the broker-pause durability test, many times, beside CPU burners.

`tests/e2e/test_gateway_durability.py::test_broker_paused_mid_traffic_loses_nothing`
pauses the broker (SIGSTOP) for 3 s under four sessions' traffic and checks that every
answered call's Step is on the topic once, in order. On a loaded machine it once found a Step
twice; this runs it `--runs` times in one pytest session (the fixtures started once) with
`--burners` processes spinning beside it, and prints how many runs passed.

Run: python bench/durability_bench.py [--runs 10] [--burners 1]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST = "tests/e2e/test_gateway_durability.py::test_broker_paused_mid_traffic_loses_nothing"


def burn() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--burners", type=int, default=1, help="CPU-burning processes beside it")
    args = parser.parse_args()
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    started = time.monotonic()
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST],
            cwd=REPO,
            env={**os.environ, "CLAW_DURABILITY_RUNS": str(args.runs)},
            capture_output=True,
            text=True,
        )
    finally:
        for b in burners:
            b.terminate()
    took = time.monotonic() - started
    failures = re.findall(r"AssertionError: (.+)", run.stdout)
    passed = re.search(r"(\d+) passed", run.stdout)
    n_passed = int(passed.group(1)) if passed else 0
    print(
        f"broker paused mid-traffic, {args.burners} CPU burner(s) beside it: "
        f"{n_passed} of {args.runs} runs passed ({took:.0f} s)"
    )
    for failure in failures:
        print(f"  failed: {failure}")
    if n_passed + len(failures) < args.runs:
        print(run.stdout[-3000:])
    sys.exit(0 if n_passed == args.runs else 1)


if __name__ == "__main__":
    main()
