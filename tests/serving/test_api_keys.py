"""API keys: hashed at rest, checked in memory, revocable, usage recorded; token buckets per minute."""

from __future__ import annotations

import multiprocessing

import pytest

from cli_helpers import featurectl
from serving.api_keys import ApiKeyError, Authenticator, KeyStore
from serving.throttle import SharedTokenBuckets, TokenBuckets


@pytest.fixture
def store(tmp_path):
    return KeyStore(f"sqlite:///{tmp_path / 'registry.db'}", "assets")


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
    with pytest.raises(ApiKeyError, match=r"budgets must be whole numbers in \[1, 2147483647\]"):
        store.create("x", ["*"], 0, 10)
    with pytest.raises(ApiKeyError, match="budgets must be whole numbers"):
        store.create("x", ["*"], 10, 10**20)


@pytest.mark.parametrize("services, message", [
    (["asset_ranking,*"], "is not a feature service name"),
    ([""], "is not a feature service name"),
    ([" asset_ranking"], "is not a feature service name"),
    ([], "needs at least one feature service"),
    (["asset_ranking", "*"], "give `--service '\\*'` alone"),
])
def test_grants_are_one_name_each_or_star_alone(store, services, message):
    with pytest.raises(ApiKeyError, match=message):
        store.create("x", services, 10, 10)
    assert store.list() == []


def test_push_grants_are_their_own_and_stored_beside_the_services(store):
    key, token = store.create("pusher", ["asset_ranking"], 10, 10, ["asset_interactions"])
    _, everything = store.create("reader", ["*"], 10, 10)
    _, any_source = store.create("any", [], 10, 10, ["*"])
    with store.engine.connect() as conn:
        grants = conn.exec_driver_sql(f"SELECT services FROM featurectl_api_keys WHERE key_id = '{key.key_id}'")
        assert grants.scalar() == "asset_ranking,push:asset_interactions"
    auth = Authenticator(store, refresh_s=3600)
    try:
        pusher = auth.authenticate(token)
        assert pusher.services == ("asset_ranking",) and pusher.pushes == ("asset_interactions",)
        assert pusher.may_push("asset_interactions") and not pusher.may_push("asset_attributes_push")
        assert pusher.may_read("asset_ranking") and not pusher.may_read("asset_interactions")
        assert not auth.authenticate(everything).may_push("asset_interactions")  # `*` grants reads only
        assert auth.authenticate(any_source).may_push("asset_attributes_push")
    finally:
        auth.close()


@pytest.mark.parametrize("pushes, message", [
    (["asset_interactions,*"], "`--push 'asset_interactions,*'` is not a push source name"),
    (["push:x"], "is not a push source name"),
    (["asset_interactions", "*"], "`*` already grants every push source"),
])
def test_push_grants_are_one_name_each_or_star_alone(store, pushes, message):
    with pytest.raises(ApiKeyError) as caught:
        store.create("x", [], 10, 10, pushes)
    assert message in str(caught.value)
    with pytest.raises(ApiKeyError, match="or push source"):
        store.create("x", [], 10, 10, [])
    assert store.list() == []


def test_keys_cli_refuses_bad_grants_and_budgets_in_one_line(tmp_path):
    registry = f"sqlite:///{tmp_path / 'registry.db'}"
    for args in (["--service", "asset_ranking,*"], ["--service", ""],
                 ["--service", "*", "--requests-per-minute", "99999999999999999999"]):
        done = featurectl("--registry", registry, "keys", "create", "x", *args)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().startswith("Error:") and len(done.stderr.strip().splitlines()) == 1, done.stderr


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


def test_workers_sharing_a_budget_file_spend_one_budget(tmp_path):
    """Two processes' buckets over one file (as `serve --workers 2` has): a 60/min key gets 60 in all, not 60
    per worker nor 30 on the worker a keep-alive connection happens to use."""
    now = [0.0]
    path = str(tmp_path / "budgets")
    workers = [SharedTokenBuckets(path, clock=lambda: now[0]) for _ in range(2)]
    assert all(workers[0].take("k", "requests", 1, 60)[0] for _ in range(45))     # one busy connection
    assert all(workers[i % 2].take("k", "requests", 1, 60)[0] for i in range(15))
    assert workers[1].take("k", "requests", 1, 60) == (False, 1)
    assert workers[0].take("other", "requests", 1, 60) == (True, 0)               # its own slot
    workers[1].give_back("k", "requests", 1, 60)
    assert workers[0].take("k", "requests", 1, 60) == (True, 0)
    for worker in workers:
        worker.close()


def test_a_budget_shared_across_real_processes_is_exact(tmp_path):
    path = str(tmp_path / "budgets")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        granted = sum(pool.starmap(_take_many, [(path, 100)] * 4))
    assert granted == 250  # a key of 250 per minute, 400 asked for by four processes at one instant


def _take_many(path: str, count: int) -> int:
    buckets = SharedTokenBuckets(path, clock=lambda: 0.0)  # no refill between the processes' takes
    try:
        return sum(buckets.take("k", "requests", 1, 250)[0] for _ in range(count))
    finally:
        buckets.close()


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
    pusher = featurectl("--registry", registry, "keys", "create", "ingest", "--push", "asset_interactions")
    assert pusher.returncode == 0, pusher.stderr
    listed = featurectl("--registry", registry, "keys", "list").stdout
    assert "ingest" in listed and "services= push=asset_interactions" in listed
    assert "warning" not in created.stderr + pusher.stderr
    typo = featurectl("--registry", registry, "keys", "create", "typo", "--service", "asset_rankin",
                      "--push", "asset_interaction")
    assert typo.returncode == 0, typo.stderr  # a service registered with Feast's SDK, or added later, is valid
    assert "no feature service `asset_rankin` (did you mean `asset_ranking`?)" in typo.stderr
    assert "no push source `asset_interaction` (did you mean `asset_interactions`?)" in typo.stderr


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
        never = gateway.admit(key, "asset_ranking", TOKENS, 101)                 # above a minute's budget
        assert never.status == 403 and never.code == "over_key_limit" and never.headers == []
    finally:
        gateway.close()
    assert store.usage() == [(key.key_id, "ranker", 3, 100, 2)]          # the refunded request is not counted


def test_usage_of_several_server_processes_adds_up(store):
    key, _ = store.create("shared", ["*"], 10, 10)
    workers = [Authenticator(KeyStore(str(store.engine.url), store.project), refresh_s=3600) for _ in range(2)]
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


def test_keys_belong_to_a_project_and_older_tables_gain_the_column(tmp_path):
    """Keys made before the `project` column stay valid for every project; new ones only for their own, and a
    project's teardown deletes only its own keys and their usage."""
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE featurectl_api_keys (key_id VARCHAR(16) PRIMARY KEY, name VARCHAR(200) "
                             "NOT NULL, key_hash VARCHAR(64) NOT NULL, services TEXT NOT NULL, requests_per_minute "
                             "INTEGER NOT NULL, tokens_per_minute INTEGER NOT NULL, created_at DATETIME NOT NULL, "
                             "revoked_at DATETIME)"))
        conn.execute(sa.text("INSERT INTO featurectl_api_keys VALUES ('0ld0ld00', 'legacy', 'h', '*', 5, 5, "
                             "'2026-01-01 00:00:00', NULL)"))
    shop, games = KeyStore(url, "shop"), KeyStore(url, "games")
    mine, _ = shop.create("mine", ["*"], 10, 10)
    theirs, _ = games.create("theirs", ["*"], 10, 10)
    assert [k.key_id for k in shop.list()] == ["0ld0ld00", mine.key_id]
    assert set(games.hashes()) == {"0ld0ld00", theirs.key_id}
    with pytest.raises(ApiKeyError, match="no active key"):
        games.revoke(mine.key_id)
    shop.add_usage({(mine.key_id, 1): [3, 0, 0], (theirs.key_id, 1): [4, 0, 0]})
    assert shop.delete_project_keys() == 1
    assert [k.key_id for k in shop.list()] == ["0ld0ld00"]
    assert {row[0]: row[2] for row in games.usage()} == {"0ld0ld00": 0, theirs.key_id: 4}
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM featurectl_api_usage")).scalar() == 1
