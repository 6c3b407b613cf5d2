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
