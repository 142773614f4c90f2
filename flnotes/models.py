"""The architectures the papers train, behind one registry: name -> constructor.

Every constructor takes ``(num_classes, input_shape)``, where ``input_shape`` is one sample's
shape without the batch dimension: (3, 32, 32) CIFAR, (1, 28, 28) MNIST/FEMNIST, (80,) a
Shakespeare window of token ids. Models return logits. There is no dropout anywhere, so a
training run is a function of the seed and the data order; parameters are created in forward
order, so the ``state_dict`` lists the "layers" (its entries) from input to output.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Shape = tuple[int, ...]


def _bad_shape(name: str, input_shape: Shape, allowed: str) -> ValueError:
    return ValueError(f"model {name!r} expects input_shape {allowed}; got {tuple(input_shape)}")


def _image(name: str, input_shape: Shape, sizes: tuple[int, ...] | None = None) -> int:
    """Check a (C, H, W) shape (square H = W in ``sizes``, or H, W >= 8) and return C."""
    shape = tuple(input_shape)
    if sizes is None:
        allowed, ok = "(C, H, W) with H, W >= 8", len(shape) == 3 and min(shape[1:]) >= 8
    else:
        allowed = " or ".join(f"(C, {s}, {s})" for s in sizes)
        ok = len(shape) == 3 and shape[1] == shape[2] and shape[1] in sizes
    if not ok or shape[0] < 1:
        raise _bad_shape(name, shape, allowed)
    return shape[0]


def _conv_net(in_channels: int, convs: tuple[tuple[int, int], ...], features: int,
              widths: tuple[int, ...]) -> nn.Sequential:
    """conv5x5 -> ReLU -> max-pool 2 for each (channels, padding), flatten, fc layers with ReLU.

    Children are named (conv1, fc1, ...) so state_dict keys read conv1.weight, fc2.bias, ...
    """
    layers: dict[str, nn.Module] = {}
    for i, (channels, padding) in enumerate(convs, start=1):
        layers[f"conv{i}"] = nn.Conv2d(in_channels, channels, 5, padding=padding)
        layers[f"conv{i}_relu"] = nn.ReLU()
        layers[f"pool{i}"] = nn.MaxPool2d(2)
        in_channels = channels
    layers["flatten"] = nn.Flatten()
    for i, width in enumerate(widths, start=1):
        layers[f"fc{i}"] = nn.Linear(features, width)
        if i < len(widths):  # the last layer gives logits
            layers[f"fc{i}_relu"] = nn.ReLU()
        features = width
    return nn.Sequential(OrderedDict(layers))


# --- small CNNs and the MLP ------------------------------------------------------------------
def cnn(num_classes: int, input_shape: Shape) -> nn.Module:
    """CNN of McMahan et al. 2017: conv5x5 32, pool, conv5x5 64, pool, fc 512, fc classes."""
    c = _image("cnn", input_shape, (32, 28))
    side = input_shape[1] // 4  # 'same' padding (as McMahan's TF code): 32 -> 8, 28 -> 7
    # On (1, 28, 28) this is exactly McMahan's MNIST CNN (1,663,370 parameters for 10 classes).
    return _conv_net(c, ((32, 2), (64, 2)), 64 * side * side, (512, num_classes))


def lenet_cifar(num_classes: int, input_shape: Shape) -> nn.Module:
    """LeNet-style CNN of FedMut's/FedMR's official code (CNNCifar): 16*5*5 features, no pad."""
    c = _image("lenet-cifar", input_shape, (32,))
    return _conv_net(c, ((6, 0), (16, 0)), 16 * 5 * 5, (120, 84, num_classes))


def lenet5(num_classes: int, input_shape: Shape) -> nn.Module:
    """LeNet-5 for 28x28 (conv 6 pad 2, conv 16, fc 120, fc 84), with ReLU and max-pooling."""
    c = _image("lenet5", input_shape, (28,))
    return _conv_net(c, ((6, 2), (16, 0)), 16 * 5 * 5, (120, 84, num_classes))


def femnist_cnn(num_classes: int, input_shape: Shape) -> nn.Module:
    """FedUp's FEMNIST CNN: conv5x5 10, conv5x5 20, 320 features, fc 50, fc classes."""
    # FedUp Sec. 6.1.2: "2 conv layers with 10 and 20 5x5 kernels, then a fully connected layer
    # of 320 neurons". 320 = 20*4*4 is the flattened size of the classic PyTorch MNIST net, so
    # we read it as that net (320 -> 50 -> classes), without its two dropout layers. (That net
    # pools before its ReLU; max-pool and ReLU commute, so the order here changes nothing.)
    c = _image("femnist-cnn", input_shape, (28,))
    return _conv_net(c, ((10, 0), (20, 0)), 320, (50, num_classes))


def mlp(num_classes: int, input_shape: Shape) -> nn.Module:
    """McMahan et al.'s 2NN: flatten, 200, ReLU, 200, ReLU, classes (any input_shape)."""
    if len(input_shape) == 0 or min(input_shape) < 1:
        raise _bad_shape("mlp", input_shape, "with at least one dimension, all >= 1")
    return _conv_net(0, (), math.prod(input_shape), (200, 200, num_classes))


# --- ResNets ---------------------------------------------------------------------------------
class PadShortcut(nn.Module):
    """He et al.'s option-A shortcut: subsample by the stride and zero-pad the new channels."""

    def __init__(self, stride: int, extra_channels: int) -> None:
        super().__init__()
        self.stride, self.extra = stride, extra_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C + extra, H / stride, W / stride), no parameters."""
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.extra // 2
        return F.pad(x, (0, 0, 0, 0, half, self.extra - half))


class BasicBlock(nn.Module):
    """Two 3x3 convs with normalisation, plus a shortcut (identity, 1x1 projection or pad)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, norm: Callable[[int], nn.Module],
                 shortcut: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, padding=1, bias=False)
        self.norm1 = norm(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, padding=1, bias=False)
        self.norm2 = norm(out_ch)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            if shortcut == "pad":  # option A
                self.shortcut = PadShortcut(stride, out_ch - in_ch)
            else:  # option B: 1x1 conv + norm, as torchvision and kuangliu's CIFAR ResNet
                self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False),
                                              norm(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual block; no in-place ops, so it works under torch.func.vmap."""
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stem with stride 1 and no max-pool, stages, global avg pool, fc."""

    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...],
                 blocks: tuple[int, ...], norm: Callable[[int], nn.Module], shortcut: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, padding=1, bias=False)
        self.norm1 = norm(widths[0])
        in_ch, stages = widths[0], []
        for i, (width, n) in enumerate(zip(widths, blocks, strict=True)):
            stride = 1 if i == 0 else 2
            layers = []
            for j in range(n):
                layers.append(BasicBlock(in_ch, width, stride if j == 0 else 1, norm, shortcut))
                in_ch = width
            stages.append(nn.Sequential(*layers))
        self.layers = nn.Sequential(*stages)  # keys: layers.<stage>.<block>.conv1.weight
        self.fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            # He init of the convs as in torchvision (and so FedMut's and FedDyn's code);
            # norm layers keep weight 1, bias 0.
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, num_classes)."""
        out = self.layers(F.relu(self.norm1(self.conv1(x))))
        return self.fc(out.mean(dim=(2, 3)))


def resnet18(num_classes: int, input_shape: Shape) -> nn.Module:
    """CIFAR ResNet-18 with BatchNorm (as FedMut's code; 11,173,962 params for 10 classes)."""
    c = _image("resnet18", input_shape)
    return ResNet(c, num_classes, (64, 128, 256, 512), (2, 2, 2, 2), nn.BatchNorm2d, "conv")


def resnet18_gn(num_classes: int, input_shape: Shape) -> nn.Module:
    """CIFAR ResNet-18 with GroupNorm(2, C) in place of every BatchNorm (FedUp, after FedDyn)."""
    # FedUp Sec. 6.1.2 uses "ResNet18 with group normalisation, following FedDyn"; FedDyn's code
    # uses 2 groups. Its stem is torchvision's ImageNet one (7x7/2 + max-pool); we keep the
    # CIFAR stem of `resnet18` so the two models differ only in normalisation.
    c = _image("resnet18-gn", input_shape)
    return ResNet(c, num_classes, (64, 128, 256, 512), (2, 2, 2, 2),
                  lambda channels: nn.GroupNorm(2, channels), "conv")


def resnet20(num_classes: int, input_shape: Shape) -> nn.Module:
    """He et al. 2016 CIFAR ResNet-20 (3x3 BasicBlocks, 16-32-64), option-A shortcuts."""
    # Option A (He et al. Sec. 4.2 use it on CIFAR) keeps shortcuts parameter-free: 269,722
    # params for 10 classes ("0.27M"); option B would add 2,752 (1x1 convs + BN).
    c = _image("resnet20", input_shape)
    return ResNet(c, num_classes, (16, 32, 64), (3, 3, 3), nn.BatchNorm2d, "pad")


# --- VGG and LSTM ----------------------------------------------------------------------------
VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG(nn.Module):
    """VGG with BatchNorm for 32x32 inputs; the five pools leave 1x1x512 features."""

    def __init__(self, in_channels: int, num_classes: int, cfg: tuple = VGG16_CFG) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(in_channels, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU()]
                in_channels = v
        self.features = nn.Sequential(*layers)
        # One linear layer on the 512 features, as the common CIFAR VGG (kuangliu). The official
        # FedMut/FedMR VGG16 uses 512-4096-4096-classes with dropout; we keep no dropout, and a
        # 4096-wide head would add ~19M parameters for a 1x1 feature map.
        self.classifier = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, 32, 32) -> (B, num_classes)."""
        return self.classifier(self.features(x).flatten(1))


def vgg16(num_classes: int, input_shape: Shape) -> nn.Module:
    """VGG-16 with BatchNorm, for 32x32 images, linear classifier on 512 features."""
    return VGG(_image("vgg16", input_shape, (32,)), num_classes)


class CharLSTM(nn.Module):
    """Next-character LSTM of LEAF/FedAvg: embedding 8, 2 x LSTM 256, fc on the last step."""

    def __init__(self, vocab_size: int, embed_dim: int = 8, hidden: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 token ids -> (B, vocab_size) logits for the next character."""
        out, _ = self.lstm(self.embed(x))  # (B, L, hidden)
        return self.fc(out[:, -1])


def lstm(num_classes: int, input_shape: Shape, hidden: int = 256, name: str = "lstm") -> nn.Module:
    """Shakespeare LSTM; the vocabulary is the set of classes (80 characters in LEAF)."""
    if len(input_shape) != 1 or input_shape[0] < 1:
        raise _bad_shape(name, input_shape, "(L,): a sequence of L token ids, e.g. (80,)")
    return CharLSTM(num_classes, hidden=hidden)


def lstm_100(num_classes: int, input_shape: Shape) -> nn.Module:
    """FedProx's (and FedUp's Sec. 6.4) Shakespeare model: embedding 8, 2 x LSTM 100."""
    return lstm(num_classes, input_shape, hidden=100, name="lstm-100")


# --- registry --------------------------------------------------------------------------------
MODELS: dict[str, Callable[..., nn.Module]] = {
    "cnn": cnn, "lenet-cifar": lenet_cifar, "resnet18": resnet18, "resnet18-gn": resnet18_gn,
    "resnet20": resnet20, "vgg16": vgg16, "lstm": lstm, "lstm-100": lstm_100, "mlp": mlp,
    "lenet5": lenet5, "femnist-cnn": femnist_cnn,
}


def model_names() -> list[str]:
    """Registered model names, sorted."""
    return sorted(MODELS)


def build_model(name: str, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """Build a registered model; ValueError for an unknown name or an unsupported input_shape."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; registered models: {', '.join(model_names())}")
    if num_classes < 1:
        raise ValueError(f"model {name!r} needs num_classes >= 1; got {num_classes}")
    return MODELS[name](num_classes, tuple(input_shape))
