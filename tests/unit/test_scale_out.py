"""Scaling out: the services `claw-stream up --workers N --gateways M` plans (N workers in one
consumer group, each with its own name, metrics port and data dir; the gateway with M processes
behind its one port), the options' handling, and the partitions a worker says it holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from faust.types import TP

from claw_stream.cli.main import main
from claw_stream.embedded.supervisor import Supervisor, scale_summary, worker_ports
from claw_stream.settings import load_settings
from claw_stream.worker.config import WorkerSettings
from claw_stream.worker.worker import Worker


def _summary(supervisor: Supervisor) -> str:
    gateway = any(s.name == "gateway" for s in supervisor.services)
    return scale_summary(supervisor.settings, supervisor.workers, gateway)


def _planned(workers: int = 1, gateways: int = 1) -> Supervisor:
    settings = load_settings()
    settings.gateway.workers = gateways
    supervisor = Supervisor(settings)
    supervisor.plan(workers=workers)
    return supervisor


@pytest.fixture(autouse=True)
def _data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLAW_DATA_DIR", str(tmp_path))


def test_one_worker_and_one_gateway_process_by_default() -> None:
    supervisor = _planned()
    workers = [s for s in supervisor.services if s.name.startswith("worker")]
    assert [w.name for w in workers] == ["worker"]  # as up.json and the doctor name it
    assert "CLAW_WORKER__INSTANCE" not in workers[0].env
    gateway = next(s for s in supervisor.services if s.name == "gateway")
    assert gateway.argv[-2:] == ["--workers", "1"]
    assert _summary(supervisor) == (
        "1 stream worker in consumer group claw-worker (claw.steps: 6 partitions); "
        "gateway: 1 process on http://127.0.0.1:8000"
    )


def test_n_workers_share_one_group_each_with_its_own_port_data_dir_and_log() -> None:
    supervisor = _planned(workers=3, gateways=4)
    workers = [s for s in supervisor.services if s.name.startswith("worker")]
    assert [w.name for w in workers] == ["worker-1", "worker-2", "worker-3"]
    ports = [int(w.argv[w.argv.index("--metrics-port") + 1]) for w in workers]
    # 9402 is the evaluator's metrics port: skipped
    assert ports == [9401, 9403, 9404]
    assert [w.url for w in workers] == [f"http://127.0.0.1:{p}/metrics" for p in ports]
    # the same app id (no --app-id, no CLAW_WORKER__APP_ID): one consumer group
    assert all("--app-id" not in w.argv and "CLAW_WORKER__APP_ID" not in w.env for w in workers)
    assert [w.env["CLAW_WORKER__INSTANCE"] for w in workers] == [w.name for w in workers]
    assert all(w.env["CLAW_WORKER__JUDGE_MAX_TOKENS"] == "48" for w in workers)  # engine judges
    gateway = next(s for s in supervisor.services if s.name == "gateway")
    assert gateway.argv[-2:] == ["--workers", "4"]
    assert _summary(supervisor) == (
        "3 stream workers in consumer group claw-worker (claw.steps: 6 partitions); "
        "gateway: 4 processes on http://127.0.0.1:8000"
    )


def test_workers_beyond_the_partitions_are_said_to_sit_idle() -> None:
    assert "(claw.steps: 6 partitions; 2 workers idle)" in _summary(_planned(workers=8))


def test_worker_ports_skip_the_stack_s_other_ports() -> None:
    assert worker_ports(9401, 1, {9401}) == [9401]  # the first is where the settings put it
    assert worker_ports(9401, 4, {9400, 9402, 9404}) == [9401, 9403, 9405, 9406]


def test_a_worker_instance_has_a_faust_data_dir_of_its_own(tmp_path: Path) -> None:
    from claw_stream.worker.app import create_app

    settings = load_settings()
    settings.worker.instance = "worker-2"
    app = create_app(settings)
    assert Path(app.conf.datadir) == tmp_path / "worker" / "claw-worker" / "worker-2"


def test_up_hands_its_counts_to_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    planned: list[Supervisor] = []

    async def run(self: Supervisor) -> int:
        planned.append(self)
        return 0

    monkeypatch.setattr(Supervisor, "run", run)
    result = CliRunner().invoke(main, ["up", "--workers", "2", "--gateways", "3"])
    assert result.exit_code == 0, result.output
    (supervisor,) = planned
    assert [s.name for s in supervisor.services if s.name.startswith("worker")] == [
        "worker-1",
        "worker-2",
    ]
    assert supervisor.settings.gateway.workers == 3


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--workers", "0"], "0 is not in the range 1<=x<=64"),
        (["--no-worker", "--workers", "2"], "--workers needs the worker"),
        (["--no-gateway", "--gateways", "2"], "--gateways needs the gateway"),
    ],
)
def test_up_refuses_counts_that_cannot_be(args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, ["up", *args])
    assert result.exit_code == 2 and said in result.output, result.output


def test_a_worker_shows_the_partitions_the_group_gave_it() -> None:
    worker = Worker(WorkerSettings(), "127.0.0.1:1", "postgresql+asyncpg://claw@127.0.0.1:1/claw")

    def held() -> dict[str, float | None]:
        registry = worker.io.metrics.registry
        return {
            t: registry.get_sample_value("claw_worker_partitions", {"topic": t})
            for t in ("claw.steps", "claw.turns", "claw.weights")
        }

    assert held() == {"claw.steps": 0, "claw.turns": 0, "claw.weights": 0}  # before a rebalance
    worker.assigned({TP("claw.steps", 0), TP("claw.steps", 3), TP("claw.turns", 0)})
    assert held() == {"claw.steps": 2, "claw.turns": 1, "claw.weights": 0}
    worker.revoked({TP("claw.steps", 3)})
    assert held() == {"claw.steps": 1, "claw.turns": 1, "claw.weights": 0}
