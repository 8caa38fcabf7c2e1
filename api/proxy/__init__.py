"""The drop-in proxy: `POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic).

A client points its official SDK at prefit and changes nothing else. For each request the
proxy names the conversation (`identity`), fits its transcript with the stored prepare
(`fitting`: cached summaries and cheap strategies, never an LLM call), forwards the request
with only the messages changed (`relay`, `upstream`), passes the answer back (event by event
when streamed, `streaming`), retries a context-length overflow at a lower pressure
(`overflow`), and after the answer syncs the transcript to the store and feeds the
provider's prompt count to calibration. The two protocols differ only in `openai.py` and
`anthropic.py` (`dialect.Dialect`).
"""
