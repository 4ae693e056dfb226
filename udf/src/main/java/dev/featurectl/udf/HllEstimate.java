package dev.featurectl.udf;

import org.apache.flink.table.functions.ScalarFunction;

/** {@code HLL_ESTIMATE(sketch BYTES) -> BIGINT}: the distinct count of a sketch; NULL or empty reads as 0. */
public class HllEstimate extends ScalarFunction {
    private static final long serialVersionUID = 1L;

    public long eval(byte[] sketch) {
        return sketch == null ? 0 : Hll.estimate(Hll.checked(sketch));
    }
}
