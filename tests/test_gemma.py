"""The Gemma 4 family on random miniatures (``random-gemma4``), against transformers as the reference.

- Speculative decoding with the assistant drafter (drafts from the target's hidden states and shared
  KV) is greedy-equal to autoregressive decoding, to ``generate(do_sample=False)`` and to
  ``generate(assistant_model=assistant)``; and every round drafts what transformers'
  ``SinglePositionMultiTokenCandidateGenerator`` drafts.
- The DiffusionGemma lane equals ``DiffusionGemmaForBlockDiffusion.generate`` at a fixed seed, and the
  denoising steps the animation shows are the drafts a ``put_draft`` streamer receives.
"""

import pytest
import torch

import explorer
from explorer.app.render import diffusion_canvas
from explorer.families.gemma import AssistantDrafter

PROMPTS = ["def parse(line):", "The quick brown fox", "x = [i for i in"]


@pytest.fixture(scope="module")
def gemma():
    return explorer.load_models("random-gemma4", device="cpu")


def _hf_ids(models, prompt):
    return torch.tensor([models.tokenizer(prompt).input_ids])


@pytest.mark.parametrize("gamma", [1, 3])
def test_assistant_speculative_equals_autoregressive_and_transformers(gemma, gamma, monkeypatch):
    from transformers.generation import candidate_generator

    hf_drafts = []
    original = candidate_generator.SinglePositionMultiTokenCandidateGenerator.get_candidates

    def recording(self, input_ids, **kwargs):
        ids, logits = original(self, input_ids, **kwargs)
        if logits is not None:
            hf_drafts.append(ids[0, input_ids.shape[1]:].tolist())
        return ids, logits

    monkeypatch.setattr(candidate_generator.SinglePositionMultiTokenCandidateGenerator, "get_candidates", recording)
    gemma.draft.generation_config.num_assistant_tokens = gamma
    accepted = 0
    for prompt in PROMPTS:
        n = 16
        ar = explorer.decode("autoregressive", gemma, prompt, max_new_tokens=n)
        spec = explorer.decode("speculative", gemma, prompt, max_new_tokens=n, drafter="assistant", gamma=gamma)
        ids = _hf_ids(gemma, prompt)
        plain = gemma.target.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1]:].tolist()
        hf_drafts.clear()
        assisted = gemma.target.generate(ids, max_new_tokens=n, do_sample=False, assistant_model=gemma.draft)
        assisted = assisted[0, ids.shape[1]:].tolist()
        assert spec.token_ids == ar.token_ids == plain == assisted, prompt
        ours = [list(e.tokens) for e in spec.events if isinstance(e, explorer.decoding.events.Proposal) and e.tokens]
        assert ours == hf_drafts, prompt  # the same drafts, round by round, as transformers' generator
        accepted += spec.stats["accepted"]
    assert accepted > 0  # some drafts were accepted: rounds after a partial acceptance were compared too


def test_assistant_drafter_is_chosen_for_an_assistant_draft(gemma):
    from explorer.decoding.config import DecodeConfig
    from explorer.decoding.drafters import make_drafter

    assert isinstance(make_drafter(gemma, DecodeConfig(drafter="model")), AssistantDrafter)
    with pytest.raises(explorer.ExplorerError, match="reads the target's hidden states"):
        make_drafter(explorer.load_models("tiny", device="cpu"), DecodeConfig(drafter="assistant"))


def test_assistant_speculative_sampling_reproduces_with_a_seed(gemma):
    a = explorer.decode("speculative", gemma, PROMPTS[0], max_new_tokens=16, drafter="assistant", temperature=0.8,
                        seed=3)
    b = explorer.decode("speculative", gemma, PROMPTS[0], max_new_tokens=16, drafter="assistant", temperature=0.8,
                        seed=3)
    assert a.token_ids == b.token_ids and len(a.token_ids) > 0


class DraftRecorder:
    """A streamer with ``put_draft``: what transformers shows for every denoising step."""

    def __init__(self):
        self.drafts, self.finals = [], []

    def put(self, value):
        self.finals.append(value[0].tolist())

    def put_draft(self, value):
        self.drafts.append(value[0].tolist())

    def end(self):
        pass


@pytest.mark.parametrize("prompt,n,steps,seed", [(PROMPTS[0], 8, None, 0), (PROMPTS[1], 16, 12, 5)])
def test_diffusion_gemma_equals_generate_and_animates_the_streamer_drafts(gemma, prompt, n, steps, seed):
    """One canvas at the model's default 48 steps, and two canvases of 6 steps (one reaches the EOS)."""
    trace = explorer.decode("diffusion", gemma, prompt, max_new_tokens=n, steps=steps, seed=seed)
    ids = _hf_ids(gemma, prompt)
    recorder = DraftRecorder()
    torch.manual_seed(seed)
    kwargs = {"max_denoising_steps": steps // 2} if steps else {}
    out = gemma.diffusion.generate(ids, max_new_tokens=n, streamer=recorder, **kwargs)
    hf = out.sequences[0, ids.shape[1]:].tolist()
    eos = gemma.tokenizer.eos_token_id
    if eos in hf:  # transformers pads after the EOS; the explorer stops there
        hf = hf[: hf.index(eos) + 1]
    assert trace.token_ids == hf
    # Replaying the events step by step rebuilds exactly the draft put_draft received at that step.
    events = [e for e in trace.events if isinstance(e, explorer.decoding.events.RefinementStep)]
    assert len(events) == len(recorder.drafts) == trace.stats["target_forward_passes"]
    canvas = 8
    for i, (event, draft) in enumerate(zip(events, recorder.drafts, strict=True)):
        shown = diffusion_canvas(events[: i + 1], n)
        block = event.block
        assert [cell[0] for cell in shown[block * canvas:(block + 1) * canvas]] == draft


def test_diffusion_gemma_seed_changes_the_sample(gemma):
    a = explorer.decode("diffusion", gemma, PROMPTS[2], max_new_tokens=8, seed=1)
    b = explorer.decode("diffusion", gemma, PROMPTS[2], max_new_tokens=8, seed=2)
    assert a.token_ids != b.token_ids


def test_the_assistant_ignores_a_decode_beside_it_on_the_same_target(gemma):
    """Its verify-pass hook belongs to its own thread (the app may decode the lanes side by side)."""
    from tests.test_eagle import decode_side_by_side

    ar = explorer.decode("autoregressive", gemma, "hello world", max_new_tokens=24).token_ids
    both = decode_side_by_side(gemma, "hello world", "assistant", n=24)
    assert both["autoregressive"] == ar and both["speculative"] == ar
