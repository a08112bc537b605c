"""A regular file of any size without its bytes: what log_file.windows sees of a huge log (fstat faked by the
test), its seeks followed and its reads recorded, each answered by the subclass's `content`."""

from __future__ import annotations


class FakeFile:
    def __init__(self, size: int) -> None:
        self.size, self.pos, self.reads = size, 0, []

    def fileno(self) -> int:
        return 0

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        self.reads.append(self.record(n))
        return self.content(n)

    def record(self, n: int) -> object:
        return n

    def content(self, n: int) -> bytes:
        raise NotImplementedError
