"""render.py: frames are escaped, every token state is marked, the diffusion canvas counts masks."""

import re

import pytest

import explorer
from explorer.app import narration, render
from explorer.decoding.events import DraftCheck, Proposal, RefinementStep, TokenStep, Verification

SCRIPT = "<script>alert(1)</script>"
PIECES = {1: "a", 2: " b", 3: "\n", 4: SCRIPT, 5: '"q"&', 6: "\x08", 7: "z"}


def piece(token_id: int) -> str:
    return PIECES[token_id]


def spec_view(events, status="running"):
    return render.LaneView("speculative", events, "prompt", piece, 16, status=status)


def verification(step, checks, accepted, emitted, resampled=None, bonus=None):
    return Verification(1.0 + step, step, tuple(checks), accepted, resampled, bonus, tuple(emitted), 0.01, 10, 10, 4)


def check(position, token, accepted, p=0.5, q=0.4):
    return DraftCheck(position, token, p, q, min(1.0, p / q), accepted)


def test_visible_html_escapes_and_shows_whitespace():
    out = render.visible_html(SCRIPT + " \n\t\x08")
    assert "<script>" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "·" in out and "↵" in out and "⇥" in out and "\\x08" in out
    assert render.visible_html("") != ""  # an empty piece stays visible


def test_token_piece_shows_the_bytes_of_a_split_character(random_models):
    piece = render.token_piece(random_models.tokenizer)
    assert [piece(i) for i in random_models.tokenizer("ä").input_ids] == ["\\xc3", "\\xa4"]
    assert piece(random_models.tokenizer.eos_token_id) == "<|endoftext|>"


def test_token_and_prompt_text_is_escaped_everywhere():
    ar = render.LaneView("autoregressive", [TokenStep(1.0, 0, 4, 0.9, 0.01), TokenStep(1.1, 1, 5, 0.5, 0.01)],
                         f"x = 1 {SCRIPT}", piece, 8, status="done")
    out = render.lane_html(ar)
    assert "<script>" not in out and out.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 2
    assert "&quot;q&quot;&amp;" in out
    assert re.search(r'title="[^"<>]*"', out)  # hover text stays inside its attribute


def test_a_newline_is_a_mark_and_never_breaks_the_lane():
    out = render.lane_html(render.LaneView("autoregressive", [TokenStep(1.0, 0, 3, 1.0, 0.01)], "p", piece, 4))
    assert "↵" in out and "<br>" not in out
    proposal = Proposal(1.0, 0, "model", 3, (3, 3, 3), (0.4, 0.3, 0.2), 0.01, 3)
    rejected = verification(0, [check(0, 3, False, p=0.1, q=0.4)], 0, (1,), resampled=1)
    out = render.lane_html(spec_view([proposal, rejected]))
    assert "<br>" not in out and out.count("↵") == 3


def test_rejected_drafts_sit_in_a_small_row_under_their_step():
    proposal = Proposal(1.0, 0, "model", 4, (1, 2, 4, 7), (0.4, 0.3, 0.2, 0.1), 0.01, 4)
    ver = verification(0, [check(0, 1, True), check(1, 2, False, p=0.1, q=0.5)], 1, (1, 5), resampled=5)
    out = render.lane_html(spec_view([proposal, ver]))
    kept, dropped = out.split('class="kept"')[1].split('class="dropped"')
    assert 'tok acc' in kept and 'tok res' in kept and 'tok rej' not in kept
    assert 'tok rej' in dropped and dropped.count('tok skip') == 2 and 'tok acc' not in dropped


def test_narration_names_the_tokens_of_the_latest_step():
    proposal = Proposal(1.0, 0, "model", 3, (1, 2, 7), (0.4, 0.3, 0.2), 0.01, 3)
    ver = verification(0, [check(0, 1, True, p=0.5, q=0.4), check(1, 2, False, p=0.1, q=0.5)], 1, (1, 4),
                       resampled=4)
    view = render.LaneView("speculative", [proposal, ver], "p", piece, 16, total_steps=6)
    text = narration.narration_html([view])
    assert "Step 1 of 6" in text and "<code>a</code> kept because p ≥ q" in text
    assert "<code><span class=\"ws\">·</span>b</code> <b>rejected</b>: p/q = 0.20" in text
    assert "<code>z</code> discarded unchecked" in text and "max(0, p − q)" in text
    assert "&lt;script&gt;" in text and "<script>" not in text  # the resampled token is escaped
    pending = narration.narration_html([render.LaneView("speculative", [proposal], "p", piece, 16)])
    assert "will check all 3 in <b>one</b> pass" in pending
    steps = [RefinementStep(1.0, 0, 0, (0, 3), (1, 2), (0.9, 0.2), 6, 0.01, why="the 2 most confident")]
    diff = narration.narration_html([render.LaneView("diffusion", steps, "p", piece, 8, total_steps=4)])
    assert "Step 1 of 4" in diff and "2 revealed (the 2 most confident)" in diff and "6 masks left" in diff
    steps.append(RefinementStep(2.0, 1, 0, (1,), (1,), (0.8,), 6, 0.01, remasked=(3,), remasked_tokens=(2,),
                                remask_confidences=(0.31,), why="1 above the confidence 0.5; 1 re-masked"))
    diff = narration.narration_html([render.LaneView("diffusion", steps, "p", piece, 8, total_steps=4)])
    assert "at position 4 masked again: its probability fell to 0.31" in diff and "1 re-masked" in diff


def test_every_lane_carries_its_hooks_and_a_known_status():
    for status in render.STATUSES:
        out = render.lane_html(render.LaneView("diffusion", [], "p", piece, 8, status=status))
        assert 'data-lane="diffusion"' in out and f'data-status="{status}"' in out
    with pytest.raises(ValueError):
        render.lane_html(render.LaneView("diffusion", [], "p", piece, 8, status="paused"))


def test_speculative_marks_pending_then_verdicts():
    proposal = Proposal(1.0, 0, "model", 4, (1, 2, 4, 7), (0.4, 0.3, 0.2, 0.1), 0.01, 4)
    pending = render.lane_html(spec_view([proposal]))
    assert pending.count('class="tok pend"') == 4 and "?" in pending
    rejected = verification(0, [check(0, 1, True), check(1, 2, True), check(2, 4, False, p=0.1, q=0.2)], 2,
                            (1, 2, 5), resampled=5)
    out = render.lane_html(spec_view([proposal, rejected]))
    assert out.count('class="tok acc"') == 2 and "✓" in out
    assert out.count('class="tok rej"') == 1 and "✗" in out
    assert out.count('class="tok skip"') == 1  # the draft after the rejection, never checked
    assert out.count('class="tok res"') == 1 and "↻" in out
    assert "min(1, p/q) = 0.500" in out and "p = 0.100" in out and "q = 0.200" in out


def test_speculative_bonus_after_full_acceptance():
    proposal = Proposal(1.0, 0, "model", 2, (1, 2), (0.9, 0.8), 0.01, 2)
    full = verification(0, [check(0, 1, True), check(1, 2, True)], 2, (1, 2, 7), bonus=7)
    out = render.lane_html(spec_view([proposal, full], "done"))
    assert out.count('class="tok acc"') == 2 and out.count('class="tok bon"') == 1 and "★" in out
    assert 'data-status="done"' in out and "2 target passes" not in out  # one verify pass, no prefill here


def test_a_step_without_drafts_shows_a_plain_target_token():
    empty = Proposal(1.0, 0, "prompt_lookup", 4, (), (), 0.0, 0)
    out = render.lane_html(spec_view([empty, verification(0, [], 0, (7,), bonus=7)]))
    assert out.count('class="tok tgt"') == 1 and 'class="tok bon"' not in out


def test_legend_has_a_text_marker_for_every_state():
    legend = render.legend_html()
    for state, (css, marker, words) in render.MARKS.items():
        assert f'class="tok {css}"' in legend and words in legend
        if marker:
            assert marker in legend, state


def test_diffusion_canvas_counts_masks_and_highlights_new():
    steps = [RefinementStep(1.0, 0, 0, (0, 3), (1, 2), (0.9, 0.2), 6, 0.01),
             RefinementStep(1.1, 1, 0, (1,), (4,), (0.7,), 5, 0.01)]
    view = render.LaneView("diffusion", steps, "p", piece, 8, block_length=4)
    out = render.lane_html(view)
    assert 'data-masks-left="5"' in out and "5 / 8 masks left" in out
    assert out.count('class="tok mask"') == 5
    assert out.count('class="tok new"') == 1 and out.count('class="tok old"') == 2
    assert "revealed at step 2 · confidence 0.700" in out
    assert out.count('class="block"') == 2  # boundaries of two blocks of 4
    assert "&lt;script&gt;" in out
    empty = render.lane_html(render.LaneView("diffusion", [], "p", piece, 8, status="waiting"))
    assert empty.count('class="tok mask"') == 8 and 'data-masks-left="8"' in empty


@pytest.mark.parametrize("method", ["autoregressive", "speculative", "diffusion"])
def test_real_trace_replays_from_empty_to_complete(random_models, method):
    trace = explorer.decode(method, random_models, "def f(x):", max_new_tokens=16, steps=8, block_length=8,
                            gamma=3)
    tok_piece = render.token_piece(random_models.tokenizer)
    start = render.lane_html(render.trace_view(trace, tok_piece, at_s=0.0))
    end = render.lane_html(render.trace_view(trace, tok_piece))
    assert 'data-status="done"' in end and f'data-tokens="{trace.stats["new_tokens"]}"' in end
    assert 'data-tokens="0"' in start or method == "speculative"
    if method == "diffusion":
        assert 'data-masks-left="16"' in start and 'data-masks-left="0"' in end
    times = [e.t - trace.t0 for e in trace.events]
    assert render.next_event_time([trace], 0.0) == pytest.approx(min(t for t in times if t > 0), abs=1e-6)
    assert render.next_event_time([trace], times[-1], backwards=True) < times[-1]


def test_lanes_side_by_side_with_legend_and_caption():
    lanes = [render.lane_html(render.LaneView(m, [], "p", piece, 8, status="waiting"))
             for m in ("autoregressive", "speculative", "diffusion")]
    out = render.lanes_html(lanes, ["autoregressive", "speculative", "diffusion"], caption="a < b")
    assert "--lanes:3" in out and 'class="legend"' in out and "a &lt; b" in out
