"""Offline tiktoken encodings: files checked, built like tiktoken builds them, loaded once."""

from __future__ import annotations

import hashlib
import importlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load

from shared.counting.encodings import SPECS, encoding_file, load_encoding
from shared.errors import ConfigError

URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"


def test_files_match_their_published_sums(tiktoken_dir: Path) -> None:
    """Every offline file hashes to its SHA256SUMS line and to the hash tiktoken expects."""
    sums = tiktoken_dir / "SHA256SUMS"
    if not sums.is_file():
        pytest.skip("no SHA256SUMS beside the offline encodings")
    lines = [line.split() for line in sums.read_text().splitlines() if line.strip()]
    assert {name for _, name in lines} >= {f"{n}.tiktoken" for n in SPECS}
    for digest, name in lines:
        assert hashlib.sha256((tiktoken_dir / name).read_bytes()).hexdigest() == digest
        assert SPECS[name.removesuffix(".tiktoken")].sha256 == digest


@pytest.mark.parametrize(
    ("name", "vocab", "hello"),
    [("o200k_base", 200019, [24912, 2375]), ("cl100k_base", 100277, [15339, 1917])],
)
def test_loads_from_the_directory(
    tiktoken_dir: Path, name: str, vocab: int, hello: list[int]
) -> None:
    """An encoding found in the folder is built from that file and encodes as tiktoken does."""
    assert encoding_file(name, tiktoken_dir) == tiktoken_dir / f"{name}.tiktoken"
    enc = load_encoding(name, tiktoken_dir)
    assert enc.name == name
    assert enc.n_vocab == vocab
    assert enc.encode("hello world") == hello
    assert enc.decode(enc.encode("naïve café ☕ ∑")) == "naïve café ☕ ∑"


def test_loaded_once_per_process(tiktoken_dir: Path) -> None:
    """A second load of the same name and folder returns the very same Encoding."""
    assert load_encoding("o200k_base", tiktoken_dir) is load_encoding("o200k_base", tiktoken_dir)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_spec_equals_tiktoken_own_definition(
    tiktoken_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Regex, special tokens and ranks equal tiktoken_ext.openai_public's (fed from a cache)."""
    constructors = importlib.import_module("tiktoken_ext.openai_public").ENCODING_CONSTRUCTORS
    ours = load_encoding(name, tiktoken_dir)
    url = URL.format(name)
    shutil.copy(
        tiktoken_dir / f"{name}.tiktoken", tmp_path / hashlib.sha1(url.encode()).hexdigest()
    )
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))

    def no_network(path: str) -> bytes:
        raise AssertionError(f"tried to fetch {path}")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    reference: dict[str, Any] = constructors[name]()
    assert SPECS[name].pat_str == reference["pat_str"]
    assert SPECS[name].special_tokens == reference["special_tokens"]
    assert ours._mergeable_ranks == reference["mergeable_ranks"]
    assert ours._special_tokens == reference["special_tokens"]


def test_corrupt_file_is_refused(tmp_path: Path) -> None:
    """A file whose hash is not the encoding's raises ConfigError instead of miscounting."""
    (tmp_path / "o200k_base.tiktoken").write_bytes(b"aGVsbG8= 0\n")
    with pytest.raises(ConfigError, match="not a valid o200k_base"):
        load_encoding("o200k_base", tmp_path)


def test_missing_file_falls_back_to_tiktoken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the file, tiktoken.get_encoding is asked (here a fake: no network in tests)."""
    fake = tiktoken.Encoding(
        name="o200k_base",
        pat_str=r"\S+|\s+",
        mergeable_ranks={bytes([b]): b for b in range(256)},
        special_tokens={},
    )
    asked: list[str] = []

    def get_encoding(name: str) -> tiktoken.Encoding:
        asked.append(name)
        return fake

    monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
    assert encoding_file("o200k_base", tmp_path) is None
    assert load_encoding("o200k_base", tmp_path) is fake
    assert asked == ["o200k_base"]


def test_unloadable_encoding_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An encoding neither in the folder nor loadable by tiktoken raises ConfigError."""

    def offline(name: str) -> tiktoken.Encoding:
        raise OSError("network is unreachable")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(ConfigError, match="PREFIT_TIKTOKEN_DIR"):
        load_encoding("cl100k_base", tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="no_such_encoding"):
        load_encoding("no_such_encoding", None)
