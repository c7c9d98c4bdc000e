"""Author-year labels for the book's bibliography (a Sphinx extension, see _config.yml).

The chapters cite with ``bibtex_reference_style: author_year`` ("Raffel et al. [2020]",
"[Raffel et al., 2020]"), so the bibliography labels each entry the same way
("[Raffel et al., 2020]") instead of pybtex's alpha codes ("[RSR+20]"). Registers the pybtex
label style and the formatting style ``relbias_author_year`` (unsrt's entries, sorted by
author, year and title), which ``bibtex_default_style`` names.
"""

from __future__ import annotations

from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle

STYLE = "relbias_author_year"


def _surname(person) -> str:
    parts = [*person.prelast_names, *person.last_names]
    return " ".join(parts).replace("{", "").replace("}", "")


def author_year(entry) -> str:
    """'Raffel et al., 2020', 'Press and Smith, 2022' or 'Su, 2024' for one entry."""
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_surname(p) for p in persons]
    if not names:
        who = entry.fields.get("organization") or entry.fields.get("title", entry.key)
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels 'Author et al., Year', with a, b, ... where two entries would share one."""

    def format_labels(self, sorted_entries):
        labels = [author_year(entry) for entry in sorted_entries]
        count, seen = Counter(labels), Counter()
        for label in labels:
            if count[label] == 1:
                yield label
            else:
                yield label + chr(ord("a") + seen[label])
                seen[label] += 1


class AuthorYearStyle(UnsrtStyle):
    default_label_style = STYLE
    default_sorting_style = "author_year_title"


def setup(app):
    register_plugin("pybtex.style.labels", STYLE, AuthorYearLabelStyle)
    register_plugin("pybtex.style.formatting", STYLE, AuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
