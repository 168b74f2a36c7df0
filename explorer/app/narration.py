"""Narration: what the latest step of each lane did, in words (tokens quoted as the lanes show them)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from explorer.app.render import LANE_TITLES, LaneView, visible_html
from explorer.app.tree_view import is_tree, tree_narration
from explorer.decoding.events import Proposal, RefinementStep, TokenStep, Verification


def _quote(piece: str) -> str:
    return f"<code>{visible_html(piece)}</code>"


def _quotes(pieces: Sequence[str]) -> str:
    return " ".join(_quote(p) for p in pieces) or "nothing"


def drafter_name(view: LaneView, proposal: Proposal) -> str:
    """The drafter as the decode's options name it (its setting), not the class's internal name."""
    return str(view.options.get("drafter") or proposal.drafter)


def _narrate_speculative(view: LaneView) -> str:
    proposal, last, passes = None, None, 0
    for e in view.events:
        if isinstance(e, Proposal):
            proposal, last = e, None
        elif isinstance(e, Verification):
            passes, last = passes + 1, e
    if last is not None and proposal is not None and proposal.step != last.step:
        proposal = None  # this step drafted nothing (e.g. one token left): the last Proposal was the step before's
    of = f" of {view.total_steps}" if view.total_steps else ""
    if proposal is None and last is None:
        return "No step yet: the target reads the prompt (prefill), then the drafter proposes."
    if is_tree(proposal):  # a token tree
        return tree_narration(proposal, last, view.piece, _quote, f"Step {passes + (last is None)}{of}")
    drafts = [view.piece(t) for t in proposal.tokens] if proposal is not None else []
    if last is None:  # drafted, not yet checked
        if not drafts:
            return f"Step {passes + 1}{of}: the drafter found nothing to propose; the target makes one token alone."
        return (f"Step {passes + 1}{of}: the {html.escape(drafter_name(view, proposal))} drafter proposed "
                f"{_quotes(drafts)}{_cut(view, proposal)}; the target will check all {len(drafts)} in <b>one</b> pass.")
    said = [f"the drafter proposed {_quotes(drafts)}; the target checked them in one pass"] if drafts else []
    kept = [c for c in last.checks if c.accepted and c.position < len(last.emitted)]
    sure = [view.piece(c.token) for c in kept if c.accept_prob >= 1]
    if sure:
        said.append(f"{_quotes(sure)} kept because p ≥ q")
    said += [f"{_quote(view.piece(c.token))} kept: p/q = {c.accept_prob:.2f} and the coin said yes"
             for c in kept if c.accept_prob < 1]
    said += [f"{_quote(view.piece(c.token))} <b>rejected</b>: p/q = {c.accept_prob:.2f} and the coin said no"
             if c.accept_prob > 0 else  # min(1, p/q) = 0: no coin is drawn (speculative.verify_drafts)
             f"{_quote(view.piece(c.token))} <b>rejected</b> without a coin: p = 0 (the target never picks it)"
             for c in last.checks if not c.accepted]
    rejection = any(not c.accepted for c in last.checks)
    if len(drafts) > len(last.checks):
        why = "they came after the rejection" if rejection else "the output was already long enough"
        said.append(f"{_quotes(drafts[len(last.checks):])} discarded unchecked ({why})")
    if last.resampled is not None:
        said.append(f"a new token {_quote(view.piece(last.resampled))} drawn from max(0, p − q)")
    elif last.bonus is not None and drafts and len(last.checks) < len(drafts):
        said.append(f"the same pass gives the target's own next token {_quote(view.piece(last.bonus))}")
    elif last.bonus is not None and drafts:
        said.append(f"every draft passed, so the same pass adds a bonus token {_quote(view.piece(last.bonus))}")
    elif last.bonus is not None:
        said.append(f"nothing was drafted: the target made {_quote(view.piece(last.bonus))} alone")
    return f"Step {passes}{of}: " + "; ".join(said) + f". {len(last.emitted)} token(s) added for one target pass."


def _cut(view: LaneView, proposal: Proposal) -> str:
    """Why a draft is shorter than γ where the lane cuts drafts by the drafter's confidence (its options say)."""
    below = view.options.get("draft_confidence")
    if not below or view.options.get("tree") or len(proposal.tokens) >= proposal.gamma or (
            proposal.tokens and proposal.tokens[-1] == getattr(view.piece, "end_id", None)):  # an end of turn ends it
        return ""
    return (f" and stopped there, short of γ = {proposal.gamma}: its probability of the whole draft fell below "
            f"{below:g}")


def _narrate_diffusion(view: LaneView) -> str:
    steps = [e for e in view.events if isinstance(e, RefinementStep)]
    of = f" of {view.total_steps}" if view.total_steps else ""
    if not steps:
        return f"All {view.max_new_tokens} positions start as [MASK]; each pass predicts every mask at once."
    e = steps[-1]
    shown = list(zip(e.positions, e.tokens, e.confidences, strict=True))[:6]
    items = ", ".join(f"{_quote(view.piece(t))} (position {p + 1}, confidence {c:.2f})" for p, t, c in shown)
    more = f" and {len(e.positions) - len(shown)} more" if len(e.positions) > len(shown) else ""
    why = f" ({html.escape(e.why)})" if e.why else ""
    taken = "".join(f" {_quote(view.piece(t))} at position {p + 1} masked again: its probability fell to {c:.2f} "
                    "once its neighbours were known." for p, t, c in
                    zip(e.remasked, e.remasked_tokens, e.remask_confidences, strict=True))
    shown_pos = {p: t for p, t, _ in shown}
    phrases = e.avoided_phrases or ((),) * len(e.avoided)
    avoided = "".join(f" {_quote(view.piece(shown_pos[p]))} at position {p + 1} rather than {_quote(view.piece(t))}, "
                      + (f"which would repeat {_quote(''.join(view.piece(x) for x in g))} (never the same "
                         f"{len(g)} tokens twice)." if g else
                         "which its neighbour holds, or the word across the punctuation beside it (never the same word "
                         "twice in a row)." if any(c.isalnum() for c in view.piece(t)) else
                         "which would repeat the punctuation beside it or stand between the same word twice (never "
                         "the same word twice in a row).")
                      for p, t, g in zip(e.avoided, e.avoided_tokens, phrases, strict=True) if p in shown_pos)
    clash = ("with a token revealed beside it in this pass it would repeat a token or a phrase"
             if view.options.get("no_repeat_ngram") else
             "a token revealed beside it, or across the punctuation beside it, in this pass is the same word")
    held = "".join(f" {_quote(view.piece(t))} at position {p + 1} held back: {clash}." for p, t in
                   zip(e.held, e.held_tokens, strict=True))
    return (f"Step {e.step + 1}{of} (block {e.block + 1}): one pass predicted every mask; {len(e.positions)} "
            f"revealed{why}: {items}{more}.{avoided}{held}{taken} {e.masks_left} masks left.")


def _narrate_autoregressive(view: LaneView) -> str:
    steps = [e for e in view.events if isinstance(e, TokenStep)]
    if not steps:
        return "One target pass per token: nothing yet."
    e = steps[-1]
    return f"Token {e.step + 1}: {_quote(view.piece(e.token))} (p = {e.p:.2f}), one target pass for one token."


def _sentence(note: str) -> str:
    """A lane's note as a sentence (capitalised, with a full stop), escaped."""
    note = note.strip()
    return html.escape(note[:1].upper() + note[1:] + ("" if note.endswith((".", "…")) else "."))


def narration_html(views: Sequence[LaneView]) -> str:
    """A plain-language account of each lane's latest step (the replay's narration)."""
    narrate = {"autoregressive": _narrate_autoregressive, "speculative": _narrate_speculative,
               "diffusion": _narrate_diffusion}
    items = []
    for view in views:
        if view.progress is not None:
            text = "Decoding alone, timed; it plays on the shared clock once every lane is decoded."
        elif view.status == "waiting" and not view.events:
            text = _sentence(view.note) if view.note else "Waiting: press Run to start this lane."
        elif view.status == "error":
            text = html.escape(view.note or "this lane failed")
        else:
            text = narrate[view.method](view)
        items.append(f'<p class="narr narr-{view.method}" data-lane="{view.method}"><b>{LANE_TITLES[view.method]}.'
                     f"</b> {text}</p>")
    return f'<div class="narr-title">What just happened</div>{"".join(items)}'
