"""/docs and /redoc work offline: every file they load is served by the app itself."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

PLAIN = {"Authorization": ""}  # the docs need no key


def referenced(html: str) -> list[str]:
    """The URLs a docs page loads: its src= and href= attributes, and the spec's url."""
    found = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    found += re.findall(r"""\burl: ?["']([^"']+)["']""", html)  # Swagger UI's openapi.json
    found += re.findall(r"""spec-url=["']([^"']+)["']""", html)  # ReDoc's
    return found


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_load_only_local_files_that_answer(client: TestClient, page: str) -> None:
    """The page names no other host (no CDN), and each file it loads answers 200 here."""
    r = client.get(page, headers=PLAIN)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "://" not in r.text, re.findall(r"\S*://\S*", r.text)
    urls = referenced(r.text)
    assert any(u.endswith(".js") for u in urls) and "/openapi.json" in urls, urls
    for url in urls:
        assert url.startswith("/"), url
        got = client.get(url, headers=PLAIN)
        assert got.status_code == 200 and got.content, (url, got.status_code)
