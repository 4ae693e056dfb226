"""Determinism: the same decode step twice, bit for bit (persistent kernels for 2 and 16 rows; Triton 4 and 16)."""
import dataclasses, sys
import torch
sys.path.insert(0, "tests/inference")
from test_decode_layers import _layers, _decode
from inference.layers import rope_tables
from inference.triton_ops import Launch, TritonOps

dev = torch.device("cuda")
cos, sin = rope_tables(128, 512, 10000.0, dev)
for rows, persistent in ((2, True), (16, True), (4, False), (16, False)):
    layers = _layers(24, 592, "cuda", seed=5, rows=max(rows, 2))
    for position in (3, 300, 511):
        pos = torch.tensor([position], device=dev)
        x0 = torch.randn(rows, 1536, device=dev, generator=torch.Generator(device=dev).manual_seed(2)).bfloat16()
        ops = TritonOps(dataclasses.replace(Launch(), persistent_layers=persistent))
        outs = []
        for _ in range(4):
            h, x = _decode(ops, x0, layers, pos, cos, sin)
            outs.append((h.clone(), x.clone()))
        torch.cuda.synchronize()
        same = [torch.equal(outs[0][0], o[0]) and torch.equal(outs[0][1], o[1]) for o in outs[1:]]
        diff = max((outs[0][0].float() - o[0].float()).abs().max().item() for o in outs[1:])
        print("rows", rows, "persistent", persistent, ops.runs_persistent_layers, "pos", position, "same", same,
              "maxdiff", diff, flush=True)
