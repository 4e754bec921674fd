"""Real model architectures for timing the comm hook against DDP's default all-reduce.

What a DDP user trains, not a toy: ResNet-50 (torchvision's when it is
installed, else the same architecture written out here), a GPT-2-style
decoder (GPT-2 small: 124 M parameters at sequence 1024) and the same
decoder at about 1 B parameters. ``examples/gpu_check.py`` builds them at full
size on a GPU; ``examples/bench/hook_models.py`` builds them scaled down for
two CPU ranks, with DDP's bucket cap scaled by the same factor as the
gradients, so a model keeps about the number of buckets its full size has.

Each spec builds a model and batches from a seed, so two copies made with
one seed are identical, and both run on PyTorch 1.13 and 2.x.
"""

import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

# -- ResNet-50 ----------------------------------------------------------------------------


class _Bottleneck(nn.Module):
    """torchvision's Bottleneck (ResNet v1.5: the stride on the 3x3 conv)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet with Bottleneck blocks, its base width a parameter (64: ResNet-50)."""

    def __init__(self, layers: Tuple[int, ...] = (3, 4, 6, 3), width: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages = []
        for i, blocks in enumerate(layers):
            stages.append(self._stage(width * 2 ** i, blocks, 1 if i == 0 else 2))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(self.inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _stage(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [_Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [_Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(width: int = 64, num_classes: int = 1000) -> Tuple[nn.Module, str]:
    """ResNet-50: torchvision's at full width when it is installed, else ResNet above; returns (model, source)."""
    if width == 64 and num_classes == 1000:
        try:
            import torchvision  # type: ignore[import-not-found]

            return torchvision.models.resnet50(), f"torchvision {torchvision.__version__}"
        except Exception:  # not installed, or built for another torch
            pass
    return ResNet(width=width, num_classes=num_classes), "examples/bench/models.py"


# -- GPT-style decoder -----------------------------------------------------------------


class _Block(nn.Module):
    """A pre-LayerNorm decoder block (GPT-2's): causal self-attention, then a 4x GELU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2.x: the fused kernels
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.13
            w = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            a = w.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A GPT-2-style decoder: token and position embeddings, blocks, a LM head tied to the embedding."""

    def __init__(self, vocab: int, seq: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


# -- specs --------------------------------------------------------------------------------


class Spec(NamedTuple):
    """One model to time: how to build it, its batches and loss, and DDP's bucket cap for it."""

    name: str
    describe: str
    build: Callable[[], Tuple[nn.Module, str]]
    batch: Callable[[torch.Generator, torch.device], Tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    bucket_cap_mb: float
    channels_last: bool = False


def _image_batch(n: int, size: int, classes: int) -> Callable:
    def batch(g: torch.Generator, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, 3, size, size, generator=g).to(device)
        return x, torch.randint(0, classes, (n,), generator=g).to(device)

    return batch


def _token_batch(n: int, seq: int, vocab: int) -> Callable:
    def batch(g: torch.Generator, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        t = torch.randint(0, vocab, (n, seq + 1), generator=g)
        return t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)

    return batch


def _lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), y)


def _gpt(vocab: int, seq: int, d: int, layers: int, heads: int) -> Callable[[], Tuple[nn.Module, str]]:
    return lambda: (GPT(vocab, seq, d, layers, heads), "examples/bench/models.py")


# DDP's default bucket cap; the scaled-down models scale it with their gradients.
DEFAULT_BUCKET_MB = 25.0


def full_size(batch_scale: float = 1.0) -> Dict[str, Spec]:
    """The models at the sizes the issue names, for one GPU (bf16 autocast, world size 1)."""
    rb = max(1, int(128 * batch_scale))
    gb = max(1, int(8 * batch_scale))
    bb = max(1, int(4 * batch_scale))
    return {
        "resnet50": Spec("resnet50", f"ResNet-50, batch {rb} x 3x224x224, channels_last",
                         lambda: resnet50(), _image_batch(rb, 224, 1000), _ce, DEFAULT_BUCKET_MB, channels_last=True),
        "gpt2-small": Spec("gpt2-small", f"GPT-2 small decoder (12 x d768, vocab 50257), batch {gb} x 1024 tokens",
                           _gpt(50257, 1024, 768, 12, 12), _token_batch(gb, 1024, 50257), _lm_loss, DEFAULT_BUCKET_MB),
        "gpt-1b": Spec("gpt-1b", f"decoder of ~1.07 B parameters (20 x d2048, vocab 32000), batch {bb} x 1024 tokens",
                       _gpt(32000, 1024, 2048, 20, 16), _token_batch(bb, 1024, 32000), _lm_loss, DEFAULT_BUCKET_MB),
    }


# Full-size gradients in MiB (float32): the scaled models' bucket caps keep
# these ratios to DDP's 25 MiB, so each has about as many buckets as its
# full size. Counted from the full models (sum of numel * 4 / 2**20).
_FULL_GRAD_MIB = {"resnet50": 97.5, "gpt2-small": 474.7, "gpt-1b": 4100.0}


def scaled_down() -> Dict[str, Spec]:
    """The same architectures, small enough for two ranks on a 2-core machine (float32, gloo)."""
    specs = {
        "resnet50": Spec("resnet50", "ResNet-50 at base width 16 (of 64), batch 8 x 3x64x64",
                         lambda: resnet50(width=16, num_classes=100), _image_batch(8, 64, 100), _ce, 0.0),
        "gpt2-small": Spec("gpt2-small", "GPT-2-style decoder 12 x d128 (of 768), vocab 4096, batch 4 x 128 tokens",
                           _gpt(4096, 128, 128, 12, 4), _token_batch(4, 128, 4096), _lm_loss, 0.0),
        "gpt-1b": Spec("gpt-1b", "decoder 20 x d256 (of 2048), vocab 4096, batch 2 x 128 tokens",
                       _gpt(4096, 128, 256, 20, 8), _token_batch(2, 128, 4096), _lm_loss, 0.0),
    }
    out = {}
    for name, s in specs.items():
        model, _ = s.build()
        mib = sum(p.numel() for p in model.parameters()) * 4 / 2 ** 20
        out[name] = s._replace(bucket_cap_mb=DEFAULT_BUCKET_MB * mib / _FULL_GRAD_MIB[name])
    return out


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def digest(model: nn.Module) -> str:
    """A digest of every parameter's bytes, equal for bit-identical models."""
    import hashlib

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def step(ddp: nn.Module, opt: Any, spec: Spec, x: torch.Tensor, y: torch.Tensor, autocast: Optional[Any]) -> None:
    """One training step: forward (under autocast when given), loss, backward, optimizer step."""
    opt.zero_grad(set_to_none=True)
    if autocast is not None:
        with autocast:
            out = ddp(x)
    else:
        out = ddp(x)
    spec.loss(out, y).backward()
    opt.step()


__all__: List[str] = ["ResNet", "GPT", "Spec", "full_size", "scaled_down", "resnet50", "digest", "step", "parameters"]
