"""Export tests run torch single-threaded: their models are tiny, and on a shared 2-core machine
two spinning torch threads make each small matmul an order of magnitude slower."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
