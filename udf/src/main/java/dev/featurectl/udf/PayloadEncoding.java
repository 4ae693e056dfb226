package dev.featurectl.udf;

import org.apache.flink.table.functions.ScalarFunction;

/** {@code PAYLOAD_ENCODING(payload BYTES, max_bytes INT) -> STRING}: how {@link PayloadText} wrote it. */
public class PayloadEncoding extends ScalarFunction {
    private static final long serialVersionUID = 1L;

    public String eval(byte[] payload, Integer maxBytes) {
        if (payload == null) {
            return null;
        }
        return PayloadText.utf8Prefix(payload, maxBytes) != null ? "utf-8" : "base64";
    }
}
