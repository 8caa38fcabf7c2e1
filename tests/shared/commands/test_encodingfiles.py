"""Installing tiktoken's files: copied from a folder or fetched by tiktoken, checked either way.

No network here: the download path runs tiktoken's own `read_file_cached` with its one reader,
`tiktoken.load.read_file`, replaced for URLs by a fake that serves the offline bytes (or bad
ones); local paths still read the disk.
"""

from __future__ import annotations

import hashlib
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import tiktoken.load

from shared.commands import cli
from shared.commands.encodingfiles import install_encodings
from shared.counting.encodings import SPECS, load_encoding
from shared.errors import ConfigError
from shared.settings import Settings

NAME = "cl100k_base"  # the smaller file: these tests parse what they install
LOCAL_READ = tiktoken.load.read_file  # tiktoken reads local files through it too


def corrupt_copy(source: Path, folder: Path) -> Path:
    """A copy of the encoding file with one byte changed."""
    folder.mkdir(parents=True, exist_ok=True)
    data = bytearray((source / f"{NAME}.tiktoken").read_bytes())
    data[100] ^= 0x01
    path = folder / f"{NAME}.tiktoken"
    path.write_bytes(bytes(data))
    return path


@pytest.fixture
def fetched(
    tiktoken_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[bytes | None], list[str]]:
    """Points TIKTOKEN_CACHE_DIR at an empty folder and fakes the network: each fetch serves
    the offline file (or the bytes given) and is recorded in the list returned."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    urls: list[str] = []

    def serve(body: bytes | None = None) -> list[str]:
        def read_file(url: str) -> bytes:
            if "://" not in url:
                return LOCAL_READ(url)
            urls.append(url)
            return body if body is not None else (tiktoken_dir / url.rsplit("/", 1)[1]).read_bytes()

        monkeypatch.setattr(tiktoken.load, "read_file", read_file)
        return urls

    return serve


def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_file(url: str) -> bytes:
        if "://" not in url:
            return LOCAL_READ(url)
        raise OSError(f"network is unreachable (test): {url}")

    monkeypatch.setattr(tiktoken.load, "read_file", read_file)


def test_copies_the_files_of_a_source_folder(tiktoken_dir: Path, tmp_path: Path) -> None:
    """Every encoding is copied byte for byte, readable by all, and loads from its new folder."""
    into = tmp_path / "into"
    installed = install_encodings(into, tiktoken_dir)
    assert [(e.name, e.origin) for e in installed] == [(n, "copied") for n in SPECS]
    for enc in installed:
        assert enc.path == into / f"{enc.name}.tiktoken"
        assert enc.path.read_bytes() == (tiktoken_dir / enc.path.name).read_bytes()
        assert stat.S_IMODE(enc.path.stat().st_mode) == 0o644
    assert load_encoding(NAME, into).encode("hello world") == [15339, 1917]


def test_a_corrupted_source_file_is_refused_and_nothing_written(
    tiktoken_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source file whose SHA-256 is wrong raises ConfigError; no file, not even half, lands."""
    no_network(monkeypatch)
    bad = corrupt_copy(tiktoken_dir, tmp_path / "src")
    into = tmp_path / "into"
    with pytest.raises(ConfigError, match=f"{bad} is not the {NAME} encoding: its SHA-256"):
        install_encodings(into, bad.parent, [NAME])
    assert list(into.iterdir()) == []


def test_files_missing_from_the_source_are_fetched_by_tiktoken(
    tiktoken_dir: Path, tmp_path: Path, fetched: Callable[[bytes | None], list[str]]
) -> None:
    """What the source lacks, tiktoken downloads (checked, cached in TIKTOKEN_CACHE_DIR)."""
    urls = fetched(None)
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(tiktoken_dir / "o200k_base.tiktoken", src)
    installed = install_encodings(tmp_path / "into", src)
    assert {e.name: e.origin for e in installed} == {"o200k_base": "copied", NAME: "downloaded"}
    assert urls == [SPECS[NAME].url]
    cached = tmp_path / "tiktoken-cache" / hashlib.sha1(SPECS[NAME].url.encode()).hexdigest()
    assert cached.read_bytes() == (tiktoken_dir / f"{NAME}.tiktoken").read_bytes()
    assert load_encoding(NAME, tmp_path / "into").encode("hello world") == [15339, 1917]


def test_a_corrupted_download_is_refused_by_tiktoken(
    tmp_path: Path, fetched: Callable[[bytes | None], list[str]]
) -> None:
    """Downloaded bytes with the wrong hash: tiktoken refuses them, ConfigError, nothing kept."""
    fetched(b"aGVsbG8= 0\n")
    into = tmp_path / "into"
    with pytest.raises(ConfigError, match=f"tiktoken refused the download of {NAME}: Hash"):
        install_encodings(into, None, [NAME])
    assert list(into.iterdir()) == []
    assert not (tmp_path / "tiktoken-cache").exists()


def test_no_network_and_no_source_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline without the files: the error names both ways of handing them over."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    no_network(monkeypatch)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"--from DIR, or docker build --build-context tiktoken"):
        install_encodings(tmp_path / "into", tmp_path / "empty", [NAME])


def test_a_good_file_in_place_is_kept_and_a_bad_one_replaced(
    tiktoken_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-running is cheap and offline; a corrupted file already in the folder is replaced."""
    no_network(monkeypatch)
    into = tmp_path / "into"
    corrupt_copy(tiktoken_dir, into)
    [first] = install_encodings(into, tiktoken_dir, [NAME])
    [again] = install_encodings(into, None, [NAME])
    assert (first.origin, again.origin) == ("copied", "present")
    assert again.path.read_bytes() == (tiktoken_dir / f"{NAME}.tiktoken").read_bytes()


def test_an_unknown_encoding_is_refused(tmp_path: Path) -> None:
    """A name prefit has no SHA-256 for is a ConfigError, before anything is fetched."""
    with pytest.raises(ConfigError, match="unknown encodings \\['p50k_base'\\]"):
        install_encodings(tmp_path, None, ["p50k_base"])


@pytest.fixture
def quiet_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.main configures structlog onto the current stderr: under capsys that stream closes
    after the test, and every later test's log line would fail on it."""
    monkeypatch.setattr(cli, "configure_logging", lambda **_: None)


@pytest.mark.usefixtures("quiet_cli")
def test_the_command_installs_and_reports(
    tiktoken_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`prefit encodings DIR --from SRC` prints each file, its origin and hash; exit 0."""
    code = cli.main(["encodings", str(tmp_path), "--from", str(tiktoken_dir), "--name", NAME])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()  # structlog's unconfigured output too
    assert f"{tmp_path / f'{NAME}.tiktoken'}  copied  sha256 {SPECS[NAME].sha256}" in lines


@pytest.mark.usefixtures("quiet_cli")
def test_the_command_fails_cleanly(
    tiktoken_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A corrupted source exits 1 with the reason; no folder at all exits 2."""
    no_network(monkeypatch)
    bad = corrupt_copy(tiktoken_dir, tmp_path / "src")
    argv = ["encodings", str(tmp_path / "into"), "--from", str(bad.parent), "--name", NAME]
    assert cli.main(argv) == 1
    assert f"prefit encodings: {bad} is not the {NAME} encoding" in capsys.readouterr().err
    monkeypatch.setattr(cli, "get_settings", lambda: Settings(tiktoken_dir=None))
    assert cli.main(["encodings"]) == 2
    assert "PREFIT_TIKTOKEN_DIR" in capsys.readouterr().err


def test_a_source_folder_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    """A mistyped --from is named, not silently replaced by a download."""
    with pytest.raises(ConfigError, match=r"--from .*nope: no such folder"):
        install_encodings(tmp_path / "into", tmp_path / "nope", [NAME])
    assert not (tmp_path / "into").exists()


@pytest.mark.usefixtures("quiet_cli")
def test_a_folder_that_cannot_be_made_exits_1_without_a_traceback(
    tiktoken_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An install folder under a file exits 1 with a one-line reason."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    argv = ["encodings", str(blocker / "into"), "--from", str(tiktoken_dir), "--name", NAME]
    assert cli.main(argv) == 1
    assert f"prefit encodings: cannot make the folder {blocker / 'into'}" in (
        capsys.readouterr().err
    )
