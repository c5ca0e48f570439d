"""``client.urls`` answers as ``urllib.parse`` does (``rc run`` no longer imports it for
plain URLs: ``tests/cli/test_startup_imports.py``)."""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from resource_controller.client import urls

#: Characters that make a URL piece plain or not: unreserved, reserved, odd and non-ASCII.
PIECES = st.text(
    alphabet=st.sampled_from(list("aZ09_.-~/:@!$&'()*+,;=?#[]% \t\né\u0663")),
    max_size=12,
)
SAFES = st.sampled_from(["/:@!$&'()*+,;=", "$&+=:@", "", "/", "é:"])


@given(text=PIECES, safe=SAFES)
@example(text="é:", safe="é:")  # quote keeps only the ASCII of ``safe``
def test_quote_is_urllibs(text: str, safe: str) -> None:
    assert urls.quote(text, safe=safe) == urllib.parse.quote(text, safe=safe)


@given(pairs=st.lists(st.tuples(PIECES, PIECES), max_size=4))
def test_urlencode_is_urllibs(pairs: list[tuple[str, str]]) -> None:
    assert urls.urlencode(pairs) == urllib.parse.urlencode(pairs)


def _urllib_split(url: str) -> urls.Split:
    parts = urllib.parse.urlsplit(url)
    return urls.Split(parts.scheme, parts.hostname, parts.port, parts.path)


URLS = st.builds(
    lambda scheme, host, port, path: f"{scheme}{host}{port}{path}",
    st.sampled_from(["http://", "https://", "HTTP://", "ftp://", " http://", "http:/", ""]),
    st.one_of(
        st.sampled_from(["127.0.0.1", "ctl.example", "Ctl", "[::1]", "u@h", "", "h_x", "a\tb"]),
        st.text(alphabet="ab.-:9", max_size=6),
    ),
    st.one_of(
        st.just(""),
        st.integers(0, 99999).map(lambda n: f":{n}"),
        st.sampled_from([":", ":08080", ":x", ":\u0663", ":-1", ":+1"]),
    ),
    st.one_of(st.just(""), st.text(alphabet="ab/_.~?#%:", max_size=6).map(lambda p: "/" + p)),
)


@given(url=URLS)
@example(url="http://h:\u0663")  # a digit, but not an ASCII one
@example(url="http://h:99999")
@example(url="http://Ctl:80/")
def test_split_is_urllibs(url: str) -> None:
    try:
        expected = _urllib_split(url)
    except ValueError:
        with pytest.raises(ValueError):
            urls.split(url)
        return
    assert urls.split(url) == expected


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("http://127.0.0.1:8080", ("http", "127.0.0.1", 8080, "")),
        ("https://ctl.example/rc/", ("https", "ctl.example", None, "/rc/")),
        ("http://h:0", ("http", "h", 0, "")),
    ],
)
def test_plain_base_urls_are_split_directly(url: str, parts: tuple[object, ...]) -> None:
    assert urls._split_plain(url) == parts


def test_out_of_range_ports_are_refused_as_urllib_refuses_them() -> None:
    with pytest.raises(ValueError, match="out of range"):
        urls.split("http://h:70000")
