#!/usr/bin/env bash
# One-time (and re-runnable) install for a newcomer or CI: system packages, the Python venv, the Maven jars that
# the local Kafka broker and Flink jobs need, and our UDF jar. Every step is skipped when its result is already
# there, so a re-run with nothing changed takes seconds.
set -Eeuo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jars_root="${FEATURECTL_JARS:-$HOME/.cache/featurectl/jars}"
venv="$root/.venv"
step="starting"

say() { echo "setup: $*"; }
die() { echo "setup: FAILED: $*" >&2; exit 1; }
trap 'echo "setup: FAILED while $step (see the output above)" >&2' ERR

# --- system packages -----------------------------------------------------------------------------------------
step="checking system packages"
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || command -v pg_ctl >/dev/null || missing+=(postgresql)
command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)  # javac: build_udf.sh compiles
command -v mvn >/dev/null || missing+=(maven)
command -v python3 >/dev/null || missing+=(python3)
command -v chromium >/dev/null || missing+=(chromium)  # headless: the Feast UI test and scripts/ui_screenshot.sh
if command -v python3 >/dev/null && ! python3 -c "import ensurepip, venv" 2>/dev/null; then
    missing+=(python3-venv)
fi
if ((${#missing[@]})); then
    step="installing ${missing[*]} with apt-get"
    [[ $(id -u) == 0 ]] || die "missing ${missing[*]}: run this script as root, or install them with apt-get"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get here: install them by hand"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    say "system packages present (redis-server, postgresql, JDK, maven, python3, chromium)"
fi

# --- Python venv ---------------------------------------------------------------------------------------------
step="creating the venv in $venv"
python3 -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] < (3, 12)))' \
    || die "python3 is $(python3 --version 2>&1); this project needs Python 3.10 or 3.11"
if [[ ! -x "$venv/bin/python" ]]; then
    say "creating $venv"
    python3 -m venv "$venv"
fi

step="installing the project into the venv (pip install -e '.[test]')"
stamp="$venv/.featurectl-install.sha256"
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/featurectl" ]]; then
    say "python packages up to date"
else
    say "pip install -e '.[test]' (the first run downloads torch and flink: minutes)"
    "$venv/bin/python" -m pip install -q --upgrade pip
    (cd "$root" && "$venv/bin/python" -m pip install -q -e '.[test]') \
        || die "pip install -e '.[test]' failed: see pip's message above"
    echo "$want" > "$stamp"
fi

# --- Maven jars ----------------------------------------------------------------------------------------------
# Each jar folder keeps a manifest: the pom's hash, then the jar names it copied. A changed pom replaces exactly
# those jars, so jars put there by others (our UDF jar in flink/) survive.
fetch_jars() {
    local kind="$1" pom="$root/scripts/jars/$1/pom.xml" dest="$jars_root/$1"
    local manifest="$dest/.maven-jars" hash tmp
    step="fetching the $kind jars into $dest (mvn dependency:copy-dependencies)"
    hash="$(sha256sum "$pom" | cut -d' ' -f1)"
    if [[ -f "$manifest" && "$(head -n1 "$manifest")" == "$hash" ]] \
        && tail -n +2 "$manifest" | (cd "$dest" && xargs -r ls >/dev/null 2>&1); then
        say "$kind jars present in $dest"
        return
    fi
    say "fetching $kind jars into $dest"
    tmp="$(mktemp -d)"
    # Maven's output only matters when it fails (and -q still prints stray colour codes), so keep it aside.
    if ! mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
        > "$tmp/mvn.log" 2>&1; then
        cat "$tmp/mvn.log" >&2
        rm -rf "$tmp"
        die "Maven could not fetch the $kind jars of $pom: see its message above"
    fi
    mkdir -p "$dest"
    if [[ -f "$manifest" ]]; then
        tail -n +2 "$manifest" | (cd "$dest" && xargs -r rm -f)
    fi
    cp "$tmp"/*.jar "$dest/"
    { echo "$hash"; (cd "$tmp" && ls -1 -- *.jar); } > "$manifest"
    rm -rf "$tmp"
}
fetch_jars kafka
fetch_jars flink
fetch_jars flink-fs
fetch_jars s3proxy
fetch_jars hdfs

# --- our UDF jar ---------------------------------------------------------------------------------------------
if [[ -x "$root/scripts/build_udf.sh" ]]; then
    step="building the UDF jar (scripts/build_udf.sh)"
    say "UDF jar (scripts/build_udf.sh)"
    "$root/scripts/build_udf.sh" || die "scripts/build_udf.sh failed: see its message above"
fi

trap - ERR
say "done: activate with 'source .venv/bin/activate', then 'featurectl services up'"
