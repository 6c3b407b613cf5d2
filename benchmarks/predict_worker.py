"""What ``bench_predict.py`` runs outside its own process, one configuration at a time:

* :func:`predict`: the predictions (in a process pool, CPU only, the GPU hidden);
* :func:`measure`: the measured peaks and the true largest batch (a fresh process per
  configuration, the oomsight hook started), or only the predicted largest batch (``check_only``);
* :func:`calibrate`: the cuBLAS workspaces and the SDPA backend choices, against the
  predictor's rules.

A configuration is one of ``bench_predict.CONFIGS``, with the keys the script adds to it.
"""

from __future__ import annotations

import json
import os
from typing import Any

GIB = 1 << 30
MARGIN = 0.10
STEPS = 3


def _setup(cfg: dict[str, Any]) -> dict[str, Any]:
    import functools

    import torch

    from oomsight.predict import models, tracing

    spec = models.get(cfg["model"])
    if cfg.get("optimizer") == "sgd":
        make_opt: Any = functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9)
    else:
        make_opt = functools.partial(torch.optim.AdamW, lr=1e-4)
    autocast = torch.bfloat16 if cfg.get("autocast") == "bf16" else None
    step = tracing.default_step(accumulation=cfg.get("accumulation", 1), autocast=autocast)
    return {"spec": spec, "optimizer": make_opt, "step": step}


def predict(cfg: dict[str, Any]) -> dict[str, Any]:
    """The predictions of one configuration (CPU only)."""
    from oomsight.predict import largest_batch, predict_peak

    s = _setup(cfg)
    spec = s["spec"]
    kwargs = {"expandable_segments": bool(cfg.get("expandable")), "steps": STEPS}
    if cfg.get("history"):
        _dump_trace(cfg)
    p = predict_peak(spec.build, lambda b: spec.batch(b, "cpu"), cfg["batch"], s["optimizer"], s["step"], **kwargs)
    search = largest_batch(
        spec.build,
        lambda b: spec.batch(b, "cpu"),
        int(cfg["cap_gib"] * GIB),
        s["optimizer"],
        s["step"],
        margin=MARGIN,
        start=max(1, cfg["batch"] // 2),
        **kwargs,
    )
    pressure = {}
    for key in ("known_max_fits", "known_max_fails"):
        b = cfg.get(key)
        if b:
            q = predict_peak(spec.build, lambda n: spec.batch(n, "cpu"), b, s["optimizer"], s["step"], **kwargs)
            pressure[key] = {"batch": b, "allocated_share_of_cap": q.peak_allocated_bytes / (cfg["cap_gib"] * GIB)}
    largest = {k: v for k, v in search.to_dict().items() if k != "prediction"}
    return {"prediction": p.to_dict(), "largest": largest, "pressure": pressure}


def _run_steps(s: dict[str, Any], batch_size: int) -> None:
    import torch

    spec = s["spec"]
    with torch.device("cuda"):
        model = spec.build()
    optimizer = s["optimizer"](model.parameters())
    batch = spec.batch(batch_size, "cuda")
    try:
        for _ in range(STEPS):
            s["step"](model, batch, optimizer)
        torch.cuda.synchronize()
    finally:
        del model, optimizer, batch


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    """Worker: the measured peaks at the batch size, then the true largest batch under the cap."""
    import gc

    import torch

    import oomsight

    oomsight.start()
    s = _setup(cfg)
    if cfg.get("check_only"):  # measured before (--measured): only run the predicted largest batch
        return _check_only(torch, s, cfg)
    torch.cuda.reset_peak_memory_stats()
    if cfg.get("history"):
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
    _run_steps(s, cfg["batch"])
    if cfg.get("history"):
        _dump_history(torch, cfg)
    measured = {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
    }
    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    cap = int(cfg["cap_gib"] * GIB)
    torch.cuda.set_per_process_memory_fraction(cap / total)
    runs: dict[int, bool] = {}

    def fits(b: int) -> bool:
        if b not in runs:
            try:
                _run_steps(s, b)
                runs[b] = True
            except torch.OutOfMemoryError:
                runs[b] = False
            gc.collect()
            torch.cuda.empty_cache()
        return runs[b]

    predicted_max = cfg.get("predicted_max")
    predicted_ok = fits(predicted_max) if predicted_max else None
    if cfg.get("check_only"):
        return {"predicted_max_ran": predicted_ok, "runs": sorted(runs.items())}
    if cfg.get("known_max"):  # measured by an earlier run of this script (--reuse): not searched again
        good, bad = cfg["known_max"]
    else:
        good, bad = _true_max(fits, cfg["batch"], measured["peak_reserved_bytes"], cap, predicted_max)
    return {
        "measured": measured,
        "true_max_batch": good,
        "first_failing_batch": bad,
        "predicted_max_ran": predicted_ok,
        "runs": sorted(runs.items()),
    }


def _check_only(torch: Any, s: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(int(cfg["cap_gib"] * GIB) / total)
    try:
        _run_steps(s, cfg["predicted_max"])
        ok = True
    except torch.OutOfMemoryError:
        ok = False
    return {"predicted_max_ran": ok, "runs": [[cfg["predicted_max"], ok]]}


def _dump_history(torch: Any, cfg: dict[str, Any]) -> None:
    """The allocator's own event list of the measured steps: [action, size] pairs."""
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [[e["action"], e["size"]] for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    with open(os.path.join(cfg["history"], f"history-{cfg['name']}.json"), "w") as fh:
        json.dump(events, fh)


def _dump_trace(cfg: dict[str, Any]) -> None:
    """The predictor's events of the same steps, to compare with the allocator's."""
    from oomsight.predict import tracing

    s = _setup(cfg)
    spec = s["spec"]
    trace = tracing.trace_steps(
        spec.build, lambda: spec.batch(cfg["batch"], "cpu"), lambda m: s["optimizer"](m.parameters()), s["step"],
        steps=STEPS, workspace_bytes=0,
    )  # fmt: skip
    with open(os.path.join(cfg["history"], f"trace-{cfg['name']}.json"), "w") as fh:
        json.dump({"events": trace.events, "categories": trace.categories, "step_ends": trace.step_ends}, fh)


def _true_max(fits: Any, b0: int, peak0: int, cap: int, hint: Any) -> tuple[int, int]:
    guess = hint or max(1, int(b0 * cap / max(peak0, 1)))
    if fits(guess):
        good, b = guess, guess + max(1, guess // 20)
        while fits(b):
            good, b = b, b + max(1, (b - good) * 2)
        bad = b
    else:
        bad, b = guess, guess - max(1, guess // 20)
        while b > 1 and not fits(b):
            bad, b = b, b - max(1, (bad - b) * 2)
        good = max(1, b)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good, bad


def calibrate() -> dict[str, Any]:
    """cuBLAS workspaces (forward thread, autograd's device thread) and the SDPA backend choice."""
    import torch

    from oomsight.predict.emulation import sdpa_backend

    a = torch.randn(64, 64, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = a @ a
    torch.cuda.synchronize()
    forward = torch.cuda.memory_allocated() - before - y.untyped_storage().nbytes()
    before = torch.cuda.memory_allocated()
    y.sum().backward()
    torch.cuda.synchronize()
    backward = torch.cuda.memory_allocated() - before - a.grad.untyped_storage().nbytes()
    members = torch.nn.attention.SDPBackend.__members__
    names = {int(m.value): name for name, m in members.items()}
    choices = []
    for dtype, mask, kv_heads in [
        (torch.bfloat16, False, 16),
        (torch.float32, False, 16),
        (torch.bfloat16, True, 16),
        (torch.float32, True, 16),
        (torch.bfloat16, False, 4),
        (torch.float32, False, 4),
    ]:
        q = torch.randn(2, 16, 128, 64, device="cuda", dtype=dtype)
        k = torch.randn(2, kv_heads, 128, 64, device="cuda", dtype=dtype)
        m = torch.ones(2, 1, 128, 128, device="cuda", dtype=torch.bool) if mask else None
        gqa = kv_heads != 16
        try:
            got = torch._fused_sdp_choice(q, k, k, attn_mask=m, dropout_p=0.0, is_causal=not mask, enable_gqa=gqa)
            chosen = names.get(int(got), str(got))
        except Exception as exc:
            chosen = f"error: {exc}"[:200]
        ours = sdpa_backend(q, m, 0.0, gqa)
        choices.append({"dtype": str(dtype), "mask": mask, "kv_heads": kv_heads, "torch": chosen, "ours": ours})
    return {
        "cublas_workspace_forward_bytes": forward,
        "cublas_workspace_backward_bytes": backward,
        "capability": list(torch.cuda.get_device_capability()),
        "sdpa": choices,
    }
