"""A bar chart of a two-column CSV (label,value) as a PNG, with Python's standard library alone: what a
subagent's task runs in the files round-trip test (the image has python3 and nothing to plot with)."""

import csv
import struct
import sys
import zlib

WIDTH, HEIGHT, BAR_GAP = 320, 200, 8


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def main(source: str, target: str) -> None:
    with open(source, newline="") as handle:
        rows = [(row[0], float(row[1])) for row in list(csv.reader(handle))[1:] if len(row) >= 2]
    top = max((value for _, value in rows), default=1.0) or 1.0
    bar = max(1, (WIDTH - BAR_GAP) // max(1, len(rows)) - BAR_GAP)
    pixels = [[(255, 255, 255)] * WIDTH for _ in range(HEIGHT)]
    for index, (_, value) in enumerate(rows):
        left = BAR_GAP + index * (bar + BAR_GAP)
        for y in range(HEIGHT - int(value / top * (HEIGHT - 10)), HEIGHT):
            for x in range(left, min(left + bar, WIDTH)):
                pixels[y][x] = (30, 110, 200)
    raw = b"".join(b"\x00" + bytes(c for pixel in line for c in pixel) for line in pixels)
    header = struct.pack(">IIBBBBB", WIDTH, HEIGHT, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    with open(target, "wb") as out:
        out.write(png)
    print(f"{len(rows)} bars -> {target}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
