"""Real agent CLIs (Claude Code, Codex, aider) run through prefit against a fake provider."""
