"""`featurectl services`: the real services answer, `up` is idempotent, and a missing piece says what to do."""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from pathlib import Path

import pytest
import yaml

from cli_helpers import ROOT, free_port
from common.config import ProjectConfig
from featurectl.services.process import read_pid


def scratch_repo(tmp_path: Path, redis_port: int | None = None) -> Path:
    """A copy of feature_repo's settings with its own state folder and unused ports, so that starting services
    from it cannot touch the ones the other tests use."""
    raw = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    raw["online_store"]["connection_string"] = f"127.0.0.1:{redis_port or free_port()}"
    raw["platform"]["state_dir"] = str(tmp_path / "state")
    raw["platform"]["kafka"] = {"bootstrap_servers": f"127.0.0.1:{free_port()}", "controller_port": free_port()}
    raw["platform"]["postgres"]["port"] = free_port()
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(raw))
    return repo


def status_pids(run_featurectl) -> dict[str, str]:
    done = run_featurectl("services", "status")
    assert done.returncode == 0, done.stderr
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\w+)\s+up\s+pid (\d+)", done.stdout, re.M)}


@pytest.mark.integration
def test_status_shows_every_service_up(local_services: ProjectConfig, run_featurectl) -> None:
    done = run_featurectl("services", "status")
    assert done.returncode == 0, done.stderr
    host, port = local_services.redis_host_port
    assert re.search(rf"^redis\s+up\s+pid \d+\s+{host}:{port}$", done.stdout, re.M), done.stdout
    assert re.search(rf"^kafka\s+up\s+pid \d+\s+{local_services.platform.kafka.bootstrap_servers}$",
                     done.stdout, re.M), done.stdout
    assert re.search(rf"^postgres\s+up\s+pid \d+\s+127.0.0.1:{local_services.platform.postgres.port}$",
                     done.stdout, re.M), done.stdout


@pytest.mark.integration
def test_redis_answers_ping(local_services: ProjectConfig) -> None:
    import redis

    host, port = local_services.redis_host_port
    with redis.Redis(host=host, port=port, socket_timeout=5) as client:
        assert client.ping()


@pytest.mark.integration
def test_kafka_round_trip(local_services: ProjectConfig) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    servers = local_services.platform.kafka.bootstrap_servers
    topic = f"test-services-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": servers})  # keep a reference: the future dies with its client
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)

    producer = Producer({"bootstrap.servers": servers})
    producer.produce(topic, key=b"asset-1", value=b"hello")
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": servers, "group.id": topic, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        message = None
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error():
                pytest.fail(f"consumer error: {message.error()}")
        assert message is not None, f"no message came back from {topic} within 60 s"
        assert (message.key(), message.value()) == (b"asset-1", b"hello")
    finally:
        consumer.close()


@pytest.mark.integration
def test_postgres_answers_as_the_configured_user(local_services: ProjectConfig) -> None:
    import psycopg

    pg = local_services.platform.postgres
    with psycopg.connect(host="127.0.0.1", port=pg.port, user=pg.user, dbname=pg.database,
                         connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.integration
def test_up_twice_leaves_running_services_alone(local_services: ProjectConfig, run_featurectl) -> None:
    before = status_pids(run_featurectl)
    done = run_featurectl("services", "up", "--postgres")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("redis", "kafka", "postgres"):
        assert f"{name}: already running (pid {before[name]})" in done.stdout
    assert status_pids(run_featurectl) == before


def test_up_starts_redis_and_kafka_only_where_the_config_puts_them_on_this_machine(tmp_path: Path,
                                                                                  run_featurectl) -> None:
    """A remote online store or broker is not shadowed by a local one on its port: `up` says it left it alone, and
    `--only redis` still starts a local one."""
    from common.config import load_config
    from featurectl.services import wanted_services

    repo = scratch_repo(tmp_path)
    raw = yaml.safe_load((repo / "feature_store.yaml").read_text())
    for host, local in (("127.0.0.1", True), ("localhost", True), ("redis.example", False)):
        raw["online_store"]["connection_string"] = f"{host}:6390"
        raw["platform"]["kafka"]["bootstrap_servers"] = f"{host}:19093,other.example:19093"
        (repo / "feature_store.yaml").write_text(yaml.safe_dump(raw))
        names = [svc.name for svc in wanted_services(load_config(repo), None, False)]
        assert ("redis" in names, "kafka" in names) == (local, local), (host, names)
        assert [svc.name for svc in wanted_services(load_config(repo), "redis", False)] == ["redis"]
    done = run_featurectl("--repo", str(repo), "services", "up", "--no-postgres")
    assert done.returncode == 0, done.stderr
    assert "redis: not started: online_store.connection_string names redis.example:6390" in done.stdout
    assert "kafka: not started: platform.kafka.bootstrap_servers names redis.example:19093" in done.stdout


def test_missing_kafka_jars_says_run_setup(tmp_path: Path, run_featurectl) -> None:
    empty = tmp_path / "jars"
    empty.mkdir()
    env = {**os.environ, "FEATURECTL_JARS": str(empty)}
    done = run_featurectl("--repo", str(scratch_repo(tmp_path)), "services", "up", "--only", "kafka", env=env)
    assert done.returncode != 0
    assert f"Kafka jars missing in {empty / 'kafka'}: run scripts/setup.sh" in done.stderr


def test_missing_redis_server_says_run_setup(tmp_path: Path, run_featurectl) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}
    done = run_featurectl("--repo", str(scratch_repo(tmp_path)), "services", "up", "--only", "redis", env=env)
    assert done.returncode != 0
    assert "redis-server not found on PATH: run scripts/setup.sh" in done.stderr


def test_port_held_by_a_stranger_is_reported(tmp_path: Path, run_featurectl) -> None:
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        repo = scratch_repo(tmp_path, redis_port=port)
        done = run_featurectl("--repo", str(repo), "services", "up", "--only", "redis")
    assert done.returncode != 0
    assert f"port {port} on 127.0.0.1 is in use by a process featurectl did not start" in done.stderr


def test_stale_pid_file_is_removed_and_never_trusted(tmp_path: Path) -> None:
    pid_file = tmp_path / "redis.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # alive, but not the program the marker names
    assert read_pid(pid_file, "redis-server 127.0.0.1:1") is None
    assert not pid_file.exists()
