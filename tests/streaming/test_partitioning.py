"""The tile partition of an entity, as Python places history tiles, equals the Flink job's (udf EntityPartitioner):
the vectors below are what the Java class returns for the same keys."""

from __future__ import annotations

import pytest

from streaming.partitioning import entity_partition, owned_partitions

# (join key values, partition of 2, of 3, of 7): from EntityPartitioner over the JSON keys Flink writes.
VECTORS = [(("asset_000001",), 1, 2, 3), (("user_000042",), 1, 2, 2), (("x\u00e9", 123), 0, 0, 0), ((-7,), 1, 2, 1)]


@pytest.mark.parametrize("key, of2, of3, of7", VECTORS)
def test_entity_partition_matches_the_java_partitioner(key, of2, of3, of7):
    assert [entity_partition(key, n) for n in (2, 3, 7)] == [of2, of3, of7]


def test_writers_own_disjoint_partitions_covering_the_topic():
    owned = [owned_partitions(5, w, 2) for w in range(2)]
    assert owned == [[0, 2, 4], [1, 3]]
    assert owned_partitions(2, 0, 1) == [0, 1]
