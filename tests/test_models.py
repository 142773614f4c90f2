"""Models: output shapes, parameter counts against formulas and published counts, errors."""

import pytest
import torch
from torch import nn

from flnotes.models import MODELS, build_model, model_names

# --- parameter counts by formula, from the layer dimensions alone ---------------------------


def conv(i: int, o: int, k: int, bias: bool = True) -> int:
    return o * i * k * k + (o if bias else 0)


def lin(i: int, o: int) -> int:
    return i * o + o


def norm(c: int) -> int:  # BatchNorm/GroupNorm affine weight + bias (running stats are buffers)
    return 2 * c


def lstm_layer(i: int, h: int) -> int:  # 4 gates: W_ih, W_hh, b_ih, b_hh
    return 4 * h * (i + h) + 2 * 4 * h


def resnet_count(c: int, widths, blocks, k: int, projection: bool) -> int:
    total = conv(c, widths[0], 3, bias=False) + norm(widths[0])
    in_ch = widths[0]
    for stage, (w, n) in enumerate(zip(widths, blocks, strict=True)):
        for b in range(n):
            total += conv(in_ch, w, 3, False) + norm(w) + conv(w, w, 3, False) + norm(w)
            if projection and (in_ch != w or (stage > 0 and b == 0)):
                total += conv(in_ch, w, 1, False) + norm(w)
            in_ch = w
    return total + lin(in_ch, k)


def vgg16_count(c: int, k: int) -> int:
    cfg = [64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]
    total = 0
    for w in cfg:
        total += conv(c, w, 3) + norm(w)
        c = w
    return total + lin(512, k)


CIFAR, MNIST = (3, 32, 32), (1, 28, 28)

# name -> (input_shape, num_classes, count by formula)
CASES = {
    "cnn": (CIFAR, 10, conv(3, 32, 5) + conv(32, 64, 5) + lin(64 * 8 * 8, 512) + lin(512, 10)),
    "lenet-cifar": (
        CIFAR,
        10,
        conv(3, 6, 5) + conv(6, 16, 5) + lin(400, 120) + lin(120, 84) + lin(84, 10),
    ),
    "resnet18": (CIFAR, 10, resnet_count(3, (64, 128, 256, 512), (2, 2, 2, 2), 10, True)),
    "resnet18-gn": (CIFAR, 100, resnet_count(3, (64, 128, 256, 512), (2, 2, 2, 2), 100, True)),
    "resnet20": (CIFAR, 10, resnet_count(3, (16, 32, 64), (3, 3, 3), 10, False)),
    "vgg16": (CIFAR, 10, vgg16_count(3, 10)),
    "lstm": ((80,), 80, 80 * 8 + lstm_layer(8, 256) + lstm_layer(256, 256) + lin(256, 80)),
    # FedProx's Shakespeare LSTM (FedUp Sec. 6.4): 100 hidden units.
    "lstm-100": ((80,), 80, 80 * 8 + lstm_layer(8, 100) + lstm_layer(100, 100) + lin(100, 80)),
    "mlp": (MNIST, 10, lin(784, 200) + lin(200, 200) + lin(200, 10)),
    "lenet5": (
        MNIST,
        10,
        conv(1, 6, 5) + conv(6, 16, 5) + lin(400, 120) + lin(120, 84) + lin(84, 10),
    ),
    "femnist-cnn": (MNIST, 62, conv(1, 10, 5) + conv(10, 20, 5) + lin(320, 50) + lin(50, 62)),
}


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def batch(name: str, shape, num_classes: int, n: int = 2) -> torch.Tensor:
    if name.startswith("lstm"):  # token ids; the vocabulary is the set of classes
        return torch.randint(0, num_classes, (n, *shape))
    return torch.randn(n, *shape)


def test_registry_holds_every_model():
    assert model_names() == sorted(CASES) == sorted(MODELS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_shape_and_parameter_count(name):
    shape, k, expected = CASES[name]
    model = build_model(name, k, shape)
    out = model(batch(name, shape, k))
    assert out.shape == (2, k) and out.dtype == torch.float32
    assert num_params(model) == expected


@pytest.mark.parametrize(
    "name, shape, k, published",
    [
        ("resnet18", CIFAR, 10, 11_173_962),  # kuangliu/pytorch-cifar ResNet18
        ("resnet18-gn", CIFAR, 10, 11_173_962),  # GN has the same affine parameters as BN
        ("resnet20", CIFAR, 10, 269_722),  # option A, "0.27M" in He et al. Table 6
        ("vgg16", CIFAR, 10, 14_728_266),  # kuangliu/pytorch-cifar VGG16
        ("lstm", (80,), 80, 819_920),  # LEAF Shakespeare LSTM
        ("mlp", MNIST, 10, 199_210),  # McMahan et al. 2017, 2NN
        ("cnn", MNIST, 10, 1_663_370),  # McMahan et al. 2017, MNIST CNN
    ],
)
def test_published_parameter_counts(name, shape, k, published):
    assert num_params(build_model(name, k, shape)) == published


def test_resnet20_option_b_count_differs_by_the_projections():
    # The 272,474 often quoted for ResNet-20 is option B: 1x1 conv + BN on the two
    # stage transitions. Ours is option A, whose shortcuts have no parameters.
    option_b = resnet_count(3, (16, 32, 64), (3, 3, 3), 10, projection=True)
    assert option_b == 272_474
    assert option_b - num_params(build_model("resnet20", 10, CIFAR)) == 2_752


@pytest.mark.parametrize(
    "name, shape",
    [
        ("cnn", (1, 32, 32)),
        ("cnn", (1, 28, 28)),
        ("resnet18", MNIST),
        ("resnet20", (1, 32, 32)),
        ("mlp", (60,)),
        ("mlp", CIFAR),
        ("lstm", (20,)),
        ("vgg16", (1, 32, 32)),
    ],
)
def test_other_channels_and_sizes(name, shape):
    model = build_model(name, 7, shape)
    assert model(batch(name, shape, 7)).shape == (2, 7)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_seed_same_state(name):
    shape, k, _ = CASES[name]
    torch.manual_seed(3)
    a = build_model(name, k, shape).state_dict()
    torch.manual_seed(3)
    b = build_model(name, k, shape).state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[key], b[key]) for key in a)
    torch.manual_seed(4)
    c = build_model(name, k, shape).state_dict()
    assert not all(torch.equal(a[key], c[key]) for key in a)


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_dropout_and_deterministic_forward_in_train_mode(name):
    shape, k, _ = CASES[name]
    model = build_model(name, k, shape).train()
    assert not any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())
    x = batch(name, shape, k)
    assert torch.equal(model(x), model(x))


def test_group_norm_variant_has_two_groups_and_no_batch_norm():
    model = build_model("resnet18-gn", 10, CIFAR)
    norms = [m for m in model.modules() if isinstance(m, (nn.GroupNorm, nn.BatchNorm2d))]
    assert norms and all(isinstance(m, nn.GroupNorm) and m.num_groups == 2 for m in norms)
    assert len(list(model.buffers())) == 0  # no running statistics to average or mutate
    assert list(model.state_dict()) == [
        k
        for k in build_model("resnet18", 10, CIFAR).state_dict()
        if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    ]


def test_state_dict_keys_are_plain_and_in_forward_order():
    keys = list(build_model("cnn", 10, CIFAR).state_dict())
    assert keys == [
        f"{layer}.{p}" for layer in ("conv1", "conv2", "fc1", "fc2") for p in ("weight", "bias")
    ]
    keys = list(build_model("lstm", 80, (80,)).state_dict())
    assert keys[0] == "embed.weight" and keys[-2:] == ["fc.weight", "fc.bias"]


def test_unknown_name_lists_registered_names():
    with pytest.raises(ValueError, match="unknown model 'resnet50'") as err:
        build_model("resnet50", 10, CIFAR)
    assert ", ".join(model_names()) in str(err.value)


@pytest.mark.parametrize(
    "name, shape",
    [
        ("cnn", (3, 64, 64)),
        ("cnn", (80,)),
        ("lenet-cifar", MNIST),
        ("vgg16", (3, 28, 28)),
        ("lenet5", CIFAR),
        ("femnist-cnn", CIFAR),
        ("resnet18", (80,)),
        ("resnet20", (3, 4, 4)),
        ("resnet18-gn", (3, 32)),
        ("lstm", MNIST),
        ("mlp", ()),
    ],
)
def test_incompatible_shape_names_model_and_shape(name, shape):
    with pytest.raises(ValueError) as err:
        build_model(name, 10, shape)
    message = str(err.value)
    assert repr(name) in message and str(tuple(shape)) in message and "expects" in message


def test_bad_num_classes():
    with pytest.raises(ValueError, match="num_classes"):
        build_model("mlp", 0, MNIST)
