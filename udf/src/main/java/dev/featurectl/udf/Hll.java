package dev.featurectl.udf;

/**
 * HyperLogLog (p = 14) operating directly on its wire format, so that a tile which saw a few values costs a
 * few bytes of Flink state rather than 16 KiB.
 *
 * <p>The format and the estimator are specified in dsl/sketch.py; the two sides must stay byte-identical.
 * Sketches are canonical: sparse exactly while {@code count * 3 < M}, entries sorted by register index.
 */
final class Hll {
    static final int P = 14;
    static final int M = 1 << P;
    static final int MAX_RANK = 64 - P + 1;
    private static final byte VERSION = 1;
    private static final byte SPARSE = 0;
    private static final byte DENSE = 1;
    private static final int HEADER = 3; // version, p, encoding
    private static final int SPARSE_HEADER = HEADER + 2; // then a u16 entry count
    private static final int ENTRY = 3; // u16 index, u8 rank
    private static final double ALPHA = 0.7213 / (1 + 1.079 / M);

    private Hll() {}

    static byte[] empty() {
        return new byte[] {VERSION, P, SPARSE, 0, 0};
    }

    /** Adds one hashed value; returns the sketch, which is a new array when a sparse sketch grew. */
    static byte[] add(byte[] sketch, long hash) {
        int index = (int) (hash >>> (64 - P));
        int rank = Math.min(Long.numberOfLeadingZeros(hash << P) + 1, MAX_RANK);
        if (sketch[2] == DENSE) {
            sketch[HEADER + index] = (byte) Math.max(sketch[HEADER + index], rank);
            return sketch;
        }
        int count = count(sketch);
        int pos = find(sketch, count, index);
        if (pos >= 0) {
            int at = SPARSE_HEADER + pos * ENTRY + 2;
            sketch[at] = (byte) Math.max(sketch[at], rank);
            return sketch;
        }
        if ((count + 1) * 3 >= M) {
            byte[] dense = toDense(sketch);
            dense[HEADER + index] = (byte) rank;
            return dense;
        }
        int split = SPARSE_HEADER + (-pos - 1) * ENTRY;
        byte[] grown = new byte[sketch.length + ENTRY];
        System.arraycopy(sketch, 0, grown, 0, split);
        System.arraycopy(sketch, split, grown, split + ENTRY, sketch.length - split);
        writeEntry(grown, split, index, rank);
        writeCount(grown, count + 1);
        return grown;
    }

    /** The union of two checked sketches; may reuse {@code into}'s array, never changes {@code other}. */
    static byte[] merge(byte[] into, byte[] other) {
        if (into[2] == SPARSE && other[2] == SPARSE) {
            return mergeSparse(into, other);
        }
        byte[] dense = into[2] == DENSE ? into : toDense(into);
        if (other[2] == DENSE) {
            for (int i = HEADER; i < dense.length; i++) {
                dense[i] = (byte) Math.max(dense[i], other[i]);
            }
        } else {
            for (int e = SPARSE_HEADER; e < other.length; e += ENTRY) {
                int at = HEADER + index(other, e);
                dense[at] = (byte) Math.max(dense[at], other[e + 2]);
            }
        }
        return dense;
    }

    /** The estimated number of distinct values: raw HLL with the linear-counting small-range correction. */
    static long estimate(byte[] sketch) {
        int[] histogram = new int[MAX_RANK + 1];
        if (sketch[2] == DENSE) {
            for (int i = HEADER; i < sketch.length; i++) {
                histogram[sketch[i]]++;
            }
        } else {
            histogram[0] = M - count(sketch);
            for (int e = SPARSE_HEADER; e < sketch.length; e += ENTRY) {
                histogram[sketch[e + 2]]++;
            }
        }
        double sum = 0; // summed from the highest rank down, in the same order as dsl/sketch.py
        for (int rank = MAX_RANK; rank >= 0; rank--) {
            sum += Math.scalb((double) histogram[rank], -rank);
        }
        double raw = ALPHA * M * M / sum;
        int zeros = histogram[0];
        double estimate = raw <= 2.5 * M && zeros > 0 ? M * StrictMath.log((double) M / zeros) : raw;
        return (long) Math.floor(estimate + 0.5);
    }

    /** A sketch from SQL input, validated; a zero-length value reads as the empty sketch. */
    static byte[] checked(byte[] sketch) {
        if (sketch.length == 0) {
            return empty();
        }
        if (sketch.length < HEADER || sketch[0] != VERSION || sketch[1] != P) {
            throw new IllegalArgumentException(
                    "not a featurectl HLL sketch (version 1, p 14): build it with HLL_SKETCH or dsl.sketch");
        }
        boolean sized = sketch[2] == DENSE
                ? sketch.length == HEADER + M
                : sketch[2] == SPARSE && sketch.length >= SPARSE_HEADER
                        && sketch.length == SPARSE_HEADER + count(sketch) * ENTRY;
        if (!sized) {
            throw new IllegalArgumentException("corrupt HLL sketch: encoding " + sketch[2] + " with "
                    + sketch.length + " bytes; rebuild it with HLL_SKETCH or dsl.sketch");
        }
        return sketch;
    }

    private static byte[] mergeSparse(byte[] a, byte[] b) {
        int[] indexes = new int[count(a) + count(b)];
        int[] ranks = new int[indexes.length];
        int n = 0;
        int i = SPARSE_HEADER;
        int j = SPARSE_HEADER;
        while (i < a.length || j < b.length) {
            int ia = i < a.length ? index(a, i) : Integer.MAX_VALUE;
            int ib = j < b.length ? index(b, j) : Integer.MAX_VALUE;
            indexes[n] = Math.min(ia, ib);
            ranks[n++] = Math.max(ia <= ib ? a[i + 2] : 0, ib <= ia ? b[j + 2] : 0);
            i += ia <= ib ? ENTRY : 0;
            j += ib <= ia ? ENTRY : 0;
        }
        if (n * 3 >= M) {
            byte[] dense = toDense(empty());
            for (int k = 0; k < n; k++) {
                dense[HEADER + indexes[k]] = (byte) ranks[k];
            }
            return dense;
        }
        byte[] out = new byte[SPARSE_HEADER + n * ENTRY];
        out[0] = VERSION;
        out[1] = P;
        out[2] = SPARSE;
        writeCount(out, n);
        for (int k = 0; k < n; k++) {
            writeEntry(out, SPARSE_HEADER + k * ENTRY, indexes[k], ranks[k]);
        }
        return out;
    }

    private static byte[] toDense(byte[] sparse) {
        byte[] dense = new byte[HEADER + M];
        dense[0] = VERSION;
        dense[1] = P;
        dense[2] = DENSE;
        for (int e = SPARSE_HEADER; e < sparse.length; e += ENTRY) {
            dense[HEADER + index(sparse, e)] = sparse[e + 2];
        }
        return dense;
    }

    /** Entry position of {@code index}, or {@code -(insertion point) - 1} as in Arrays.binarySearch. */
    private static int find(byte[] sparse, int count, int index) {
        int low = 0;
        int high = count - 1;
        while (low <= high) {
            int mid = (low + high) >>> 1;
            int found = index(sparse, SPARSE_HEADER + mid * ENTRY);
            if (found < index) {
                low = mid + 1;
            } else if (found > index) {
                high = mid - 1;
            } else {
                return mid;
            }
        }
        return -low - 1;
    }

    private static int count(byte[] sparse) {
        return u16(sparse, HEADER);
    }

    private static int index(byte[] sparse, int entry) {
        return u16(sparse, entry);
    }

    private static int u16(byte[] data, int at) {
        return (data[at] & 0xff) | (data[at + 1] & 0xff) << 8;
    }

    private static void writeCount(byte[] sparse, int count) {
        sparse[HEADER] = (byte) count;
        sparse[HEADER + 1] = (byte) (count >>> 8);
    }

    private static void writeEntry(byte[] sparse, int entry, int index, int rank) {
        sparse[entry] = (byte) index;
        sparse[entry + 1] = (byte) (index >>> 8);
        sparse[entry + 2] = (byte) rank;
    }
}
