"""Each GPU test starts from an empty device: what a test allocated is released after it.

Tests read the device's free memory (the driver's figure, a ballast sized to the free memory): a test
run after another must not see that one's tensors, or the blocks PyTorch's caching allocator kept from
it (a ballast of the whole card stays in the cache, and the card then reads as full), so the outcome
does not depend on the order the tests run in.
"""

import gc

import pytest
import torch


@pytest.fixture(autouse=True)
def _release_device_memory():
    yield
    if torch.cuda.is_available():
        gc.collect()  # tensors kept alive only by reference cycles (modules, optimizers, hooks)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # cached blocks back to the driver
