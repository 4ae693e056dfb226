"""What several suites share outside fixtures: the repo root, the CLI as a subprocess, a scratch copy of the
example repo, a free port, one of the CLI's HTTP servers started and stopped, another folder's helper module,
headless Chromium.

Tests import this module, never `conftest` (two conftest files make `import conftest` ambiguous).
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, NamedTuple, Optional

import yaml

from featurectl.services.scratch_redis import free_port, stop_process

ROOT = Path(__file__).resolve().parent.parent


def sibling(name: str, folder: str) -> ModuleType:
    """A helper module of another test folder (`tests/<folder>/<name>.py`), imported once under its own name."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def featurectl(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the CLI of the interpreter running pytest (the project's venv), from the repo root."""
    return subprocess.run([sys.executable, "-m", "featurectl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def copy_example_repo(folder: Path, project: str, registry: dict, online_store: Optional[dict] = None,
                      data_dir: Optional[Path] = None) -> Path:
    """The example repo's definitions (and Feast's view of them) as `folder/project`, not applied. Its
    feature_store.yaml gets `project`, the `registry` settings merged in, `online_store` instead of its own when
    given, and its `platform` section with `data_dir` (or none at all: the defaults)."""
    repo = folder / project
    repo.mkdir(parents=True)
    for name in ("features.py", "_feast_objects.py", ".feastignore"):
        shutil.copyfile(ROOT / "feature_repo" / name, repo / name)
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["project"] = project
    settings["registry"].update(registry)
    if online_store is not None:
        settings["online_store"] = online_store
    if data_dir is None:
        settings.pop("platform", None)
    else:
        settings["platform"]["data_dir"] = str(data_dir)
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return repo


def register_repo(repo: Path):
    """`featurectl apply` in-process (a subprocess costs seconds of imports): the repo's definitions compiled and
    registered in its Feast registry; returns the Feast `FeatureStore`."""
    from feast import FeatureStore

    from common.config import load_config
    from dsl.compile_flink import SourceSettings
    from dsl.compile_repo import compile_repo

    cfg = load_config(repo)
    store = FeatureStore(config=cfg.feast_repo_config())
    store.apply(compile_repo(cfg.repo_path, SourceSettings(cfg.platform.kafka.bootstrap_servers, cfg.data_dir))
                .feast.all())
    return store


def project_keys(repo: Path):
    """The API keys of a repo's project, in its registry database."""
    from common.config import load_config
    from serving.api_keys import KeyStore

    cfg = load_config(repo)
    return KeyStore(cfg.registry_url, cfg.project)


class CliServer(NamedTuple):
    url: str
    process: subprocess.Popen
    log: Path


@contextlib.contextmanager
def cli_server(repo: Path, command: str, *args: str, port: Optional[int] = None, ready_path: str = "/health",
               ready_s: float = 180, log: Optional[Path] = None, grace_s: float = 20) -> Iterator[CliServer]:
    """`featurectl --repo REPO COMMAND --port PORT ARGS` (one of the CLI's HTTP servers) until the block ends, its
    output in `log` (default: beside the repo); yields once `ready_path` answers 200, then stops it by its pid."""
    port = port or free_port()
    log = log or repo.parent / f"{command}-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "featurectl", "--repo", str(repo), command, "--port",
                                    str(port), *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_s
        while not _answers_ok(url + ready_path):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"featurectl {command} did not start:\n{log.read_text()}")
            time.sleep(0.3)
        yield CliServer(url, process, log)
    finally:
        stop_process(process, grace_s)


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except OSError:  # refused, not up yet, or an HTTP error status
        return False


@contextlib.contextmanager
def generation_app_in_thread(make_service: Callable[[], Any], start_s: float = 60) -> Iterator[str]:
    """The generation HTTP app over `make_service()` (a service or a rollout), served by uvicorn in a thread of
    this process; yields its base URL."""
    import uvicorn

    from inference.service.http_app import GenerationApp, server_config

    port = free_port()
    server = uvicorn.Server(server_config(GenerationApp(make_service), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_s
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the generation HTTP server did not start in {start_s:g} s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def chromium(profile: Path, *args: str) -> str:
    """Headless Chromium (no sandbox: CI runs as root); virtual time stands still while the page fetches, so
    `--virtual-time-budget` lets it load and draw before the DOM or the screenshot is taken; returns its stdout."""
    import pytest

    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium is not installed: scripts/setup.sh apt-installs it")
    done = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                           "--virtual-time-budget=20000", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def answer_in_process(repo: Path, path: str, body: dict) -> tuple[int, dict]:
    """`POST path` answered by the feature server's app in this process, with a client of `repo`."""
    import asyncio
    import json

    from serving.client import AsyncOnlineClient
    from serving.http_app import FeatureServer

    async def answer() -> tuple[int, dict]:
        app = FeatureServer(make_client=lambda: None)
        app.client = AsyncOnlineClient.from_repo(repo, refresh_s=0)
        try:
            status, payload, _, _ = await app.respond("POST", path, json.dumps(body).encode())
        finally:
            await app.client.close()
        return status, json.loads(payload)

    return asyncio.run(answer())
