"""An emoji split over byte-level tokens shows as one chip in the diffusion lane, not as "\\xf0\\x9f" chips."""

from explorer.app import byte_chips, render
from explorer.decoding.events import RefinementStep


def test_a_character_over_several_tokens_is_one_chip(random_models):
    piece = render.token_piece(random_models.tokenizer)
    ids = random_models.tokenizer("a🌊ä").input_ids
    pieces = [piece(i) for i in ids]
    assert any("\\xf0" in p for p in pieces) and len(ids) >= 4, pieces  # split into byte tokens
    step = RefinementStep(1.0, 0, 0, tuple(range(len(ids))), tuple(ids), (0.5,) * len(ids), 0, 0.01)
    out = render.lane_html(render.LaneView("diffusion", [step], "p", piece, len(ids), status="done"))
    assert "\\xf0" not in out and "\\xc3" not in out
    assert ">🌊<" in out and ">ä<" in out
    assert out.count('class="tok new') == 3  # "a", the wave, "ä"


def test_runs_never_cross_a_block_or_a_mask_and_plain_text_stays():
    wave = ["\\xf0\\x9f", "\\x8c\\x8a"]
    assert byte_chips.merged(wave, 4) == {0: (2, "🌊")}
    assert byte_chips.merged(wave, 1) == {}  # blocks of one: never merged across the boundary
    assert byte_chips.merged([wave[0], None, wave[1]], 4) == {}
    assert byte_chips.merged(["print('\\x41')", "x"], 4) == {}  # an ASCII escape in code is text
