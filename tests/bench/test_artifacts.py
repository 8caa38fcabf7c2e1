"""The artifact benchmark's measuring rules: its extractor and the masking baseline."""

from __future__ import annotations

from bench.artifacts import MASK, artifacts, mask
from shared.counting.counters import HeuristicCounter
from shared.messages import Message


def test_extractor_finds_each_kind_of_artifact() -> None:
    """Paths, identifiers, error names, booking ids, URLs and long numbers; not prose."""
    text = (
        "Edit src/pkg/core.py and setup.cfg: parse_header raised ValueError in MyParser; "
        "booking ZFA04Y, order #W2378156, see https://x.org/a?b=1, total 1,234.50 on the table"
    )
    found = artifacts(text)
    for want in ("src/pkg/core.py", "setup.cfg", "parse_header", "ValueError", "MyParser",
                 "ZFA04Y", "#W2378156", "https://x.org/a?b=1", "1,234.50"):  # fmt: skip
        assert want in found, want
    assert not {"Edit", "total", "table"} & found


def _turn(i: int, size: int) -> list[Message]:
    call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": f"step {i}", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": "x " * size},
    ]


def test_masking_blanks_the_oldest_outputs_first_and_fits() -> None:
    """Observation masking keeps every call, blanks outputs oldest first, and fits the budget;
    a prompt under the budget is left as it is."""
    counter = HeuristicCounter()

    def tokens(msgs: list[Message]) -> int:
        return counter.count(msgs)

    prompt: list[Message] = [{"role": "user", "content": "task"}]
    for i in range(10):
        prompt += _turn(i, 400)
    assert mask(prompt, tokens(prompt), tokens) == prompt
    budget = tokens(prompt) // 2
    out = mask(prompt, budget, tokens)
    assert tokens(out) <= budget and len(out) == len(prompt)
    blanked = [i for i, m in enumerate(out) if m.get("content") == MASK]
    assert blanked and blanked == [
        i for i in range(len(out)) if i <= blanked[-1] and i % 2 == 0 and i
    ]
    assert out[-1] == prompt[-1]
