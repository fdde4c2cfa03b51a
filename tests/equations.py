"""The transformer's sublayers written out in float64 from the papers' equations, for the tests that check a
model against a direct re-implementation (DCA, ResiDual, the aggregation and normalisation baselines); tensors
are (T, B, C) as in fairseq."""

import math

import torch
import torch.nn.functional as F


def layer_norm(x, module):
    return F.layer_norm(x, (x.size(-1),), module.weight, module.bias, module.eps)


def attention(query, key, value, attn, key_padding_mask=None, causal=False, head_scale=None, chunk_scale=None):
    """Concat(g_1 h_1, ..., g_H h_H) W_O + b with h_i = softmax(Q_i K_i^T / sqrt(d_head) + mask) V_i (g_i = 1
    without ``head_scale``, NormFormer's); ``chunk_scale``: fairseq's variant of it, the projected output cut
    into H chunks and scaled."""
    tq, b, c = query.shape
    h = attn.num_heads
    d = c // h

    def heads(x, proj):
        return (x @ proj.weight.T + proj.bias).reshape(x.size(0), b * h, d).transpose(0, 1)

    q, k, v = heads(query, attn.q_proj), heads(key, attn.k_proj), heads(value, attn.v_proj)
    scores = q @ k.transpose(1, 2) / math.sqrt(d)  # (B*H, Tq, Tk)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask.repeat_interleave(h, dim=0)[:, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores[0], dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(tq, b, h, d)
    if head_scale is not None:
        out = out * head_scale[:, None]
    out = out.reshape(tq, b, c) @ attn.out_proj.weight.T + attn.out_proj.bias
    if chunk_scale is not None:
        out = (out.reshape(tq, b, h, d) * chunk_scale[:, None]).reshape(tq, b, c)
    return out


def ffn(x, layer, ffn_norm=None):
    """fc2(relu(fc1(x))), with NormFormer's LN between them when ``ffn_norm`` is given."""
    hidden = F.relu(x @ layer.fc1.weight.T + layer.fc1.bias)
    if ffn_norm is not None:
        hidden = layer_norm(hidden, ffn_norm)
    return hidden @ layer.fc2.weight.T + layer.fc2.bias
