"""Edits a training state file (checkpoints/train_state.c's layout, version 2, 3 or 4) as a damaged disk or
a bad writer would, for tests/e2e/test_adversarial.sh. Written from the documented layout, not from
the C code: CRC-32C computed here, the parameter tensors' sizes from DESIGN.md.

    state_file.py FILE set-step N           the header's step (and the checksum, so only the value is wrong)
    state_file.py FILE put ARRAY I VALUE    value I (negative: from the end) of master, m or v, checksum updated
    state_file.py FILE flip ARRAY I         one bit of value I flipped, checksum not updated
"""
import struct
import sys

HEADER, HISTORY, TENSORS = 512, 2 * 128 * 4, 16
STEP, NPARAMS, OPT_COUNT, CHECKSUM = 8, 21, 23, 27


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def sizes(h):
    """The 16 tensors' sizes in the model file's order, from the header's maxT, V, Vp, L, NH, C."""
    max_t, Vp, L, C = h[2], h[4], h[5], h[7]
    return [Vp * C, max_t * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
            L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]


def main():
    path, action = sys.argv[1], sys.argv[2]
    b = bytearray(open(path, "rb").read())
    h = list(struct.unpack_from("<64q", b))
    version, count = h[1], h[OPT_COUNT]
    assert h[22] == 0 and count == h[NPARAMS], "edits only states of a whole model (no ZeRO shard)"
    if action == "set-step":
        struct.pack_into("<q", b, 8 * STEP, int(sys.argv[3]))
    else:
        array = ["master", "m", "v"].index(sys.argv[3])
        i = int(sys.argv[4]) % count
        at = HEADER + HISTORY + 4 * (array * count + i)
        if action == "flip":
            b[at] ^= 0x10
        else:
            struct.pack_into("<f", b, at, float(sys.argv[5]))
            if version >= 3:  # the CRC of the tensor holding value i
                start = 0
                for t, size in enumerate(sizes(h)):
                    if start <= i < start + size:
                        first = HEADER + HISTORY + 4 * (array * count + start)
                        trailer = HEADER + HISTORY + 12 * count + 4 * (array * TENSORS + t)
                        struct.pack_into("<I", b, trailer, crc32c(b[first:first + 4 * size]))
                    start += size
    if version >= 3 and action == "set-step":
        struct.pack_into("<q", b, 8 * CHECKSUM, 0)
        struct.pack_into("<q", b, 8 * CHECKSUM, crc32c(b[:HEADER + HISTORY]))
    open(path, "wb").write(b)


main()
