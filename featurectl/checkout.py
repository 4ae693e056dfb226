"""What lives only in featurectl's source checkout, never in an installed distribution: the example repo with its
data generator (`feature_repo/`) and the benchmarks (`bench/`). They are not installed as top-level packages (a
user's own `bench` would clash with them); the commands that use them (`datagen`, `demo`, `bench`) import them
from the checkout through here."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from common.errors import FeaturectlError

ROOT = Path(__file__).resolve().parents[1]


def checkout_module(name: str) -> ModuleType:
    """Import `name` (e.g. `feature_repo.sample_data`) from the checkout this featurectl runs from."""
    top = name.split(".")[0]
    if not (ROOT / top / "__init__.py").is_file():
        raise FeaturectlError(f"`{top}/` comes with featurectl's source checkout, not with an installed featurectl: "
                              "run this command from a clone of the repository")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(name)
