"""Image views and encoders for SimCLR-style training (batched tensor ops, any device).

SimCLR (Chen et al. 2020) makes two random views of every image of a batch. Here a view is made
for the whole batch at once with plain torch ops, so the same pipeline runs on the CPU or on the
GPU holding the batch (torchvision is not needed):

* :func:`random_resized_crop`: one affine resampling per image (``affine_grid`` /
  ``grid_sample``, bilinear) of a random crop of area ``scale`` and aspect ratio ``ratio``,
  torchvision's ``RandomResizedCrop`` sampling (10 tries, whole image as fallback), with an
  optional extra rotation / shear for MNIST;
* :func:`random_flip`, :func:`color_jitter` (brightness, contrast, saturation, hue in HSV, as
  torchvision's ``ColorJitter``, applied in that fixed order), :func:`random_grayscale`;
* :class:`SimCLRAugment`: the composition, called as ``augment(x, generator)`` by
  :class:`hardbatch.train.Trainer`. :func:`cifar_augment` and :func:`mnist_augment` are the presets.

All random numbers are drawn on the CPU from the given ``torch.Generator`` and then moved to the
batch's device, so a seed gives the same views (up to float rounding) on CPU and GPU.

Encoders (:func:`make_encoder`): :class:`ConvNet`, a compact VGG-style network for CPU runs, and
:func:`resnet18_cifar`, ResNet-18 with the CIFAR stem (3x3 stride-1 first convolution, no max
pool; SimCLR's CIFAR-10 setting, Chen et al. 2020, App. B.9), each wrapped in
:class:`ImageEncoder`, which takes uint8 or float images and normalises them. The projection head
is :func:`projection_head` (2-layer MLP to 128 d).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "MNIST_MEAN",
    "MNIST_STD",
    "ConvNet",
    "ImageEncoder",
    "SimCLRAugment",
    "cifar_augment",
    "color_jitter",
    "make_encoder",
    "mnist_augment",
    "projection_head",
    "random_flip",
    "random_grayscale",
    "random_resized_crop",
    "resnet18_cifar",
    "to_float",
]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)
_GRAY = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as PIL / torchvision


# ------------------------------------------------------------------------------ checks / helpers
def _check_images(x: Tensor, name: str = "x") -> None:
    if not isinstance(x, Tensor) or x.ndim != 4:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a [B, C, H, W] image tensor, got {shape}; add the "
                         "channel axis with x.unsqueeze(1) for grey images")


def _check_range(value: Sequence[float], name: str, low: float, high: float) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be a pair (low, high)") from None
    if not (low <= lo <= hi <= high):
        raise ValueError(f"{name}={value!r} must satisfy {low} <= low <= high <= {high}")
    return lo, hi


def _check_prob(p: float, name: str) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}={p} must be a probability in [0, 1]")
    return p


def _uniform(n: int, lo: float, hi: float, generator: torch.Generator | None) -> Tensor:
    return torch.rand(n, generator=generator) * (hi - lo) + lo


def to_float(x: Tensor) -> Tensor:
    """uint8 images -> float32 in [0, 1]; float images are returned as float32 unchanged."""
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)
    return x.float() if x.dtype != torch.float32 else x


# ------------------------------------------------------------------------------ geometry
def random_resized_crop(x: Tensor, generator: torch.Generator | None = None, *,
                        scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3),
                        rotation: float = 0.0, shear: float = 0.0,
                        size: tuple[int, int] | None = None,
                        padding_mode: str = "border") -> Tensor:
    """Random crop of each image, resized back to ``size`` (default: the input size).

    Crop sampling is torchvision's ``RandomResizedCrop``: area fraction ``a ~ U(scale)``, log
    aspect ratio ``~ U(log ratio)``, width ``sqrt(a r)``, height ``sqrt(a / r)`` (fractions of the
    image side); up to 10 tries per image, else the whole image. The centre is uniform over the
    positions that keep the crop inside the image. ``rotation`` (degrees) and ``shear`` (degrees,
    along x) add a random rotation in ``[-rotation, rotation]`` and shear in ``[-shear, shear]``
    (MNIST's small affine); the area outside the image follows ``padding_mode``. One
    ``affine_grid`` / bilinear ``grid_sample`` call for the batch (``align_corners=False``), so
    ``scale=(1, 1), ratio=(1, 1)`` returns the input (up to float rounding).

    Args:
        x: ``[B, C, H, W]`` float images (any device).
        generator: CPU ``torch.Generator`` driving every random draw.

    Returns:
        ``[B, C, *size]`` float images on ``x``'s device.
    """
    _check_images(x)
    lo, hi = _check_range(scale, "scale", 0.0, 1.0)
    if lo <= 0.0:
        raise ValueError(f"scale={scale!r} must have a positive lower bound, e.g. (0.08, 1.0)")
    rlo, rhi = _check_range(ratio, "ratio", 1e-6, math.inf)
    if rotation < 0 or shear < 0:
        raise ValueError(f"rotation={rotation} and shear={shear} must be >= 0 (degrees)")
    b, c, h, w = x.shape
    out_h, out_w = size if size is not None else (h, w)
    tries = 10
    area = torch.rand(tries, b, generator=generator) * (hi - lo) + lo
    log_r = torch.rand(tries, b, generator=generator) * (math.log(rhi) - math.log(rlo)) + math.log(rlo)
    r = log_r.exp() * (h / w)  # aspect of the crop in pixels -> fractions of the sides
    cw, ch = (area * r).sqrt(), (area / r).sqrt()
    ok = (cw <= 1.0) & (ch <= 1.0)
    first = torch.where(ok.any(0), ok.float().argmax(0), torch.full((b,), -1))
    pick = first.clamp_min(0)
    cols = torch.arange(b)
    cw = torch.where(first >= 0, cw[pick, cols], torch.ones(b))
    ch = torch.where(first >= 0, ch[pick, cols], torch.ones(b))
    # centres (normalised coordinates in [-1, 1]) keep the crop inside the image
    cx = (torch.rand(b, generator=generator) * 2 - 1) * (1 - cw)
    cy = (torch.rand(b, generator=generator) * 2 - 1) * (1 - ch)
    a11, a12, a21, a22 = cw, torch.zeros(b), torch.zeros(b), ch
    if rotation > 0 or shear > 0:
        ang = _uniform(b, -rotation, rotation, generator) * (math.pi / 180)
        sh = torch.tan(_uniform(b, -shear, shear, generator) * (math.pi / 180))
        cos, sin = ang.cos(), ang.sin()
        # output -> input: diag(cw, ch) @ R(ang) @ [[1, sh], [0, 1]]
        r11, r12, r21, r22 = cos, cos * sh - sin, sin, sin * sh + cos
        a11, a12, a21, a22 = cw * r11, cw * r12, ch * r21, ch * r22
    theta = torch.stack([torch.stack([a11, a12, cx], 1), torch.stack([a21, a22, cy], 1)], 1)
    theta = theta.to(device=x.device, dtype=x.dtype)
    grid = F.affine_grid(theta, [b, c, out_h, out_w], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=padding_mode, align_corners=False)


def random_flip(x: Tensor, generator: torch.Generator | None = None, p: float = 0.5) -> Tensor:
    """Mirror each image left-right with probability ``p`` (``[B, C, H, W]``, any dtype)."""
    _check_images(x)
    p = _check_prob(p, "p")
    flip = (torch.rand(x.shape[0], generator=generator) < p).to(x.device)
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


# ------------------------------------------------------------------------------ colour
def _gray(x: Tensor) -> Tensor:
    """Luma ``[B, 1, H, W]`` of RGB ``[B, 3, H, W]``."""
    wts = torch.tensor(_GRAY, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * wts).sum(1, keepdim=True)


def _rgb_to_hsv(x: Tensor) -> Tensor:
    r, g, b = x.unbind(1)
    maxc, _ = x.max(1)
    minc, _ = x.min(1)
    delta = maxc - minc
    s = torch.where(maxc > 0, delta / maxc.clamp_min(1e-12), torch.zeros_like(maxc))
    d = delta.clamp_min(1e-12)
    h = torch.where(maxc == r, ((g - b) / d) % 6,
                    torch.where(maxc == g, (b - r) / d + 2, (r - g) / d + 4))
    h = torch.where(delta > 0, h / 6.0, torch.zeros_like(h))
    return torch.stack([h, s, maxc], 1)


def _hsv_to_rgb(x: Tensor) -> Tensor:
    h, s, v = x.unbind(1)
    n = torch.tensor([5.0, 3.0, 1.0], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    k = (n + h.unsqueeze(1) * 6) % 6
    f = torch.minimum(k, 4 - k).clamp(0, 1)
    return v.unsqueeze(1) - v.unsqueeze(1) * s.unsqueeze(1) * f


def color_jitter(x: Tensor, generator: torch.Generator | None = None, *,
                 brightness: float = 0.4, contrast: float = 0.4, saturation: float = 0.4,
                 hue: float = 0.1, p: float = 0.8) -> Tensor:
    """torchvision's ``ColorJitter`` on each image with probability ``p`` (SimCLR: 0.8).

    Factors ``U(1 - b, 1 + b)`` for brightness (scale), contrast (blend with the image's mean
    luma), saturation (blend with the pixel's luma); hue shifted by ``U(-hue, hue)`` turns in HSV.
    Applied in that fixed order (torchvision permutes it per call); values clamped to [0, 1].
    Grey (1-channel) images get brightness and contrast only.

    Args:
        x: ``[B, C, H, W]`` float images in [0, 1], C = 1 or 3.
    """
    _check_images(x)
    p = _check_prob(p, "p")
    for name, v in (("brightness", brightness), ("contrast", contrast),
                    ("saturation", saturation)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name}={v} must lie in [0, 1] (factor range 1 +- {name})")
    if not 0.0 <= hue <= 0.5:
        raise ValueError(f"hue={hue} must lie in [0, 0.5]")
    b, c = x.shape[:2]
    if c not in (1, 3):
        raise ValueError(f"x has {c} channels; color_jitter needs 1 (grey) or 3 (RGB)")
    apply = torch.rand(b, generator=generator) < p

    def factor(strength: float) -> Tensor:
        f = _uniform(b, 1 - strength, 1 + strength, generator)
        return torch.where(apply, f, torch.ones(b)).to(x.device, x.dtype).view(b, 1, 1, 1)

    fb, fc, fs = factor(brightness), factor(contrast), factor(saturation)
    shift = torch.where(apply, _uniform(b, -hue, hue, generator), torch.zeros(b))
    if not bool(apply.any()):
        return x
    original = x
    x = (x * fb).clamp(0, 1)
    gray = _gray(x) if c == 3 else x
    m = gray.mean(dim=(1, 2, 3), keepdim=True)
    x = ((x - m) * fc + m).clamp(0, 1)
    if c == 3:
        gray = _gray(x)
        x = ((x - gray) * fs + gray).clamp(0, 1)
        if hue > 0:
            hsv = _rgb_to_hsv(x)
            hsv = torch.cat([(hsv[:, :1] + shift.to(x.device, x.dtype).view(b, 1, 1, 1)) % 1.0,
                             hsv[:, 1:]], 1)
            x = _hsv_to_rgb(hsv).clamp(0, 1)
    # images not drawn keep their exact values (no HSV round-trip rounding)
    return torch.where(apply.to(x.device)[:, None, None, None], x, original)


def random_grayscale(x: Tensor, generator: torch.Generator | None = None,
                     p: float = 0.2) -> Tensor:
    """Replace each RGB image by its luma (3 equal channels) with probability ``p``."""
    _check_images(x)
    p = _check_prob(p, "p")
    if x.shape[1] != 3:
        raise ValueError(f"random_grayscale needs RGB images [B, 3, H, W], got {x.shape[1]} "
                         "channels")
    pick = (torch.rand(x.shape[0], generator=generator) < p).to(x.device)
    return torch.where(pick[:, None, None, None], _gray(x).expand_as(x), x)


# ------------------------------------------------------------------------------ composition
class SimCLRAugment:
    """One SimCLR view of a batch: crop (+ affine) -> flip -> colour jitter -> grayscale.

    Called as ``augment(x, generator)`` (the :class:`~hardbatch.train.Trainer` hook) on a
    ``[B, C, H, W]`` uint8 or float batch on any device; returns float32 ``[B, C, H, W]`` in
    [0, 1] on the same device. Stages with probability / strength 0 are skipped.

    Args:
        scale, ratio: crop area and aspect ranges (:func:`random_resized_crop`).
        rotation, shear: extra affine (degrees) for grey digits; ``padding_mode`` outside.
        flip: probability of a horizontal flip.
        jitter: (brightness, contrast, saturation, hue); ``jitter_p`` its probability.
        grayscale: probability of grayscale (RGB only).
    """

    def __init__(self, *, scale: tuple[float, float] = (0.2, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), rotation: float = 0.0,
                 shear: float = 0.0, flip: float = 0.5,
                 jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1),
                 jitter_p: float = 0.8, grayscale: float = 0.2,
                 padding_mode: str = "border") -> None:
        _check_range(scale, "scale", 0.0, 1.0)
        _check_range(ratio, "ratio", 1e-6, math.inf)
        self.scale, self.ratio = tuple(scale), tuple(ratio)
        self.rotation, self.shear = float(rotation), float(shear)
        self.flip = _check_prob(flip, "flip")
        if len(jitter) != 4:
            raise ValueError(f"jitter={jitter!r} must be (brightness, contrast, saturation, hue)")
        self.jitter = tuple(float(j) for j in jitter)
        self.jitter_p = _check_prob(jitter_p, "jitter_p")
        self.grayscale = _check_prob(grayscale, "grayscale")
        if padding_mode not in ("zeros", "border", "reflection"):
            raise ValueError(f"padding_mode={padding_mode!r} must be zeros, border or reflection")
        self.padding_mode = padding_mode

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        _check_images(x)
        x = to_float(x)
        identity_crop = (self.scale == (1.0, 1.0) and self.ratio == (1.0, 1.0)
                         and self.rotation == 0 and self.shear == 0)
        if not identity_crop:
            x = random_resized_crop(x, generator, scale=self.scale, ratio=self.ratio,
                                    rotation=self.rotation, shear=self.shear,
                                    padding_mode=self.padding_mode)
        if self.flip > 0:
            x = random_flip(x, generator, self.flip)
        if self.jitter_p > 0 and any(j > 0 for j in self.jitter):
            bri, con, sat, hue = self.jitter
            x = color_jitter(x, generator, brightness=bri, contrast=con, saturation=sat,
                             hue=hue if x.shape[1] == 3 else 0.0, p=self.jitter_p)
        if self.grayscale > 0 and x.shape[1] == 3:
            x = random_grayscale(x, generator, self.grayscale)
        return x

    def __repr__(self) -> str:
        return (f"SimCLRAugment(scale={self.scale}, ratio={self.ratio}, rotation={self.rotation}, "
                f"shear={self.shear}, flip={self.flip}, jitter={self.jitter}, "
                f"jitter_p={self.jitter_p}, grayscale={self.grayscale})")

    def config(self) -> dict:
        """The settings, for run records."""
        return {"scale": list(self.scale), "ratio": list(self.ratio), "rotation": self.rotation,
                "shear": self.shear, "flip": self.flip, "jitter": list(self.jitter),
                "jitter_p": self.jitter_p, "grayscale": self.grayscale,
                "padding_mode": self.padding_mode}


def cifar_augment() -> SimCLRAugment:
    """SimCLR's CIFAR-10 views: crop scale (0.2, 1) (the common CIFAR setting of MoCo / SimCLR
    re-implementations; SimCLR's paper uses 0.08), flip 0.5, jitter (0.4, 0.4, 0.4, 0.1) with
    p 0.8, grayscale 0.2, no blur (SimCLR App. B.9)."""
    return SimCLRAugment()


def mnist_augment() -> SimCLRAugment:
    """MNIST views: crop scale (0.5, 1), aspect (0.8, 1.25), rotation +-15 deg, shear +-10 deg
    (zeros outside), brightness / contrast 0.4 with p 0.8; no flip (digits are not symmetric)."""
    return SimCLRAugment(scale=(0.5, 1.0), ratio=(0.8, 1.25), rotation=15.0, shear=10.0,
                         flip=0.0, jitter=(0.4, 0.4, 0.0, 0.0), jitter_p=0.8, grayscale=0.0,
                         padding_mode="zeros")


# ------------------------------------------------------------------------------ encoders
class ImageEncoder(nn.Module):
    """``backbone((to_float(x) - mean) / std)``: accepts uint8 or [0, 1] float images.

    ``out_dim`` is the backbone's feature width (the evaluated representation).
    """

    def __init__(self, backbone: nn.Module, mean: Sequence[float], std: Sequence[float],
                 out_dim: int) -> None:
        super().__init__()
        if len(mean) != len(std):
            raise ValueError(f"mean ({len(mean)}) and std ({len(std)}) need one entry per channel")
        self.backbone = backbone
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))
        self.out_dim = int(out_dim)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, H, W]`` images -> ``[B, out_dim]`` features."""
        if x.ndim != 4 or x.shape[1] != self.mean.shape[1]:
            raise ValueError(f"expected [B, {self.mean.shape[1]}, H, W] images, got "
                             f"{tuple(x.shape)}")
        x = (to_float(x) - self.mean) / self.std
        return self.backbone(x)


class ConvNet(nn.Module):
    """Compact VGG-style encoder for CPU runs: per stage ``conv3x3-BN-ReLU`` then 2x2 max pool
    (none after the last), global average pool. ``[B, C, H, W] -> [B, widths[-1]]``.

    The default ``(32, 64, 128, 256)`` costs about 17 MMAC per 32x32 RGB image (ResNet-18 with
    the CIFAR stem: 556 MMAC).
    """

    def __init__(self, in_channels: int = 3, widths: Sequence[int] = (32, 64, 128, 256)) -> None:
        super().__init__()
        if not widths or any(int(w) < 1 for w in widths):
            raise ValueError(f"widths={widths!r} must be a non-empty list of positive ints")
        layers: list[nn.Module] = []
        c = in_channels
        for i, w in enumerate(widths):
            layers += [nn.Conv2d(c, w, 3, padding=1, bias=False), nn.BatchNorm2d(w),
                       nn.ReLU(inplace=True)]
            if i < len(widths) - 1:
                layers.append(nn.MaxPool2d(2))
            c = w
        self.features = nn.Sequential(*layers)
        self.out_dim = int(widths[-1])

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x).mean(dim=(2, 3))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (nn.Sequential() if stride == 1 and cin == cout else
                      nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                    nn.BatchNorm2d(cout)))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        return F.relu(self.bn2(self.conv2(out)) + self.short(x), inplace=True)


class _ResNet18(nn.Module):
    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(64), nn.ReLU(inplace=True))
        blocks, c = [], 64
        for w, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_BasicBlock(c, w, stride), _BasicBlock(w, w, 1)]
            c = w
        self.blocks = nn.Sequential(*blocks)
        self.out_dim = 512

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(self.stem(x)).mean(dim=(2, 3))


def resnet18_cifar(in_channels: int = 3) -> nn.Module:
    """ResNet-18 (He et al. 2016) with the CIFAR stem: 3x3 stride-1 first conv, no max pool
    (SimCLR App. B.9). ``[B, C, 32, 32] -> [B, 512]`` features after global average pooling."""
    return _ResNet18(in_channels)


def projection_head(in_dim: int, out_dim: int = 128, hidden: int | None = None) -> nn.Module:
    """SimCLR's 2-layer MLP head ``Linear-BN-ReLU-Linear`` (``in_dim -> hidden -> out_dim``,
    hidden defaults to ``in_dim``). ``[B, in_dim] -> [B, out_dim]``."""
    hidden = int(hidden or in_dim)
    return nn.Sequential(nn.Linear(in_dim, hidden, bias=False), nn.BatchNorm1d(hidden),
                         nn.ReLU(inplace=True), nn.Linear(hidden, out_dim))


def make_encoder(arch: str, dataset: str) -> ImageEncoder:
    """``arch`` in {"convnet", "resnet18"} for ``dataset`` in {"cifar10", "mnist"}, wrapped in
    :class:`ImageEncoder` with the dataset's mean / std."""
    if dataset == "cifar10":
        chans, mean, std = 3, CIFAR10_MEAN, CIFAR10_STD
    elif dataset == "mnist":
        chans, mean, std = 1, MNIST_MEAN, MNIST_STD
    else:
        raise ValueError(f"dataset={dataset!r} must be 'cifar10' or 'mnist'")
    if arch == "convnet":
        net: nn.Module = ConvNet(chans)
    elif arch == "resnet18":
        net = resnet18_cifar(chans)
    else:
        raise ValueError(f"arch={arch!r} must be 'convnet' (CPU) or 'resnet18' (GPU)")
    return ImageEncoder(net, mean, std, net.out_dim)
