"""Writing report files: all or nothing, a failure naming the path."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from ..errors import FlopscopeError


def write_atomically(path: str | Path, text: str, what: str = "the file") -> Path:
    """Write ``text`` to ``path`` all or nothing: into a temporary file in the same
    directory, then renamed over ``path`` (``os.replace``, atomic on POSIX and
    Windows), so a reader never sees half a file and a failed write leaves the old
    one. Any failure raises a :class:`~flopscope.errors.FlopscopeError` naming
    ``path``."""
    out = Path(path)
    temporary = out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # os.open applies the umask, as a plain open() would (tempfile's files are
        # private to their owner)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, out)
    except OSError as e:
        temporary.unlink(missing_ok=True)
        raise FlopscopeError(f"cannot write {what} to {out}: {e.strerror or e}") from e
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return out
