package dev.featurectl.udf;

import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.catalog.DataTypeFactory;
import org.apache.flink.table.functions.AggregateFunction;
import org.apache.flink.table.types.DataType;
import org.apache.flink.table.types.inference.InputTypeStrategies;
import org.apache.flink.table.types.inference.InputTypeStrategy;
import org.apache.flink.table.types.inference.TypeInference;
import org.apache.flink.table.types.inference.TypeStrategies;
import org.apache.flink.table.types.logical.ArrayType;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.LogicalTypeRoot;
import org.apache.flink.types.Row;

import java.util.EnumSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;

/**
 * {@code LAST_BY(value T, ts TIMESTAMP | TIMESTAMP_LTZ) -> T}: the value at the greatest event time.
 *
 * <p>Ties on the timestamp keep the greater value, so the result is the maximum of (ts, value) pairs and never
 * depends on arrival order: streaming, batch and two-phase aggregation agree. NULL values and NULL times are
 * skipped. T is CHAR/VARCHAR, BOOLEAN, INT, BIGINT, FLOAT, DOUBLE or ARRAY&lt;FLOAT&gt; (a vector feature); strings
 * compare by code point (as Python and Flink's own MAX do), floating point as {@link Double#compare} (NaN
 * greatest), arrays element by element (a NULL element first), then the shorter first (as Python's lists).
 */
public class LastBy extends AggregateFunction<Object, Row> {
    private static final long serialVersionUID = 1L;
    private static final int VALUE = 0;
    private static final int TS = 1;
    private static final Set<LogicalTypeRoot> VALUE_ROOTS = EnumSet.of(LogicalTypeRoot.CHAR, LogicalTypeRoot.VARCHAR,
            LogicalTypeRoot.BOOLEAN, LogicalTypeRoot.INTEGER, LogicalTypeRoot.BIGINT, LogicalTypeRoot.FLOAT,
            LogicalTypeRoot.DOUBLE);
    private static final Set<LogicalTypeRoot> ELEMENT_ROOTS = EnumSet.of(LogicalTypeRoot.FLOAT);
    /** No implicit casts for the value (DECIMAL would silently become FLOAT): the caller casts explicitly. */
    private static final InputTypeStrategy INPUT = InputTypeStrategies.sequence(
            InputTypeStrategies.constraint(
                    "LAST_BY takes a STRING, BOOLEAN, INT, BIGINT, FLOAT, DOUBLE or ARRAY<FLOAT> value; CAST other "
                            + "types first",
                    args -> isValueType(args.get(VALUE).getLogicalType())),
            InputTypeStrategies.or(
                    InputTypeStrategies.logical(LogicalTypeRoot.TIMESTAMP_WITHOUT_TIME_ZONE),
                    InputTypeStrategies.logical(LogicalTypeRoot.TIMESTAMP_WITH_LOCAL_TIME_ZONE)));

    private static boolean isValueType(LogicalType type) {
        if (type.getTypeRoot() == LogicalTypeRoot.ARRAY) {
            return ELEMENT_ROOTS.contains(((ArrayType) type).getElementType().getTypeRoot());
        }
        return VALUE_ROOTS.contains(type.getTypeRoot());
    }

    /** Output = the value's type; state = ROW(value, ts) in the arguments' own types, so no precision is lost. */
    @Override
    public TypeInference getTypeInference(DataTypeFactory typeFactory) {
        return TypeInference.newBuilder()
                .inputTypeStrategy(INPUT)
                .accumulatorTypeStrategy(call -> {
                    List<DataType> args = call.getArgumentDataTypes();
                    return Optional.of(DataTypes.ROW(
                            DataTypes.FIELD("value", args.get(VALUE).nullable()),
                            DataTypes.FIELD("ts", args.get(TS).nullable())));
                })
                .outputTypeStrategy(TypeStrategies.forceNullable(TypeStrategies.argument(VALUE)))
                .build();
    }

    @Override
    public Row createAccumulator() {
        return new Row(2);
    }

    public void accumulate(Row acc, Object value, Object ts) {
        if (value != null && ts != null) {
            offer(acc, value, ts);
        }
    }

    public void merge(Row acc, Iterable<Row> others) {
        for (Row other : others) {
            if (other.getField(TS) != null) {
                offer(acc, other.getField(VALUE), other.getField(TS));
            }
        }
    }

    public void resetAccumulator(Row acc) {
        acc.setField(VALUE, null);
        acc.setField(TS, null);
    }

    @Override
    public Object getValue(Row acc) {
        return acc.getField(VALUE);
    }

    /** Keeps (value, ts) when it is greater than the current pair: by ts, then by value. */
    private static void offer(Row acc, Object value, Object ts) {
        Object bestTs = acc.getField(TS);
        int byTime = bestTs == null ? 1 : compare(ts, bestTs);
        if (byTime > 0 || byTime == 0 && compare(value, acc.getField(VALUE)) > 0) {
            acc.setField(VALUE, value);
            acc.setField(TS, ts);
        }
    }

    @SuppressWarnings("unchecked")
    private static int compare(Object a, Object b) {
        if (a instanceof String left) {
            return compareCodePoints(left, (String) b);
        }
        if (a instanceof Object[] left) {
            return compareArrays(left, (Object[]) b);
        }
        return ((Comparable<Object>) a).compareTo(b);
    }

    /** Element by element, a NULL element before any value; equal prefixes: the shorter array first. */
    private static int compareArrays(Object[] a, Object[] b) {
        for (int i = 0; i < Math.min(a.length, b.length); i++) {
            int byElement = a[i] == null || b[i] == null
                    ? Boolean.compare(a[i] != null, b[i] != null) : compare(a[i], b[i]);
            if (byElement != 0) {
                return byElement;
            }
        }
        return Integer.compare(a.length, b.length);
    }

    /** String.compareTo orders UTF-16 units, which differs from code point order above U+FFFF. */
    private static int compareCodePoints(String a, String b) {
        int i = 0;
        int j = 0;
        while (i < a.length() && j < b.length()) {
            int ca = a.codePointAt(i);
            int cb = b.codePointAt(j);
            if (ca != cb) {
                return Integer.compare(ca, cb);
            }
            i += Character.charCount(ca);
            j += Character.charCount(cb);
        }
        return Integer.compare(a.length() - i, b.length() - j);
    }
}
