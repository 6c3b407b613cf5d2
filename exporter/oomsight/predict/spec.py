"""The model spec a ``PredictJob`` describes: the named model, the transformers configuration or the
user's ``--module`` file, then ``--dtype``, ``--checkpointing``, ``--lora``, ``--quantize`` and
``--prepare-kbit`` applied to what its ``build()`` returns, in that order.

A spec is ``{"build": () -> nn.Module, "batch": (n, device) -> inputs}``, with ``"optimizer"``
(params -> Optimizer) and ``"step"`` (model, batch, optimizer) -> None where the user's file gives them,
``"config"`` and ``"seq_len"`` for a configuration. What cannot be used is a ``SpecError`` (one line, exit
2), the user's own error named with its file and line, never a traceback.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import traceback
from typing import Any

from oomsight.predict import inputs
from oomsight.predict.job import DTYPES, PredictJob


class SpecError(ValueError):
    """What was given to predict cannot be used: the line to print."""


def spec_of(job: PredictJob) -> dict[str, Any]:
    """The model spec the job describes (the module's docstring)."""
    found = _base_spec(job)
    if job.optimizer_impl and found.get("optimizer"):
        raise SpecError(
            "--optimizer-impl applies to the optimizer predict builds (--optimizer); the --module's own "
            "'optimizer' chooses its implementation itself (foreach=, fused=)"
        )
    if job.lora:  # a target the model does not have is the user's to fix, not the trace's (exit 2)
        inputs.check_lora_targets(found["build"], job.lora_targets, importlib.util.find_spec("peft") is not None)
    found = {**found, "build": adapted(job, found["build"])}
    if job.generate:
        from oomsight.predict import generation, hfmodel

        if "config" not in found:
            raise SpecError("--generate needs a transformers configuration (--model TYPE:... or a config.json)")
        assert job.cache is not None  # job_from_args: dynamic where --cache is not given
        found.update(
            build=generation.eval_mode(found["build"]),
            batch=hfmodel.tokens(found["config"], job.prompt_tokens),
            step=generation.decode_step(job.new_tokens, job.cache),
            optimizer=_no_optimizer,
        )
    return found


def _no_optimizer(_params: Any) -> None:
    """Inference: nothing to step."""
    return None


def adapted(job: PredictJob, build: Any) -> Any:
    """``build`` with the job's ``--dtype``, ``--checkpointing``, ``--lora``, ``--quantize`` and
    ``--prepare-kbit`` applied to what it returns."""
    import torch

    from oomsight.predict import adapter

    if job.dtype:
        dtype = getattr(torch, DTYPES[job.dtype])
        build = functools.partial(_built_as, build, dtype)
    if job.checkpointing:
        build = functools.partial(_checkpointed, build)
    if job.lora:
        peft = importlib.util.find_spec("peft") is not None
        build = adapter.with_lora(build, job.lora_rank, job.lora_targets, peft)
    if job.quantize:
        build = adapter.with_quantized_base(build, job.quantize)
    if job.prepare_kbit:
        build = adapter.prepared_for_kbit_training(build)
    return build


def _built_as(build: Any, dtype: Any) -> Any:
    return build().to(dtype)


def _checkpointed(build: Any) -> Any:
    """transformers' activation checkpointing of every block (non-reentrant, as accelerate and TRL set it)."""
    model = build()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _base_spec(job: PredictJob) -> dict[str, Any]:
    from oomsight.predict import hfmodel, models

    if job.model and job.model not in models.MODELS and hfmodel.is_config(job.model):
        return _config_spec(job, job.model)
    if job.seq_len is not None:
        raise SpecError("--seq-len applies to a transformers configuration (--model TYPE:... or a config.json)")
    if job.model:
        try:
            named = models.get(job.model)
            models.check_available(named)
        except (KeyError, ImportError) as exc:
            raise SpecError(exc.args[0] if exc.args else exc) from None
        return {"build": named.build, "batch": named.batch}
    return _module_spec(str(job.module))


def _module_spec(module: str) -> dict[str, Any]:
    """``--module FILE.py:NAME``: what the user's function returns, checked (``inputs.module_spec``)."""
    path, _, name = module.rpartition(":")
    if not path or not name:
        raise SpecError(f"--module {module}: give FILE.py:NAME")
    if not os.path.isfile(path):
        raise SpecError(f"--module: {path}: no such file")
    function = getattr(_load(path), name, None)
    if not callable(function):
        raise SpecError(f"--module: {path} has no function {name}")
    try:
        found = function()
    except Exception as exc:
        raise SpecError(f"--module: {path}: {name}() raised {_in_user_file(exc, path)}") from None
    return inputs.module_spec(found, f"{path}: {name}()")


def _config_spec(job: PredictJob, model: str) -> dict[str, Any]:
    """The spec of a transformers configuration: its model by its head, its batch by what it takes
    (``hfmodel.inputs_of``); the flags about tokens checked against that and against its positions."""
    from oomsight.predict import hfmodel

    try:
        config = hfmodel.load_config(model)
    except hfmodel.ConfigError as exc:
        raise SpecError(str(exc)) from None
    except ImportError:
        raise SpecError(
            f"--model {model}: a configuration needs transformers (pip install 'oomsight[predict]')"
        ) from None
    where, takes = model.partition(":")[0], hfmodel.inputs_of(config)
    found = {"build": hfmodel.builder(config), "config": config}
    if takes != hfmodel.TEXT:
        inputs.check_image_model(where, job, with_text=takes == hfmodel.IMAGES_AND_TEXT)
    if takes == hfmodel.IMAGES:
        return {**found, "batch": hfmodel.image_inputs(config)}
    text = hfmodel.text_side(config)
    inputs.check_positions(text, where, job)
    seq = hfmodel.seq_len_of(text, job.seq_len)
    return {**found, "batch": hfmodel.batch_of(config, seq), "seq_len": seq}


def _load(path: str) -> Any:
    """The user's file as a module; its own error (a ``SyntaxError``, a ``NameError``) named with
    the file and line, never a traceback."""
    loader = importlib.util.spec_from_file_location("oomsight_predict_module", path)
    if loader is None or loader.loader is None:
        raise SpecError(f"--module: {path} is not a Python file")
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except SyntaxError as exc:
        raise SpecError(f"--module: {path}:{exc.lineno}: SyntaxError: {exc.msg}") from None
    except Exception as exc:  # the user's file failed while it was imported
        raise SpecError(f"--module: {path} failed to import: {_in_user_file(exc, path)}") from None
    return module


def _in_user_file(exc: BaseException, path: str) -> str:
    """``NameError: name 'x' is not defined (line 6)``: the error and its line in the user's file."""
    target = os.path.abspath(path)
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == target]
    return f"{type(exc).__name__}: {first_line(str(exc))}" + (f" (line {lines[-1]})" if lines else "")


def first_line(text: str) -> str:
    """The first line of an error's text (the text itself where it is blank)."""
    return text.strip().splitlines()[0] if text.strip() else text
