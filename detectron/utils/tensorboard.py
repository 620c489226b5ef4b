"""A minimal TensorBoard event-file writer for scalar curves.

TensorBoard reads `events.out.tfevents.*` files: TFRecord framing (length, masked CRC-32C, payload,
masked CRC-32C) around serialized `Event` protocol buffers. Training only logs scalars, so writing that
format directly costs ~80 lines and saves the project the tensorboard/protobuf/grpc dependency chain.
"""
import os
import socket
import struct
import time


def _make_crc32c_table():
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _make_crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value):
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number, wire_type, payload):
    key = _varint((number << 3) | wire_type)
    if wire_type == 2:  # length-delimited
        return key + _varint(len(payload)) + payload
    return key + payload


def encode_event(wall_time, step=None, file_version=None, scalars=None):
    """Serialize an Event: wall_time=1 (double), step=2 (int64), file_version=3, summary=5."""
    msg = _field(1, 1, struct.pack('<d', wall_time))
    if step is not None:
        msg += _field(2, 0, _varint(int(step)))
    if file_version is not None:
        msg += _field(3, 2, file_version.encode())
    if scalars:
        values = b''.join(
            _field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack('<f', float(v))))
            for tag, v in scalars.items())
        msg += _field(5, 2, values)
    return msg


def frame_record(payload):
    header = struct.pack('<Q', len(payload))
    return (header + struct.pack('<I', masked_crc32c(header)) + payload
            + struct.pack('<I', masked_crc32c(payload)))


class EventWriter:
    """Appends scalar summaries to one event file in `log_dir`."""

    def __init__(self, log_dir):
        os.makedirs(log_dir, exist_ok=True)
        name = 'events.out.tfevents.{:.0f}.{}.{}'.format(time.time(), socket.gethostname(), os.getpid())
        self.path = os.path.join(log_dir, name)
        self._file = open(self.path, 'ab')
        self._file.write(frame_record(encode_event(time.time(), file_version='brain.Event:2')))
        self._file.flush()

    def add_scalars(self, scalars, step):
        self._file.write(frame_record(encode_event(time.time(), step=step, scalars=scalars)))
        self._file.flush()

    def close(self):
        self._file.close()
