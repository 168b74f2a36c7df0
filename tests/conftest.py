import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Two cores: one intra-op thread per test process avoids oversubscription stalls.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def random_models():
    import explorer

    return explorer.load_models("random-tiny", device="cpu")
