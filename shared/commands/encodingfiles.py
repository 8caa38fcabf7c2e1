"""Installing tiktoken's encoding files into the folder `PREFIT_TIKTOKEN_DIR` names.

The image build runs this (`prefit encodings`), and so can an operator preparing an air-gapped
host. Each encoding of `SPECS` becomes `<name>.tiktoken` in the folder:
- copied from a source folder when it holds the file (an air-gapped build passes one with
  `--build-context tiktoken=DIR`);
- else downloaded by tiktoken itself (`tiktoken.load.read_file_cached`), which refuses bytes
  whose SHA-256 is not the one it expects and keeps a copy in `TIKTOKEN_CACHE_DIR`.

Either way the bytes are checked against the SHA-256 of `SPECS` before anything is written, the
file is written whole or not at all, and it is then loaded as an `Encoding`: a build that would
ship a wrong or unreadable file fails there, not at a deployment's first request.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tiktoken.load import read_file_cached

from shared.counting.encodings import SPECS, EncodingSpec, encoding_file, load_encoding
from shared.errors import ConfigError
from shared.logs import get_logger

log = get_logger(__name__)

Origin = Literal["present", "copied", "downloaded"]


@dataclass(frozen=True)
class InstalledEncoding:
    """One encoding file in place, checked, and where its bytes came from."""

    name: str
    path: Path
    origin: Origin
    sha256: str


def install_encodings(
    into: Path, source: Path | None = None, names: Sequence[str] | None = None
) -> list[InstalledEncoding]:
    """Put `<name>.tiktoken` for each of `names` (default: all) into `into`, checked; see the
    module docstring.

    A file already in `into` with the right hash is kept. Raises `ConfigError` for an unknown
    name, a `source` that is not a folder, an `into` that cannot be made, a source file or a
    download whose hash is wrong, or an encoding tiktoken cannot fetch.
    """
    names = list(SPECS) if names is None else names
    unknown = sorted(set(names) - set(SPECS))
    if unknown:
        raise ConfigError(f"unknown encodings {unknown}: prefit knows {sorted(SPECS)}")
    if source is not None and not source.is_dir():
        raise ConfigError(f"--from {source}: no such folder")
    try:
        into.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make the folder {into}: {exc.strerror or exc}") from None
    return [_install(name, into, source) for name in names]


def _install(name: str, into: Path, source: Path | None) -> InstalledEncoding:
    spec = SPECS[name]
    target = into / f"{name}.tiktoken"
    origin: Origin
    if target.is_file() and _sha256(target.read_bytes()) == spec.sha256:
        origin = "present"
    else:
        found = encoding_file(name, source) if source is not None else None
        if found is not None:
            data, origin = found.read_bytes(), "copied"
            _check(name, data, spec, found)
        else:
            data, origin = _download(name, spec), "downloaded"
            _check(name, data, spec, spec.url)
        _write_whole(target, data)
    load_encoding(name, into)  # parses it: a file that hashes right but cannot load fails here
    log.info("encoding.installed", encoding=name, origin=origin, path=str(target))
    return InstalledEncoding(name, target, origin, spec.sha256)


def _download(name: str, spec: EncodingSpec) -> bytes:
    try:
        data: bytes = read_file_cached(spec.url, expected_hash=spec.sha256)
        return data
    except ValueError as exc:  # tiktoken's own refusal of bytes with the wrong hash
        raise ConfigError(f"tiktoken refused the download of {name}: {exc}") from None
    except (OSError, ImportError) as exc:  # requests' errors are OSErrors
        raise ConfigError(
            f"cannot download {name} from {spec.url} ({type(exc).__name__}: {exc}); on a host "
            "without internet, pass a folder holding the files (prefit encodings --from DIR, "
            "or docker build --build-context tiktoken=DIR)"
        ) from None


def _check(name: str, data: bytes, spec: EncodingSpec, origin: Path | str) -> None:
    actual = _sha256(data)
    if actual != spec.sha256:
        raise ConfigError(
            f"{origin} is not the {name} encoding: its SHA-256 is {actual}, "
            f"tiktoken expects {spec.sha256}"
        )


def _write_whole(target: Path, data: bytes) -> None:
    """Write to a temporary file beside `target`, then rename: a reader never sees half."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, 0o644)  # the image reads it as a user other than the one that wrote it
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
