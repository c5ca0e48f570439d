"""The array spec as Slurm writes it and the per-pass cap (EXT-ARRAY-1); pure."""

from __future__ import annotations

import pytest

from resource_controller.core import arrays
from resource_controller.core.arrays import ArrayCaps, ArraySpecError


@pytest.mark.parametrize(
    ("text", "indexes", "cap"),
    [
        ("0-4", (0, 1, 2, 3, 4), 0),
        ("0-9:3", (0, 3, 6, 9), 0),
        ("1,4,9", (1, 4, 9), 0),
        ("9,1,4-5", (1, 4, 5, 9), 0),
        ("0-99%8", tuple(range(100)), 8),
        (" 7 ", (7,), 0),
        ("0-9999", tuple(range(10_000)), 0),
    ],
)
def test_specs_parse_to_their_indexes_in_order(
    text: str, indexes: tuple[int, ...], cap: int
) -> None:
    spec = arrays.parse(text)
    assert (spec.indexes, spec.max_running, spec.text) == (indexes, cap, text.strip())


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("5-1", "range 5-1 runs backwards"),
        ("0-20000", "more than 10000 tasks"),
        ("0-9999,10000", "more than 10000 tasks"),
        ("0-9:0", "step of 0-9:0"),
        ("1,1", "index 1 is given twice"),
        ("0-3%0", "%N cap"),
        ("0-3%x", "%N cap"),
        ("", "no indexes"),
        ("%4", "no indexes"),
        ("a-b", "'a-b' is not an index"),
        ("-1", "'-1' is not an index"),
        ("1,,2", "'' is not an index"),
        ("0-99999999999", "indexes go up to"),
    ],
)
def test_bad_specs_are_refused_naming_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(ArraySpecError, match=None) as caught:
        arrays.parse(text)
    assert said in str(caught.value)


def test_the_caps_admit_up_to_n_and_read_each_array_once() -> None:
    reads: list[str] = []

    def read(array_id: str) -> tuple[int, int]:
        reads.append(array_id)
        return {"capped": (3, 1), "open": (0, 0)}[array_id]

    caps = ArrayCaps(read)
    assert caps.admits("") and caps.admits("open")
    assert caps.admits("capped")
    caps.placed("capped")
    assert caps.admits("capped") and "capped" not in caps.full
    caps.placed("capped")
    assert "capped" in caps.full and not caps.admits("capped")
    caps.placed("open")
    assert caps.admits("open")
    assert reads == ["open", "capped"]
