#!/usr/bin/env bash
# The project's test command: install what is missing (scripts/setup.sh, fast when nothing changed), start the
# local services, run pytest (arguments passed through), and stop the services again however pytest ends.
# Exits with pytest's code.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
# shellcheck disable=SC1091
source .venv/bin/activate

trap 'featurectl services down || echo "test.sh: featurectl services down failed" >&2' EXIT
featurectl services up --postgres

code=0
python -m pytest -q "$@" || code=$?
exit "$code"
