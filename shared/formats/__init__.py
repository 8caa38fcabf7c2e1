"""Wire formats prefit converts to and from its OpenAI chat form, losslessly.

Anthropic Messages (`anthropic`, built on the content-block checks of `blocks`), the
OpenAI Responses API (`responses`) and the Gemini API's contents (`gemini`).
"""

from shared.formats.anthropic import (
    from_anthropic,
    to_anthropic,
    tools_from_anthropic,
    tools_to_anthropic,
)

__all__ = ["from_anthropic", "to_anthropic", "tools_from_anthropic", "tools_to_anthropic"]
