"""The diffusion lane after the answer's end: one quiet "(end of answer)" marker, never a wall of end-of-turn chips
(N = 256, as a SmolLM2 chat answer fills its canvas with <|im_end|>), while running and at the end."""

from explorer.app import render
from explorer.app.diffusion_view import END_MARK
from explorer.decoding.events import RefinementStep

END = 9
WORDS = {1: "The", 2: " sun", 3: " feeds", 4: " plants", 5: ".", END: "<|im_end|>"}


def piece(token_id: int) -> str:
    return WORDS[token_id]


piece.end_id = END  # what render.token_piece sets from the tokenizer


def step(i: int, positions: list[int], tokens: list[int], masks_left: int) -> RefinementStep:
    return RefinementStep(1.0 + i, i, positions[0] // 32, tuple(positions), tuple(tokens), (0.9,) * len(positions),
                          masks_left, 0.01)


def lane(events, status: str) -> str:
    return render.lane_html(render.LaneView("diffusion", events, "p", piece, 256, block_length=32, status=status))


def test_positions_after_the_answers_end_are_one_marker_not_a_wall_of_end_chips():
    # step 1: the model is sure the answer ends early: the end token at position 5 and a wall after it
    wall = step(0, list(range(5, 32)), [END] * 27, 256 - 27)
    running = lane([wall], "running")
    assert running.count("&lt;|im_end|&gt;") == 1 and running.count(END_MARK) == 1
    assert running.count('class="tok mask"') == 5  # the answer's five positions, still masked
    assert 'title="positions 7-256: after the answer&#x27;s end, not part of the answer (26 revealed, 224 still ' \
           'masked)"' in running
    # step 2 fills the answer: the decoder stops there (stop_at_end); the rest stays one marker
    done = lane([wall, step(1, [0, 1, 2, 3, 4], [1, 2, 3, 4, 5], 256 - 32)], "done")
    assert done.count("&lt;|im_end|&gt;") == 1 and done.count(END_MARK) == 1
    assert 'class="tok mask"' not in done and done.count('class="block"') == 1
    assert ">The<" in done and ">.<" in done


def test_without_an_end_token_every_position_shows():
    out = lane([step(0, [0, 1], [1, 2], 254)], "running")
    assert END_MARK not in out and out.count('class="tok mask"') == 254 and out.count('class="block"') == 8
