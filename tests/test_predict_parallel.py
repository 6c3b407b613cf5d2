"""The per-rank arithmetic of ``oomsight predict --parallel`` (``predict/parallel.py``) against
real gloo ranks on the CPU: FSDP2's ``fully_shard`` (its padded local shards, the unit gathered in
forward, gradients and optimizer state per rank), FSDP1's flat shard and DDP's buckets, each read
off the storages the ranks really hold (as tests/test_accounting.py reads them)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
from torch import nn  # noqa: E402

from oomsight.predict import parallel  # noqa: E402


def model() -> nn.Module:
    torch.manual_seed(0)  # Linear(64, 5): 5 rows over 2 ranks, so FSDP pads dim 0
    return nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))


def storages(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            s = getattr(t, "_local_tensor", t).untyped_storage()
            if s.nbytes():
                seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def step(m: nn.Module, opt: Any) -> None:
    m(torch.randn(8, 40)).sum().backward()
    opt.step()


def fsdp2(rank: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    m = model()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    opt = torch.optim.AdamW(m.parameters())
    step(m, opt)
    seen: dict[str, int] = {}

    def look(module: nn.Module, args: Any) -> None:  # FSDP's pre-forward hook has gathered this unit
        seen["gathered"] = storages(module.parameters())

    most = {"unsharded": 0}

    def unsharded(*_: Any) -> None:  # every FSDP unit's gathered buffers alive now
        alive = 0
        for module in m.modules():
            group = getattr(module, "_get_fsdp_state", None) and module._get_fsdp_state()._fsdp_param_group
            for fp in group.fsdp_params if group else ():
                alive += sum(t.untyped_storage().nbytes() for t in getattr(fp, "all_gather_outputs", []))
        most["unsharded"] = max(most["unsharded"], alive)

    handles = [m[2].register_forward_pre_hook(look)]
    for layer in (m[0], m[2], m[4]):
        handles += [layer.register_forward_pre_hook(unsharded), layer.register_full_backward_hook(unsharded)]
    m(torch.randn(8, 40)).sum().backward()
    for h in handles:
        h.remove()
    return {
        "most_unsharded": most["unsharded"],
        "parameters": storages(m.parameters()),
        "gradients": storages(p.grad for p in m.parameters()),
        "state": storages(v for s in opt.state.values() for v in s.values() if v.dim()),
        "gathered_unit": seen["gathered"],
    }


def fsdp1(rank: int) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel

    m = FullyShardedDataParallel(model(), device_id=torch.device("cpu"))
    step(m, torch.optim.AdamW(m.parameters()))
    return {"flat_shard": storages([m._handle.flat_param._local_shard])}


def ddp(rank: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    m = DistributedDataParallel(model(), bucket_cap_mb=0.01)
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(2):  # the buckets are rebuilt after the first iteration
        step(m, opt)
    buckets = m.reducer._get_zeros_like_grad_buckets()
    return {"buckets": sum(b.buffer().numel() * b.buffer().element_size() for b in buckets)}


def rank_body(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=world)
    try:
        found = {"fsdp2": fsdp2(rank), "fsdp1": fsdp1(rank), "ddp": ddp(rank)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(found))
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Leave without the interpreter's teardown: gloo's threads, destroyed at exit, now and then abort a
    # finished rank ("terminate called without an active exception"); everything is written.
    os._exit(0)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: Any) -> list[dict[str, Any]]:
    out = str(tmp_path_factory.mktemp("gloo"))
    torch.multiprocessing.spawn(rank_body, args=(2, out), nprocs=2, join=True)
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]


def single_gpu() -> dict[str, Any]:
    """What one process holds for the same model after an AdamW step: the states of a prediction."""
    m = model()
    opt = torch.optim.AdamW(m.parameters())
    step(m, opt)
    params = storages(m.parameters())
    state = storages(v for s in opt.state.values() for v in s.values() if v.dim())
    cats = {"parameters": params, "gradients": params, "optimizer_state": state, "activations": 1000}
    return {"peak_allocated_bytes": sum(cats.values()), "by_category_bytes": cats}


def test_fsdp2_shards_are_the_padded_local_storages_and_the_gathered_unit_its_full_bytes(ranks: Any) -> None:
    units = parallel.units(model(), 2)
    assert [u.name for u in units] == ["0", "2", "4", "(root)"]
    laid = parallel.per_rank(single_gpu(), units, parallel.Layout(2, "fsdp2"))["parts_bytes"]
    for found in ranks:  # both ranks hold padded shards of the same size
        assert laid["parameters"] == found["fsdp2"]["parameters"]
        assert found["fsdp2"]["gathered_unit"] == units[1].param_bytes
    assert laid["gathered_parameters"] >= units[0].param_bytes + units[1].param_bytes
    for found in ranks:  # the most gathered at once in forward and backward: at most what is counted
        assert units[1].param_bytes <= found["fsdp2"]["most_unsharded"] <= laid["gathered_parameters"]
    for part in ("gradients", "optimizer_state"):  # exact on the rank holding the padded rows, never under
        truth = [r["fsdp2"]["gradients" if part == "gradients" else "state"] for r in ranks]
        assert laid[part] == max(truth)
        assert all(t <= laid[part] for t in truth)


def test_fsdp1_s_flat_shard_is_the_model_padded_to_the_world(ranks: Any) -> None:
    whole = parallel._unit("(root)", list(model().parameters()), 2)
    for found in ranks:
        assert found["fsdp1"]["flat_shard"] == whole.flat_shard_bytes


def test_ddp_buckets_hold_the_trained_gradient_bytes(ranks: Any) -> None:
    single = single_gpu()
    laid = parallel.per_rank(single, parallel.units(model(), 2), parallel.Layout(2, "ddp"))
    for found in ranks:
        assert laid["parts_bytes"]["ddp_buckets"] == found["ddp"]["buckets"]
    assert laid["per_rank_peak_allocated_bytes"] == single["peak_allocated_bytes"] + found["ddp"]["buckets"]
    view = parallel.per_rank(single, parallel.units(model(), 2), parallel.Layout(2, "ddp", bucket_view=True))
    assert view["parts_bytes"]["ddp_buckets"] == 0


def test_sharding_lowers_the_per_rank_peak_as_the_world_grows_and_offload_removes_state() -> None:
    single = single_gpu()
    peaks = [parallel.per_rank(single, parallel.units(model(), w), parallel.Layout(w, "zero3"))
             for w in (2, 4, 8)]  # fmt: skip
    assert [p["parts_bytes"]["optimizer_state"] for p in peaks] == sorted(
        (p["parts_bytes"]["optimizer_state"] for p in peaks), reverse=True
    )
    off = parallel.per_rank(single, parallel.units(model(), 8), parallel.Layout(8, "zero3", offload="params"))
    assert off["parts_bytes"]["optimizer_state"] == 0  # the small model's parameters are all ZeRO-3-persistent:
    assert off["parts_bytes"]["parameters"] == sum(u.persistent_bytes for u in parallel.units(model(), 8))  # whole
    assert off["per_rank_peak_allocated_bytes"] < peaks[-1]["per_rank_peak_allocated_bytes"]


def test_gpus_needed_is_the_fewest_ranks_that_fit_and_none_for_ddp_past_one() -> None:
    single = single_gpu()
    units_of = lambda w: parallel.units(model(), w)  # noqa: E731
    per = {w: parallel.per_rank(single, units_of(w), parallel.Layout(w, "fsdp2"))["per_rank_peak_allocated_bytes"]
           for w in (2, 4, 8)}  # fmt: skip
    budget = per[4]
    assert parallel.gpus_needed(single, units_of, parallel.Layout(2, "fsdp2"), lambda w: budget) == (
        2 if per[2] <= budget else 4
    )
    assert parallel.gpus_needed(single, units_of, parallel.Layout(2, "ddp"), lambda w: budget) is None
    roomy = single["peak_allocated_bytes"]
    assert parallel.gpus_needed(single, units_of, parallel.Layout(2, "ddp"), lambda w: roomy) == 1


def test_no_reshard_keeps_every_unit_gathered() -> None:
    units = parallel.units(model(), 2)
    kept = parallel.per_rank(single_gpu(), units, parallel.Layout(2, "fsdp2", reshard=False))
    assert kept["parts_bytes"]["gathered_parameters"] == sum(u.param_bytes for u in units)


def test_hybrid_sharding_shards_within_its_group_and_adds_the_replicas_all_reduce() -> None:
    single = single_gpu()
    over_two = parallel.per_rank(single, parallel.units(model(), 2), parallel.Layout(2, "fsdp2"))["parts_bytes"]
    hybrid = parallel.Layout(8, "fsdp2", shard_size=2)
    laid = parallel.per_rank(single, parallel.units(model(), hybrid.shards), hybrid)["parts_bytes"]
    assert laid["parameters"] == over_two["parameters"]
    assert laid["replica_all_reduce_buffer"] == max(u.trained_shard_bytes for u in parallel.units(model(), 2))
    assert parallel.check(parallel.Layout(8, "fsdp2", shard_size=3)) == "--shard-size must divide --world-size"
    assert "applies to fsdp" in str(parallel.check(parallel.Layout(8, "zero3", shard_size=2)))
    units_of = lambda w: parallel.units(model(), w)  # noqa: E731
    assert parallel.gpus_needed(single, units_of, hybrid, lambda w: 10**12) == 2
    assert parallel.gpus_needed(single, units_of, hybrid, lambda w: 1) is None


def test_zero2_and_zero3_keep_their_gradient_partition_even_when_the_peak_has_no_gradients() -> None:
    single = single_gpu()
    no_grads = {**single, "by_category_bytes": {**single["by_category_bytes"], "gradients": 0}}
    trained = sum(p.numel() for p in model().parameters())
    for kind in ("zero2", "zero3"):
        laid = parallel.per_rank(no_grads, parallel.units(model(), 4), parallel.Layout(4, kind))["parts_bytes"]
        assert laid["gradient_partition"] == math.ceil(trained / 4) * 4
        offloaded = parallel.Layout(4, kind, offload="optimizer")
        off = parallel.per_rank(no_grads, parallel.units(model(), 4), offloaded)["parts_bytes"]
        assert off["gradient_partition"] == 0
    zero1 = parallel.per_rank(no_grads, parallel.units(model(), 4), parallel.Layout(4, "zero1"))["parts_bytes"]
    assert zero1.get("gradients", 0) == 0  # stage 1 keeps the full gradients only while they exist


def test_the_largest_batch_per_rank_is_the_last_whose_per_rank_peak_fits() -> None:
    calls: list[int] = []

    def peak_of(b: int) -> int:  # a fixed part and a per-sample part, as a rank's peak has
        calls.append(b)
        return 5_000 + 300 * b + (b * b) // 50

    found = parallel.largest_batch(peak_of, 40_000, start=4)
    assert len(set(calls)) <= 10  # predictions are seconds each: a handful, not a scan
    assert found["max_batch_size"] == max(b for b in range(1, 1000) if peak_of(b) <= 40_000)
    assert parallel.largest_batch(peak_of, 100, start=4)["max_batch_size"] == 0


def test_the_optimizer_steps_transient_is_a_later_steps_temporary_not_the_first_steps_new_state():
    # AdamW's first step makes its two moments (8 bytes a parameter) before its foreach temporary;
    # a layout counts the state itself (sharded or not), so only the rise of a later step is added
    from oomsight.predict import predict_peak

    def build():
        return torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])

    p = predict_peak(build, lambda n: torch.randn(n, 512), 8, steps=3, workspace_bytes=0)
    params = 4 * 4 * (512 * 512 + 512)  # fp32
    transient = p.moments["optimizer_step_transient_bytes"]
    assert params <= transient < params + 64 * 1024, transient  # one parameter-sized foreach buffer
