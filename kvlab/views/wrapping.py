"""Fitting text to figures: titles wrapped at phrase boundaries, labels fitted to their cells.

plotly neither wraps titles nor measures text, so the views do both before a
browser draws anything, with DejaVu Sans's advance widths (the views' font).
"""

from __future__ import annotations

import re
from typing import Any

#: The narrowest figure the views are laid out for, in px: a notebook column beside a side panel, or
#: plotly's default 700 px less some room. Titles wrap, labels fit and legends have room at this width.
NARROWEST = 600
HEAD_WIDTH = 62  # characters of a bold 16 px title that fit a 600 px wide figure
SUB_WIDTH = 92  # characters of the 12 px subtitle

# Advance widths of DejaVu Sans (the views' font) for printable ASCII, in thousandths of the font size,
# so that labels can be fitted to their cells before a browser draws them.
_ASCII = "".join(chr(i) for i in range(32, 127))
_WIDTHS = (318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337, *[636] * 10, 337, 337,
           838, 838, 838, 531, 1000, 684, 686, 698, 770, 632, 575, 775, 752, 295, 295, 656, 557, 863, 748, 787,
           603, 787, 695, 635, 611, 732, 684, 989, 685, 611, 685, 390, 337, 390, 838, 500, 500, 613, 635, 550,
           635, 615, 352, 635, 634, 278, 278, 579, 278, 974, 634, 612, 635, 635, 411, 521, 392, 634, 592, 818,
           592, 592, 525, 636, 337, 636, 838)  # fmt: skip
_EM = dict(zip(_ASCII, _WIDTHS, strict=True)) | {"…": 1000, "×": 838, "·": 318, "→": 838, "–": 500}


def text_px(text: str, font_px: float = 10) -> float:
    """How wide ``text`` (one line, no markup) is in DejaVu Sans of ``font_px``; bold is about 10% wider."""
    return sum(_EM.get(ch, 700) for ch in text) * font_px / 1000


#: Runs a title never breaks inside: "Step 3 of 7", a bracketed token list, a number with its unit.
_UNBROKEN = re.compile(r"Step \d+ of \d+|\[[^\[\]]*[\])]|\d[\d,.]* (?:tokens?|blocks?|slots?)\b")
#: What a break after a word costs: nothing after a phrase's end, a little after a comma, most inside one.
_PHRASE_END = (":", "·", ";", "—", "–")


def _break_cost(word: str, following: str) -> int:
    """A break between ``word`` and ``following``: free after a phrase's end, never before a "·"."""
    if following in _PHRASE_END:
        return 8
    if "→" in (word, following):  # "A → B" reads as one phrase: break around the arrow only if it must
        return 6
    if word.endswith(_PHRASE_END):
        return 0
    return 1 if word.endswith(",") else 4


def _units(line: str, width: int) -> list[str]:
    """The words of ``line``, with the words of each ``_UNBROKEN`` run that fits a line joined into one unit."""
    words = line.split()
    spans = [m.span() for m in _UNBROKEN.finditer(line) if m.end() - m.start() <= width]
    units: list[str] = []
    at, last_span = 0, None
    for word in words:
        start = line.index(word, at)
        at = start + len(word)
        span = next((s for s in spans if s[0] <= start < s[1]), None)
        if span is not None and span == last_span:
            units[-1] += " " + word
        else:
            units.append(word)
        last_span = span
    return units


def _wrap_line(line: str, width: int) -> list[str]:
    """One line's breaks: the fewest lines, then breaks at phrase ends, then lines of even length.

    A break goes after a phrase's end (":", "·", ";") where it can, never inside
    "Step N of M" or a short token list, so a title reads in whole phrases.
    """
    units = _units(line, width)
    if not units:
        return []
    n = len(units)

    def length(i: int, j: int) -> int:
        return sum(len(u) for u in units[i:j]) + (j - i - 1)

    # best[i]: (lines, break cost, longest line, -shortest line) of units[i:], and where its first line ends
    best: list[tuple[tuple[int, int, int, int], int]] = [((0, 0, 0, -width), n)] * (n + 1)
    for i in range(n - 1, -1, -1):
        options = []
        for j in range(i + 1, n + 1):
            size = length(i, j)
            if size > width and j > i + 1:
                break
            (lines, cost, longest, less_short), _ = best[j]
            more = _break_cost(units[j - 1], units[j]) if j < n else 0
            options.append(((lines + 1, cost + more, max(longest, size), max(less_short, -size)), j))
        best[i] = min(options)
    out, i = [], 0
    while i < n:
        j = best[i][1]
        out.append(" ".join(units[i:j]))
        i = j
    return out


def wrap(text: str, width: int) -> str:
    """``text`` with ``<br>`` breaks so that no line is wider than ``width`` characters.

    Existing ``<br>`` breaks are kept; plotly does not wrap titles itself.
    Lines break at phrase boundaries where they can (``_wrap_line``), and a
    word longer than ``width`` stays whole on its own line.
    """
    return "<br>".join("<br>".join(_wrap_line(line, width)) or line for line in text.split("<br>"))


def title_text(title: str, subtitle: str | None = None) -> dict[str, Any]:
    text = f"<b>{wrap(title, HEAD_WIDTH)}</b>"
    if subtitle:
        text += f"<br><span style='font-size:12px'>{wrap(subtitle, SUB_WIDTH)}</span>"
    return {"text": text}


def top_margin(
    title: dict[str, Any], axis_on_top: bool = False, head_lines: int = 0, sub_lines: int = 0
) -> int:
    """Room above the plot for the title's lines and, when there, a top axis with its title.

    ``head_lines`` and ``sub_lines`` reserve room for at least that many title
    and subtitle lines, so that the steps of a stepper, whose captions differ in
    length, share one plot area.
    """
    head, _, sub = title["text"].partition("</b>")
    heads = max(head.count("<br>") + 1, head_lines)
    subs = max(sub.count("<br>") if sub else 0, sub_lines)  # the subtitle starts with its own <br>
    return 24 + 21 * heads + 17 * subs + (44 if axis_on_top else 6)


def title_lines(text: str) -> int:
    """How many lines ``text`` takes as a figure's bold title."""
    return wrap(text, HEAD_WIDTH).count("<br>") + 1


def fit_label(text: str, room_px: float, font_px: float = 10) -> str:
    """``text`` in at most two lines no wider than ``room_px``, for a cell whose hover text says it in full.

    A short text stays as it is; a longer one breaks at a space, as late as
    both lines allow ("sample 0" becomes "sample" over "0"; "copy of 2" may
    become "copy" over "of 2"), keeping the end that tells two requests
    apart; only what still does not fit is cut, with an ellipsis.
    """

    def fits(part: str) -> bool:
        return text_px(part, font_px) <= room_px

    if room_px <= 0:
        return ""
    if fits(text):
        return text
    words = text.split(" ")
    for k in range(len(words) - 1, 0, -1):
        head, tail = " ".join(words[:k]), " ".join(words[k:])
        if fits(head) and fits(tail):
            return f"{head}<br>{tail}"
    if len(words) > 1 and fits(words[-1]):
        return f"{cut_to(' '.join(words[:-1]), room_px, font_px)}<br>{words[-1]}"
    return cut_to(text, room_px, font_px)


def cut_to(text: str, room_px: float, font_px: float = 10) -> str:
    """``text``, or as much of it as fits in ``room_px`` followed by an ellipsis."""
    if text_px(text, font_px) <= room_px:
        return text
    while text and text_px(text + "…", font_px) > room_px:
        text = text[:-1]
    return text + "…" if text else ""
