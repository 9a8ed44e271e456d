"""Archives built in memory for the tests that open bundles (CLI, service, fuzzing)."""
from __future__ import annotations

import io
import tarfile
import zipfile


def archive(kind: str, members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    """A .zip (``kind == "zip"``) or .tar.gz of ``members``; ``links`` adds tar symlinks."""
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        return buf.getvalue()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


def tar_with(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    return archive("tar", members, links)
