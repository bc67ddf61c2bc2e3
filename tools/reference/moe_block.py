#!/usr/bin/env python3
"""Mixture-of-experts MLP blocks in float64 and what they compute, for weft's MoE layer
(include/weft/nn/moe.hpp, ops/moe.hpp): tests/nn/moe.cpp reads the fixtures and checks the output,
the losses and every gradient, so CI needs neither PyTorch nor transformers.

  tools/reference/moe_block.py OUT_DIR      (tests/fixtures/moe)

writes OUT_DIR/<case>.safetensors for each case:
  mixtral    transformers' MixtralSparseMoeBlock: softmax over 4 experts, top 2, renormalised
  qwen3      transformers' Qwen3MoeSparseMoeBlock with norm_topk_prob False: 6 experts, top 3, the
             top-k probabilities as they are
  capacity   the mixtral case's routing with a capacity of ceil(0.75 N k / E) token slots an expert:
             an expert keeps its slots in token order and drops the rest (their outputs and
             gradients zero), written here in plain PyTorch
  shared     the mixtral case plus a shared expert (a SwiGLU MLP every token passes, added)
  deepseek   transformers' DeepseekV3MoE: sigmoid scores over 6 experts, top 2 of the scores plus
             e_score_correction_bias (set so that it changes some choices), renormalised (+ 1e-20),
             times routed_scaling_factor 2.5, one shared expert; no z-loss, and the load-balancing
             loss over the scores normalised to sum 1 (as Megatron-Core's for sigmoid routers)
  deepseek_groups  the same over 8 experts in 4 groups, the top 3 from the top 2 groups
             (n_group 4, topk_group 2: group-limited routing, which changes some choices; transformers'
             own float32 router chooses the same experts)

Each holds the tensors x (N, C), dy (N, C) (the upstream gradient), router (E, C), gate_up (E, 2H, C)
(transformers' layout: the H gate rows, then the H up rows), down (E, C, H), shared_gate_up
(2S, C) and shared_down (C, S) where there is a shared expert; y (N, C); "aux" (the load-balancing
loss: E sum_e f_e P_e, f_e the slots routed to e over N, P_e the mean probability of e, as
transformers' load_balancing_loss_func computes it for one layer), "z" (the router z-loss: the mean
over tokens of logsumexp(logits)^2); "index" (N, k) the experts chosen (int64); and "grad.<name>"
for x and every weight, of L = sum(y * dy) + 0.02 aux + 0.001 z; "config" (int64): N, C, H, E, k,
renormalise, S, capacity (0: dropless), and for deepseek sigmoid (1), the scale x 1000 and whether
there is an expert bias (its values "bias" (E)), and for deepseek_groups the groups and top groups.
"""
import math
import pathlib
import sys

import torch
from safetensors.torch import save_file
from transformers import DeepseekV3Config, MixtralConfig, Qwen3MoeConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE, DeepseekV3TopkRouter
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

AUX, Z = 0.02, 0.001


def router_losses(logits, index, E):
    probs = torch.softmax(logits, dim=-1)
    N = logits.shape[0]
    counts = torch.zeros(E, dtype=torch.float64).scatter_add_(0, index.reshape(-1),
                                                              torch.ones(index.numel(), dtype=torch.float64))
    aux = E * torch.sum((counts / N) * probs.sum(0) / N)
    z = torch.mean(torch.logsumexp(logits, dim=-1) ** 2)
    return aux, z


def swiglu(x, gate_up, down):
    H = gate_up.shape[0] // 2
    h = x @ gate_up.T
    return (torch.nn.functional.silu(h[:, :H]) * h[:, H:]) @ down.T


def plain_block(x, router, gate_up, down, k, renorm, capacity):
    """The routed experts in plain PyTorch: top-k of the softmax, an expert's slots in token order,
    those past the capacity dropped."""
    logits = x @ router.T
    probs = torch.softmax(logits, dim=-1)
    w, index = torch.topk(probs, k, dim=-1)
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    y = torch.zeros_like(x)
    E = router.shape[0]
    for e in range(E):
        tok, slot = torch.where(index == e)  # row-major: token order
        if capacity > 0:
            tok, slot = tok[:capacity], slot[:capacity]
        if tok.numel() == 0:
            continue
        out = swiglu(x[tok], gate_up[e], down[e]) * w[tok, slot, None]
        y = y.index_add(0, tok, out)
    return y, logits, index


def case(name, out, seed, N=12, C=8, H=6, E=4, k=2, renorm=True, S=0, capacity_factor=0.0):
    torch.manual_seed(seed)
    x = torch.randn(N, C, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(N, C, dtype=torch.float64)
    capacity = math.ceil(capacity_factor * N * k / E) if capacity_factor > 0 else 0
    if name == "qwen3":
        cfg = Qwen3MoeConfig(hidden_size=C, moe_intermediate_size=H, num_experts=E, num_experts_per_tok=k,
                             norm_topk_prob=renorm)
        block = Qwen3MoeSparseMoeBlock(cfg).to(torch.float64)
    else:
        cfg = MixtralConfig(hidden_size=C, intermediate_size=H, num_local_experts=E, num_experts_per_tok=k)
        block = MixtralSparseMoeBlock(cfg).to(torch.float64)
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 1.0)
        block.experts.gate_up_proj.normal_(0.0, 1.0 / math.sqrt(C))
        block.experts.down_proj.normal_(0.0, 1.0 / math.sqrt(H))
    # transformers' routers take the softmax in float32 whatever the model's dtype; in float64 here
    # (the same formula), so that 1e-10 can hold.
    def router64(hidden, gate=block.gate):
        logits = torch.nn.functional.linear(hidden.reshape(-1, C), gate.weight)
        top, idx = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        if renorm:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, idx
    block.gate.forward = router64
    params = {"router": block.gate.weight, "gate_up": block.experts.gate_up_proj, "down": block.experts.down_proj}
    if S > 0:
        params["shared_gate_up"] = torch.nn.Parameter(torch.randn(2 * S, C, dtype=torch.float64) / math.sqrt(C))
        params["shared_down"] = torch.nn.Parameter(torch.randn(C, S, dtype=torch.float64) / math.sqrt(S))
    if name in ("mixtral", "qwen3", "shared"):
        y = block(x.unsqueeze(0)).squeeze(0)  # transformers' block
        logits = x @ block.gate.weight.T
        _, index = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        # The plain version agrees (the capacity case's check of itself).
        y_plain, _, _ = plain_block(x, params["router"], params["gate_up"], params["down"], k, renorm, 0)
        assert torch.allclose(y, y_plain, rtol=0, atol=1e-13), (y - y_plain).abs().max()
    else:
        y, logits, index = plain_block(x, params["router"], params["gate_up"], params["down"], k, renorm, capacity)
    if S > 0:
        y = y + swiglu(x, params["shared_gate_up"], params["shared_down"])
    aux, z = router_losses(logits, index, E)
    loss = (y * dy).sum() + AUX * aux + Z * z
    loss.backward()
    tensors = {"x": x.detach(), "dy": dy, "y": y.detach(), "aux": aux.detach().reshape(1),
               "z": z.detach().reshape(1), "index": index.to(torch.int64),
               "config": torch.tensor([N, C, H, E, k, int(renorm), S, capacity], dtype=torch.int64),
               "grad.x": x.grad}
    for n, p in params.items():
        tensors[n] = p.detach().clone()
        tensors["grad." + n] = p.grad
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / f"{name}.safetensors"))
    print(f"{name}: y {y.abs().max().item():.4f} aux {aux.item():.6f} z {z.item():.6f}"
          f" capacity {capacity} index {index.tolist()}")


def grouped_choice(scores_for_choice, groups, top_groups, k):
    """DeepseekV3TopkRouter's choice (transformers 5), in the dtype given: each group scored by the
    sum of its two largest scores, the experts outside the top groups masked, the top k of the rest
    (sorted, largest first)."""
    n, E = scores_for_choice.shape
    group_scores = scores_for_choice.view(n, groups, E // groups).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=top_groups, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, groups, E // groups).reshape(n, E)
    return torch.topk(scores_for_choice.masked_fill(~score_mask.bool(), float("-inf")), k, dim=-1, sorted=True)[1]


def deepseek_case(out, seed, N=12, C=8, H=6, E=6, k=2, scale=2.5, groups=1, top_groups=1, name="deepseek"):
    """transformers' DeepSeek-V3 MoE block in float64: its router lifted to float64 (it computes in
    float32 whatever the dtype); with groups 1, every expert eligible; with more, transformers'
    group-limited choice (n_group, topk_group), whose float32 router must choose the same experts."""
    torch.manual_seed(seed)
    x = torch.randn(N, C, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(N, C, dtype=torch.float64)
    cfg = DeepseekV3Config(hidden_size=C, moe_intermediate_size=H, n_routed_experts=E, num_experts_per_tok=k,
                           n_shared_experts=1, n_group=groups, topk_group=top_groups, routed_scaling_factor=scale,
                           norm_topk_prob=True)
    cfg._experts_implementation = "eager"
    block = DeepseekV3MoE(cfg).to(torch.float64)
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 1.0)
        block.gate.e_score_correction_bias.copy_(torch.linspace(-0.3, 0.3, E, dtype=torch.float64).flip(0))
        block.experts.gate_up_proj.normal_(0.0, 1.0 / math.sqrt(C))
        block.experts.down_proj.normal_(0.0, 1.0 / math.sqrt(H))
        for lin in (block.shared_experts.gate_proj, block.shared_experts.up_proj):
            lin.weight.normal_(0.0, 1.0 / math.sqrt(C))
        block.shared_experts.down_proj.weight.normal_(0.0, 1.0 / math.sqrt(H))
    gate = block.gate
    orig = DeepseekV3MoE.forward

    def choice(scores_for_choice):
        if groups == 1:
            return torch.topk(scores_for_choice, k, dim=-1, sorted=True)[1]
        return grouped_choice(scores_for_choice, groups, top_groups, k)

    # transformers' own router (float32) on these weights: the experts it chooses.
    with torch.no_grad():
        _, _, chosen32 = DeepseekV3TopkRouter.forward(gate, x.detach().unsqueeze(0))

    def router64(hidden):
        logits = torch.nn.functional.linear(hidden.reshape(-1, C), gate.weight)
        scores = logits.sigmoid()
        idx = choice(scores + gate.e_score_correction_bias)
        w = scores.gather(1, idx)
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20) * gate.routed_scaling_factor
        return logits, w, idx
    gate.forward = router64
    y = orig(block, x.unsqueeze(0)).squeeze(0)
    logits = x @ gate.weight.T
    scores = logits.sigmoid()
    index = choice(scores + gate.e_score_correction_bias)
    assert torch.equal(index.sort(-1)[0], chosen32.sort(-1)[0]), "transformers' float32 router chooses otherwise"
    unbiased = torch.topk(scores, k, dim=-1)[1]
    assert not torch.equal(index.sort(-1)[0], unbiased.sort(-1)[0]), "the bias changes no choice"
    if groups > 1:
        ungrouped = torch.topk(scores + gate.e_score_correction_bias, k, dim=-1)[1]
        assert not torch.equal(index.sort(-1)[0], ungrouped.sort(-1)[0]), "the groups change no choice"
    counts = torch.zeros(E, dtype=torch.float64).scatter_add_(0, index.reshape(-1),
                                                              torch.ones(index.numel(), dtype=torch.float64))
    share = scores / (scores.sum(-1, keepdim=True) + 1e-20)
    aux = E * torch.sum((counts / N) * share.sum(0) / N)
    loss = (y * dy).sum() + AUX * aux
    loss.backward()
    se = block.shared_experts
    tensors = {"x": x.detach(), "dy": dy, "y": y.detach(), "aux": aux.detach().reshape(1),
               "z": torch.zeros(1, dtype=torch.float64), "index": index.to(torch.int64),
               "config": torch.tensor([N, C, H, E, k, 1, H, 0, 1, int(scale * 1000), 1] +
                                      ([groups, top_groups] if groups > 1 else []), dtype=torch.int64),
               "grad.x": x.grad, "bias": gate.e_score_correction_bias.detach().clone(),
               "router": gate.weight.detach().clone(), "grad.router": gate.weight.grad,
               "gate_up": block.experts.gate_up_proj.detach().clone(), "grad.gate_up": block.experts.gate_up_proj.grad,
               "down": block.experts.down_proj.detach().clone(), "grad.down": block.experts.down_proj.grad,
               "shared_gate_up": torch.cat([se.gate_proj.weight, se.up_proj.weight]).detach(),
               "grad.shared_gate_up": torch.cat([se.gate_proj.weight.grad, se.up_proj.weight.grad]),
               "shared_down": se.down_proj.weight.detach().clone(), "grad.shared_down": se.down_proj.weight.grad}
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / f"{name}.safetensors"))
    print(f"{name}: y {y.abs().max().item():.4f} aux {aux.item():.6f} index {index.tolist()}")


def main(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    case("mixtral", out, 54)
    case("qwen3", out, 55, E=6, k=3, renorm=False)
    case("capacity", out, 54, capacity_factor=0.75)
    case("shared", out, 56, S=5)
    deepseek_case(out, 57)
    deepseek_case(out, 58, N=16, E=8, k=3, groups=4, top_groups=2, name="deepseek_groups")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/moe")
