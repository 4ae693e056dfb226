package dev.featurectl.udf;

/** Flink state of HLL_SKETCH and HLL_MERGE: one sketch in wire format (small while sparse). */
public class HllAccumulator {
    public byte[] sketch = Hll.empty();
}
