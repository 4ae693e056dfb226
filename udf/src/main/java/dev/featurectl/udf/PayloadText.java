package dev.featurectl.udf;

import org.apache.flink.table.functions.ScalarFunction;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Base64;

/**
 * {@code PAYLOAD_TEXT(payload BYTES, max_bytes INT) -> STRING}: the start of a payload as a dead letter keeps it.
 *
 * <p>The first {@code max_bytes} bytes, less a character the cut would split, as text when they are valid UTF-8;
 * otherwise the first {@code max_bytes} bytes in base64 ({@link PayloadEncoding} says which). Either way the
 * original bytes can be had back exactly, never a re-serialization.
 */
public class PayloadText extends ScalarFunction {
    private static final long serialVersionUID = 1L;

    public String eval(byte[] payload, Integer maxBytes) {
        if (payload == null) {
            return null;
        }
        String text = utf8Prefix(payload, maxBytes);
        return text != null ? text : Base64.getEncoder().encodeToString(prefix(payload, maxBytes, false));
    }

    /** The prefix as text, or null when it is not valid UTF-8. */
    static String utf8Prefix(byte[] payload, int maxBytes) {
        try {
            return StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(prefix(payload, maxBytes, true)))
                    .toString();
        } catch (CharacterCodingException e) {
            return null;
        }
    }

    /** At most `maxBytes` bytes; with `wholeCharacters`, a cut inside a UTF-8 sequence moves to its start. */
    static byte[] prefix(byte[] payload, int maxBytes, boolean wholeCharacters) {
        if (payload.length <= maxBytes) {
            return payload;
        }
        int cut = maxBytes;
        while (wholeCharacters && cut > 0 && maxBytes - cut < 3 && (payload[cut] & 0xC0) == 0x80) {
            cut--;
        }
        return Arrays.copyOf(payload, cut);
    }
}
