"""A protobuf wire-format reader for tests, independent of detectron/utils/tensorboard.py's encoder."""


def read_varint(buf, pos):
    value = shift = 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        shift, pos = shift + 7, pos + 1
        if not byte & 0x80:
            return value, pos


def proto_fields(buf):
    """{field number: [values]} of a protobuf message: varints as ints, the rest as bytes."""
    fields, pos = {}, 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        wire = key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
        else:
            size, pos = (8, pos) if wire == 1 else (4, pos) if wire == 5 else read_varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        fields.setdefault(key >> 3, []).append(value)
    return fields
