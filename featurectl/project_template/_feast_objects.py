"""What Feast's own CLI (`feast plan`, `feast apply`, `feast feature-views list`, ...) finds in this folder: the
Feast objects `featurectl apply` registers, compiled from the definitions beside this file. featurectl skips files
whose names start with `_`; `.feastignore` keeps Feast out of the others."""

from pathlib import Path

from common.config import load_config
from dsl.compile_flink import SourceSettings
from dsl.compile_repo import feast_namespace

_config = load_config(Path(__file__).parent)
globals().update(feast_namespace(_config.repo_path, SourceSettings(_config.platform.kafka.bootstrap_servers,
                                                                   _config.data_storage)))
