"""``import REF`` and ``export DIGEST DEST`` with skopeo, keeping manifest digests.

Imports copy into skopeo's ``dir:`` layout (manifest bytes unchanged) and commit that;
exports copy from the store's OCI layout (``oci:$ROLLBOX_HOME/oci:<hex>``) with
``--preserve-digests``, so export → import round-trips to the same digest.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from rollbox.baselines.builders.proc import run
from rollbox.baselines.locks import flock
from rollbox.baselines.refs import hex_of
from rollbox.baselines.writer import StoreWriter
from rollbox.errors import InvalidInputError, NotFoundError, StoreError
from rollbox.models import BaselineInfo, ImageSource

IMPORT_TRANSPORTS = ("docker://", "oci:", "oci-archive:", "docker-archive:", "dir:")
EXPORT_TRANSPORTS = ("docker://", "oci:", "oci-archive:", "docker-archive:", "dir:")
_LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?$")
_NOT_FOUND = ("manifest unknown", "no such file", "not found", "name unknown", "does not exist")


def is_transport_ref(ref: str) -> bool:
    """True when ``ref`` names an image through a skopeo transport we import from."""
    return ref.startswith(IMPORT_TRANSPORTS)


def is_loopback_registry(ref: str) -> bool:
    """True for ``docker://`` references whose registry is on loopback (plain HTTP ok)."""
    if not ref.startswith("docker://"):
        return False
    host = ref[len("docker://") :].split("/", 1)[0]
    return bool(_LOOPBACK.match(host))


def _check_path(ref: str) -> None:
    for transport in ("oci-archive:", "docker-archive:", "oci:", "dir:"):
        if ref.startswith(transport):
            rest = ref[len(transport) :]
            path = rest if transport == "dir:" else rest.split(":", 1)[0]
            if not Path(path).exists():
                raise InvalidInputError(f"{ref}: {path} does not exist")


_MSG = re.compile(r'level=(?:fatal|error) msg="((?:[^"\\]|\\.)*)"')


def _failure(what: str, ref: str, output: str) -> Exception:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "no output"
    m = _MSG.search(last)
    if m:  # logrus line: keep just the message
        last = m.group(1).replace('\\"', '"')
    if any(s in output.lower() for s in _NOT_FOUND):
        return NotFoundError(f"{what} {ref}: {last}")
    return StoreError(f"{what} {ref} failed: {last}")


def import_image(
    store: StoreWriter,
    ref: str,
    *,
    names: list[str] | None = None,
    tls_verify: bool | None = None,
    command_timeout: int | None = None,
) -> BaselineInfo:
    """Import ``ref`` (``docker://``, ``oci:``, ``oci-archive:``, ``docker-archive:``) with
    its digest unchanged.

    Args:
        store: the store to add it to.
        ref: a skopeo transport:reference.
        names: names to give it.
        tls_verify: verify registry TLS (default: yes, except for loopback registries).
        command_timeout: give up after this many seconds (skopeo ``--command-timeout``).

    Raises:
        InvalidInputError: unknown transport or missing path.
        NotFoundError: the image does not exist.
        StoreError: skopeo failed otherwise (its message in one line).
    """
    if not is_transport_ref(ref):
        raise InvalidInputError(
            f"unknown image reference {ref!r}",
            hint="use docker://, oci:, oci-archive:, docker-archive: or a rootfs path",
        )
    _check_path(ref)
    if tls_verify is None:
        tls_verify = not is_loopback_registry(ref)
    store.home.ensure()
    key = hashlib.sha256(ref.encode()).hexdigest()[:32]
    with flock(store.home.locks / f"import-{key}.lock"), store.staging("import") as stage:
        img = stage / "img"
        cmd = ["skopeo"]
        if command_timeout is not None:
            cmd.append(f"--command-timeout={command_timeout}s")
        cmd += ["copy", "--quiet", "--preserve-digests"]
        if ref.startswith("docker://"):
            cmd.append(f"--src-tls-verify={'true' if tls_verify else 'false'}")
        proc = run([*cmd, ref, f"dir:{img}"], timeout=3600)
        if proc.returncode != 0:
            raise _failure("import of", ref, proc.stdout)
        all_names = list(names or [])
        if ref.startswith("docker://") and "@" not in ref:
            # a registry image is also known by its reference, so FROM can name it
            all_names.append(ref[len("docker://") :])
        # skopeo verified every blob against its digest while copying
        return store.commit_image(
            img, ImageSource(reference=ref), names=all_names or None, trusted=True
        )


def export_image(store: StoreWriter, ref: str, dest: str, *, tls_verify: bool | None = None) -> str:
    """Copy baseline ``ref`` to ``dest`` (``oci-archive:FILE``, ``docker://…``, ...).

    Returns:
        The digest at the destination (the baseline's own: digests are preserved).

    Raises:
        InvalidInputError: unknown destination transport.
        StoreError: skopeo failed.
    """
    info = store.resolve(ref)
    if not dest.startswith(EXPORT_TRANSPORTS):
        raise InvalidInputError(
            f"unknown export destination {dest!r}",
            hint="use oci-archive:FILE, oci:DIR:TAG or docker://HOST/NAME:TAG",
        )
    if dest.startswith("oci-archive:"):
        parent = Path(dest[len("oci-archive:") :].split(":", 1)[0]).absolute().parent
        if not parent.is_dir():
            raise InvalidInputError(f"{dest}: directory {parent} does not exist")
    if tls_verify is None:
        tls_verify = not is_loopback_registry(dest)
    src = f"oci:{store.home.oci}:{hex_of(info.digest)}"
    cmd = ["skopeo", "copy", "--quiet"]
    if not dest.startswith("docker-archive:"):
        # docker-archive has no manifest digest to keep: skopeo must convert to it
        cmd.append("--preserve-digests")
    if dest.startswith("docker://"):
        cmd.append(f"--dest-tls-verify={'true' if tls_verify else 'false'}")
    with store.lock():  # keeps gc from removing blobs while they are read
        proc = run([*cmd, src, dest], timeout=3600)
    if proc.returncode != 0:
        raise _failure("export to", dest, proc.stdout)
    return info.digest
