"""Mutation run: inject known bugs one at a time into a scratch copy and check that the tests catch each.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/mutation.py [--only ID,ID] [--timeout 300] [--markdown]

For every mutant below: copy explorer/ and tests/ (assets/ is linked, read-only) into a scratch folder,
replace one snippet of source, run the mutant's fast test files with ``pytest -x``, and report
**killed** (some test failed) or **survived** (all passed). The real tree is never touched. First the
unmutated copy runs every test file used, so a kill means the mutation was caught, not a broken copy.
A mutant whose snippet is no longer in the source is reported as **stale** (update the list).
Not in CI: it runs the sampler tests once per mutant (about 10-20 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLER = ["tests/test_sampling_reference.py", "tests/test_audit.py", "tests/test_speculative_exact.py"]
DIFFUSION = ["tests/test_diffusion.py"]
VALIDATION = ["tests/test_api_cli.py"]
TREE = ["tests/test_tree.py"]

# (id, what the bug is, file, snippet, replacement, test files)
MUTANTS = [
    # speculative sampling: the rule of Leviathan et al. / Chen et al.
    ("no_residual", "after a rejection, resample from p instead of norm(max(0, p - q))",
     "explorer/decoding/acceptance.py",
     "residual = torch.clamp(p - q, min=0)", "residual = p.clone()", SAMPLER),
    ("q_before_warping", "draft drawn from the warped q, verified with softmax of the raw logits",
     "explorer/decoding/drafters.py", "            token = sample(q, gen)\n",
     "            token = sample(q, gen)\n            q = torch.softmax(logits[0, -1].float(), -1)\n", SAMPLER),
    ("bonus_from_draft", "bonus token drawn from the draft's last row instead of p", "explorer/decoding/acceptance.py",
     "return len(drafted), checks, sample(p[len(drafted)], gen), True",
     "return len(drafted), checks, sample(q[len(drafted) - 1] if drafted else p[0], gen), True", SAMPLER),
    ("bonus_dropped", "bonus token not emitted after a full acceptance", "explorer/decoding/speculative.py",
     "emitted = cut_emitted(drafted[:accepted] + [drawn], eos, remaining)",
     "emitted = cut_emitted(drafted[:accepted] + ([] if is_bonus and drafted else [drawn]), eos, remaining)", SAMPLER),
    ("accept_flipped", "accept a draft with probability 1 - p/q", "explorer/decoding/acceptance.py",
     "uniform(gen) < ratio)", "uniform(gen) > ratio)", SAMPLER),
    ("no_kv_rollback", "draft KV cache not rolled back after a rejection", "explorer/decoding/drafters.py",
     "    def rollback(self, keep: int) -> None:\n        crop_cache(self.cache, keep)",
     "    def rollback(self, keep: int) -> None:\n        pass", SAMPLER),
    ("adaptive_gamma_+1/-2", "adaptive gamma steps +1 / -2 instead of +2 / -1", "explorer/decoding/speculative.py",
     "gamma + 2) if all_accepted else max(1, gamma - 1)", "gamma + 1) if all_accepted else max(1, gamma - 2)",
     SAMPLER),
    # warping
    ("temperature_ignored", "warp_logits ignores the temperature", "explorer/decoding/sampling.py",
     "torch.nan_to_num(logits / temperature,", "torch.nan_to_num(logits / 1.0,", SAMPLER),
    ("top_k_removed", "top-k filtering removed", "explorer/decoding/sampling.py",
     "if top_k is not None and 0 < top_k < logits.shape[-1]:", "if False:", SAMPLER),
    ("top_p_one_short", "top-p drops the token that reaches p", "explorer/decoding/sampling.py",
     "drop_sorted = cum - torch.softmax(sorted_logits, dim=-1) >= top_p", "drop_sorted = cum >= top_p", SAMPLER),
    # masked diffusion
    ("least_confident", "reveal the least confident positions", "explorer/decoding/diffusion.py",
     "return torch.topk(confidence, count).indices",
     "return torch.topk(torch.where(still_masked, -confidence, confidence), count).indices", DIFFUSION),
    ("threshold_half", "threshold compared at half its value", "explorer/decoding/diffusion.py",
     "((confidence > threshold) & still_masked)", "((confidence > threshold / 2) & still_masked)", DIFFUSION),
    ("schedule_reversed", "reveal schedule used in reverse", "explorer/decoding/diffusion.py",
     "schedule = reveal_schedule(block_len, steps_per_block)",
     "schedule = reveal_schedule(block_len, steps_per_block)[::-1]", DIFFUSION),
    ("shift_for_mlm", "logit shift applied to masked-LM models too", "explorer/decoding/diffusion.py",
     "int(bool(models.diffusion_shift)), p_len + n", "1, p_len + n", DIFFUSION),
    ("extra_reveal", "one extra reveal per step", "explorer/decoding/diffusion.py",
     "count = schedule[s] if s < len(schedule) else 1", "count = (schedule[s] if s < len(schedule) else 1) + 1",
     DIFFUSION),
    # validation and loading
    ("no_steps_le_tokens", "check steps <= max_new_tokens removed", "explorer/decoding/config.py",
     "_require(k <= n,", "_require(True,", VALIDATION),
    ("no_gamma_upper_bound", "gamma upper bound removed", "explorer/decoding/config.py",
     "1 <= cfg.gamma <= 64", "1 <= cfg.gamma", VALIDATION),
    ("no_top_k_ge_1", "check top_k >= 1 removed", "explorer/decoding/config.py",
     "(_is_int(cfg.top_k) and cfg.top_k >= 1)", "_is_int(cfg.top_k)", VALIDATION),
    ("no_block_le_tokens", "check block_length <= max_new_tokens removed", "explorer/decoding/config.py",
     "_require(b <= n,", "_require(True,", VALIDATION),
    ("trust_remote_code_always", "trust_remote_code for every hub diffusion model", "explorer/models.py",
     "remote = preset.diffusion in TRUST_REMOTE_CODE_ALLOWLIST", "remote = True", VALIDATION),
    # metrics and rendering
    ("p99_as_max", "p99 computed as the maximum", "explorer/measure/metrics.py",
     "return float(np.percentile(arr, q)) if arr.size",
     "return float(np.max(arr) if q == 99 else np.percentile(arr, q)) if arr.size", ["tests/test_bench.py"]),
    ("no_escape_token", "token characters not HTML-escaped", "explorer/app/render.py",
     "out.append(html.escape(ch))", "out.append(ch)", ["tests/test_render.py"]),
    ("no_escape_words", "legend words (constants in MARKS) not HTML-escaped", "explorer/app/render.py",
     'f"{html.escape(words)}</span>")', 'f"{words}</span>")', ["tests/test_render.py"]),
    # the audit itself
    ("audit_ignores_power", "audit says PASS when it could not have detected the bugs", "explorer/measure/audit.py",
     "    elif weak:\n", "    elif False:\n", ["tests/test_audit.py"]),
    # token trees (recursive rejection sampling over siblings, tree mask, compaction)
    ("tree_no_residual", "a tree's next sibling is tried against p, not the residual", "explorer/decoding/tree.py",
     "target = residual_distribution(target, q)", "target = target", TREE),
    ("tree_q_unadjusted", "siblings drawn without replacement, verified with the unadjusted q",
     "explorer/decoding/speculative_tree.py", "            self.left[token] = 0.0\n",
     "            self.left[token] = 0.0\n            row = self.q\n", TREE),
    ("tree_mask_open", "every tree node sees every node", "explorer/decoding/tree.py",
     "allowed[r, [slot[a] for a in ancestors_and_self(parents, node)]] = True",
     "allowed[r, list(slot.values())] = True", TREE),
    ("tree_positions_by_index", "tree positions by flattened index, not depth", "explorer/decoding/tree.py",
     "[prefix_len - 1 + d for d in tree_depths(parents)]", "[prefix_len + i for i in range(n)]", TREE),
    ("tree_cache_cropped", "target cache cropped like a chain, not compacted to the path",
     "explorer/decoding/speculative_tree.py",
     "select_cache(cache, list(range(past + len(fed))) + [past + len(fed) + i for i in path])",
     "select_cache(cache, list(range(past + len(fed) + len(path))))", TREE),
    ("tree_draft_cache_cropped", "draft cache cropped like a chain", "explorer/decoding/speculative_tree.py",
     "list(range(min(prefix_len, self.cache.get_seq_length()))) + kept)",
     "list(range(min(prefix_len, self.cache.get_seq_length()) + len(kept))))", TREE),
    ("tree_bonus_from_root", "a tree's bonus token drawn from the root's distribution", "explorer/decoding/tree.py",
     "return path, checks, sample(target, gen), not kids",
     "return path, checks, sample(p[0] if not kids else target, gen), not kids", TREE),
]


def scratch_copy() -> Path:
    root = Path(tempfile.mkdtemp(prefix="mutation-"))
    for sub in ("explorer", "tests"):
        shutil.copytree(ROOT / sub, root / sub, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    (root / "assets").symlink_to(ROOT / "assets")
    return root


def run_tests(root: Path, files: list[str], timeout: int) -> tuple[str, float, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *files],
                              cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.perf_counter() - start, ""
    failed = next((line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))), "")
    return ("survived" if proc.returncode == 0 else "killed"), time.perf_counter() - start, failed


def run_mutant(mutant: tuple, timeout: int) -> tuple:
    """One mutant in its own scratch copy."""
    ident, what, path, old, new, tests = mutant
    root = scratch_copy()
    try:
        source = (root / path).read_text()
        if old != new and source.count(old) != 1:
            return ident, what, path, "stale", 0.0, f"snippet found {source.count(old)} times"
        (root / path).write_text(source.replace(old, new))
        status, seconds, failed = run_tests(root, tests, timeout)
        if old == new:  # the baseline: nothing replaced, every test must pass
            status = "baseline passes" if status == "survived" else "BASELINE FAILS"
    finally:
        shutil.rmtree(root)
    row = ident, what, path, status, seconds, failed.removeprefix("FAILED ").split(" - ")[0]
    print(f"{ident:26s} {status:16s} {seconds:6.1f} s  {row[5]}", file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="comma-separated mutant ids")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutant")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (each in its own copy)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated copy")
    parser.add_argument("--markdown", action="store_true", help="print the result table as markdown")
    args = parser.parse_args(argv)
    mutants = [m for m in MUTANTS if args.only is None or m[0] in args.only.split(",")]
    if not args.no_baseline:  # the unmutated copy runs every test file used (alongside the mutants)
        files = sorted({f for m in mutants for f in m[5]})
        mutants = [("baseline", "unmutated copy, every test file used", "explorer/decoding/api.py", "import", "import",
                    files), *mutants]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda m: run_mutant(m, max(args.timeout, 3600 if m[0] == "baseline" else 0)),
                             mutants))
    if rows and rows[0][0] == "baseline":
        baseline, rows = rows[0], rows[1:]
        print(f"baseline (unmutated copy): {baseline[3]} in {baseline[4]:.0f} s {baseline[5]}")
        if baseline[3] != "baseline passes":
            return 2
    killed = sum(r[3].startswith("killed") for r in rows)
    if args.markdown:
        print("| mutant | bug | file | result | first failing test |\n|---|---|---|---|---|")
        for ident, what, path, status, _seconds, failed in rows:
            print(f"| `{ident}` | {what} | {path.removeprefix('explorer/')} | {status} | "
                  f"{failed.removeprefix('tests/') or '-'} |")
    else:
        for ident, _what, _path, status, seconds, failed in rows:
            print(f"{ident:26s} {status:16s} {seconds:6.1f} s  {failed}")
    print(f"\nkilled {killed} of {len(rows)}; survived: "
          f"{', '.join(r[0] for r in rows if r[3] == 'survived') or 'none'}")
    return 0 if killed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
