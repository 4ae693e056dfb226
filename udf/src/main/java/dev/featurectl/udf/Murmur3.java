package dev.featurectl.udf;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/**
 * MurmurHash3 x64_128 with seed 0, returning the first 64-bit half (h1).
 *
 * <p>Equals Python's {@code mmh3.hash64(data, seed=0, signed=False)[0]} read as an unsigned long, which is
 * what lets dsl/sketch.py build byte-identical HyperLogLog sketches.
 */
public final class Murmur3 {
    private static final long C1 = 0x87c37b91114253d5L;
    private static final long C2 = 0x4cf5ad432745937fL;
    private static final VarHandle LONG_LE =
            MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    private Murmur3() {}

    /** The h1 half of x64_128(data, seed 0). */
    public static long hash64(byte[] data) {
        int length = data.length;
        int blocks = length >>> 4;
        long h1 = 0;
        long h2 = 0;
        for (int i = 0; i < blocks; i++) {
            h1 ^= mixK1((long) LONG_LE.get(data, i << 4));
            h1 = Long.rotateLeft(h1, 27) + h2;
            h1 = h1 * 5 + 0x52dce729;
            h2 ^= mixK2((long) LONG_LE.get(data, (i << 4) + 8));
            h2 = Long.rotateLeft(h2, 31) + h1;
            h2 = h2 * 5 + 0x38495ab5;
        }
        int tail = blocks << 4;
        int rest = length & 15;
        if (rest > 8) {
            h2 ^= mixK2(littleEndian(data, tail + 8, rest - 8));
        }
        if (rest > 0) {
            h1 ^= mixK1(littleEndian(data, tail, Math.min(rest, 8)));
        }
        h1 ^= length;
        h2 ^= length;
        h1 += h2;
        h2 += h1;
        h1 = fmix(h1);
        h2 = fmix(h2);
        return h1 + h2;
    }

    /** Up to 8 tail bytes as a little-endian long, the way the reference switch fall-through builds k1/k2. */
    private static long littleEndian(byte[] data, int offset, int count) {
        long k = 0;
        for (int i = count - 1; i >= 0; i--) {
            k = (k << 8) | (data[offset + i] & 0xffL);
        }
        return k;
    }

    private static long mixK1(long k1) {
        return Long.rotateLeft(k1 * C1, 31) * C2;
    }

    private static long mixK2(long k2) {
        return Long.rotateLeft(k2 * C2, 33) * C1;
    }

    private static long fmix(long k) {
        k ^= k >>> 33;
        k *= 0xff51afd7ed558ccdL;
        k ^= k >>> 33;
        k *= 0xc4ceb9fe1a85ec53L;
        return k ^ (k >>> 33);
    }
}
