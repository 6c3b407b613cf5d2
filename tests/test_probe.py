"""The batch-size probe and the leak scan, on models of memory (no GPU needed)."""

import gc
import types

import pytest

from oomsight.hook.leakscan import OWN_STEP_GRAPHS, message, scan
from oomsight.tools.probe import fit, probe_batch_size

MIB = 1 << 20


class OOM(Exception):
    pass


class LinearMemory:
    """A device whose peak is fixed + per_sample * batch (+ a quadratic term if asked)."""

    def __init__(self, capacity, fixed, per_sample, quadratic=0.0):
        self.cap, self.fixed, self.per, self.quad = capacity, fixed, per_sample, quadratic
        self.last = 0
        self.ooms = 0
        self.released = 0

    floor = 0  # a peak set by something else at small batches (AdamW's step temporaries)

    def peak(self, b):
        return max(self.floor, self.fixed + self.per * b + self.quad * b * b)

    def step(self, b):
        if self.peak(b) > self.cap:
            self.ooms += 1
            raise OOM(f"batch {b}")
        self.last = self.peak(b)

    def capacity(self):
        return self.cap

    def measure(self, fn):
        fn()
        peak = int(self.last + self.cached)
        self.cached = max(self.cached, self.cache_leftover * self.last)
        return peak

    cache_leftover = 0.0  # reserved bytes left cached by the previous batch unless released

    def release(self):
        self.released += 1
        self.cached = 0

    cached = 0

    def is_oom(self, exc):
        return isinstance(exc, OOM)


def true_max(mem):
    b = 1
    while mem.peak(b + 1) <= mem.cap:
        b += 1
    return b


def test_a_linear_model_gets_the_batch_that_keeps_the_margin_without_any_oom():
    mem = LinearMemory(capacity=80_000 * MIB, fixed=2_000 * MIB, per_sample=30 * MIB)
    advice = probe_batch_size(mem.step, start=8, margin=0.1, memory=mem)
    assert advice["max_batch_size"] == int((80_000 * 0.9 - 2_000) / 30)
    assert mem.ooms == 0
    assert advice["fixed_bytes"] == 2_000 * MIB and advice["bytes_per_sample"] == pytest.approx(30 * MIB)
    assert [p[0] for p in advice["points"]] == [8, 16, 32]


def test_the_answer_is_within_ten_percent_of_the_true_maximum():
    mem = LinearMemory(capacity=40_000 * MIB, fixed=5_000 * MIB, per_sample=7 * MIB)
    best = probe_batch_size(mem.step, margin=0.05, memory=mem)["max_batch_size"]
    assert 0.9 * true_max(mem) <= best <= true_max(mem)


def test_a_model_worse_than_linear_recovers_from_the_failed_check_and_backs_off():
    mem = LinearMemory(capacity=10_000 * MIB, fixed=1_000 * MIB, per_sample=1 * MIB, quadratic=0.002 * MIB)
    advice = probe_batch_size(mem.step, start=4, margin=0.0, memory=mem)
    assert mem.ooms >= 1 and mem.released >= 1  # the check failed, was cleaned up
    assert mem.peak(advice["max_batch_size"]) <= mem.cap  # and the final answer runs


def test_a_flat_start_set_by_optimizer_temporaries_is_not_fitted():
    # measured on the H200: at small batches AdamW's step buffers set the peak, not the batch
    mem = LinearMemory(capacity=4096 * MIB, fixed=600 * MIB, per_sample=0.13 * MIB)
    mem.floor = 1100 * MIB
    advice = probe_batch_size(mem.step, start=256, margin=0.03, memory=mem)
    assert 0.9 * true_max(mem) <= advice["max_batch_size"] <= true_max(mem)
    assert advice["points"][0][1] == advice["points"][1][1] == 1100 * MIB  # the flat part was measured, then left out


def test_blocks_cached_for_a_smaller_batch_do_not_inflate_the_next_measurement():
    # without releasing between points, the reserved peak of batch 2b still held b's blocks
    mem = LinearMemory(capacity=4096 * MIB, fixed=600 * MIB, per_sample=0.16 * MIB)
    mem.cache_leftover = 1.0
    advice = probe_batch_size(mem.step, start=256, margin=0.03, memory=mem)
    assert advice["bytes_per_sample"] == pytest.approx(0.16 * MIB)
    assert 0.9 * true_max(mem) <= advice["max_batch_size"] <= true_max(mem)


def test_a_start_that_never_fits_is_a_clear_error():
    mem = LinearMemory(capacity=100 * MIB, fixed=200 * MIB, per_sample=1 * MIB)
    with pytest.raises(RuntimeError, match="start smaller"):
        probe_batch_size(mem.step, memory=mem)


def test_errors_other_than_oom_are_not_swallowed():
    mem = LinearMemory(capacity=100 * MIB, fixed=1, per_sample=1)

    def broken(b):
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError):
        probe_batch_size(broken, memory=mem)


def test_fit_recovers_a_line():
    assert fit([(1, 12), (2, 14), (4, 18)]) == pytest.approx((10.0, 2.0))


class FakeTensor:
    """Shaped like a torch.Tensor for the scan: grad_fn, is_cuda, storage, dtype, shape."""

    def __init__(self, ptr, nbytes, node="AddmmBackward0", cuda=True):
        self.grad_fn = type(node, (), {})() if node else None
        self.is_cuda = cuda
        self.dtype = "torch.float32"
        self.shape = (64, 2048)
        self._s = types.SimpleNamespace(data_ptr=lambda: ptr, nbytes=lambda: nbytes)

    def untyped_storage(self):
        return self._s


def test_the_leak_scan_counts_graph_holding_cuda_tensors_once_per_storage():
    fake_torch = types.SimpleNamespace(Tensor=FakeTensor)
    kept = [FakeTensor(i, MIB) for i in range(30)]
    kept.append(kept[0])  # same storage twice
    kept += [FakeTensor(1000, MIB, node=None), FakeTensor(1001, MIB, cuda=False)]  # no graph / not CUDA
    gc.collect()
    finding = scan(fake_torch, step=42, growth=512 * MIB, sites_of=lambda ptrs: {})
    assert (finding["graph_tensors"], finding["graph_bytes"], finding["step"]) == (30, 30 * MIB, 42)
    assert finding["sites"] == ["AddmmBackward0 float32 (64, 2048) x30 = 30.00 MiB"]
    located = scan(fake_torch, 42, None, lambda ptrs: {p: "train.py:17 in evaluate" for p in ptrs})
    assert located["sites"] == ["train.py:17 in evaluate (30 tensors)"]
    del kept


@pytest.mark.parametrize("graphs", [0, 1, OWN_STEP_GRAPHS, OWN_STEP_GRAPHS + 1, 30])
def test_the_scan_s_warning_calls_a_leak_only_what_piles_with_its_graph(graphs):
    """A replay buffer filling on an H100 was warned "Likely a leak" with 2 tensors of 2 KiB holding a graph
    (the last step's loss and Q values): the warning says what the scan found, and advises nothing that
    changes the result."""
    fake_torch = types.SimpleNamespace(Tensor=FakeTensor)
    kept = [FakeTensor(5000 + i, MIB) for i in range(graphs)]
    gc.collect()
    text = message(scan(fake_torch, step=9, growth=213 * MIB, sites_of=lambda ptrs: {}))
    assert text.startswith("oomsight: memory between steps grew by 213.00 MiB;")
    assert f"{graphs} CUDA tensors hold an autograd graph past the step" in text
    assert ("Likely a leak" in text) is (graphs > OWN_STEP_GRAPHS), text
    assert ("kept without a graph" in text) is (graphs <= OWN_STEP_GRAPHS), text
    assert "no_grad" not in text
    del kept
