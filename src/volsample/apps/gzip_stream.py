"""A gzip stream deflated on threads, as pigz does, for writing NIfTI files fast.

``volsample register`` writes its volumes (float fields of some 100 MB) through it: the
chunks are deflated independently and joined into one deflate stream, one gzip member,
which any gzip reader takes.
"""
from __future__ import annotations

import collections
import concurrent.futures
import io
import struct
import zlib
from typing import Any, BinaryIO

from .. import _config

_GZIP_CHUNK = 4 << 20  # bytes deflated per task
# A chunk is deflated only when a sample of it shrinks by at least an eighth: float fields
# and images (noise in their low mantissa bits) shrink by under a tenth, at 30 MB/s; they
# are stored (deflate's stored blocks, as fast as a copy) instead. Label maps shrink 20x.
_SAMPLE_PIECES, _SAMPLE_PIECE = 4, 16 << 10
_WORTH_DEFLATING = 7 / 8


def _deflate(chunk: bytes, last: bool) -> bytes:
    """One chunk as raw deflate blocks of its own, ending on a byte boundary (a sync flush;
    the last chunk ends the stream): stored when it barely compresses (``_worth_deflating``),
    else Z_RLE, runs and Huffman codes, no string matching (on a displacement field 2.6x
    faster than zlib's level 1, and as small)."""
    level = 1 if _worth_deflating(chunk) else 0
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS, 8, zlib.Z_RLE)
    return compressor.compress(chunk) + compressor.flush(zlib.Z_FINISH if last
                                                         else zlib.Z_SYNC_FLUSH)


def _worth_deflating(chunk: bytes) -> bool:
    """Whether pieces spread over ``chunk`` (all of it, when short) deflate to under
    ``_WORTH_DEFLATING`` of their size."""
    if len(chunk) <= _SAMPLE_PIECES * _SAMPLE_PIECE:
        sample = chunk
    else:
        stride = (len(chunk) - _SAMPLE_PIECE) // (_SAMPLE_PIECES - 1)
        sample = b"".join(chunk[i * stride:i * stride + _SAMPLE_PIECE]
                          for i in range(_SAMPLE_PIECES))
    compressor = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS, 8, zlib.Z_RLE)
    size = len(compressor.compress(sample)) + len(compressor.flush())
    return size < _WORTH_DEFLATING * len(sample)


class ParallelGzip(io.RawIOBase):
    """A write-only stream gzipping into ``file`` on threads, as pigz does: chunks are
    deflated independently and joined into one deflate stream, one gzip member, which any
    gzip reader takes. At most two chunks per thread are held at once."""

    def __init__(self, file: BinaryIO) -> None:
        super().__init__()
        self.file = file
        threads = _config.get_num_threads()
        self.pool = concurrent.futures.ThreadPoolExecutor(threads)
        self.pending: collections.deque = collections.deque()
        self.held = 2 * threads
        self.buffer = bytearray()
        self.crc = 0
        self.position = 0
        file.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")  # deflate, no mtime

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Only to where the stream is (nibabel seeks to its start before writing)."""
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self.position + offset}.get(whence)
        if target != self.position:
            raise io.UnsupportedOperation("a gzip stream being written seeks nowhere else")
        return self.position

    def write(self, data: Any) -> int:  # any bytes-like object
        """Chunks go to the threads straight from ``data`` (no copy of it held); only a
        last partial chunk waits in the buffer for the next write."""
        data = memoryview(data).cast("B")
        size = len(data)
        self.position += size
        if self.buffer:  # complete the chunk that earlier writes began
            fill = min(size, _GZIP_CHUNK - len(self.buffer))
            self.buffer += data[:fill]
            data = data[fill:]
            if len(self.buffer) < _GZIP_CHUNK:
                return size
            self._submit(bytes(self.buffer), last=False)
            self.buffer = bytearray()
        while len(data) >= _GZIP_CHUNK:
            self._submit(bytes(data[:_GZIP_CHUNK]), last=False)
            data = data[_GZIP_CHUNK:]
        self.buffer += data
        return size

    def _submit(self, chunk: bytes, last: bool) -> None:
        self.crc = zlib.crc32(chunk, self.crc)
        self.pending.append(self.pool.submit(_deflate, chunk, last))
        while len(self.pending) > (0 if last else self.held):
            self.file.write(self.pending.popleft().result())

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._submit(bytes(self.buffer), last=True)
            self.file.write(struct.pack("<II", self.crc, self.position & 0xFFFFFFFF))
        finally:
            self.pool.shutdown(cancel_futures=True)
            super().close()
