"""What Feast's own CLI (`feast plan`, `feast apply`, `feast feature-views list`, ...) finds in this folder: the
Feast objects `featurectl apply` registers, compiled from the definitions beside this file. featurectl skips files
whose names start with `_`; `.feastignore` keeps Feast out of the others."""

from pathlib import Path

from common.config import load_config
from dsl.compile_repo import feast_namespace

globals().update(feast_namespace(Path(__file__).parent, load_config(Path(__file__).parent).data_dir))
