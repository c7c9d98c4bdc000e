import pytest

from relbias.book.words import and_list


def test_and_list_joins_as_prose():
    assert and_list(["T5"]) == "T5"
    assert and_list(["T5", "ALiBi"]) == "T5 and ALiBi"
    assert and_list(("a", "b", "c")) == "a, b and c"


def test_and_list_refuses_an_empty_list():
    with pytest.raises(ValueError, match="items"):
        and_list([])
