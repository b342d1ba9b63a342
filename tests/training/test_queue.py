"""The FIFO instance queue (paper 001 §3.1): order, overflow, buffers that follow device and dtype."""

from __future__ import annotations

import pytest
import torch

from training.queue import InstanceQueue


def test_random_unit_init_is_a_buffer_not_a_parameter() -> None:
    q = InstanceQueue(6, 4, generator=torch.Generator().manual_seed(0))
    assert q.vectors.shape == (6, 4) and torch.allclose(q.vectors.norm(dim=-1), torch.ones(6))
    assert list(q.parameters()) == [] and {"vectors", "pointer"} <= set(q.state_dict())
    assert not torch.equal(q.vectors, InstanceQueue(6, 4, generator=torch.Generator().manual_seed(1)).vectors)


def test_first_in_first_out_with_wraparound() -> None:
    q = InstanceQueue(4, 1)
    q.enqueue(torch.tensor([[1.0], [2.0], [3.0]]))
    assert q.ordered()[-3:].flatten().tolist() == [1.0, 2.0, 3.0]
    q.enqueue(torch.tensor([[4.0], [5.0]]))  # overwrites the random vector, then 1
    assert q.ordered().flatten().tolist() == [2.0, 3.0, 4.0, 5.0]
    q.enqueue(torch.tensor([6.0]))  # a single vector
    assert q.ordered().flatten().tolist() == [3.0, 4.0, 5.0, 6.0]
    q.enqueue(torch.arange(10.0, 16.0)[:, None])  # more than the queue holds: keep the newest 4
    assert q.ordered().flatten().tolist() == [12.0, 13.0, 14.0, 15.0]


def test_enqueue_detaches_and_casts_to_the_module_dtype() -> None:
    q = InstanceQueue(3, 2).to(torch.float64)
    x = torch.ones(2, 2, requires_grad=True)
    q.enqueue(x)
    assert q.vectors.dtype == torch.float64 and not q.vectors.requires_grad
    assert q.ordered()[-2:].tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_state_dict_round_trip_resumes_the_same_memory() -> None:
    q = InstanceQueue(5, 3)
    q.enqueue(torch.randn(7, 3))
    copy = InstanceQueue(5, 3)
    copy.load_state_dict(q.state_dict())
    assert torch.equal(copy.ordered(), q.ordered())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_follows_the_module_to_cuda() -> None:
    q = InstanceQueue(3, 2).cuda()
    q.enqueue(torch.ones(1, 2))  # a CPU batch is moved to the queue's device
    assert q.vectors.is_cuda and q.pointer.is_cuda


def test_meta_device_follows_module() -> None:
    q = InstanceQueue(3, 2).to("meta")
    assert q.vectors.device.type == "meta"


def test_bad_sizes_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="queue size must be >= 1"):
        InstanceQueue(0, 4)
    with pytest.raises(ValueError, match=r"pass \(B, 4\)"):
        InstanceQueue(3, 4).enqueue(torch.ones(2, 5))
