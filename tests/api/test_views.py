"""The tip arithmetic an append relies on agrees with the policy on real transcripts."""

from __future__ import annotations

import pytest

from api.views import context_start, known_tail_start
from shared.head import head_end
from shared.policy import ContextPolicy
from tests.conftest import load_transcript, needs_transcripts, transcript_files


@needs_transcripts
@pytest.mark.parametrize("keep_recent", [1, 3, 5])
def test_tail_start_from_any_window_matches_policy_regions(keep_recent: int) -> None:
    """From any suffix window, tail_start is either unknowable or exactly regions()'s tail."""
    policy = ContextPolicy(1_000_000, keep_recent=keep_recent)
    checked = 0
    for path in transcript_files()[::4]:
        msgs = load_transcript(path)["messages"]
        for n in range(1, len(msgs) + 1, 7):
            prefix = msgs[:n]
            head, tail = policy.regions(prefix)
            assert head == head_end(prefix)
            for offset in range(0, n, 5):
                found = known_tail_start(prefix[offset:], offset, head, keep_recent)
                if found is not None:
                    assert found == tail, (path.name, n, offset)
                    checked += 1
            assert known_tail_start(prefix, 0, head, keep_recent) == tail
    assert checked > 100


def test_context_start_is_the_last_turn_groups_first_message() -> None:
    """Validation context: from the last non-tool message (the open tool call) to the end."""
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}]}
    tool = {"role": "tool", "tool_call_id": "a", "content": "x"}
    assert context_start([{"role": "user", "content": "u"}, call, tool, tool]) == 1
    assert context_start([tool, tool]) is None
    assert context_start([]) is None
