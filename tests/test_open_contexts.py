"""What the hook reads at an OOM about the job's open contexts, with the real torch (CPU)."""

import gc

import pytest

from oomsight.hook.cuda import TorchCuda

torch = pytest.importorskip("torch")
checkpoint = pytest.importorskip("torch.utils.checkpoint").checkpoint


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_activations_waiting_for_backward_are_seen_and_gone_after_it(reentrant):
    probe = TorchCuda(torch)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    assert not probe.open_contexts()["checkpointing"]
    y = checkpoint(lin, x, use_reentrant=reentrant)
    assert probe.open_contexts()["checkpointing"]
    y.sum().backward()
    del y
    gc.collect()
    assert not probe.open_contexts()["checkpointing"]


def test_a_disabled_autocast_block_is_not_taken_for_autocast():
    probe = TorchCuda(torch)
    with torch.autocast("cpu", enabled=False):
        assert probe.open_contexts() == {"autocast": False, "checkpointing": False}


def test_activation_offload_is_told_apart_from_checkpointing():
    probe = TorchCuda(torch)
    seen = []
    lin = torch.nn.Linear(4, 4)

    def body(x):
        seen.append(probe.saved_tensor_hooks())
        return lin(x)

    x = torch.randn(2, 4, requires_grad=True)
    body(x)
    with torch.autograd.graph.save_on_cpu():
        body(x)
    checkpoint(body, x, use_reentrant=False)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        body(x)
    assert seen == [None, "offload", "checkpoint", "other"]


def test_private_pool_segments_are_counted_apart_and_never_offered_as_free_blocks():
    def segment(pool, total, allocated, free_block):
        blocks = [{"state": "active_allocated", "size": allocated}, {"state": "inactive", "size": free_block}]
        return {"device": 0, "segment_type": "large", "segment_pool_id": pool, "total_size": total,
                "allocated_size": allocated, "blocks": blocks}

    snapshot = {"segments": [segment((0, 0), 100, 60, 40), segment((1, 0), 1000, 100, 900),
                             segment((0, 2), 50, 50, 0), {**segment((0, 0), 70, 0, 70), "device": 1}]}

    class Memory:
        _snapshot = staticmethod(lambda: snapshot)

    probe = TorchCuda(torch)
    probe.cuda = type("Cuda", (), {"memory": Memory})()
    assert probe.largest_free_block(0) == 40  # the graph pool's 900 cannot serve other tensors
    assert probe.private_pools(0) == (1050, 900)  # a CUDA graph pool (n, 0) and a MemPool (0, n)
    assert probe.private_pools(1) == (0, 0)
