"""Redis AUTH, ACL users and TLS through `online_store.connection_string`, against real redis-servers of the
test's own (password and ACL user set in a config file, TLS with a CA and certificates made by `openssl` here);
the password never shows in a repr, a log line, an exception or a server's error reply."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import hiredis
import pytest
import yaml
from cli_helpers import featurectl, free_port
from serving_env import feast_rows, feature_server, get, make_repo, post

from common.config import load_config
from redis_store.errors import RedisConfigError, RedisReplyError, RedisUnavailableError
from redis_store.node import AsyncNode, SyncNode
from redis_store.settings import RedisSettings
from serving import AsyncOnlineClient, OnlineClient

pytestmark = pytest.mark.integration

PASSWORD = "s3cr3t-Pa55-for-the-default-user"
ACL_USER, ACL_PASSWORD = "feast_reader", "acl-Pa55word-of-feast-reader"
SECRETS = (PASSWORD, ACL_PASSWORD)
FEATURES = ["asset_activity:views_1h", "asset_attributes:category"]


def _no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"a password leaked into: {text[:300]}"


class ConfRedis:
    """A redis-server started from a config file in its own folder (so no secret is on its command line)."""

    def __init__(self, folder: Path, conf: str, ready: RedisSettings):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "redis.conf").write_text(conf + f'\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {folder}\n')
        self.process = subprocess.Popen(["redis-server", str(folder / "redis.conf")], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                node = SyncNode(ready, ready.nodes[0])
                try:
                    node.ping()
                finally:
                    node.close()
                return
            except Exception:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server from {folder}/redis.conf did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(folder: Path) -> Path:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    folder.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test-ca",
             cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext", cwd=folder)
    return folder


@pytest.fixture(scope="module")
def auth_redis(tmp_path_factory):
    folder = tmp_path_factory.mktemp("redis-auth")
    port = free_port()
    conf = f"port {port}\nrequirepass {PASSWORD}\nuser {ACL_USER} on >{ACL_PASSWORD} ~* &* +@all\n"
    server = ConfRedis(folder / "server", conf, RedisSettings.parse(f"127.0.0.1:{port},password={PASSWORD}"))
    yield folder, port
    server.stop()


@pytest.fixture(scope="module")
def auth_repo(auth_redis):
    """A registered repo whose connection string reads the password from the environment, with Feast's rows."""
    folder, port = auth_redis
    repo, _ = make_repo(folder, "authrepo", f"127.0.0.1:{port},password={PASSWORD}")
    settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
    settings["online_store"]["connection_string"] = f"127.0.0.1:{port},password=${{TEST_REDIS_PASSWORD}}"
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TEST_REDIS_PASSWORD", PASSWORD)
        from feast import FeatureStore

        store = FeatureStore(config=load_config(repo).feast_repo_config())      # Feast writes through AUTH
        feast_rows(store, "asset_activity", {"a1": {"views_1h": 4}})
        feast_rows(store, "asset_attributes", {"a1": {"category": "chair"}})
    return repo


def _with_connection(repo: Path, connection_string: str) -> Path:
    """A copy of `repo` (same registry) pointing at Redis with another connection string."""
    other = repo.parent / f"{repo.name}-{abs(hash(connection_string)) % 10**8}"
    if not other.exists():
        shutil.copytree(repo, other)
        settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
        settings["online_store"]["connection_string"] = connection_string
        (other / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return other


def test_connection_string_keeps_feasts_format_and_hides_the_password():
    s = RedisSettings.parse(f"redis.internal:6380,db=2,username=feast,password={PASSWORD},ssl=true,"
                            "ssl_ca_certs=/etc/ca.pem,ssl_certfile=/etc/c.pem,ssl_keyfile=/etc/c.key,"
                            "ssl_cert_reqs=required,ssl_check_hostname=true,socket_timeout=0.5")
    assert s.nodes == (("redis.internal", 6380),) and s.db == 2 and s.username == "feast"
    assert s.password == PASSWORD and s.tls and s.ca_certs == "/etc/ca.pem" and s.check_hostname
    assert s.certfile == "/etc/c.pem" and s.keyfile == "/etc/c.key" and s.timeout_s == 0.5
    _no_secret(repr(s), str(s))
    assert RedisSettings.parse("127.0.0.1:6379,password=1e5").password == "1e5"   # never decoded as a number
    cluster = RedisSettings.parse("10.0.0.1:7000,10.0.0.2:7000,ssl=true", "redis_cluster")
    assert cluster.cluster and len(cluster.nodes) == 2 and cluster.tls


@pytest.mark.parametrize("text, fragment", [
    ("127.0.0.1:6379,pasword=x", "unknown setting(s) `pasword`"),
    ("127.0.0.1:6379,ssl=maybe", "`ssl` must be true or false"),
    ("127.0.0.1:6379,ssl_cert_reqs=always", "`ssl_cert_reqs` must be one of"),
    ("password=x", "names no host:port"),
    ("redis-host,password=x", "is not host:port"),
    ("127.0.0.1:6379,password=x,tail-of-secret", "cannot hold a `,`"),
    ("127.0.0.1:6379,password=${UNSET_TEST_VAR}", "export that environment variable"),
])
def test_bad_connection_strings_say_what_to_fix_without_the_secret(text, fragment):
    with pytest.raises(RedisConfigError, match="online_store") as caught:
        RedisSettings.parse(text)
    assert fragment in str(caught.value)
    assert "=x" not in str(caught.value) and "tail-of-secret" not in str(caught.value)


def test_sdk_reads_with_the_password_and_with_an_acl_user(auth_redis, auth_repo, monkeypatch):
    monkeypatch.setenv("TEST_REDIS_PASSWORD", PASSWORD)
    with OnlineClient.from_repo(auth_repo) as client:
        assert client.get_features(FEATURES, {"asset_id": ["a1"]})["views_1h"] == [4]

    port = auth_redis[1]
    acl = _with_connection(auth_repo, f"127.0.0.1:{port},username={ACL_USER},password={ACL_PASSWORD}")

    async def read() -> dict:
        client = AsyncOnlineClient.from_repo(acl)
        try:
            return await client.get_features(FEATURES, {"asset_id": ["a1"]})
        finally:
            await client.close()

    assert asyncio.run(read())["category"] == ["chair"]
    writers = RedisSettings.from_config(load_config(acl))           # what the writers connect with: same AUTH
    node = SyncNode(writers, writers.nodes[0])
    assert node.read([], [hiredis.pack_command(("ACL", "WHOAMI"))]) == [ACL_USER.encode()]
    node.close()


@pytest.mark.parametrize("suffix, reply", [("", "NOAUTH"), (",password=wrong-one", "WRONGPASS"),
                                           (f",username={ACL_USER},password={PASSWORD}", "WRONGPASS")])
def test_missing_or_wrong_password_is_a_clear_error_without_secrets(auth_redis, auth_repo, caplog, suffix, reply):
    caplog.set_level(logging.DEBUG)
    port = auth_redis[1]
    repo = _with_connection(auth_repo, f"127.0.0.1:{port}{suffix}")
    with OnlineClient.from_repo(repo) as client, pytest.raises(RedisReplyError) as caught:
        client.get_features(FEATURES, {"asset_id": ["a1"]})
    message = str(caught.value)
    assert reply in message and "set `password=`" in message and "connection_string" in message
    _no_secret(message, repr(caught.value), caplog.text)


def test_feature_server_uses_the_password_and_never_shows_it(auth_redis, auth_repo, monkeypatch):
    monkeypatch.setenv("TEST_REDIS_PASSWORD", PASSWORD)          # inherited by the server process
    body = {"features": FEATURES, "entities": {"asset_id": ["a1"]}}
    with feature_server(auth_repo, free_port()) as url:
        status, reply = post(url, body)
    assert status == 200 and reply["results"][1]["values"] == [4]
    port = auth_redis[1]
    wrong = _with_connection(auth_repo, f"127.0.0.1:{port},username={ACL_USER},password={PASSWORD}")
    with feature_server(wrong, free_port()) as url:
        status, reply = post(url, body)
        ready_status, ready_bytes = get(url, "/ready")
        ready = ready_bytes.decode()
    assert status == 502 and reply["code"] == "redis_error" and "WRONGPASS" in reply["error"]
    assert ready_status == 503 and "set `password=`" in ready
    logs = "".join(p.read_text() for p in wrong.parent.glob("server-*.log"))
    _no_secret(str(reply), ready, logs)


def test_a_long_command_without_the_password_is_an_auth_error_not_a_lost_connection(auth_redis):
    """Redis refuses a command of more than 10 arguments before AUTH (`Protocol error: unauthenticated multibulk
    length`) and closes the connection, before the replies of the commands after it (a push's guarded writes, a
    view's HMGET of many features)."""
    settings = RedisSettings.parse(f"127.0.0.1:{auth_redis[1]}")
    long_command = hiredis.pack_command(("HMGET", "some-key", *(f"view:f{i}" for i in range(12))))
    commands = [long_command, hiredis.pack_command(("PING",))]
    node = SyncNode(settings, settings.nodes[0])
    with pytest.raises(RedisReplyError) as caught:
        node.read([b"some-key", b""], commands)
    node.close()

    async def read() -> None:
        client = AsyncNode(settings, settings.nodes[0])
        try:
            await client.read([b"some-key", b""], commands)
        finally:
            await client.close()

    with pytest.raises(RedisReplyError) as caught_async:
        asyncio.run(read())
    for message in (str(caught.value), str(caught_async.value)):
        assert "unauthenticated" in message and "set `password=`" in message, message


def test_apply_and_teardown_refused_by_redis_fail_in_one_line_before_the_registry_changes(auth_redis, tmp_path):
    """Removing a view (apply) or a project (teardown) has Feast drop online tables with a redis-py client of its
    own; a refused password is one line from our client first, not redis-py's traceback after the registry
    changed."""
    port = auth_redis[1]
    assert featurectl("init", "--dir", str(tmp_path), "authproj").returncode == 0
    repo = tmp_path / "authproj"
    settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
    settings["registry"]["path"] = f"sqlite:///{tmp_path}/registry.db"
    settings["online_store"]["connection_string"] = f"127.0.0.1:{port},password=${{TEST_REDIS_PASSWORD}}"
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    right, wrong = ({**os.environ, "TEST_REDIS_PASSWORD": secret} for secret in (PASSWORD, ACL_PASSWORD))
    assert featurectl("--repo", str(repo), "apply", env=right).returncode == 0
    features = (repo / "features.py").read_text()
    start, end = features.index("customer_orders = FeatureView("), features.index("customer_profile = FeatureView(")
    (repo / "features.py").write_text(features[:start] + features[end:].replace(
        "features=[customer_orders, customer_profile]", "features=[customer_profile]"))
    for command in (("apply",), ("teardown", "--yes")):
        refused = featurectl("--repo", str(repo), *command, env=wrong)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.startswith("Error: redis at ") and "WRONGPASS" in refused.stderr, refused.stderr
        _no_secret(refused.stdout, refused.stderr)
    applied = featurectl("--repo", str(repo), "apply", env=right)       # the removal is still to do
    assert applied.returncode == 0 and "customer_orders" in applied.stdout, applied.stdout
    assert featurectl("--repo", str(repo), "teardown", "--yes", env=right).returncode == 0


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """TLS only (no plain port), client certificates required, and a password."""
    folder = tmp_path_factory.mktemp("redis-tls")
    certs = _certificates(folder / "certs")
    port = free_port()
    conf = (f"port 0\ntls-port {port}\ntls-cert-file {certs}/server.crt\ntls-key-file {certs}/server.key\n"
            f"tls-ca-cert-file {certs}/ca.crt\ntls-auth-clients yes\nrequirepass {PASSWORD}\n")
    full = (f"127.0.0.1:{port},password={PASSWORD},ssl=true,ssl_ca_certs={certs}/ca.crt,"
            f"ssl_certfile={certs}/client.crt,ssl_keyfile={certs}/client.key")
    server = ConfRedis(folder / "server", conf, RedisSettings.parse(full))
    repo, _ = make_repo(folder, "tlsrepo", full)
    yield repo, port, certs, full
    server.stop()


def test_tls_with_client_certificates_for_feast_the_sdk_and_the_writers(tls_redis):
    repo, _, _, full = tls_redis
    from feast import FeatureStore

    feast_rows(FeatureStore(config=load_config(repo).feast_repo_config()), "asset_attributes",
               {"a9": {"category": "lamp"}})                                   # Feast writes over TLS
    with OnlineClient.from_repo(repo) as client:
        assert client.get_features(["asset_attributes:category"], {"asset_id": ["a9"]})["category"] == ["lamp"]

    async def read() -> dict:
        client = AsyncOnlineClient.from_repo(repo)
        try:
            return await client.get_features(["asset_attributes:category"], {"asset_id": ["a9"]})
        finally:
            await client.close()

    assert asyncio.run(read())["category"] == ["lamp"]
    _materialize_one(RedisSettings.parse(full), load_config(repo).project, "a10", "sofa")  # materialization
    with OnlineClient.from_repo(repo) as client:
        assert client.get_features(["asset_attributes:category"], {"asset_id": ["a10"]})["category"] == ["sofa"]


def _materialize_one(settings: RedisSettings, project: str, asset_id: str, category: str) -> None:
    """One row through the materializer's check-and-set writer, on its own TLS connection."""
    import numpy as np
    import pyarrow as pa

    from batch.redis_writer import CheckedChunkWriter, RowCommands
    from dsl.types import ValueType
    from redis_store import columns, layout

    keys = columns.bulk(columns.key_column(layout.KeyEncoder(project, {"asset_id": ValueType.STRING}),
                                           [pa.array([asset_id])]))
    millis = np.array([int(time.time() * 1000)])
    ts_field = layout.ts_field("asset_attributes")
    fields = [layout.field_name("asset_attributes", "category"), ts_field]
    values = [columns.value_column(pa.array([category]), ValueType.STRING), columns.timestamp_column(millis)]
    writer = CheckedChunkWriter(settings, connections=1)
    writer.send(RowCommands(keys, millis, columns.hget_commands(keys, ts_field), fields, values))
    assert writer.close() == 1


@pytest.mark.parametrize("change", ["no_ca", "no_client_cert", "plain_tcp"])
def test_tls_misconfiguration_fails_fast_and_says_so(tls_redis, caplog, change):
    caplog.set_level(logging.DEBUG)
    _, port, certs, full = tls_redis
    text = {"no_ca": full.replace(f",ssl_ca_certs={certs}/ca.crt", ""),
            "no_client_cert": full.split(",ssl_certfile=")[0],
            "plain_tcp": f"127.0.0.1:{port},password={PASSWORD},socket_timeout=0.5"}[change]
    node_settings = RedisSettings.parse(text)
    node = SyncNode(node_settings, node_settings.nodes[0])
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError) as caught:
        node.ping()
    assert time.monotonic() - started < 5
    message = str(caught.value)
    if change == "no_ca":
        assert "TLS with redis at 127.0.0.1" in message and "CERTIFICATE_VERIFY_FAILED" in message
        assert "ssl_ca_certs" in message
    else:
        assert f"127.0.0.1:{port}" in message
    if change == "plain_tcp":
        assert "ssl=true" in message
    _no_secret(message, caplog.text)


def test_tls_against_a_plain_port_names_tls_not_an_overloaded_redis(auth_redis, tls_redis):
    """A plain port never answers a TLS handshake (Redis waits for a command line): the timeout says so."""
    certs = tls_redis[2]
    settings = RedisSettings.parse(f"127.0.0.1:{auth_redis[1]},password={PASSWORD},ssl=true,"
                                   f"ssl_ca_certs={certs}/ca.crt,socket_connect_timeout=0.5")

    async def ping() -> None:
        node = AsyncNode(settings, settings.nodes[0])
        try:
            await node.ping()
        finally:
            await node.close()

    sync_node = SyncNode(settings, settings.nodes[0])
    for call in (sync_node.ping, lambda: asyncio.run(ping())):
        started = time.monotonic()
        with pytest.raises(RedisUnavailableError) as caught:
            call()
        assert time.monotonic() - started < 5
        message = str(caught.value)
        assert "no TLS handshake within 0.5s" in message and "tls-port" in message, message
        _no_secret(message)
