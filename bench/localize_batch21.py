"""Where does the 16-row kernel differ between identical runs? One layer's scratch buffers, then 24 layers' h,
for the kernel as on batch21 and with extra barriers patched in."""
import importlib.util, sys
from pathlib import Path
import torch
sys.path.insert(0, ".scratch/b21")
from t21 import _layers
from inference.layers import rope_tables

spec = importlib.util.spec_from_file_location("dl21", ".scratch/b21/decode_layers_b21.py")
dl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dl)
src = Path(".scratch/b21/decode_layers.cu").read_text()
END_LN = "      else a.hi[i] = chunk_norm(a.hi[i], mean, rstd);\n    }\n  }\n}"
assert END_LN in src
START_ATT = "  const int cnt = sp.cnt;\n"
assert START_ATT in src
BEFORE_SEND = "  consumers_sync();\n    for (int e = tid; e < nsum; e += CT) {"
assert BEFORE_SEND in src
variants = {
    "as_is": src,
    "sync_after_ln": src.replace(END_LN, END_LN[:-1] + "  consumers_sync();\n}"),
    "sync_attn_start": src.replace(START_ATT, START_ATT + "  consumers_sync();\n"),
    "all_three": src.replace(END_LN, END_LN[:-1] + "  consumers_sync();\n}").replace(START_ATT, START_ATT + "  consumers_sync();\n").replace(BEFORE_SEND, "  consumers_sync();\n  consumers_sync();\n    for (int e = tid; e < nsum; e += CT) {"),
}
dev = torch.device("cuda")
cos, sin = rope_tables(128, 512, 10000.0, dev)
layers = _layers(24, 592, "cuda", seed=5, rows=16)
for name, text in variants.items():
    p = Path(f"/tmp/{name}.cu"); p.write_text(text); dl.SOURCE = p
    pl = dl.PersistentLayers(dev)
    for rows in (16, 2):
        for n, position in ((1, 300), (2, 300), (24, 300), (24, 3)):
            pos = torch.tensor([position], device=dev)
            x0 = torch.randn(rows, 1536, device=dev, generator=torch.Generator(device=dev).manual_seed(2)).bfloat16()
            snaps = []
            for rep in range(3):
                x = x0.clone()
                h = pl(x, pos, layers[:n], cos, sin, 1e-6, 1e-5, pdl=False)
                torch.cuda.synchronize()
                lw = layers[n - 1]
                snaps.append({"qkv": pl.qkv[:rows].clone(), "attn": pl.attn[:rows].clone(), "act": pl.act[:rows].clone(),
                              "x": x.clone(), "h": h.clone(), "k_new": lw.cache.k[:rows, :, lw.offset + position].clone()})
            diffs = {k: max((snaps[0][k].float() - s[k].float()).abs().max().item() for s in snaps[1:]) for k in snaps[0]}
            print(name, "rows", rows, "layers", n, "pos", position, {k: round(v, 5) for k, v in diffs.items()}, flush=True)
