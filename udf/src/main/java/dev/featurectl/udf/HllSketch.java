package dev.featurectl.udf;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.functions.AggregateFunction;

import java.util.Arrays;

/**
 * {@code HLL_SKETCH(value STRING) -> BYTES}: a mergeable HyperLogLog sketch of the non-NULL values.
 *
 * <p>Values are hashed from Flink's internal UTF-8 bytes, so no Java String is built per event.
 */
public class HllSketch extends AggregateFunction<byte[], HllAccumulator> {
    private static final long serialVersionUID = 1L;

    @Override
    public HllAccumulator createAccumulator() {
        return new HllAccumulator();
    }

    public void accumulate(
            HllAccumulator acc, @DataTypeHint(value = "STRING", bridgedTo = StringData.class) StringData value) {
        if (value != null) {
            acc.sketch = Hll.add(acc.sketch, Murmur3.hash64(value.toBytes()));
        }
    }

    public void merge(HllAccumulator acc, Iterable<HllAccumulator> others) {
        for (HllAccumulator other : others) {
            acc.sketch = Hll.merge(acc.sketch, other.sketch);
        }
    }

    public void resetAccumulator(HllAccumulator acc) {
        acc.sketch = Hll.empty();
    }

    /** A copy: dense sketches are updated in place, and the emitted value must not change afterwards. */
    @Override
    public byte[] getValue(HllAccumulator acc) {
        return Arrays.copyOf(acc.sketch, acc.sketch.length);
    }
}
