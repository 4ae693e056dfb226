"""Helpers of the feature logging tests: a repo with logged services over known rows, requests that carry
`X-Request-ID`, the server's log counters and the log files."""

from __future__ import annotations

import datetime as dt
import json
import socket
import urllib.request
from pathlib import Path
from typing import Optional

import httptools
import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import yaml
from cli_helpers import copy_example_repo, register_repo
from serving_env import feast_rows, get

from dsl.types import ValueType
from redis_store.layout import encode_timestamp
from serving.catalog import LogSpec
from serving.result import OnlineFeatures, ViewRows

LOGGED = """
from dsl import FeatureLogging

logged_ranking = FeatureService("logged_ranking", features=[asset_activity[["views_1h", "dwell_ms_mean_1h"]],
                                                            asset_attributes[["category", "polygon_count"]]],
                                logging=FeatureLogging(sample_rate=1.0))
sampled_ranking = FeatureService("sampled_ranking", features=[asset_activity[["views_1h"]]],
                                 logging=FeatureLogging(sample_rate=0.5))
logged_fit = FeatureService("logged_fit", features=[asset_attributes[["category"]], generation_fit],
                            logging=FeatureLogging(sample_rate=1.0))
logged_fit_only = FeatureService("logged_fit_only", features=[generation_fit], logging=FeatureLogging(sample_rate=1.0))
"""


def logged_repo(folder: Path, project: str, redis_port: int, logging: dict) -> tuple[Path, object]:
    """The example repo plus LOGGED, `platform.feature_logging: logging`, logs under `folder/data`, and rows: `a1`
    (views_1h 4, dwell_ms_mean_1h 2.5, category chair, polygon_count 1200), `a2` (views_1h 1) and `old` (activity
    three days old, category lamp), written by Feast five minutes ago. Returns (repo, Feast's store)."""
    repo = copy_example_repo(folder, project, {"path": f"sqlite:///{folder / project}.db"},
                             {"type": "redis", "connection_string": f"127.0.0.1:{redis_port}"},
                             data_dir=folder / "data")
    with (repo / "features.py").open("a") as out:
        out.write(LOGGED)
    settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
    settings["platform"]["feature_logging"] = logging
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    store = register_repo(repo)
    recent = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    feast_rows(store, "asset_activity", {"a1": {"views_1h": 4, "dwell_ms_mean_1h": 2.5}, "a2": {"views_1h": 1}},
               recent)
    feast_rows(store, "asset_activity", {"old": {"views_1h": 9, "dwell_ms_mean_1h": 1.0}},
               recent - dt.timedelta(days=3))
    feast_rows(store, "asset_attributes", {"a1": {"category": "chair", "polygon_count": 1200},
                                           "old": {"category": "lamp"}}, recent)
    return repo, store


def post_features(url: str, body: dict, request_id: Optional[str] = None) -> tuple[int, dict, Optional[str]]:
    """POST /get-online-features: the status, the answer and its `x-request-id`."""
    headers = {"Content-Type": "application/json", **({"X-Request-ID": request_id} if request_id else {})}
    request = urllib.request.Request(url + "/get-online-features", data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status, json.loads(reply.read()), reply.headers.get("x-request-id")


def log_table(repo: Path, service: str) -> pa.Table:
    """Every row logged for `service` (the files of `logged_repo`'s data folder)."""
    path = repo.parent / "data" / "feature_logs" / service
    return ds.dataset(path, format="parquet", partitioning="hive", ignore_prefixes=["."]).to_table()


def log_counts(url: str, service: str) -> dict:
    """The server's feature log counters of `service` (all workers: each shares its own every second)."""
    counts = json.loads(get(url, "/stats")[1])["feature_log"]
    return counts.get(service, dict.fromkeys(("logged", "dropped", "written", "failed", "files", "bytes"), 0))


def pipelined(port: int, bodies: list[bytes], request_ids: Optional[list[str]] = None) -> list[int]:
    """Send every request at once on one connection (each with its `X-Request-ID`, when given); the status of each
    answer."""
    statuses: list[int] = []

    class Answers:
        def on_message_complete(self) -> None:
            statuses.append(parser.get_status_code())

    ids = [b"X-Request-ID: %s\r\n" % i.encode() for i in request_ids] if request_ids else [b""] * len(bodies)
    parser = httptools.HttpResponseParser(Answers())
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"".join(b"POST /get-online-features HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"%sContent-Length: %d\r\n\r\n%s" % (header, len(body), body)
                              for header, body in zip(ids, bodies)))
        while len(statuses) < len(bodies):
            data = sock.recv(1 << 16)
            assert data, "the server closed the connection"
            parser.feed_data(data)
    return statuses


def one_row_answer(value: float) -> bytes:
    """The answer the server sends for one entity row of one float feature."""
    stamp = encode_timestamp(int(dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone.utc).timestamp() * 1000))
    response = OnlineFeatures({"asset_id": ["a1"]}, ["views"], {"views": [value]}, {"views": ValueType.FLOAT64},
                              {"views": ViewRows([stamp], [], [])})
    return orjson.dumps(response.to_feast_response())


def one_feature_spec(path: Path) -> LogSpec:
    """A logged service `svc` of that one feature, its logs under `path`."""
    schema = pa.schema([("asset_id", pa.string()), ("v__views", pa.float64()),
                        ("v__views__timestamp", pa.timestamp("s", "UTC")), ("v__views__status", pa.int32()),
                        ("__log_timestamp", pa.timestamp("us", "UTC")), ("__log_date", pa.date32()),
                        ("__request_id", pa.string())])
    return LogSpec("svc", str(path), 1.0, schema, ("v__views",))
