"""Serving registered versions (tiny CPU model): a promote or rollback under steady load fails nothing and every
answer comes from the version that was champion when it was admitted; the A/B split; shadow runs never answer."""

from __future__ import annotations

import gc
import shutil
import threading
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path

import orjson
import pytest

from cli_helpers import cli_server, copy_example_repo, generation_app_in_thread

pytestmark = pytest.mark.integration


def test_ab_split_is_stable_and_within_two_points_of_the_share():
    from inference.service.rollout import ab_arm

    keys = [f"req-{i}" for i in range(2000)]
    for share in (0.05, 0.1, 0.5):
        arms = [ab_arm(key, share) for key in keys]
        assert abs(arms.count("challenger") / len(keys) - share) <= 0.02, share
        assert arms == [ab_arm(key, share) for key in keys]                     # the same key, the same arm
    assert [ab_arm(f"asset_{i:06d}", 0.1) for i in range(2000)].count("challenger") == pytest.approx(200, abs=40)


def test_a_rollout_without_a_champion_refuses_to_start():
    from inference.registry import ModelRegistryError
    from inference.service import ServiceConfig
    from inference.service.rollout import Rollout

    def build(cfg):
        raise AssertionError("nothing to build without a champion")

    with pytest.raises(ModelRegistryError, match="no champion to serve"):
        Rollout(ServiceConfig.from_name("tiny"), lambda alias: None, build)


def test_a_request_costs_the_tokens_of_the_version_its_arm_serves(tmp_path):
    """With an A/B split, a challenger that generates more shape tokens charges its own count, not the champion's."""
    import datetime as dt

    from inference.registry import ModelVersion
    from inference.registry.checkpoint_check import file_sha256
    from inference.service import GenerationRequest, ServiceConfig
    from inference.service.rollout import Rollout, ab_arm, request_key

    class Tokens:
        def __init__(self, cfg):
            self.tokens = 1024 if cfg.model == "v0.5" else 512

        def tokens_for(self, request):
            return self.tokens

        def close(self):
            pass

    versions = {}
    for number, (alias, config) in enumerate((("champion", "v0.1"), ("challenger", "v0.5")), start=1):
        source = tmp_path / f"{alias}.pt"
        source.write_bytes(alias.encode())
        versions[alias] = ModelVersion("m", number, str(source), config, file_sha256(source), dt.datetime.now())
    rollout = Rollout(ServiceConfig.from_name("tiny"), versions.get, Tokens, ab_share=0.5)
    try:
        requests = [GenerationRequest("a chair", asset_id=f"asset_{i}") for i in range(40)]
        costs = [rollout.tokens_for(r) for r in requests]
        assert costs == [1024 if ab_arm(request_key(r), 0.5) == "challenger" else 512 for r in requests]
        assert set(costs) == {512, 1024}
    finally:
        rollout.close()


@pytest.mark.parametrize("args, message", [
    (["--ab", "challenger=0.1"], "add --model models:/NAME@champion"),
    (["--model", "models:/m@champion", "--ab", "challenger=1.5"], "e.g. challenger=0.1"),
    (["--model", "models:/m@challenger"], "a server follows the champion"),
    (["--model", "m"], "is not a model alias URI"),
])
def test_generate_server_rollout_options_are_checked_before_anything_loads(tmp_path, args, message):
    from click.testing import CliRunner

    from featurectl.cli import Context
    from featurectl.generate_commands import generate_server

    result = CliRunner().invoke(generate_server, ["--config", "tiny", *args], obj=Context(tmp_path, None))
    assert result.exit_code == 2 and message in result.output, result.output


@pytest.fixture(scope="module")
def registry_repo(tmp_path_factory, tiny_checkpoints) -> Path:
    """A repo whose model registry holds `m`: version 1 (seed 0) champion, version 2 (seed 1) challenger."""
    from common.config import load_config
    from inference.registry import ModelRegistry, verify_checkpoint

    tmp = tmp_path_factory.mktemp("rollout")
    repo = copy_example_repo(tmp, "rollout", {"path": f"sqlite:///{tmp / 'registry.db'}"})
    registry = ModelRegistry(load_config(repo).registry_url)
    for path in tiny_checkpoints:
        registry.register("m", verify_checkpoint(path))
    registry.promote("m", 1, "champion")
    registry.promote("m", 2, "challenger")
    return repo


def _registry(repo: Path):
    from common.config import load_config
    from inference.registry import ModelRegistry

    return ModelRegistry(load_config(repo).registry_url)


def _rollout(repo: Path, ab_share: float = 0.0, shadow_share: float = 0.0, poll_s: float = 3600):
    from inference.service import GenerationService, ServiceConfig
    from inference.service.rollout import Rollout

    def build(cfg):
        service = GenerationService(cfg)
        service.warm_up()
        return service

    registry = _registry(repo)
    cfg = ServiceConfig.from_name("tiny", max_batch_wait_ms=1.0, batch_buckets=(1, 2), mesh_workers=1)
    return Rollout(cfg, lambda alias: registry.resolve("m", alias), build, ab_share, shadow_share, poll_s)


def test_requests_admitted_before_a_switch_finish_on_the_old_version(registry_repo, tiny_checkpoints):
    from inference.registry import verify_checkpoint
    from inference.service import GenerationRequest

    registry = _registry(registry_repo)
    rollout = _rollout(registry_repo)
    try:
        before = [rollout.submit(GenerationRequest(f"a chair {i}", seed=i)) for i in range(6)]
        old = weakref.ref(rollout.champion)
        registry.promote("m", 2, "champion")
        rollout.poll()                                    # builds and warms version 2, then switches
        after = [rollout.submit(GenerationRequest(f"a chair {i}", seed=i)) for i in range(6)]
        assert [f.result(60).model_version for f in before] == ["m/1"] * 6
        assert [f.result(60).model_version for f in after] == ["m/2"] * 6
        assert rollout.versions() == {"champion": "m/2"}
        deadline = time.monotonic() + 30
        while old() is not None:                          # retired once what it admitted settled, and freed
            assert time.monotonic() < deadline, "version 1 was not closed and freed after its requests settled"
            time.sleep(0.05)
            gc.collect()
        # the same request answered by each version: different weights, different tokens
        registry.rollback("m")
        rollout.poll()
        again = rollout.submit(GenerationRequest("a chair 0", seed=0)).result(60)
        assert again.model_version == "m/1" and again.tokens == before[0].result().tokens
        assert again.tokens != after[0].result().tokens

        # a version whose file changed after registration is refused; the champion keeps serving
        changed = registry_repo.parent / "changed.safetensors"
        shutil.copyfile(tiny_checkpoints[1], changed)
        version = registry.register("m", verify_checkpoint(changed)).version
        changed.write_bytes(tiny_checkpoints[0].read_bytes())
        registry.promote("m", version, "champion")
        rollout.poll()
        assert rollout.versions() == {"champion": "m/1"}
        assert rollout.submit(GenerationRequest("a chair 0", seed=0)).result(60).model_version == "m/1"
        registry.rollback("m")
    finally:
        rollout.close()


def test_shadow_copies_run_on_the_challenger_and_are_never_returned(registry_repo):
    from inference.service import GenerationRequest

    registry = _registry(registry_repo)
    registry.promote("m", 1, "champion")
    rollout = _rollout(registry_repo, shadow_share=1.0)
    try:
        results = [rollout.submit(GenerationRequest(f"a lamp {i}", seed=i)).result(60) for i in range(4)]
        champion = rollout.champion
        direct = [champion.generate(GenerationRequest(f"a lamp {i}", seed=i)) for i in range(4)]
        assert [r.model_version for r in results] == ["m/1"] * 4
        assert [r.tokens for r in results] == [d.tokens for d in direct]          # the champion's own answers
        deadline = time.monotonic() + 60
        while rollout.shadow.summary().get("m/2", {}).get("outcomes", {}).get("compared", 0) < 4:
            assert time.monotonic() < deadline, rollout.shadow.summary()
            time.sleep(0.1)
        shadow = rollout.shadow.summary()["m/2"]
        assert 0 <= shadow["token_agreement"] < 1 and shadow["volume_difference"] >= 0
        text = rollout.stats.exposition().decode()
        assert 'cube3d_shadow_requests_total{outcome="compared",version="m/2"} 4.0' in text
        assert 'cube3d_shadow_token_agreement{version="m/2"}' in text
        assert 'cube3d_requests_total{arm="champion",outcome="ok",version="m/1"}' in text
        assert 'cube3d_requests_total{arm="shadow",outcome="ok",version="m/2"} 4.0' in text     # apart from A/B
    finally:
        rollout.close()


def _post(url: str, body: dict, request_id: str | None = None):
    headers = {"X-Request-ID": request_id} if request_id else {}
    request = urllib.request.Request(f"{url}/generate", data=orjson.dumps(body), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.headers.get("X-Model-Version"), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("X-Model-Version"), exc.read()


def test_promote_and_rollback_under_steady_load_fail_nothing(registry_repo):
    """Two clients send requests back to back while version 2 is promoted, then rolled back; the server follows
    the alias by polling. Every answer is 200, and a request sent after some answer came from a version was
    admitted by that version or a later champion, never an earlier one."""
    registry = _registry(registry_repo)
    registry.promote("m", 1, "champion")
    rollout = _rollout(registry_repo, poll_s=0.2)
    answers: list[tuple[float, float, int, str]] = []          # sent, received, status, version
    stop = threading.Event()

    def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            sent = time.monotonic()
            status, version, _ = _post(url, {"prompt": f"a table {n} {i}", "seed": i})
            answers.append((sent, time.monotonic(), status, version))
            i += 1

    def wait_for(version: str) -> float:
        deadline = time.monotonic() + 120
        while not any(a[3] == version and a[0] > changed for a in list(answers)):
            assert time.monotonic() < deadline, f"no answer from {version} 120 s after the alias moved"
            time.sleep(0.05)
        return min(a[1] for a in answers if a[3] == version and a[0] > changed)

    try:
        with generation_app_in_thread(lambda: rollout) as url:
            clients = [threading.Thread(target=client, args=(n,)) for n in range(2)]
            for thread in clients:
                thread.start()
            time.sleep(1.0)
            changed = time.monotonic()
            registry.promote("m", 2, "champion")
            first_v2 = wait_for("m/2")
            changed = time.monotonic()
            registry.rollback("m")
            first_v1_again = wait_for("m/1")
            time.sleep(0.5)
            stop.set()
            for thread in clients:
                thread.join(60)
    finally:
        stop.set()
        rollout.close()
    assert {a[2] for a in answers} == {200}, answers
    for sent, _, _, version in answers:
        if first_v2 < sent < changed:
            assert version == "m/2"
        if sent > first_v1_again:
            assert version == "m/1"
    assert sum(1 for a in answers if a[3] == "m/1" and a[0] < first_v2) > 0


def test_generate_server_splits_ab_by_request_id_and_labels_metrics(registry_repo):
    from inference.service.rollout import ab_arm

    _registry(registry_repo).promote("m", 1, "champion")
    with cli_server(registry_repo, "generate-server", "--config", "tiny", "--model", "models:/m@champion",
                    "--ab", "challenger=0.5", "--shadow", "1.0", ready_path="/ready") as server:
        keys = [f"key-{i}" for i in range(8)]
        for key in keys:
            status, version, body = _post(server.url, {"prompt": "a red car"}, key)
            assert status == 200 and body[:4] == b"glTF"
            assert version == {"champion": "m/1", "challenger": "m/2"}[ab_arm(key, 0.5)], key
        with urllib.request.urlopen(f"{server.url}/ready") as reply:
            assert orjson.loads(reply.read())["versions"] == {"champion": "m/1", "challenger": "m/2"}
        with urllib.request.urlopen(f"{server.url}/metrics") as reply:
            text = reply.read().decode()
    champion_share = sum(ab_arm(k, 0.5) == "champion" for k in keys)
    assert 0 < champion_share < len(keys)
    assert f'cube3d_requests_total{{arm="champion",outcome="ok",version="m/1"}} {champion_share}.0' in text
    challenger_share = len(keys) - champion_share              # the shadow copies are counted apart
    assert f'cube3d_requests_total{{arm="challenger",outcome="ok",version="m/2"}} {challenger_share}.0' in text
    assert 'cube3d_generated_tokens_total{arm="challenger",version="m/2"}' in text
    assert 'cube3d_stage_duration_seconds_count{arm="challenger",stage="decode",version="m/2"}' in text


def test_shadow_stats_name_their_percentiles_in_ms_as_the_service_stats_do():
    from inference.service.shadow import Agreement, ShadowStats

    stats = ShadowStats()
    stats.compared("m/2", 0.25, Agreement(tokens=0.5, bbox=0.1, volume=0.2))
    row = stats.summary()["m/2"]
    assert row["p50_ms"] == pytest.approx(250, rel=0.02) and "p50" not in row
    assert row["outcomes"]["compared"] == 1 and row["token_agreement"] == 0.5
