import glob
import struct

from detectron.utils.tensorboard import EventWriter, crc32c, masked_crc32c
from protobuf_reader import proto_fields


def test_crc32c_known_vectors():
    # RFC 3720 / iSCSI check values for CRC-32C
    assert crc32c(b'123456789') == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA


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
    assert proto_fields(records[0])[3] == [b'brain.Event:2']
    event = proto_fields(records[1])
    assert event[2] == [20]
    values = [proto_fields(v) for v in proto_fields(event[5][0])[1]]
    got = {v[1][0].decode(): struct.unpack('<f', v[2][0])[0] for v in values}
    assert got == {'loss': 1.5, 'lr': struct.unpack('<f', struct.pack('<f', 0.02))[0]}
