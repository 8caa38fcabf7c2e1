"""tiktoken encodings that load without a network.

`tiktoken.get_encoding(name)` downloads its BPE file on first use. Production hosts and CI
have no internet, so an operator points `Settings.tiktoken_dir` at a folder holding
`<name>.tiktoken` files (byte-identical to tiktoken's downloads) and `load_encoding` builds
the `Encoding` from that file directly, with the regex and special tokens that
`tiktoken_ext.openai_public` defines for the name. The file's SHA-256 is checked against
the hash tiktoken itself expects, so a truncated or foreign file is refused, not used.

Note: `tiktoken.load.load_tiktoken_bpe` keeps a copy of the file in tiktoken's own cache
folder (`TIKTOKEN_CACHE_DIR`, else `<tmp>/data-gym-cache`) when it can write there.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from shared.errors import ConfigError
from shared.logs import get_logger

log = get_logger(__name__)

# The special-token names of tiktoken_ext.openai_public (not imported: it ships no type hints).
ENDOFTEXT = "<|endoftext|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
ENDOFPROMPT = "<|endofprompt|>"


@dataclass(frozen=True)
class EncodingSpec:
    """What an `Encoding` needs besides its BPE ranks (copied from tiktoken_ext.openai_public)."""

    pat_str: str
    special_tokens: dict[str, int]
    sha256: str
    url: str  # where tiktoken downloads it; `TIKTOKEN_CACHE_DIR` names files by its SHA-1


_LETTERS_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LETTERS_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_O200K_PAT = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?" + _LETTERS_UPPER + "*" + _LETTERS_LOWER + "+" + _CONTRACTIONS,
        r"[^\r\n\p{L}\p{N}]?" + _LETTERS_UPPER + "+" + _LETTERS_LOWER + "*" + _CONTRACTIONS,
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

_BLOBS = "https://openaipublic.blob.core.windows.net/encodings"

SPECS: dict[str, EncodingSpec] = {
    "o200k_base": EncodingSpec(
        pat_str=_O200K_PAT,
        special_tokens={ENDOFTEXT: 199999, ENDOFPROMPT: 200018},
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        url=f"{_BLOBS}/o200k_base.tiktoken",
    ),
    "cl100k_base": EncodingSpec(
        pat_str=_CL100K_PAT,
        special_tokens={
            ENDOFTEXT: 100257,
            FIM_PREFIX: 100258,
            FIM_MIDDLE: 100259,
            FIM_SUFFIX: 100260,
            ENDOFPROMPT: 100276,
        },
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        url=f"{_BLOBS}/cl100k_base.tiktoken",
    ),
}

_loaded: dict[tuple[str, str | None], tiktoken.Encoding] = {}
_lock = threading.Lock()


def encoding_file(name: str, directory: Path | None) -> Path | None:
    """The offline file `load_encoding` would read for `name` in `directory`: `<name>.tiktoken`,
    or the file tiktoken's own cache (`TIKTOKEN_CACHE_DIR`) keeps under the SHA-1 of its URL."""
    if directory is None or name not in SPECS:
        return None
    folder = Path(directory)
    for candidate in (f"{name}.tiktoken", hashlib.sha1(SPECS[name].url.encode()).hexdigest()):
        path = folder / candidate
        if path.is_file():
            return path
    return None


def offline_dirs() -> list[Path]:
    """Where encodings are looked for when no folder is given: the settings'
    `PREFIT_TIKTOKEN_DIR`, then tiktoken's own `TIKTOKEN_CACHE_DIR`."""
    from shared.settings import get_settings  # settings are read only when no folder is given

    settings = get_settings()
    return [d for d in (settings.tiktoken_dir, settings.tiktoken_cache_dir) if d is not None]


def load_encoding(name: str, directory: Path | None = None) -> tiktoken.Encoding:
    """The encoding `name`, from an offline file in `directory` when present, else from tiktoken.

    Without `directory`, the folders of `offline_dirs()` are searched (so a library user on
    an air-gapped host only sets `PREFIT_TIKTOKEN_DIR` or `TIKTOKEN_CACHE_DIR`). Loaded once
    per process (per name and folder). Raises `ConfigError` for an unknown name, a file whose
    hash is wrong, or an encoding tiktoken cannot fetch.
    """
    if directory is None:
        directory = next((d for d in offline_dirs() if encoding_file(name, d)), None)
    key = (name, str(directory) if directory is not None else None)
    found = _loaded.get(key)
    if found is not None:
        return found
    with _lock:  # a BPE file takes ~0.2 s to parse: load it once even under concurrent callers
        found = _loaded.get(key)
        if found is None:
            found = _load(name, directory)
            _loaded[key] = found
    return found


def _load(name: str, directory: Path | None) -> tiktoken.Encoding:
    path = encoding_file(name, directory)
    if path is None:
        return _from_tiktoken(name, directory)
    spec = SPECS[name]
    try:
        ranks = load_tiktoken_bpe(str(path), expected_hash=spec.sha256)
    except ValueError as exc:  # tiktoken's hash mismatch, or an unparsable line
        raise ConfigError(f"tiktoken file {path} is not a valid {name} encoding: {exc}") from None
    encoding = tiktoken.Encoding(
        name=name,
        pat_str=spec.pat_str,
        mergeable_ranks=ranks,
        special_tokens=dict(spec.special_tokens),
    )
    log.info("encoding.loaded", encoding=name, source="file", tokens=encoding.n_vocab)
    return encoding


def _from_tiktoken(name: str, directory: Path | None) -> tiktoken.Encoding:
    try:
        encoding = tiktoken.get_encoding(name)
    except (ValueError, OSError, ImportError) as exc:
        where = f"no {name}.tiktoken in {directory}, and " if directory is not None else ""
        raise ConfigError(
            f"{where}tiktoken cannot load encoding {name!r} ({type(exc).__name__}: {exc}); "
            "set PREFIT_TIKTOKEN_DIR to a folder holding the offline encoding files"
        ) from None
    log.info("encoding.loaded", encoding=name, source="tiktoken", tokens=encoding.n_vocab)
    return encoding
