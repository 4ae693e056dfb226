#!/usr/bin/env bash
# Builds the Flink UDF jar (udf/) and installs it where common/flink.py loads Flink jars from.
# A no-op when the installed jar is newer than the pom and every source file.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="${FEATURECTL_JARS:-$HOME/.cache/featurectl/jars}/flink"
dest="$dest_dir/featurectl-udf.jar"

if [[ -f "$dest" ]] && [[ -z "$(find "$root/udf/pom.xml" "$root/udf/src" -newer "$dest" -print -quit)" ]]; then
    exit 0
fi
command -v mvn >/dev/null || { echo "build_udf.sh: mvn not found; install Maven 3.8+ and Java 17" >&2; exit 1; }

mvn -q -f "$root/udf/pom.xml" package -DskipTests
mkdir -p "$dest_dir"
# Copy then rename, so a Flink job starting meanwhile never loads a half-written jar.
cp "$root/udf/target/featurectl-udf.jar" "$dest.tmp.$$"
mv -f "$dest.tmp.$$" "$dest"
echo "installed $dest"
