"""API keys: hashed at rest, checked in memory, revocable, usage recorded; token buckets per minute."""

from __future__ import annotations

import pytest

from cli_helpers import featurectl
from serving.api_keys import ApiKeyError, Authenticator, KeyStore
from serving.throttle import TokenBuckets


@pytest.fixture
def store(tmp_path):
    return KeyStore(f"sqlite:///{tmp_path / 'registry.db'}")


def test_keys_are_stored_hashed_and_authenticate(store):
    key, token = store.create("ranker", ["asset_ranking"], 100, 1000)
    with store.engine.connect() as conn:
        stored = " ".join(str(v) for row in conn.exec_driver_sql("SELECT * FROM featurectl_api_keys") for v in row)
    assert token not in stored and token.split("_", 2)[2] not in stored
    auth = Authenticator(store, refresh_s=3600)
    try:
        assert auth.authenticate(token).key_id == key.key_id
        assert auth.authenticate(token[:-1] + ("x" if token[-1] != "x" else "y")) is None
        assert auth.authenticate("fk_nothing_here") is None and auth.authenticate(None) is None
        assert auth.authenticate(token).may_read("asset_ranking")
        assert not auth.authenticate(token).may_read("cube3d_conditioning")
        assert not auth.authenticate(token).may_read(None)
    finally:
        auth.close()


def test_revoked_keys_stop_authenticating(store):
    key, token = store.create("old", ["*"], 10, 10)
    store.revoke(key.key_id)
    auth = Authenticator(store, refresh_s=3600)
    try:
        assert auth.authenticate(token) is None
    finally:
        auth.close()
    with pytest.raises(ApiKeyError, match="no active key"):
        store.revoke(key.key_id)


def test_usage_is_recorded_per_key(store):
    key, _ = store.create("gen", ["*"], 10, 10)
    auth = Authenticator(store, refresh_s=3600)
    auth.count(key, requests=3, tokens=1024)
    auth.count(key, rejected=1)
    auth.close()
    assert store.usage() == [(key.key_id, "gen", 3, 1024, 1)]


def test_bad_budgets_are_rejected(store):
    with pytest.raises(ApiKeyError, match="budgets must be positive"):
        store.create("x", ["*"], 0, 10)


def test_token_bucket_refills_per_minute():
    now = [0.0]
    buckets = TokenBuckets(clock=lambda: now[0])
    assert all(buckets.take("k", "requests", 1, 60)[0] for _ in range(60))
    allowed, retry_after = buckets.take("k", "requests", 1, 60)
    assert not allowed and retry_after == 1
    now[0] += 1.0
    assert buckets.take("k", "requests", 1, 60) == (True, 0)
    assert buckets.take("k", "tokens", 512, 1024) == (True, 0)
    assert buckets.take("k", "tokens", 1024, 1024) == (False, 30)
    assert buckets.take("k", "tokens", 5000, 1024) == (False, 60)


def test_keys_cli_round_trip(tmp_path):
    registry = f"sqlite:///{tmp_path / 'registry.db'}"
    created = featurectl("--registry", registry, "keys", "create", "ranker", "--service", "asset_ranking")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip().splitlines()[-1]
    key_id = token.split("_")[1]
    listed = featurectl("--registry", registry, "keys", "list")
    assert key_id in listed.stdout and "active" in listed.stdout and token not in listed.stdout
    assert featurectl("--registry", registry, "keys", "revoke", key_id).returncode == 0
    assert "revoked" in featurectl("--registry", registry, "keys", "list").stdout
    usage = featurectl("--registry", registry, "keys", "usage")
    assert usage.returncode == 0 and key_id in usage.stdout


def test_token_bucket_gives_back_what_a_refused_request_spent():
    now = [0.0]
    buckets = TokenBuckets(clock=lambda: now[0])
    assert buckets.take("k", "tokens", 512, 1024) == (True, 0)
    assert buckets.take("k", "tokens", 512, 1024) == (True, 0)
    buckets.give_back("k", "tokens", 512, 1024)
    assert buckets.take("k", "tokens", 512, 1024) == (True, 0)
    buckets.give_back("k", "tokens", 5000, 1024)                       # never above one minute's budget
    assert buckets.take("k", "tokens", 1024, 1024) == (True, 0)


def test_gateway_order_401_403_429_and_usage(store):
    from serving.gateway import REQUESTS, TOKENS, Gateway

    key, token = store.create("ranker", ["asset_ranking"], 2, 100)
    now = [0.0]
    gateway = Gateway(Authenticator(store, refresh_s=3600), buckets=TokenBuckets(clock=lambda: now[0]))
    try:
        assert gateway.identify(None).status == 401 and gateway.identify("fk_x_y").code == "invalid_api_key"
        assert gateway.identify(token).key_id == key.key_id
        assert gateway.admit(key, "cube3d_conditioning", REQUESTS, 1).status == 403
        assert gateway.admit(key, None, REQUESTS, 1).status == 403                 # feature lists need `*`
        assert gateway.admit(key, "asset_ranking", REQUESTS, 1) is None
        assert gateway.admit(key, "asset_ranking", REQUESTS, 1) is None
        refused = gateway.admit(key, "asset_ranking", REQUESTS, 1)
        assert refused.status == 429 and refused.headers == [(b"retry-after", b"30")]
        now[0] += 30
        assert gateway.admit(key, "asset_ranking", TOKENS, 60) is None
        gateway.refund(key, TOKENS, 60)
        assert gateway.admit(key, "asset_ranking", TOKENS, 100) is None          # the refund came back
    finally:
        gateway.close()
    assert store.usage() == [(key.key_id, "ranker", 3, 100, 1)]          # the refunded request is not counted


def test_usage_of_several_server_processes_adds_up(store):
    key, _ = store.create("shared", ["*"], 10, 10)
    workers = [Authenticator(KeyStore(str(store.engine.url)), refresh_s=3600) for _ in range(2)]
    for worker in workers:
        worker.count(key, requests=2, tokens=5)
    for worker in workers:
        worker.close()
    assert store.usage() == [(key.key_id, "shared", 4, 10, 0)]


def test_keys_from_headers():
    from serving.gateway import bearer, key_from_headers

    assert bearer(b"Bearer fk_a_b ") == "fk_a_b" and bearer(b"bearer fk_a_b") == "fk_a_b"
    assert bearer(b"Basic dXNlcjpwYXNz") is None and bearer(None) is None
    assert key_from_headers([(b"X-API-Key", b"fk_1_x")]) == "fk_1_x"
    assert key_from_headers([(b"x-api-key", b"fk_1_x"), (b"authorization", b"Bearer fk_2_y")]) == "fk_2_y"
    assert key_from_headers([(b"authorization", b"Basic abc")]) is None
