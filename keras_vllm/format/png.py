"""The PNG files of an artifact's golden images (format 1.11), written and
read without an image library.

The golden images (`format.golden_images`) are tiny RGB pictures keras-vllm
draws itself; they are stored as PNG so a person can open them. The reader
takes exactly what the writer produces (8-bit RGB, not interlaced, every
row unfiltered) and refuses anything else, with every length bounded before
it is allocated: an artifact's bytes go through `zlib` and numpy only, and
no general-purpose decoder (plain Python, like the rest of the format).
"""

import struct
import zlib

from keras_vllm.format.checks import fail

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Bit depth 8, colour type 2 (RGB), compression 0, filter 0, no interlace.
_RGB8 = (8, 2, 0, 0, 0)


def _chunk(kind, data):
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def encode(height, width, rgb):
    """PNG bytes of `height` x `width` pixels, `rgb` their row-major 8-bit
    RGB bytes (a uint8 `(height, width, 3)` array's `tobytes()`).

    Example:

    ```python
    data = encode(4, 6, bytes(4 * 6 * 3))
    decode(data, max_side=16)  # (4, 6, b"\x00\x00...")
    ```
    """
    row = 3 * width
    if len(rgb) != row * height:
        raise ValueError("encode() takes height x width x 3 bytes.")
    rows = b"".join(
        b"\x00" + rgb[y * row:(y + 1) * row] for y in range(height)
    )
    header = struct.pack(">II", width, height) + bytes(_RGB8)
    return (
        _SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows, 9))
        + _chunk(b"IEND", b"")
    )


def decode(data, max_side, what="image"):
    """`(height, width, rgb)` of PNG bytes `encode` wrote: `rgb` is the
    row-major 8-bit RGB bytes.

    Args:
        data: the file's bytes.
        max_side: the largest height or width accepted.
        what: the file's name, for messages.

    Raises:
        ArtifactError: when the bytes are not such a PNG (or are corrupt).
    """
    def bad(reason):
        fail(f"{what} is not a PNG keras-vllm wrote ({reason}); re-export "
             "the model.")

    if not data.startswith(_SIGNATURE):
        bad("no PNG signature")
    at, chunks = len(_SIGNATURE), []
    while at < len(data):
        if at + 12 > len(data):
            bad("a truncated chunk")
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, end = data[at + 4:at + 8], at + 8 + length
        if end + 4 > len(data):
            bad("a truncated chunk")
        body = data[at + 8:end]
        (crc,) = struct.unpack(">I", data[end:end + 4])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            bad(f"a bad checksum in its {kind!r} chunk")
        chunks.append((kind, body))
        at = end + 4
    kinds = [kind for kind, _ in chunks]
    if len(kinds) < 3 or kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or set(
        kinds[1:-1]
    ) != {b"IDAT"}:
        bad("chunks other than IHDR, IDAT and IEND")
    header = chunks[0][1]
    if len(header) != 13 or tuple(header[8:]) != _RGB8:
        bad("not 8-bit RGB")
    width, height = struct.unpack(">II", header[:8])
    if not (0 < width <= max_side and 0 < height <= max_side):
        bad(f"{width} x {height} pixels, over {max_side} a side")
    row = 1 + 3 * width
    expected = row * height
    inflate = zlib.decompressobj()
    try:
        rows = inflate.decompress(
            b"".join(body for _, body in chunks[1:-1]), expected + 1
        )
    except zlib.error:
        bad("corrupt compressed data")
    if len(rows) != expected or not inflate.eof:
        bad("pixel data of the wrong length")
    if any(rows[y * row] for y in range(height)):
        bad("filtered rows")
    rgb = b"".join(
        rows[y * row + 1:(y + 1) * row] for y in range(height)
    )
    return height, width, rgb
