"""aider's prompt shape, as aider 0.86 sends it (recorded once against a fake provider).

Every prompt opens with the system prompt and, for models that take examples as messages,
a fixed few-shot exchange (the example request "Change get_factorial() to use
math.factorial" and its answer, a second example, then "I switched to a new code base..." /
"Ok."). Then the finished turns (the person's requests, the answers with their edit blocks,
"I updated the files." / "Ok." after each applied edit), then the files in the chat with
their canned reply, then the current message, with the edit-format reminder appended to it
(or sent as a trailing system message, for models that take it so). Only the structure and
short texts are kept here; the bodies are filler of the recorded sizes.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]

SYSTEM = "Act as an expert software developer.\nAlways use best practices when coding.\n" + (
    "Describe each change with a *SEARCH/REPLACE block*. " * 120
)
EXAMPLES: list[Message] = [
    {"role": "user", "content": "Change get_factorial() to use math.factorial"},
    {
        "role": "assistant",
        "content": "To make this change we need to modify `mathweb/flask/app.py` to:\n\n"
        "1. Import the math package.\n2. Remove the existing factorial() function.\n\n"
        "mathweb/flask/app.py\n```python\n<<<<<<< SEARCH\nfrom flask import Flask\n=======\n"
        "import math\nfrom flask import Flask\n>>>>>>> REPLACE\n```\n",
    },
    {"role": "user", "content": "Refactor hello() into its own file."},
    {
        "role": "assistant",
        "content": "To make this change we need to modify `main.py` and make a new file "
        "`hello.py`:\n\nhello.py\n```python\n<<<<<<< SEARCH\n=======\ndef hello():\n"
        '    print("hello")\n>>>>>>> REPLACE\n```\n',
    },
    {
        "role": "user",
        "content": "I switched to a new code base. Please don't consider the above files or "
        "try to edit them any longer.",
    },
    {"role": "assistant", "content": "Ok."},
]
FILES_PREFIX = (
    "I have *added these files to the chat* so you can go ahead and edit them.\n\n"
    "*Trust this message as the true contents of these files!*\n"
)
FILES_REPLY = "Ok, any changes I propose will be to those files."
REMINDER = "# *SEARCH/REPLACE block* Rules:\n\nEvery *SEARCH/REPLACE block* must use this format."
UPDATED: list[Message] = [
    {"role": "user", "content": "I updated the files."},
    {"role": "assistant", "content": "Ok."},
]


def edit_turns() -> list[Message]:
    """Two requests of the person's among aider's acknowledged context: the file listing and
    its canned reply before the first, "I updated the files." / "Ok." after its answer."""
    return [
        {"role": "user", "content": FILES_PREFIX + "a.py"},
        {"role": "assistant", "content": FILES_REPLY},
        {"role": "user", "content": "Rename foo to bar in a.py"},
        {"role": "assistant", "content": "Done, see the edit block."},
        *UPDATED,
        {"role": "user", "content": "Now run the tests"},
    ]


def answer(step: int, size: int) -> Message:
    """An edit answer of about `size` characters."""
    body = f"def step_{step}():\n" + "    value = compute(value)  # refine\n" * (size // 36)
    return {
        "role": "assistant",
        "content": f"I will edit app.py for step {step}.\n\napp.py\n```python\n<<<<<<< SEARCH\n"
        f"{body}=======\n{body}>>>>>>> REPLACE\n```\n",
    }


def files(step: int, size: int) -> list[Message]:
    """The chat-files pair: the current contents of the edited file, and the canned reply."""
    listing = "app.py\n```python\n" + f"# version {step}\n" + "x = compute(x)\n" * (size // 15)
    return [
        {"role": "user", "content": FILES_PREFIX + listing + "```\n"},
        {"role": "assistant", "content": FILES_REPLY},
    ]


def request(step: int, task: str) -> str:
    """What the person (or aider's lint reflection) says at `step`; the task at step 0."""
    if step == 0:
        return task
    if step % 3 == 0:
        return f"# Fix any errors below, if possible.\n\napp.py:{step}: E501 line too long"
    return f"Now also handle case {step} in app.py"


def prompts(
    task: str,
    steps: int,
    *,
    examples: bool = True,
    reminder: str = "user",
    answer_chars: int = 1500,
    file_chars: int = 2000,
) -> list[list[Message]]:
    """The prompt aider sends at each step of a session whose person asked `task` first."""
    head: list[Message] = [{"role": "system", "content": SYSTEM}]
    if examples:
        head += EXAMPLES
    done: list[Message] = []
    out = []
    for step in range(steps):
        cur: Message = {"role": "user", "content": request(step, task)}
        sent = {**cur, "content": cur["content"] + "\n\n" + REMINDER} if reminder == "user" else cur
        tail = [{"role": "system", "content": REMINDER}] if reminder == "sys" else []
        out.append([*head, *done, *files(step, file_chars), sent, *tail])
        done += [cur, answer(step, answer_chars), *UPDATED]
    return out


NO_FILES: list[Message] = [
    {"role": "user", "content": "I am not sharing any files that you can edit yet."},
    {"role": "assistant", "content": "Ok."},
]
AFFIRMED = "Understood. Send me the first build log."
MAP_REPLY = "Ok, I won't try and edit those files without asking first."


def run_output(step: int, size: int) -> Message:
    """What `/run` adds to the chat (aider's `run_output` prompt): a build log of `size`."""
    log = "".join(
        f"src/mod{step}_{k}.c:{k}: warning: unused variable 'tmp'\n" for k in range(size // 48)
    )
    return {
        "role": "user",
        "content": f"I ran this command:\n\nmake -j4 step{step}\n\nAnd got this output:\n\n{log}",
    }


def repo_map(size: int) -> list[Message]:
    """The repository map aider hands over after its examples, and its canned reply."""
    listing = "".join(f"src/mod{k}.c:\n  int build_{k}(void);\n" for k in range(size // 40))
    prefix = (
        "Here are summaries of some files present in my git repository.\n"
        "Do not propose changes to these files, treat them as *read-only*.\n"
    )
    return [
        {"role": "user", "content": prefix + listing},
        {"role": "assistant", "content": MAP_REPLY},
    ]


def run_prompts(
    request: str,
    steps: int,
    *,
    log_chars: int = 3000,
    answer_chars: int = 600,
    map_chars: int = 0,
) -> list[list[Message]]:
    """The prompt aider sends at each step of a session with no files in the chat whose
    person states `request`, answered by a short affirmation, then pastes a build log with
    `/run` (added with aider's "Ok.") and asks about it, step after step; with a repository
    map of `map_chars` when not 0."""
    head: list[Message] = [{"role": "system", "content": SYSTEM}, *EXAMPLES]
    head += repo_map(map_chars) if map_chars else []
    done: list[Message] = []
    out = []
    for step in range(steps):
        ask: Message = {"role": "user", "content": f"Why does build {step} warn, and is it safe?"}
        cur = (
            [{"role": "user", "content": request}]
            if step == 0
            else [run_output(step, log_chars), {"role": "assistant", "content": "Ok."}, ask]
        )
        sent = {**cur[-1], "content": cur[-1]["content"] + "\n\n" + REMINDER}
        out.append([*head, *done, *NO_FILES, *cur[:-1], sent])
        reply = AFFIRMED if step == 0 else f"Build {step} is safe. " + "z" * answer_chars
        done += [*cur, {"role": "assistant", "content": reply}]
    return out
