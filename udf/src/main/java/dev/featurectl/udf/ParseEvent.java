package dev.featurectl.udf;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonFactory;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonParser;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.core.JsonToken;
import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.catalog.DataTypeFactory;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.functions.TableFunction;
import org.apache.flink.table.types.DataType;
import org.apache.flink.table.types.inference.InputTypeStrategies;
import org.apache.flink.table.types.inference.TypeInference;
import org.apache.flink.table.types.logical.LogicalTypeFamily;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;

/**
 * {@code PARSE_EVENT(payload BYTES, spec STRING literal) -> ROW(columns..., __error STRING)}: one Kafka payload
 * read strictly against a source schema, one output row per payload.
 *
 * <p>The spec is {@code {"columns": [[name, type], ...], "required": [name, ...]}} with type one of STRING, INT,
 * BIGINT, FLOAT, DOUBLE, BOOLEAN. A value counts only when its JSON type is exactly the column's: a JSON string for
 * STRING; an integer (no fraction, no exponent) in range for INT and BIGINT; any finite number for FLOAT and DOUBLE
 * (an integer included); true or false for BOOLEAN. {@code __error} is the first problem, else NULL:
 * {@code malformed_json} (not one UTF-8 JSON object and nothing after it), then {@code missing_field:<c>} for a
 * required column that is absent or null (in the order given), then {@code wrong_type:<c>} (in column order).
 * JSON null reads as absent; fields outside the schema are ignored; of repeated fields the last counts.
 */
public class ParseEvent extends TableFunction<RowData> {
    private static final long serialVersionUID = 1L;
    private static final JsonFactory JSON = new JsonFactory();
    private static final StringData MALFORMED = StringData.fromString("malformed_json");

    private transient String specText;
    private transient Spec spec;

    /** The schema of one source: column names and kinds, where each required column is, and the error texts. */
    static final class Spec {
        final String[] names;
        final Kind[] kinds;
        final int[] required;
        final Map<String, Integer> index = new HashMap<>();
        final StringData[] missing;
        final StringData[] wrongType;

        Spec(String[] names, Kind[] kinds, int[] required) {
            this.names = names;
            this.kinds = kinds;
            this.required = required;
            this.missing = new StringData[names.length];
            this.wrongType = new StringData[names.length];
            for (int i = 0; i < names.length; i++) {
                index.put(names[i], i);
                missing[i] = StringData.fromString("missing_field:" + names[i]);
                wrongType[i] = StringData.fromString("wrong_type:" + names[i]);
            }
        }

        static Spec parse(String text) {
            try (JsonParser p = JSON.createParser(text)) {
                List<String> names = new ArrayList<>();
                List<Kind> kinds = new ArrayList<>();
                List<String> required = new ArrayList<>();
                expect(p.nextToken() == JsonToken.START_OBJECT, text);
                while (p.nextToken() == JsonToken.FIELD_NAME) {
                    String field = p.currentName();
                    expect(p.nextToken() == JsonToken.START_ARRAY, text);
                    while (p.nextToken() != JsonToken.END_ARRAY) {
                        if (field.equals("columns")) {
                            expect(p.currentToken() == JsonToken.START_ARRAY, text);
                            p.nextToken();
                            names.add(p.getText());
                            p.nextToken();
                            kinds.add(Kind.of(p.getText()));
                            expect(p.nextToken() == JsonToken.END_ARRAY, text);
                        } else if (field.equals("required")) {
                            required.add(p.getText());
                        } else {
                            throw new ValidationException("PARSE_EVENT spec has an unknown field `" + field + "`");
                        }
                    }
                }
                Spec spec = new Spec(names.toArray(new String[0]), kinds.toArray(new Kind[0]),
                        new int[required.size()]);
                for (int i = 0; i < required.size(); i++) {
                    Integer at = spec.index.get(required.get(i));
                    if (at == null) {
                        throw new ValidationException("PARSE_EVENT spec requires `" + required.get(i)
                                + "`, which is not among its columns");
                    }
                    spec.required[i] = at;
                }
                return spec;
            } catch (IOException e) {
                throw new ValidationException("PARSE_EVENT spec is not valid JSON: " + text, e);
            }
        }

        private static void expect(boolean ok, String text) {
            if (!ok) {
                throw new ValidationException("PARSE_EVENT spec must be {\"columns\": [[name, type], ...], "
                        + "\"required\": [name, ...]}, got " + text);
            }
        }

        DataType rowType() {
            List<DataTypes.Field> fields = new ArrayList<>();
            for (int i = 0; i < names.length; i++) {
                fields.add(DataTypes.FIELD(names[i], kinds[i].type));
            }
            fields.add(DataTypes.FIELD("__error", DataTypes.STRING()));
            return DataTypes.ROW(fields).bridgedTo(RowData.class);
        }
    }

    /** The column kinds a source may declare, with their SQL type. */
    enum Kind {
        STRING(DataTypes.STRING()), INT(DataTypes.INT()), BIGINT(DataTypes.BIGINT()), FLOAT(DataTypes.FLOAT()),
        DOUBLE(DataTypes.DOUBLE()), BOOLEAN(DataTypes.BOOLEAN());

        final DataType type;

        Kind(DataType type) {
            this.type = type;
        }

        static Kind of(String name) {
            try {
                return Kind.valueOf(name);
            } catch (IllegalArgumentException e) {
                throw new ValidationException("PARSE_EVENT spec: unknown column type `" + name
                        + "`; use STRING, INT, BIGINT, FLOAT, DOUBLE or BOOLEAN", e);
            }
        }
    }

    /** Thrown for a value of the wrong JSON type; carries no stack trace (it is a verdict, not a fault). */
    private static final class WrongType extends Exception {
        private static final long serialVersionUID = 1L;
        static final WrongType INSTANCE = new WrongType();

        private WrongType() {
            super(null, null, false, false);
        }
    }

    @Override
    public TypeInference getTypeInference(DataTypeFactory typeFactory) {
        return TypeInference.newBuilder()
                .inputTypeStrategy(InputTypeStrategies.sequence(
                        InputTypeStrategies.logical(LogicalTypeFamily.BINARY_STRING),
                        InputTypeStrategies.and(InputTypeStrategies.LITERAL,
                                InputTypeStrategies.logical(LogicalTypeFamily.CHARACTER_STRING))))
                .outputTypeStrategy(call -> {
                    String text = call.getArgumentValue(1, String.class).orElseThrow(
                            () -> new ValidationException("PARSE_EVENT needs its spec as a string literal"));
                    return Optional.of(Spec.parse(text).rowType());
                })
                .build();
    }

    public void eval(byte[] payload, String specArg) {
        if (spec == null || !specArg.equals(specText)) {
            spec = Spec.parse(specArg);
            specText = specArg;
        }
        int n = spec.names.length;
        GenericRowData row = new GenericRowData(n + 1);
        boolean[] wrong = new boolean[n];
        if (!readObject(payload, row, wrong)) {
            for (int i = 0; i < n; i++) {
                row.setField(i, null);
            }
            row.setField(n, MALFORMED);
        } else {
            row.setField(n, firstProblem(row, wrong));
        }
        collect(row);
    }

    private StringData firstProblem(GenericRowData row, boolean[] wrong) {
        for (int i : spec.required) {
            if (row.getField(i) == null && !wrong[i]) {
                return spec.missing[i];
            }
        }
        for (int i = 0; i < wrong.length; i++) {
            if (wrong[i]) {
                return spec.wrongType[i];
            }
        }
        return null;
    }

    /**
     * Fills the schema's columns from one JSON object; false when the payload is not exactly one UTF-8 JSON object.
     * Bytes that Jackson would decode as UTF-16 or UTF-32 (a NUL byte, a UTF-16 byte order mark) are refused
     * first: JSON text carries no raw NUL, and events are UTF-8.
     */
    private boolean readObject(byte[] payload, GenericRowData row, boolean[] wrong) {
        if (payload == null || payload.length < 2 || !plausiblyUtf8(payload)) {
            return false;
        }
        try (JsonParser p = JSON.createParser(payload)) {
            if (p.nextToken() != JsonToken.START_OBJECT) {
                return false;
            }
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                Integer at = spec.index.get(p.currentName());
                JsonToken token = p.nextToken();
                if (at == null) {
                    p.skipChildren();
                    continue;
                }
                try {
                    row.setField(at, value(p, token, spec.kinds[at]));
                    wrong[at] = false;
                } catch (WrongType e) {
                    p.skipChildren();
                    row.setField(at, null);
                    wrong[at] = true;
                }
            }
            return p.currentToken() == JsonToken.END_OBJECT && p.nextToken() == null;
        } catch (IOException e) {
            return false;
        }
    }

    private static boolean plausiblyUtf8(byte[] payload) {
        if ((payload[0] & 0xFF) == 0xFE && (payload[1] & 0xFF) == 0xFF
                || (payload[0] & 0xFF) == 0xFF && (payload[1] & 0xFF) == 0xFE) {
            return false;
        }
        for (byte b : payload) {
            if (b == 0) {
                return false;
            }
        }
        return true;
    }

    private static Object value(JsonParser p, JsonToken token, Kind kind) throws IOException, WrongType {
        if (token == JsonToken.VALUE_NULL) {
            return null;
        }
        switch (kind) {
            case STRING:
                if (token == JsonToken.VALUE_STRING) {
                    return StringData.fromString(p.getText());
                }
                break;
            case INT:
                if (token == JsonToken.VALUE_NUMBER_INT && p.getNumberType() == JsonParser.NumberType.INT) {
                    return p.getIntValue();
                }
                break;
            case BIGINT:
                if (token == JsonToken.VALUE_NUMBER_INT && (p.getNumberType() == JsonParser.NumberType.INT
                        || p.getNumberType() == JsonParser.NumberType.LONG)) {
                    return p.getLongValue();
                }
                break;
            case FLOAT:
            case DOUBLE:
                if (token == JsonToken.VALUE_NUMBER_INT || token == JsonToken.VALUE_NUMBER_FLOAT) {
                    double value = p.getDoubleValue();
                    if (kind == Kind.DOUBLE && Double.isFinite(value)) {
                        return value;
                    }
                    if (kind == Kind.FLOAT && Math.abs(value) <= Float.MAX_VALUE) {
                        return (float) value;
                    }
                }
                break;
            case BOOLEAN:
                if (token == JsonToken.VALUE_TRUE || token == JsonToken.VALUE_FALSE) {
                    return token == JsonToken.VALUE_TRUE;
                }
                break;
            default:
                break;
        }
        throw WrongType.INSTANCE;
    }
}
