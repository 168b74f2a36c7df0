"""A token tree's verify step as HTML: depth columns, siblings stacked, the accepted path highlighted.

Pure functions over a tree Proposal (``parents`` set) and its Verification. Each node is a chip with its
draft probability q under it; it is accepted (✓, on the path), rejected (✗, struck: a sibling the target
tried and refused), or never checked (⊘, dimmed: under a node that was not accepted). A node spans the rows
of its leaves (CSS grid), so a 16-node tree takes as many rows as it has leaves.
"""

from __future__ import annotations

import html
from collections.abc import Callable

from explorer.decoding.events import DraftCheck, Proposal, Verification

Piece = Callable[[int], str]  # token id -> its text
Chip = Callable[[str, str, str], str]  # (text, state, hover title) -> a token chip (render's)

MAX_PIECE_CHARS = 10  # a long token is cut in the tree (its full text is in the hover)
MAX_TRIES_SAID = 4  # the narration names at most this many siblings tried at one depth


def is_tree(proposal: Proposal | None) -> bool:
    """A tree proposal (``parents`` set), as opposed to a chain's."""
    return proposal is not None and proposal.parents is not None


def leaf_rows(parents: tuple[int, ...]) -> list[tuple[int, int]]:
    """(first row, rows spanned) per node: its leaves, numbered depth-first in sibling order."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    span = [0] * len(parents)
    start = [0] * len(parents)
    row = 0

    def visit(node: int) -> None:
        nonlocal row
        start[node] = row
        kids = children.get(node, [])
        if not kids:
            row += 1
        for kid in kids:
            visit(kid)
        span[node] = row - start[node]

    for top in children.get(-1, []):
        visit(top)
    return list(zip(start, span, strict=True))


def _depths(parents: tuple[int, ...]) -> list[int]:
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


def _node_chip(chip: Chip, piece: str, state: str, title: str, q: float) -> str:
    short = piece if len(piece) <= MAX_PIECE_CHARS else piece[: MAX_PIECE_CHARS - 1] + "…"
    return f'{chip(short, state, title)}<span class="q">{q:.2f}</span>'


def _node_state(node: int, depth: int, check: DraftCheck | None, kept: set[int], proposal: Proposal,
                verified: bool) -> tuple[str, str]:
    q = proposal.q[node]
    where = f"depth {depth} · node {node + 1} · q = {q:.3f}"
    if not verified:
        return "pending", f"{where} (waiting for the target)"
    if check is None:
        return "discarded", f"{where} · never checked: its parent was not accepted"
    numbers = f"p = {check.p:.3f} · q = {check.q:.3f} · min(1, p/q) = {check.accept_prob:.3f}"
    if check.accepted and node in kept:
        return "accepted", f"{where} · accepted · {numbers}"
    if check.accepted:
        return "discarded", f"{where} · accepted but cut (EOS / length) · {numbers}"
    return "rejected", f"{where} · rejected · {numbers} (the next sibling is tried against the residual)"


def tree_grid_html(proposal: Proposal, ver: Verification | None, piece: Piece, chip: Chip) -> str:
    """The drafted tree as a grid: column d holds depth d, a node spans its leaves' rows."""
    parents = proposal.parents or ()
    if not parents:
        return ""
    checks = {c.node: c for c in ver.checks} if ver is not None else {}
    path = list(ver.path or ()) if ver is not None else []
    kept = set(path[: max(0, len(ver.emitted) - 1)]) if ver is not None else set()
    if ver is not None and len(ver.emitted) > len(path):  # the path and the target's token all kept
        kept = set(path)
    depths = _depths(parents)
    cells = []
    for node, ((row, span), depth) in enumerate(zip(leaf_rows(parents), depths, strict=True)):
        state, title = _node_state(node, depth, checks.get(node), kept, proposal, ver is not None)
        on_path = " on-path" if node in path else ""
        cells.append(f'<span class="tnode{on_path}" style="grid-column:{depth};grid-row:{row + 2} / span {span}">'
                     f"{_node_chip(chip, piece(proposal.tokens[node]), state, title, proposal.q[node])}</span>")
    columns = max(depths)
    heads = [f'<span class="thead" style="grid-column:{d};grid-row:1">depth {d}</span>' for d in range(1, columns + 1)]
    cells = heads + cells
    return (f'<span class="tree" role="group" aria-label="drafted token tree, {len(parents)} nodes" '
            f'style="grid-template-columns:repeat({columns}, max-content)">{"".join(cells)}</span>')


def tree_step_html(proposal: Proposal, ver: Verification | None, piece: Piece, kept: list[str], title: str,
                   chip: Chip) -> str:
    """One tree step: the kept tokens on top (as a chain step), the tree under them (shown for the latest step;
    earlier steps show a one-line summary instead)."""
    n = len(proposal.tokens)
    accepted = ver.accepted if ver is not None else 0
    summary = (f'<span class="tree-sum">tree of {n}: {accepted} accepted</span>' if ver is not None
               else f'<span class="tree-sum">tree of {n}, waiting for the target</span>')
    pending = " pending" if ver is None else ""
    grid = tree_grid_html(proposal, ver, piece, chip)
    return (f'<span class="step tree-step{pending}" title="{html.escape(title, quote=True)}">'
            f'<span class="kept">{"".join(kept) or "&#8203;"}</span>{summary}{grid}</span>')


def tree_narration(proposal: Proposal, ver: Verification | None, piece: Piece, quote: Callable[[str], str],
                   step: str) -> str:
    """What a tree step did, in words: the tree, each depth's tries, the kept path and the target's token."""
    parents = proposal.parents or ()
    depths = _depths(parents)
    shape = (f"a tree of {len(parents)} nodes ({sum(p < 0 for p in parents)} at depth 1, "
             f"{max(depths, default=0)} deep)")
    if ver is None:
        return (f"{step}: the {html.escape(proposal.drafter)} drafter proposed {shape}; the target will check every "
                "node in <b>one</b> pass, each node seeing only its ancestors.")
    said = [f"the {html.escape(proposal.drafter)} drafter proposed {shape}; the target checked every node in one pass"]
    for depth in sorted({c.position for c in ver.checks}):
        tries = [c for c in ver.checks if c.position == depth]
        words = [f"{quote(piece(c.token))} {'accepted' if c.accepted else '<b>rejected</b>'} "
                 f"(p/q = {c.accept_prob:.2f})" for c in tries]
        if len(words) > MAX_TRIES_SAID:  # the first few refusals, how many more, and the last try
            words = words[:MAX_TRIES_SAID - 1] + [f"{len(words) - MAX_TRIES_SAID} more rejected"] + words[-1:]
        residual = " (each next sibling against the residual)" if len(tries) > 1 else ""
        said.append(f"at depth {depth + 1}: " + ", then ".join(words) + residual)
    if ver.resampled is not None:
        said.append(f"no child was accepted, so {quote(piece(ver.resampled))} was drawn from the last residual")
    elif ver.bonus is not None:
        said.append(f"the path reached a leaf, so the same pass adds a bonus token {quote(piece(ver.bonus))}")
    return f"{step}: " + "; ".join(said) + f". {len(ver.emitted)} token(s) added for one target pass."
