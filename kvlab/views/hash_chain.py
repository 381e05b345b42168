"""Example 6's view: rows of chained block hashes, each block compared with the first row's.

The view hashes nothing: each row is a ``kvlab.core.hashing.HashChain``
(``hash_chain(tokens, block_size, salt=..., scheme=...)``, which also keeps the
tokens each digest covers and the unhashed partial block) or a plain list of
digests (``bytes`` or hex strings, as ``block_hashes`` returns). A block whose
digest differs from the first row's block at the same index is marked; every
later block then differs too, since each hash covers its parent's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from kvlab.core.hashing import HashChain
from kvlab.errors import InvalidArgumentError
from kvlab.views import theme
from kvlab.views._common import (
    Spec,
    base_layout,
    check_title,
    cut_to,
    discrete_colorscale,
    legend_entry,
    legend_height,
    read_pairs,
    text_px,
    title_text,
    tokens_text,
    top_margin,
)

_KINDS = list(theme.CHAIN_COLORS)  # same as the first row, changed, partial block, new
SAME, CHANGED, PARTIAL, NEW = range(4)
MAX_NAME_PX = 280  # widest row name drawn whole, in px of 13 px text; a longer one is cut (its hover has it)


@dataclass(frozen=True)
class _Row:
    name: str
    digests: list[str]  # hex
    texts: list[str]  # each block's tokens, for the hover ("" when only digests were given)
    tail: tuple[int, ...]
    block_size: int | None
    salt: str | None
    scheme: str | None


def _row(name: object, value: object) -> _Row:
    if not isinstance(name, str):
        raise InvalidArgumentError(f"row names must be strings, got {name!r}")
    if isinstance(value, HashChain):
        texts = [tokens_text(block, 16) for block in value.blocks]
        return _Row(name, [d.hex() for d in value.digests], texts, value.tail, value.block_size, value.salt,
                    value.scheme)  # fmt: skip
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgumentError(
            f"chains[{name!r}] must be a kvlab.core.hashing.HashChain or a list of digests (bytes or hex "
            f"strings), got {type(value).__name__}"
        )
    items = list(value)
    if not all(isinstance(v, (bytes, str)) for v in items):
        raise InvalidArgumentError(
            f"chains[{name!r}] holds token ids: hash them first, with "
            f"kvlab.core.hashing.hash_chain(tokens, block_size)"
        )
    return _Row(name, [v.hex() if isinstance(v, bytes) else v for v in items], [""] * len(items), (), None, None,
                None)  # fmt: skip


def _rows(chains: object) -> list[_Row]:
    pairs = read_pairs("chains", chains) if isinstance(chains, Mapping) else []
    if not pairs:
        raise InvalidArgumentError("chains must be a non-empty dict: row name -> HashChain or digests")
    rows = [_row(name, value) for name, value in pairs]
    sizes = sorted({r.block_size for r in rows if r.block_size is not None})
    if len(sizes) > 1:
        raise InvalidArgumentError(
            f"the rows hash blocks of different sizes ({sizes}); compare one block size"
        )
    return rows


def _cells(
    row: _Row, r: int, base: list[str], ncols: int
) -> tuple[list[int | None], list[str], list[str | None]]:
    """(colour codes, labels, hover texts) of one row's blocks, compared with ``base`` (the first row)."""
    zr: list[int | None] = [None] * ncols
    tr = [""] * ncols
    hr: list[str | None] = [None] * ncols
    first_change = next((i for i, d in enumerate(row.digests) if i < len(base) and d != base[i]), None)
    for i, d in enumerate(row.digests):
        if i >= len(base):  # nothing to compare with: the first row never hashed a block here
            zr[i] = NEW
            tr[i] = f"<b>{d[:8]}</b><br>new"
            why = (
                f"<br>new: the first row has no full block {i}, so this hash is computed for the first "
                f"time (a cache holding the first row has nothing for it)"
            )
        else:
            same = d == base[i]
            zr[i] = SAME if same else CHANGED
            mark = "reference" if r == 0 else ("same" if same else "changed")
            tr[i] = f"<b>{d[:8]}</b><br>{mark}"
            why = ""
            if not same and first_change is not None and i > first_change:
                why = f"<br>changed because block {first_change} changed: each hash covers its parent's"
            elif not same:
                why = "<br>its tokens (or salt) differ from the first row's"
        salt = f"<br>salt {row.salt!r}" if row.salt is not None else ""
        tok = f"<br>tokens {row.texts[i]}" if row.texts[i] else ""
        hr[i] = f"<b>{row.name}</b> · block {i}<br>hash {d[:16]}…{tok}{salt}{why}"
    if row.tail:
        i = len(row.digests)
        zr[i] = PARTIAL
        tr[i] = f"{len(row.tail)} tok<br>no hash"
        hr[i] = (
            f"<b>{row.name}</b> · partial block {i}: {len(row.tail)} of {row.block_size} tokens "
            f"{tokens_text(row.tail)}<br>not hashed: its content still changes as tokens are appended"
        )
    return zr, tr, hr


def _subtitle(rows: list[_Row], scheme: str | None) -> str:
    sizes = {r.block_size for r in rows if r.block_size is not None}
    what = f"{sizes.pop()}-token blocks, " if sizes else ""
    if scheme is None:
        schemes = list(dict.fromkeys(r.scheme for r in rows if r.scheme is not None)) or ["lesson"]
    else:
        schemes = [scheme]
    return (
        f"{what}scheme {' / '.join(map(repr, schemes))}: each block's hash covers its parent's hash, so one "
        f"change changes every later hash · compared with {rows[0].name!r} ({len(rows[0].digests)} full blocks)"
    )


def hash_chain_spec(
    chains: Mapping[str, HashChain | Sequence[bytes | str]],
    *,
    scheme: str | None = None,
    title: str | None = None,
) -> Spec:
    """Rows of chained block hashes, each block compared with the first row's block at the same index.

    ``scheme`` names the hash scheme in the subtitle; by default the rows'
    (``HashChain.scheme``), or ``"lesson"`` for rows of bare digests.
    """
    rows = _rows(chains)
    if scheme is not None and not isinstance(scheme, str):
        raise InvalidArgumentError(f"scheme must be a string or None, got {type(scheme).__name__}")
    ncols = max(max(len(r.digests) + (1 if r.tail else 0) for r in rows), 1)
    z, text, hover = zip(*(_cells(row, i, rows[0].digests, ncols) for i, row in enumerate(rows)), strict=True)
    data: list[dict[str, Any]] = [{
        "type": "heatmap", "z": list(z), "text": list(text), "hovertext": list(hover),
        "colorscale": discrete_colorscale([theme.CHAIN_COLORS[k] for k in _KINDS]), "zmin": -0.5,
        "zmax": len(_KINDS) - 0.5, "showscale": False, "xgap": 3, "ygap": 3, "texttemplate": "%{text}",
        "textfont": {"size": 12, "family": theme.MONO_FAMILY}, "hovertemplate": "%{hovertext}<extra></extra>",
        "hoverongaps": False, "name": "hashes",
    }]  # fmt: skip
    used = {code for row in z for code in row if code is not None}
    data += [legend_entry(k, theme.CHAIN_COLORS[k]) for code, k in enumerate(_KINDS) if code in used]
    ttl = title_text(title or "Chained block hashes", _subtitle(rows, scheme))
    top = top_margin(ttl, True)
    plot_h = len(rows) * 56
    names = [cut_to(r.name, MAX_NAME_PX, 13) for r in rows]  # hover texts give a long name in full
    left = int(max(text_px(name, 13) for name in names)) + 16
    bottom = legend_height(data, left=left, font_px=13) + 16
    layout = base_layout(
        ttl,
        height=plot_h + top + bottom,
        margin={"l": left, "r": 20, "t": top, "b": bottom},
        legend={"orientation": "h", "y": -6 / plot_h, "x": 0, "yanchor": "top"},
        xaxis={"range": [-0.5, ncols - 0.5], "tickmode": "array", "tickvals": list(range(ncols)),
               "ticktext": [f"block {i}" for i in range(ncols)], "side": "top", "showgrid": False,
               "zeroline": False, "fixedrange": True},
        yaxis={"range": [len(rows) - 0.5, -0.5], "tickmode": "array", "tickvals": list(range(len(rows))),
               "ticktext": names, "showgrid": False, "zeroline": False, "fixedrange": True},
    )  # fmt: skip
    return {"data": data, "layout": layout}


def hash_chain_figure(
    chains: Mapping[str, HashChain | Sequence[bytes | str]],
    *,
    scheme: str | None = None,
    title: str | None = None,
) -> go.Figure:
    """Example 6: chained block hashes per row; blocks whose hash differs from the first row's are marked.

    ``chains`` maps a row name to a ``kvlab.core.hashing.hash_chain(tokens,
    block_size, salt=..., scheme=...)`` (hover texts then show each block's
    tokens, its salt and the unhashed partial block) or to bare digests
    (``bytes`` or hex strings, as ``block_hashes`` returns).
    """
    return go.Figure(hash_chain_spec(chains, scheme=scheme, title=check_title(title)))
