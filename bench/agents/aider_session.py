"""One scripted aider session, run by aider's own Python (its venv, outside this repository).

    /tmp/aider-venv/bin/python bench/agents/aider_session.py --model openai/agent-model \
        --sid abcd1234 --task "TASK-MARKER-abcd1234: ..." --turns 40 --command "..."

Aider has no tools: a person types, `/run` adds a command's output to the chat. So one
session is aider's scripting API (`Coder.run`, one process, one chat history): the task
first, then per turn `/run <command printing a large log>` (added to the chat, as a person
confirming "add output to the chat?") and a message asking about it, which is the request
the provider sees. `--command` holds `{turn}` where the turn number goes. The provider
(bench/agents/brain.py) answers plain text, or SEARCH/REPLACE edits that aider applies.
Environment: OPENAI_API_BASE, OPENAI_API_KEY (set by bench/agents/run.py).
"""

from __future__ import annotations

import argparse


def main() -> None:
    from aider.coders import Coder
    from aider.io import InputOutput
    from aider.models import Model

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--sid", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--command", required=True)
    args = parser.parse_args()
    io = InputOutput(yes=True, pretty=False, fancy_input=False)
    model = Model(args.model)
    coder = Coder.create(
        main_model=model,
        io=io,
        fnames=["README.md"],
        use_git=False,
        auto_commits=False,
        dirty_commits=False,
        auto_lint=False,
        map_tokens=0,
        suggest_shell_commands=False,
        detect_urls=False,
        stream=True,
    )
    coder.run(with_message=args.task)
    for turn in range(1, args.turns + 1):
        coder.run(with_message="/run " + args.command.replace("{turn}", str(turn)))
        coder.run(
            with_message=f"AGENTRUN sid={args.sid} turn={turn}: that is the log of step "
            f"{turn}. What does it show?"
        )
    print(f"aider session {args.sid}: {args.turns} turns sent")


if __name__ == "__main__":
    main()
