import copy, torch, ember, traceback
import torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
def cases():
    yield "encoder_layer", nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), (torch.randn(2, 5, 16),)
    yield "encoder_layer_norm_first", nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"), (torch.randn(2, 5, 16),)
    yield "mha", nn.MultiheadAttention(16, 4, batch_first=True), (torch.randn(2, 5, 16), torch.randn(2, 7, 16), torch.randn(2, 7, 16))
    yield "conv_bn_pool", nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 4, 3, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten()), (torch.randn(2, 3, 16, 16),)
    yield "groupnorm_silu", nn.Sequential(nn.Conv2d(4, 8, 1), nn.GroupNorm(2, 8), nn.SiLU(), nn.ConvTranspose2d(8, 4, 2, stride=2)), (torch.randn(2, 4, 6, 6),)
    yield "upsample_shuffle", nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False), nn.Conv2d(4, 16, 3, padding=1), nn.PixelShuffle(2)), (torch.randn(1, 4, 5, 5),)
    yield "embed_ln", nn.Sequential(nn.Embedding(30, 12), nn.LayerNorm(12), nn.Linear(12, 5), nn.LogSoftmax(-1)), (torch.randint(0, 30, (3, 7)),)
    yield "gru", nn.GRU(6, 8, num_layers=2, batch_first=True), (torch.randn(2, 4, 6),)
    yield "instnorm_prelu", nn.Sequential(nn.Conv1d(3, 6, 3), nn.InstanceNorm1d(6, affine=True), nn.PReLU(), nn.Dropout(0.0)), (torch.randn(2, 3, 10),)
    yield "bilinear_softplus", nn.Sequential(nn.Linear(5, 9), nn.Softplus(), nn.Hardswish(), nn.Linear(9, 3), nn.Softmax(-1)), (torch.randn(4, 5),)
def flat(o):
    if isinstance(o, torch.Tensor): return [o]
    if isinstance(o, (tuple, list)): return [t for x in o for t in flat(x)]
    return []
for name, model, args in cases():
    for mode in ("eval", "train"):
        try:
            ref = copy.deepcopy(model); mine = copy.deepcopy(model)
            getattr(ref, mode)(); getattr(mine, mode)()
            c = ember.compile(mine)
            ctx = torch.no_grad() if mode == "eval" else torch.enable_grad()
            with ctx:
                want = flat(ref(*args)); got = flat(c(*args)); got = flat(c(*args))
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            if mode == "train":
                sum(w.float().sum() * (i + 1) for i, w in enumerate(want) if w.requires_grad).backward()
                sum(g.float().sum() * (i + 1) for i, g in enumerate(got) if g.requires_grad).backward()
                for (pn, pa), pb in zip(mine.named_parameters(), ref.parameters()):
                    if pb.grad is None: continue
                    torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-4, msg=lambda m, pn=pn: f"{pn}: {m}")
            recs = c._compiled_forward.records
            print(f"{name:28s} {mode:5s} ok   graphs={sum(r.graphs for r in recs)} breaks={sum(len(r.breaks) for r in recs)} kinds={[type(r.compiled).__name__ for r in recs]}")
        except Exception as e:
            print(f"{name:28s} {mode:5s} FAIL {type(e).__name__}: {str(e)[:300]}")
