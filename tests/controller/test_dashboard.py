"""The dashboard page over HTTP: served without a token, self-contained, text only
(controller-api.md §13.1, DASH-001..003, DASH-010, DASH-015)."""

from __future__ import annotations

import re
from importlib import resources

from controller_harness import ADMIN, CLIENT, TOKENS, WORKER, Harness

STATIC = resources.files("resource_controller.controller") / "static"


def _static(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def _page(rc: Harness) -> str:
    r = rc.anon.get("/")
    assert r.status_code == 200, r.text
    return r.text


def test_root_answers_without_a_token_with_the_spec_headers(rc: Harness) -> None:
    # DASH-001 / AUTH-001: GET / alone needs no token; html, utf-8, never cached.
    r = rc.anon.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["rc-controller-instance"] == rc.svc.instance  # AUTH-020
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
    # A token sent anyway changes nothing.
    assert rc.client.get("/").text == r.text


def test_only_root_exactly_is_the_page(rc: Harness) -> None:
    # DASH-001 / DASH-002 / AUTH-030: the script and style are inline; no other path.
    for path in ("/index.html", "/dashboard.js", "/dashboard.css", "/static/dashboard.js"):
        assert rc.anon.get(path).status_code == 404, path


def test_style_and_script_are_inline_and_allowed_by_hash(rc: Harness) -> None:
    # DASH-002: one self-contained page; the CSP admits exactly that style and script.
    html = _page(rc)
    script, style = _static("dashboard.js"), _static("dashboard.css")
    assert html.count("<script>") == 1 and script in html
    assert html.count("<style>") == 1 and style in html
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert not re.search(r"<link[^>]*rel=\"stylesheet\"", html)
    csp = rc.anon.get("/").headers["content-security-policy"]
    assert len(re.findall(r"'sha256-[A-Za-z0-9+/=]+'", csp)) == 2


def test_the_page_references_no_other_host(rc: Harness) -> None:
    # DASH-002: no http:, https: or protocol-relative URL anywhere in the page.
    html = _page(rc)
    assert not re.search(r"https?:", html, re.IGNORECASE)
    assert not re.search(r"""(src|href|action)\s*=\s*["']?//""", html, re.IGNORECASE)
    assert not re.search(r"""["'`(]//[A-Za-z0-9]""", html)
    assert "@import" not in html and "url(" not in html
    for tag in re.findall(r"<(?:link|img|script|iframe)\b[^>]*>", html):
        for url in re.findall(r"""(?:src|href)="([^"]*)\"""", tag):
            assert url.startswith("data:"), tag  # the tab icon is a data: URI


def test_the_page_holds_no_credential(rc: Harness) -> None:
    # DASH-001: no token of any role is embedded.
    html = _page(rc)
    for entry in TOKENS.split(","):
        tok = entry.split(":")[0]
        assert not re.search(rf"\b{re.escape(tok)}\b", html), tok
    assert {WORKER, CLIENT, ADMIN} == {e.split(":")[0] for e in TOKENS.split(",")}


def test_the_script_never_builds_markup_from_strings() -> None:
    # DASH-003: DOM text nodes only.
    script = _static("dashboard.js")
    for banned in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "createContextualFragment",
        "DOMParser",
        "eval(",
        "new Function",
        'setTimeout("',
        "href",
    ):
        assert banned not in script, banned


def test_the_script_keeps_credentials_where_the_spec_says() -> None:
    # DASH-010: sessionStorage under rc_token only; never localStorage, cookies or IndexedDB.
    script = _static("dashboard.js")
    assert "localStorage" not in script
    assert "document.cookie" not in script
    assert "indexedDB" not in script
    keys = set(re.findall(r"sessionStorage\.(?:setItem|getItem|removeItem)\(([^,)]+)", script))
    assert keys == {"KEY"}
    assert 'const KEY = "rc_token"' in script
    # DASH-015: the token goes in the query string only for the event stream.
    assert script.count("?token=") == 1
    assert 'new EventSource("/v1/events?token=" + encodeURIComponent(token()))' in script
    # DASH-013: every prompt the page shows asks for an admin token.
    prompts = re.findall(r"prompt\(([^)]*)\)", script)
    assert prompts and all("Admin token" in p for p in prompts)


def test_the_page_uses_the_spec_vocabulary() -> None:
    # DASH-040: every state in words.
    script = _static("dashboard.js")
    for words in (
        'ready: "free"',
        'busy: "in use"',
        'unknown: "not reporting"',
        'unhealthy: "out of the pool"',
        'queued: "waiting for a device"',
        'assigned: "starting"',
        'succeeded: "finished"',
        'killed: "stopped"',
    ):
        assert words in script, words


def test_the_page_is_published_as_a_route_without_a_token(rc: Harness) -> None:
    # API-010 route 25: GET / in the OpenAPI document, no security, an HTML answer.
    doc = rc.client.get("/openapi.json").json()
    op = doc["paths"]["/"]["get"]
    assert op["security"] == []
    assert "text/html" in op["responses"]["200"]["content"]
    assert "401" not in op["responses"]
