"""Which tile-topic partition holds an entity, and which window writer owns a partition.

Every tile of an entity goes to one partition, so one writer holds all of its windows. The Flink job places
tile records with the Kafka producer partitioner `dev.featurectl.udf.EntityPartitioner` (udf/); this module is
its mirror, used to place the history tiles (which never pass through Kafka) with the writer that owns their
entity. Format: CRC-32 of the join key values in key order (a str as is, an int as its decimal digits) joined by
U+001F, modulo the topic's partitions. Writer `i` of `n` owns the partitions `p` with `p % n == i`.
"""

from __future__ import annotations

import json
import zipfile
import zlib

from common.flink import FlinkSetupError, flink_jars

PARTITIONER_CLASS = "dev.featurectl.udf.EntityPartitioner"
UDF_JAR = "featurectl-udf.jar"


def entity_partition(key: tuple, partitions: int) -> int:
    """The tile-topic partition of the entity `key` (its join key values, in the view's key order)."""
    text = "\x1f".join(v if isinstance(v, str) else json.dumps(v) for v in key)
    return zlib.crc32(text.encode()) % partitions


def owned_partitions(partitions: int, writer: int, writers: int) -> list[int]:
    """The partitions of a `partitions`-partition topic that writer `writer` of `writers` reads."""
    return [p for p in range(partitions) if p % writers == writer]


def require_partitioner() -> None:
    """Refuse to start a job whose UDF jar predates the partitioner: its tile sink would fail on the first tile."""
    entry = PARTITIONER_CLASS.replace(".", "/") + ".class"
    for jar in flink_jars():
        if jar.name == UDF_JAR:
            with zipfile.ZipFile(jar) as archive:
                if entry in archive.namelist():
                    return
            raise FlinkSetupError(f"{jar} has no {PARTITIONER_CLASS} (the tile topics' partitioner): it was built "
                                  "from older sources; run scripts/build_udf.sh")
    raise FlinkSetupError(f"no {UDF_JAR} among the Flink jars: run scripts/setup.sh")
