"""Pass the server's output on while masking secrets in it.

SGLang 0.5.23 logs its resolved options at start (`server_args={...}`, entrypoints/engine.py) with only the
watermark secrets redacted, so the API key would reach server.log and `docker logs`. The server's stdout and stderr
go through this relay instead; it copies bytes as they come (tqdm frames joined by carriage returns stay live for
the healthcheck) and replaces every secret, including one split across two reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

MASK = b"<redacted>"


class Masker:
    """Replace secrets in a byte stream fed in arbitrary pieces."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # As written, and as repr() and JSON escape it (SGLang logs its options through repr).
        forms = {form for s in secrets if s for form in (s, repr(s)[1:-1], json.dumps(s)[1:-1])}
        self.secrets = sorted((f.encode() for f in forms), key=len, reverse=True)
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk
        for secret in self.secrets:
            data = data.replace(secret, MASK)
        hold = self._partial_tail(data)
        self.pending = data[len(data) - hold :] if hold else b""
        return data[: len(data) - hold] if hold else data

    def flush(self) -> bytes:
        out, self.pending = self.pending, b""
        return out

    def _partial_tail(self, data: bytes) -> int:
        """The length of the longest end of `data` that begins a secret (it may complete in the next read)."""
        longest = 0
        for secret in self.secrets:
            for size in range(min(len(secret) - 1, len(data)), longest, -1):
                if data.endswith(secret[:size]):
                    longest = size
                    break
        return longest


def relay(source_fd: int, target_fd: int, secrets: Iterable[str]) -> None:
    """Copy source to target until end of file, masking `secrets`."""
    masker = Masker(secrets)
    while chunk := os.read(source_fd, 65536):
        write_all(target_fd, masker.feed(chunk))
    write_all(target_fd, masker.flush())


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]
