package dev.featurectl.udf;

import org.apache.flink.table.functions.AggregateFunction;

import java.util.Arrays;

/** {@code HLL_MERGE(sketch BYTES) -> BYTES}: the union of sketches, e.g. tiles combined into a window. */
public class HllMerge extends AggregateFunction<byte[], HllAccumulator> {
    private static final long serialVersionUID = 1L;

    @Override
    public HllAccumulator createAccumulator() {
        return new HllAccumulator();
    }

    public void accumulate(HllAccumulator acc, byte[] sketch) {
        if (sketch != null) {
            acc.sketch = Hll.merge(acc.sketch, Hll.checked(sketch));
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
