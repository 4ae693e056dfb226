"""Both HTTP servers fuzzed from their own OpenAPI documents (schemathesis, valid and invalid inputs) while they
run for real (`featurectl serve`, `featurectl generate-server --config tiny` on the CPU, a private Redis): no
input gets a 5xx, and every error is a JSON body naming the problem (`error`) and its kind (`code`)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from fault_env import PrivateServices, cli_server, example_repo, feature_server, http, sibling
from inference.service.openapi import OPENAPI as GENERATION_OPENAPI
from serving.openapi import OPENAPI as FEATURE_OPENAPI

pytestmark = pytest.mark.integration

FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The example repo in a SQLite registry with a few assets' values in a private Redis."""
    from feast import FeatureStore

    from common.config import load_config

    folder = tmp_path_factory.mktemp("http_fuzz")
    services = PrivateServices(folder / "services")
    services.redis.up()
    try:
        repo = example_repo(folder, "http_fuzz", {"path": f"sqlite:///{folder}/registry.db"}, services.redis_port)
        store = FeatureStore(config=load_config(repo).feast_repo_config())
        values = {f"asset_{i:06d}": {"views_1h": i, "views_24h": 2 * i} for i in range(3)}
        sibling("serving_env", "serving").feast_rows(store, "asset_activity", values,
                                                     dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1))
        yield repo
    finally:
        services.down()


def operations(document: dict) -> list:
    """(operation, generation mode) pairs of an OpenAPI document: one test each, valid and invalid inputs."""
    schema = schemathesis.openapi.from_dict(document)
    found = [result.ok() for result in schema.get_all_operations()]
    return [pytest.param(op, mode, id=f"{op.method.upper()} {op.path} {mode.value}")
            for op in found for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
            if mode is GenerationMode.POSITIVE or len(op.body)]  # a string path parameter has no invalid value


def fuzz(operation, mode: GenerationMode, url: str, max_examples: int, timeout_s: float) -> None:
    """Hypothesis drives the operation's strategy; every generated request goes to the live server."""
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(FUZZ, max_examples=max_examples)
    def one(case) -> None:
        check(case, case.call(base_url=url, timeout=timeout_s))

    one()


def check(case, response) -> None:
    """No 5xx, not even when a `timeout_s` passes before the mesh is done (that is a 202 naming the job to poll);
    every error a JSON object with a non-empty `error` message and a `code`."""
    described = (f"{case.method} {case.formatted_path} {case.body!r:.300} -> {response.status_code} "
                 f"{response.content[:300]!r}")
    if response.status_code == 202:
        job = json.loads(response.content)
        poll = f"/jobs/{job['job_id']}"
        assert job["poll"] == poll and response.headers["location"] == [poll], described   # header values: lists
    if response.status_code < 400:
        return
    try:
        body = json.loads(response.content)
    except ValueError:
        pytest.fail(f"an error without a JSON body: {described}")
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"].strip() \
        and isinstance(body.get("code"), str), f"an error body that names no problem: {described}"
    case.validate_response(response, checks=[not_a_server_error])


@pytest.fixture(scope="module")
def feature_url(repo):
    with feature_server(repo) as url:
        yield url


@pytest.mark.parametrize("operation, mode", operations(FEATURE_OPENAPI))
def test_feature_server_never_answers_5xx_and_names_every_error(feature_url, operation, mode):
    fuzz(operation, mode, feature_url, max_examples=60, timeout_s=30)


@pytest.fixture(scope="module")
def generation_url(repo):
    with cli_server(repo, "generate-server", "--config", "tiny", "--device", "cpu", "--resolution", "3",
                    "--timeout", "20") as url:
        yield url


@pytest.mark.parametrize("operation, mode", operations(GENERATION_OPENAPI))
def test_generation_server_never_answers_5xx_and_names_every_error(generation_url, operation, mode):
    valid_generate = operation.path == "/generate" and mode is GenerationMode.POSITIVE  # a mesh each, on the CPU
    fuzz(operation, mode, generation_url, max_examples=6 if valid_generate else 25, timeout_s=60)


@pytest.mark.parametrize("path, document", [("feature", FEATURE_OPENAPI), ("generation", GENERATION_OPENAPI)])
def test_servers_publish_the_documents_fuzzed_here(feature_url, generation_url, path, document):
    url = feature_url if path == "feature" else generation_url
    assert http("GET", url + "/openapi.json") == (200, json.loads(json.dumps(document)))
