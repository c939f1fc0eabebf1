"""A checkpoint's fingerprint: what the KV store keys notes by besides the alias and dtype (issue 48),
so notes written by one set of weights are never served to another.

Read once per loaded model, never by hashing gigabytes: the config, plus

- for a local folder (a converted bundled model, a path): every `*.safetensors` file's name, size and
  JSON header (names, dtypes, shapes, offsets) and `SAMPLES` slices of `SAMPLE_BYTES` spread evenly
  over its tensor bytes (1 MiB a file at most, so a fine-tune of the same shapes changes it while an
  8B model costs a few milliseconds of reads); `*.bin` weights by name, size and the same samples;
- for a hub id, the revision (the commit transformers resolved the files from);
- for a tiny random model, its config and seed (its weights follow from them).

The same files on two hosts give the same fingerprint (nothing depends on paths or times), so hosts
holding one checkpoint share its notes through the shared tier, and hosts holding two do not.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

SAMPLES = 256
SAMPLE_BYTES = 4096


def fingerprint(model) -> str:
    """A hex digest naming the weights `model` was loaded from (see the module docstring)."""
    config = model.config
    h = hashlib.sha256()
    settings = json.loads(config.to_json_string(use_diff=False))
    for where in ("_name_or_path", "_model_name_or_path", "_commit_hash"):  # where, not what
        settings.pop(where, None)
    h.update(json.dumps(settings, sort_keys=True).encode())
    source = str(getattr(config, "_name_or_path", "") or "")
    folder = Path(source).expanduser() if source else None
    if folder is not None and folder.is_dir():
        weights = sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")])
        for path in weights:
            _file(h, path)
        if not weights:
            h.update(b"no weight files")
    elif source:
        h.update(f"hub:{source}@{getattr(config, '_commit_hash', None) or 'unknown revision'}".encode())
    else:
        h.update(b"built from its config")
    return h.hexdigest()


def _file(h, path: Path) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size};".encode())
    with path.open("rb") as f:
        start = 0
        if path.suffix == ".safetensors" and size >= 8:
            (n,) = struct.unpack("<Q", f.read(8))
            n = min(n, size - 8)
            h.update(f.read(n))  # the header: every tensor's name, dtype, shape and offsets
            start = 8 + n
        span = size - start
        if span <= SAMPLES * SAMPLE_BYTES:
            f.seek(start)
            h.update(f.read())
            return
        step = span // SAMPLES
        for i in range(SAMPLES):
            f.seek(start + i * step)
            h.update(f.read(SAMPLE_BYTES))
