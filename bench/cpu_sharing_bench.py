"""torch on CPU cores it shares: SmolLM2 decoding and one long forward, alone and beside a busy
core, with OpenMP's default (its threads busy-wait between parallel regions) and with
`OMP_WAIT_POLICY=PASSIVE` (they sleep), which `claw-stream up` gives its services and the test
suite gives itself (claw_stream/embedded/supervisor.py `SHARED_CPU_ENV`).

Each case runs in a process of its own (OpenMP reads the policy once); the busy core is a Python
loop in another process. Ratios are within this one run.

Run: python bench/cpu_sharing_bench.py [--model smollm2-135m|PATH] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from claw_stream.embedded.models import ensure_model  # noqa: E402
from claw_stream.settings import load_settings  # noqa: E402

CASE = """
import json, sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(int(sys.argv[2]))
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
rows = tok(["Tell me about the sea and the sky"] * 4, return_tensors="pt")
with torch.no_grad():
    model.generate(**rows, max_new_tokens=4, do_sample=False)
    t = time.perf_counter()
    model.generate(**rows, max_new_tokens=48, min_new_tokens=48, do_sample=False)
    decode = time.perf_counter() - t
    ids = torch.randint(0, 1000, (4, 512))
    t = time.perf_counter()
    model(ids)
    forward = time.perf_counter() - t
print(json.dumps({"decode": decode, "forward": forward}))
"""


def _busy() -> None:
    while True:
        pass


def run_case(model: Path, threads: int, passive: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    out = subprocess.run(
        [sys.executable, "-c", CASE, str(model), str(threads)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    console = Console()
    model = ensure_model(args.model, load_settings().models_dir)
    table = Table(title=f"{model.name}, {args.threads} torch threads, {os.cpu_count()} cores")
    for column in ("beside", "OMP_WAIT_POLICY", "48 tokens x 4 rows", "forward 4 x 512"):
        table.add_column(column, justify="right")
    results: dict[tuple[bool, bool], dict[str, float]] = {}
    with console.status("measuring") as status:
        for busy in (False, True):
            burner = multiprocessing.Process(target=_busy, daemon=True) if busy else None
            if burner is not None:
                burner.start()
                time.sleep(0.5)  # the loop is running before the case loads its model
            try:
                for passive in (False, True):
                    status.update(f"{'beside a busy core' if busy else 'alone'}, passive={passive}")
                    results[busy, passive] = r = run_case(model, args.threads, passive)
                    table.add_row(
                        "a busy core" if busy else "nothing",
                        "PASSIVE" if passive else "(default)",
                        f"{r['decode']:.2f} s",
                        f"{r['forward']:.2f} s",
                    )
            finally:
                if burner is not None:
                    burner.kill()
    console.print(table)
    for kind in ("decode", "forward"):
        spin = results[True, False][kind] / results[True, True][kind]
        idle = results[False, True][kind] / results[False, False][kind]
        console.print(
            f"{kind}: beside a busy core the default takes {spin:.1f}x PASSIVE's time; "
            f"alone PASSIVE takes {idle:.2f}x the default's"
        )


if __name__ == "__main__":
    main()
