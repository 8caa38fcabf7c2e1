"""`prefit inspect`: a picture of what prepare keeps, shortens, clears, summarizes or drops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.commands import inspect as inspect_module
from shared.commands.inspect import fates, inspect_command
from shared.counting.counters import HeuristicCounter
from shared.errors import ConfigError
from shared.policy import ContextPolicy
from tests.conftest import needs_transcripts
from tests.shared import aider
from tests.shared.strategies.test_strategies import agent

pytestmark = pytest.mark.anyio


def test_picture_shows_every_fate_with_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A long agent run shows head, cleared and kept groups and the token totals."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"messages": agent(60)}))
    assert (
        inspect_command([str(path), "--window", "12000", "--reserve-output", "1000", "--no-color"])
        == 0
    )
    out = capsys.readouterr().out
    assert "122 messages, 61 turn groups; budget 11000 tokens" in out
    for fate in ("head", "kept", "cleared"):
        assert fate in out
    assert "applied: ClearToolResults" in out


def test_unreadable_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A malformed transcript exits 2 with the reason, not a traceback."""
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"role": "wizard", "content": "x"}]))
    assert inspect_command([str(path), "--window", "8000"]) == 2
    assert "message 0: unknown role 'wizard'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"\xff\xfe not text", "can't decode byte 0xff"),
        (b"5", "expected {'messages': [...]} or a list of messages"),
        (b'{"tools": []}', "expected {'messages': [...]} or a list of messages"),
        (b"# a README", "Expecting value"),
    ],
)
def test_a_file_that_is_not_a_transcript_is_a_clear_error(
    content: bytes, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes that are not UTF-8, or JSON that is not a transcript, exit 2 naming the file and
    the reason, not with a traceback."""
    path = tmp_path / "odd.json"
    path.write_bytes(content)
    assert inspect_command([str(path), "--window", "8000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prefit inspect: cannot read {path}: ") and reason in err, err


@needs_transcripts
def test_real_transcript_with_exact_counter(
    capsys: pytest.CaptureFixture[str], tiktoken_dir: Path
) -> None:
    """Works on a real transcript with the tiktoken counter."""
    from tests.conftest import TRANSCRIPTS

    path = TRANSCRIPTS / "mswea_gemini3pro__django__django-13933.json"
    assert (
        inspect_command([str(path), "--window", "32000", "--counter", "tiktoken", "--no-color"])
        == 0
    )
    assert "132 messages" in capsys.readouterr().out


def test_tiktoken_that_cannot_load_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--counter tiktoken without its files exits 2 with the loader's reason, no traceback."""

    def unloadable(**_: object) -> None:
        raise ConfigError("tiktoken cannot load encoding 'o200k_base' (offline)")

    monkeypatch.setattr(inspect_module, "TiktokenCounter", unloadable)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"messages": agent(3)}))
    assert inspect_command([str(path), "--window", "8000", "--counter", "tiktoken"]) == 2
    assert "prefit inspect: tiktoken cannot load encoding" in capsys.readouterr().err


async def test_a_request_kept_in_a_cut_template_is_a_head_cell() -> None:
    """aider's request kept inside a cut template shows as head, the map dropped before it."""
    msgs = aider.run_prompts("Fix the build warnings", 30, map_chars=4000)[-1]
    policy = ContextPolicy(8_000, counter=HeuristicCounter(), reserve_output=512)
    cells = {a: fate for a, _, fate in fates(msgs, await policy.cut(msgs))}
    assert cells[9] == "head" and cells[7] == "dropped"  # the request; the repository map
