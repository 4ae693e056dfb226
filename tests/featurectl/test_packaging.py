"""The distribution as a user installs it: our packages, typed (`py.typed`), and neither the example repo nor the
benchmarks as top-level packages of site-packages; mypy sees the SDK's and the DSL's types from it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cli_helpers import ROOT
from featurectl.init_commands import TEMPLATE_FILES

PACKAGES = {"common", "dsl", "redis_store", "streaming", "batch", "serving", "inference", "featurectl"}
USER_SCRIPT = '''\
from dsl import Aggregation, Entity, EventSource, FeatureView, Int64, String, Timestamp
from serving import OnlineClient

asset = Entity("asset", join_keys={"asset_id": String})
source = EventSource(name="e", schema={"asset_id": String, "n": Int64, "t": Timestamp}, timestamp_field="t",
                     path="e")
view = FeatureView(name="v", entity=asset, source=source, features=[Aggregation("sum", "n", windows=["1h"])])
names: list[str] = view.feature_names
client = OnlineClient.from_repo("feature_repo")
columns: dict[str, list] = client.get_features(["v:n_sum_1h"], {"asset_id": ["a"]})
table = client.get_features(["v:n_sum_1h"], {"asset_id": ["a"]}, output="arrow")
wrong: int = client.get_features(["v:n_sum_1h"], {"asset_id": ["a"]})
sent: int = client.push("e", [{"asset_id": "a", "n": 1, "t": 1767225600000}], to="online_and_offline").events_sent
'''
MYPY_INI = """\
[mypy]
follow_imports = silent
[mypy-feast.*,pyarrow.*,pandas.*,numpy.*,torch.*,sqlalchemy.*,google.*,redis.*,hiredis.*,mmh3.*,yaml.*]
follow_imports = skip
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--wheel-dir", str(out), str(ROOT)], capture_output=True, text=True, cwd=out)
    assert done.returncode == 0, done.stdout + done.stderr
    return next(out.glob("featurectl-*.whl"))


def test_the_wheel_holds_our_typed_packages_and_nothing_else(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == PACKAGES, top
    assert {name.split("/")[0] for name in names if name.endswith("/py.typed")} == PACKAGES
    template = {f"featurectl/project_template/{n}" for n in TEMPLATE_FILES}
    assert template <= set(names), "`featurectl init` copies these"


def test_mypy_sees_the_sdk_and_dsl_types_from_the_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    (tmp_path / "user.py").write_text(USER_SCRIPT)
    (tmp_path / "mypy.ini").write_text(MYPY_INI)
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-incremental",
                           "user.py"], capture_output=True, text=True, cwd=tmp_path,
                          env={"MYPYPATH": str(site), "PATH": "/usr/bin:/bin"})
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "user.py:12:" in errors[0], done.stdout + done.stderr
    assert 'expression has type "dict[str, list[Any]]", variable has type "int"' in errors[0]
