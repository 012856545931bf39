"""A checkpoint's manifest: every file with its size and xxh3-128 hash, written last, inside the atomic rename.

``step_N/manifest.json`` = ``{"version", "step", "backend", "model", "files": {relative path: {"size", "xxh3_128"}}}``.
`verify_checkpoint` re-reads every listed file and names the first one that is missing, has another size or hashes
differently. ``training_info.json`` of a checkpoint written with a manifest carries ``"manifest": true``, so a
manifest that went missing is told apart from a checkpoint written before manifests existed (those load unverified).
xxh3 (from ``xxhash``, a dependency of ``datasets``) reads at several GB/s, so hashing a checkpoint costs a fraction of
writing it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import xxhash

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
# Set in training_info.json when the checkpoint is (to be) written with a manifest.
MANIFEST_FLAG = "manifest"
_CHUNK = 8 << 20


def file_hash(path: Path) -> str:
    digest = xxhash.xxh3_128()
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _listed_files(root: Path) -> list[Path]:
    files = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            if path.is_file() and not path.is_symlink() and path.relative_to(root).as_posix() != MANIFEST_FILE:
                files.append(path)
    return sorted(files)


def write_manifest(checkpoint: Path, step: int, training_info: Mapping[str, Any]) -> int:
    """Hash every file under ``checkpoint`` into its ``manifest.json`` (fsynced); return the total bytes listed."""
    files: dict[str, dict[str, Any]] = {
        path.relative_to(checkpoint).as_posix(): {"size": path.stat().st_size, "xxh3_128": file_hash(path)}
        for path in _listed_files(checkpoint)
    }
    model = training_info.get("model") or {}
    manifest = {
        "version": MANIFEST_VERSION,
        "step": step,
        "backend": model.get("backend"),
        "model": model.get("name"),
        "files": files,
    }
    target = checkpoint / MANIFEST_FILE
    with target.open("w") as out:
        json.dump(manifest, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    return sum(int(entry["size"]) for entry in files.values())


def expects_manifest(checkpoint: Path) -> bool:
    """Whether ``checkpoint``'s ``training_info.json`` says it was written with a manifest."""
    path = checkpoint / "training_info.json"
    if not path.is_file():
        return False  # not a folder this package finalized: nothing says what it should hold
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return True  # an unreadable training_info.json is damage, not an old format
    return bool(info.get(MANIFEST_FLAG))


def verify_checkpoint(checkpoint: Path) -> str | None:
    """None when every file of ``checkpoint``'s manifest is there with its size and hash; else one line naming the
    first file at fault. Raises `FileNotFoundError` for a checkpoint without a manifest that never had one."""
    manifest_path = checkpoint / MANIFEST_FILE
    if not manifest_path.is_file():
        if expects_manifest(checkpoint):
            return f"{MANIFEST_FILE} is missing (training_info.json says the checkpoint was written with one)"
        raise FileNotFoundError(manifest_path)
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST_FILE} is unreadable ({type(e).__name__}: {e})"
    for name, entry in sorted(files.items()):
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} has {size} bytes, the manifest says {entry['size']}"
        if file_hash(path) != entry["xxh3_128"]:
            return f"{name} does not match its xxh3-128 hash in the manifest (same size, different content)"
    return None


def checkpoint_bytes(checkpoint: Path) -> int:
    """Bytes a checkpoint holds: its manifest's total, or the files' sizes without a manifest."""
    try:
        files = json.loads((checkpoint / MANIFEST_FILE).read_text())["files"]
        return int(sum(entry["size"] for entry in files.values()))
    except (OSError, ValueError, KeyError, TypeError):
        return sum(path.stat().st_size for path in _listed_files(checkpoint))
