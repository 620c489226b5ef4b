import glob
import struct

from detectron.utils.tensorboard import EventWriter, crc32c, masked_crc32c


def test_crc32c_known_vectors():
    # RFC 3720 / iSCSI check values for CRC-32C
    assert crc32c(b'123456789') == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA


def _read_varint(buf, pos):
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos


def _parse_fields(buf):
    """Decode a protobuf message into {field: [values]} (independent of the writer's encoder)."""
    fields, pos = {}, 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, pos = _read_varint(buf, pos)
        elif wire == 1:
            val, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            val, pos = buf[pos:pos + 4], pos + 4
        else:
            n, pos = _read_varint(buf, pos)
            val, pos = buf[pos:pos + n], pos + n
        fields.setdefault(num, []).append(val)
    return fields


def test_event_file_records_and_scalars(tmp_path):
    writer = EventWriter(str(tmp_path))
    writer.add_scalars({'loss': 1.5, 'lr': 0.02}, step=20)
    writer.close()
    (path,) = glob.glob(str(tmp_path / 'events.out.tfevents.*'))
    data = open(path, 'rb').read()
    records, pos = [], 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack('<Q', header)
        assert struct.unpack('<I', data[pos + 8:pos + 12])[0] == masked_crc32c(header)
        payload = data[pos + 12:pos + 12 + length]
        assert struct.unpack('<I', data[pos + 12 + length:pos + 16 + length])[0] == masked_crc32c(payload)
        records.append(payload)
        pos += 16 + length
    assert len(records) == 2
    assert _parse_fields(records[0])[3] == [b'brain.Event:2']
    event = _parse_fields(records[1])
    assert event[2] == [20]
    values = [_parse_fields(v) for v in _parse_fields(event[5][0])[1]]
    got = {v[1][0].decode(): struct.unpack('<f', v[2][0])[0] for v in values}
    assert got == {'loss': 1.5, 'lr': struct.unpack('<f', struct.pack('<f', 0.02))[0]}
