"""Feast's Redis layout and the one client stack that reads and writes it; every writer (`batch`, `streaming`)
and every reader (`serving`) imports this package, which imports none of them.

| module | what |
| --- | --- |
| `layout` | the format (below), a value at a time: keys, field names, the tag table, varints, timestamps, decoding |
| `columns` | the same bytes for whole Arrow columns, down to the RESP of HSET/HGET/EXPIRE (materialization) |
| `decode` | fast decoders of many values of one feature (the SDK) |
| `dump` | `DUMP` payloads of listpack hashes, so materialization creates a new key with one `RESTORE` |
| `guarded` | the guarded write (Lua): a key is written only when its `_ts` is not newer |
| `settings` | where Redis is and how to authenticate and encrypt (Feast's `connection_string`) |
| `node`, `cluster` | the client: pre-packed RESP on our own sockets, hiredis replies, pools; a cluster's slots |

Format (Feast 0.67, `entity_key_serialization_version: 3`, RedisOnlineStore): key = the serialized entity key +
the project name; one hash per key; field per feature = murmur3_32 of `"{view}:{feature}"` (4 LE bytes);
`_ts:{view}` = a serialized `google.protobuf.Timestamp`; values = serialized `feast.types.Value` (b"" is NULL).
`layout`'s docstring has the byte-level details; tests check every byte against Feast's own functions.
"""
