"""Leaks: memory that is still referenced after the step that made it, growing until the OOM.

Every one of these runs a fixed number of steps; the plain run runs out of the capped GPU well before the
end, and ``--remedy`` (remedy key ``leak``) keeps a Python number, a CPU copy or a running statistic
instead of the GPU tensor, after which the same number of steps fits.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F
from common import DRY, autocast, bert_config, cap_gpu, dev, fast_fp32, gpt2, llama, pick, tokens, workload


@workload("leak", "leak")
def gpt2_keeps_outputs(remedy: bool) -> None:
    """GPT-2 (6 layers) pretraining loop that keeps every step's ``outputs`` for "later analysis".

    ``history.append(outputs)`` holds the step's ModelOutput, i.e. its fp32 logits (batch x seq x 50257,
    about 400 MB) — backward already freed the saved activations, but the logits stay. Live memory
    climbs by the same amount every step: a leak. Remedy: keep ``outputs.loss.item()``.
    """
    cap_gpu(10)
    model = gpt2(6, 768, 12)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    history: list = []
    for _step in range(pick(120, 2)):
        ids = tokens(pick(4, 2), pick(512, 16), model.config.vocab_size)
        outputs = model(input_ids=ids, labels=ids)
        outputs.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        history.append(outputs.loss.item() if remedy else outputs)


@workload("leak", "leak")
def llama_retain_graph_loss_log(remedy: bool) -> None:
    """Llama-style LM; ``loss.backward(retain_graph=True)`` (copied from a GAN recipe) plus ``losses.append(loss)``.

    With retain_graph the autograd graph keeps its saved activations after backward; appending the loss
    tensor to a Python list keeps the whole graph — every step's activations — alive. ~0.7 GB a step.
    Label leak: the growth is tensors the user keeps. Remedy: log ``loss.item()`` (the graph then dies with
    the step even though retain_graph is still passed).
    """
    cap_gpu(12)
    model = llama(512, 8, 1408, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses: list = []
    for _step in range(pick(60, 2)):
        ids = tokens(pick(4, 2), pick(256, 16), model.config.vocab_size)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward(retain_graph=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item() if remedy else loss)
    print("mean loss", float(sum(float(x) for x in losses) / len(losses)))


@workload("leak", "leak")
def vit_forward_hook_activations(remedy: bool) -> None:
    """ViT-B/16 image classifier (HF ViTForImageClassification, bf16 autocast) with forward hooks for "feature viz".

    A forward hook on every encoder layer appends the layer's output tensor to ``feature_store`` and
    nothing ever clears it: 12 x batch x 197 x 768 per step. Remedy: the hook records the activation norm
    as a float (what the dashboard actually plotted).
    """
    from transformers import ViTConfig, ViTForImageClassification

    cap_gpu(8)
    size = pick(224, 32)
    cfg = ViTConfig(image_size=size, num_labels=1000) if not DRY.on else ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    with dev():
        model = ViTForImageClassification(cfg)
    feature_store: list = []

    def hook(_mod, _inp, out):  # type: ignore[no-untyped-def]
        h = out[0] if isinstance(out, tuple) else out
        feature_store.append(h.detach().float().norm().item() if remedy else h)

    blocks = model.vit.layers if hasattr(model.vit, "layers") else model.vit.encoder.layer  # transformers >= 5.2x
    for layer in blocks:
        layer.register_forward_hook(hook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _step in range(pick(80, 2)):
        x = torch.randn(pick(32, 2), 3, size, size, device=dev())
        y = torch.randint(0, cfg.num_labels, (x.shape[0],), device=dev())
        with autocast():
            loss = model(pixel_values=x, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


class _Encoder(torch.nn.Module):
    def __init__(self, d: int, layers: int, heads: int, vocab: int, classes: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True, norm_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(ids)).mean(1))


@workload("leak", "leak")
def encoder_grad_snapshots_every_10(remedy: bool) -> None:
    """nn.TransformerEncoder text classifier (~80M params) that snapshots all gradients every 10th step.

    For a gradient-noise study, ``grad_snapshots.append([p.grad.clone() for p in params])`` runs every 10
    steps and the list is never trimmed: a stair-shaped leak of one full fp32 gradient copy (~320 MB) per
    stair, flat in between. Remedy: keep the per-tensor gradient norms as floats.
    """
    fast_fp32()
    cap_gpu(6)
    d, layers = pick(1024, 64), pick(6, 2)
    model = _Encoder(d, layers, pick(16, 4), 32000, 20).to(dev())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    grad_snapshots: list = []
    for step in range(pick(200, 2)):
        ids = torch.randint(0, 32000, (pick(32, 2), pick(128, 8)), device=dev())
        y = torch.randint(0, 20, (ids.shape[0],), device=dev())
        F.cross_entropy(model(ids), y).backward()
        if step % 10 == 0:
            params = [p for p in model.parameters() if p.grad is not None]
            if remedy:
                grad_snapshots.append([p.grad.norm().item() for p in params])
            else:
                grad_snapshots.append([p.grad.clone() for p in params])
        opt.step()
        opt.zero_grad(set_to_none=True)


@workload("leak", "leak")
def bert_dynpad_keeps_hidden_states(remedy: bool) -> None:
    """BERT-base fine-tune with dynamic padding that keeps ``outputs.hidden_states`` for a probing study.

    Batches are padded to their own longest sequence (lengths drawn from a skewed distribution, 32..512),
    so the step's memory jumps around; on top of that every step appends the 13 hidden-state tensors to
    ``probe_feats``: a leak whose slope is noisy. Remedy: keep only the CLS vectors, on the CPU.
    """
    from transformers import BertForSequenceClassification

    cap_gpu(8)
    with dev():
        model = BertForSequenceClassification(bert_config(num_labels=3))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    rng = random.Random(0)
    probe_feats: list = []
    for _step in range(pick(90, 2)):
        lengths = [min(512, int(rng.lognormvariate(4.6, 0.6))) for _ in range(pick(16, 2))]
        seq = pick(max(lengths), 16)
        ids = tokens(len(lengths), seq, 30000)
        mask = (torch.arange(seq, device=dev())[None] < torch.tensor(lengths, device=dev())[:, None]).long()
        y = torch.randint(0, 3, (len(lengths),), device=dev())
        with autocast():
            out = model(input_ids=ids, attention_mask=mask, labels=y, output_hidden_states=True)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        probe_feats.append(out.hidden_states[-1][:, 0].detach().cpu() if remedy else out.hidden_states)


@workload("leak", "leak")
def segformer_caches_probs_for_metrics(remedy: bool) -> None:
    """SegFormer semantic segmentation; per-step softmax probabilities cached on the GPU for epoch-end metrics.

    The probabilities are ``.detach()``-ed (no graph) and upsampled to label resolution, then appended to
    ``all_probs`` with the masks for an epoch-end mIoU/calibration computation: detached GPU tensors, about
    180 MB a step, a leak. Remedy: update a running confusion matrix on the GPU each step (what torchmetrics
    does) and keep nothing.
    """
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    cap_gpu(8)
    classes, size = 21, pick(512, 64)
    cfg = SegformerConfig(num_labels=classes) if not DRY.on else SegformerConfig(
        num_labels=classes, hidden_sizes=[8, 16, 32, 64], decoder_hidden_size=32, depths=[1, 1, 1, 1])
    with dev():
        model = SegformerForSemanticSegmentation(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-5)
    all_probs: list = []
    all_masks: list = []
    confusion = torch.zeros(classes, classes, dtype=torch.long, device=dev())
    for _step in range(pick(70, 2)):
        x = torch.randn(pick(8, 2), 3, size, size, device=dev())
        masks = torch.randint(0, classes, (x.shape[0], size, size), device=dev())
        with autocast():
            out = model(pixel_values=x, labels=masks)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        probs = F.interpolate(out.logits.detach().float(), size=(size, size), mode="bilinear").softmax(1)
        if remedy:
            idx = masks.flatten() * classes + probs.argmax(1).flatten()
            confusion += torch.bincount(idx, minlength=classes * classes).view(classes, classes)
        else:
            all_probs.append(probs)
            all_masks.append(masks)


@workload("leak", "leak")
def gpt2_eval_forgets_no_grad_accumulates(remedy: bool) -> None:
    """GPT-2 validation loop that forgets ``torch.no_grad()`` and collects ``outputs.logits`` in a list.

    Ambiguous by nature, labelled ``leak``: each kept logits tensor carries its autograd graph, so every
    batch's forward activations stay alive (~0.5 GB a batch). Forgetting no_grad alone would be harmless
    here (each batch's graph dies with the batch), and adding no_grad alone would still keep 200 MB of
    detached logits a batch, which also runs out over the 200-batch set. The fix that works is to stop
    keeping the tensors: the remedy keeps argmax predictions on the CPU (grad mode left as it was).
    """
    cap_gpu(12)
    model = gpt2(6, 768, 12)
    model.eval()
    all_logits: list = []
    n_correct = 0
    for _batch in range(pick(200, 2)):
        ids = tokens(pick(4, 2), pick(256, 16), model.config.vocab_size)
        outputs = model(input_ids=ids)
        if remedy:
            preds = outputs.logits.argmax(-1).cpu()
            n_correct += int((preds[:, :-1] == ids[:, 1:].cpu()).sum())
        else:
            all_logits.append(outputs.logits)
    print("top-1 next-token hits", n_correct)


@workload("leak", "leak")
def gpt2_debug_keeps_attentions_fast(remedy: bool) -> None:
    """GPT-2 small (12 layers, eager attention) debugging run: ``output_attentions=True`` and keeps every output.

    Each step's kept output holds 12 attention-probability maps (batch x 12 x 1024 x 1024 fp32, ~1.2 GB
    together) plus the logits: ~1.7 GB a step, so the 16 GiB GPU is gone within ~5 steps. A fast leak.
    Remedy: keep the attention entropy per layer as floats.
    """
    cap_gpu(16)
    model = gpt2(12, 768, 12, attn_implementation="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    debug_outputs: list = []
    for _step in range(pick(30, 2)):
        ids = tokens(pick(2, 2), pick(1024, 16), model.config.vocab_size)
        out = model(input_ids=ids, labels=ids, output_attentions=True)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if remedy:
            debug_outputs.append([float(-(a * (a + 1e-9).log()).sum(-1).mean()) for a in out.attentions])
        else:
            debug_outputs.append(out)
