package dev.featurectl.udf;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;
import java.util.Map;
import java.util.zip.CRC32;

import org.apache.flink.kafka.shaded.org.apache.kafka.clients.producer.Partitioner;
import org.apache.flink.kafka.shaded.org.apache.kafka.common.Cluster;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;

/**
 * The Kafka producer partitioner of the tile topics: every tile of one entity goes to one partition, so the window
 * writer that owns the partition holds all of the entity's windows. The record key is the tile's primary key as
 * JSON ({@code {"<join key>": ..., ..., "tile_start": ...}}, what upsert-kafka writes and compaction keeps one
 * version of); the partition is CRC-32 of the join key values (text as is, other values as their JSON), joined by
 * U+001F, modulo the topic's partitions. Mirrored by {@code streaming/partitioning.py}, which places the history
 * tiles the same way.
 */
public final class EntityPartitioner implements Partitioner {
    private static final String TILE_START = "tile_start";
    private static final ObjectMapper MAPPER = new ObjectMapper();

    @Override
    public int partition(String topic, Object key, byte[] keyBytes, Object value, byte[] valueBytes,
                         Cluster cluster) {
        int partitions = cluster.partitionCountForTopic(topic);
        if (keyBytes == null) {
            throw new IllegalArgumentException("a tile record without a key in topic " + topic);
        }
        return (int) (crc(entity(keyBytes)) % partitions);
    }

    static String entity(byte[] keyBytes) {
        JsonNode row;
        try {
            row = MAPPER.readTree(keyBytes);
        } catch (IOException e) {
            throw new IllegalArgumentException("a tile key that is not JSON: " + e.getMessage(), e);
        }
        StringBuilder out = new StringBuilder();
        for (Iterator<Map.Entry<String, JsonNode>> it = row.fields(); it.hasNext(); ) {
            Map.Entry<String, JsonNode> field = it.next();
            if (TILE_START.equals(field.getKey())) {
                continue;
            }
            if (out.length() > 0) {
                out.append('\u001f');
            }
            JsonNode node = field.getValue();
            out.append(node.isTextual() ? node.textValue() : node.toString());
        }
        return out.toString();
    }

    static long crc(String text) {
        CRC32 crc = new CRC32();
        crc.update(text.getBytes(StandardCharsets.UTF_8));
        return crc.getValue();
    }

    @Override
    public void configure(Map<String, ?> configs) {
    }

    @Override
    public void close() {
    }
}
