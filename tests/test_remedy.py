"""measure_remedies on a model of memory and time (the GPU run is still to come)."""

import pytest

from oomsight.tools.remedy import measure_remedies

MIB = 1 << 20


class OOM(Exception):
    pass


class Device:
    """Each variant declares its peak and step time; over the cap it raises OOM."""

    def __init__(self, cap):
        self.cap = cap
        self.current = None
        self.released = 0

    def variant(self, peak, seconds):
        def step():
            if peak > self.cap:
                raise OOM()
            self.current = (peak, peak + 2 * MIB, seconds)

        return step

    def measure_window(self, fn, steps):
        for _ in range(steps):
            fn()
        return self.current

    def release(self):
        self.released += 1

    def is_oom(self, exc):
        return isinstance(exc, OOM)


def test_each_variant_is_compared_with_the_baseline():
    dev = Device(cap=1000 * MIB)
    out = measure_remedies(
        {
            "baseline": dev.variant(800 * MIB, 0.010),
            "bf16 autocast": dev.variant(500 * MIB, 0.008),
            "checkpointing": dev.variant(300 * MIB, 0.013),
            "torch.compile": dev.variant(900 * MIB, 0.007),  # a higher peak: measured, not assumed
        },
        memory=dev,
    )
    by = {m.name: m for m in out}
    assert by["baseline"].peak_change_ratio == 0
    assert by["bf16 autocast"].peak_change_ratio == pytest.approx(-0.375)
    assert by["checkpointing"].time_change_ratio == pytest.approx(0.3)
    assert by["torch.compile"].peak_change_ratio == pytest.approx(0.125)
    assert by["checkpointing"].peak_reserved_bytes == 302 * MIB


def test_a_variant_that_does_not_fit_is_reported_and_the_rest_still_measured():
    dev = Device(cap=1000 * MIB)
    out = measure_remedies(
        {
            "baseline": dev.variant(800 * MIB, 0.01),
            "bigger batch": dev.variant(2000 * MIB, 0.02),
            "accumulate": dev.variant(400 * MIB, 0.011),
        },
        rounds=3,
        memory=dev,
    )
    by = {m.name: m for m in out}
    assert by["bigger batch"].error == "out of memory" and by["bigger batch"].peak_allocated_bytes is None
    assert by["accumulate"].peak_change_ratio == pytest.approx(-0.5)
    assert dev.released >= 3


def test_a_baseline_alone_is_refused():
    with pytest.raises(ValueError, match="at least one variant"):
        measure_remedies({"baseline": lambda: None}, memory=Device(1))
