"""The transcripts a clone carries: small, licensed, listed in NOTICE, copied unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO_TRANSCRIPTS, ROOT, SHARED

FILES = sorted(REPO_TRANSCRIPTS.glob("*.json"))


def test_a_few_real_transcripts_under_a_megabyte() -> None:
    """Several kinds of conversation, under 1 MB in all."""
    names = [p.name for p in FILES]
    assert sum(p.stat().st_size for p in FILES) < 1_000_000
    for kind in ("mswea_", "tau2_", "taubench_", "toolbench_", "sweagent_plain_"):
        assert any(n.startswith(kind) for n in names), kind


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem[:50])
def test_each_keeps_its_source_and_licence_and_is_in_notice(path: Path) -> None:
    """MIT or Apache-2.0, its source named, NOTICE lists it with both, and it is the file of
    ../shared/transcripts it was copied from, byte for byte, when that folder is here."""
    data = json.loads(path.read_text())
    assert data["license"].startswith(("MIT", "Apache-2.0")) and data["source"]
    notice = (ROOT / "NOTICE").read_text()
    listed = notice.split(f"transcripts/{path.name}\n", 1)
    assert len(listed) == 2 and data["license"] in listed[1].split("\n\n", 1)[0]
    source = SHARED / "transcripts" / path.name
    assert not source.is_file() or source.read_bytes() == path.read_bytes()
