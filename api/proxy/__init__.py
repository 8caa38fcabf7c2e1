"""The drop-in proxy: `POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic).

A client points its official SDK at prefit and changes nothing else. For each request the
proxy names the caller and the conversation (`identity`), fits its transcript with the
stored prepare (`relay`: cached summaries and cheap strategies, never an LLM call),
forwards the request with only the messages changed (`relay`, to the providers of
`upstream`), passes the answer back (event by event when streamed, `streaming`), retries a
context-length overflow at a lower pressure (`overflow`), and after the answer syncs the
transcript to the store and feeds the provider's prompt count to calibration. The provider
protocols differ only in `dialects` (`openai`, `anthropic`, `responses`: `dialects.Dialect`,
each owning its provider: its upstream, its overflow errors, its counts); `routes` says
which endpoints are fitted, passed through, or refused; `services` holds the proxy's own
parts per app (the dialects, the upstream clients, the windows learned, the resent bodies
of `bodies`).
"""
