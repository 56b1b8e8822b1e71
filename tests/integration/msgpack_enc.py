# msgpack_enc.py - enc(obj): the MessagePack bytes of None, bool, int (>= 0), float, str, bytes,
# lists and dicts, for the integration tests that build well-formed frames with hostile contents
# (a forged scored batch, a forged report) the way an insider holding a key would. Python's
# standard library has no MessagePack; these few forms are all the frames need.
import struct


def enc(o):
    if o is None:
        return b'\xc0'
    if isinstance(o, bool):
        return b'\xc3' if o else b'\xc2'
    if isinstance(o, int):
        return bytes([o]) if 0 <= o < 128 else b'\xcf' + struct.pack('>Q', o)
    if isinstance(o, float):
        return b'\xcb' + struct.pack('>d', o)
    if isinstance(o, str):
        b = o.encode()
        return b'\xd9' + bytes([len(b)]) + b
    if isinstance(o, bytes):
        return b'\xc4' + bytes([len(o)]) + o
    if isinstance(o, list):
        return b'\xdc' + struct.pack('>H', len(o)) + b''.join(enc(x) for x in o)
    return b'\xde' + struct.pack('>H', len(o)) + b''.join(enc(k) + enc(v) for k, v in o.items())
