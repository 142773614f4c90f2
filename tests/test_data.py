"""Loaders read tiny fake datasets in each real on-disk format, through the real code path."""

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from flnotes.data import TensorData, dataset_names, load_dataset, vision
from flnotes.data.options import data_option_problems, loader_options
from flnotes.data.vision import MEAN_STD

CIFAR10_CLASSES = [
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
]  # fmt: skip


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Keep image-folder caches and default data dirs inside tmp_path, never in ~/.cache."""
    monkeypatch.setenv("FLNOTES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FLNOTES_DATA", str(tmp_path / "default-data"))


def to_uint8(x: torch.Tensor, name: str) -> np.ndarray:
    """Undo the loader's per-channel normalisation."""
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in MEAN_STD[name])
    return (x * std + mean).mul(255).round().to(torch.uint8).numpy()


# ------------------------------------------------------------------ CIFAR pickles


@pytest.fixture
def no_md5(monkeypatch):
    """The fake pickles cannot match torchvision's md5 sums: skip that check (tests only).

    CIFAR10._check_integrity and CIFAR10._load_meta both call the module's check_integrity.
    """
    import torchvision.datasets.cifar as tv_cifar

    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *args, **kwargs: True)


def dump(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj, protocol=2))


def fake_batch(rng, n: int, num_classes: int) -> tuple[np.ndarray, list[int]]:
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, num_classes, n).tolist()


def test_cifar10_pickles(tmp_path, no_md5):
    rng = np.random.default_rng(0)
    root = tmp_path / "cifar-10-batches-py"
    train_x, train_y = [], []
    for i in range(1, 6):
        x, y = fake_batch(rng, 4, 10)
        dump(root / f"data_batch_{i}", {"batch_label": f"batch {i}", "data": x, "labels": y})
        train_x.append(x)
        train_y += y
    test_x, test_y = fake_batch(rng, 3, 10)
    dump(root / "test_batch", {"data": test_x, "labels": test_y})
    dump(root / "batches.meta", {"label_names": CIFAR10_CLASSES})

    d = load_dataset("cifar10", data_dir=tmp_path)
    assert isinstance(d, TensorData) and d.num_classes == 10 and d.input_shape == (3, 32, 32)
    assert d.train_x.shape == (20, 3, 32, 32) and d.train_x.dtype == torch.float32
    assert d.test_x.shape == (3, 3, 32, 32)
    assert d.train_y.dtype == torch.int64 and d.train_y.tolist() == train_y
    assert d.test_y.tolist() == test_y
    # CIFAR rows are 1024 R, 1024 G, 1024 B values, each plane row-major: exactly (C,H,W).
    assert np.array_equal(
        to_uint8(d.train_x, "cifar10"), np.concatenate(train_x).reshape(-1, 3, 32, 32)
    )
    assert np.array_equal(to_uint8(d.test_x, "cifar10"), test_x.reshape(-1, 3, 32, 32))


def test_cifar100_pickles_fine_and_coarse(tmp_path, no_md5):
    rng = np.random.default_rng(1)
    root = tmp_path / "cifar-100-python"
    fine = {"train": rng.integers(0, 100, 12).tolist(), "test": rng.integers(0, 100, 5).tolist()}
    coarse = {k: [f // 5 for f in v] for k, v in fine.items()}  # any fine->coarse map will do
    for split, n in (("train", 12), ("test", 5)):
        x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        dump(root / split, {"data": x, "fine_labels": fine[split], "coarse_labels": coarse[split]})
    dump(root / "meta", {"fine_label_names": [f"f{i}" for i in range(100)],
                         "coarse_label_names": [f"c{i}" for i in range(20)]})  # fmt: skip

    d = load_dataset("cifar100", data_dir=tmp_path)
    assert d.num_classes == 100 and d.train_x.shape == (12, 3, 32, 32)
    assert d.train_y.tolist() == fine["train"] and d.test_y.tolist() == fine["test"]
    c = load_dataset("cifar100", data_dir=tmp_path, coarse=True)
    assert c.num_classes == 20 and c.train_y.dtype == torch.int64
    assert c.train_y.tolist() == coarse["train"] and c.test_y.tolist() == coarse["test"]
    assert torch.equal(c.train_x, d.train_x)


def test_missing_cifar_says_where_it_looked_and_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("cifar10", data_dir=tmp_path / "nowhere")
    msg = str(err.value)
    assert str(tmp_path / "nowhere" / "train") in msg
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py") in msg
    assert "download=True" in msg and "ImageFolder" in msg


# ------------------------------------------------------------------ image folders


def write_image_folder(root: Path, classes: list[str], per_class: dict[str, int]) -> dict:
    """PNG images (lossless, so pixel values can be checked) plus one JPEG per train class."""
    from PIL import Image

    rng = np.random.default_rng(2)
    written = {}
    for split, n in per_class.items():
        for cls in reversed(classes):  # creation order must not matter
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(arr).save(root / split / cls / f"{i:04d}.png")
                written[(split, cls, i)] = arr
        (root / split / "notes.txt").write_text("not a class folder, not an image")
    for cls in classes:
        Image.fromarray(np.full((32, 32, 3), 128, np.uint8)).save(root / "train" / cls / "x.jpg")
    return written


def test_cifar10_image_folder_and_cache(tmp_path, monkeypatch):
    root = tmp_path / "cifar10-jpeg"
    written = write_image_folder(root, CIFAR10_CLASSES, {"train": 2, "test": 1})

    d = load_dataset("cifar10", data_dir=root)
    assert d.train_x.shape == (30, 3, 32, 32) and d.test_x.shape == (10, 3, 32, 32)
    assert d.train_x.dtype == torch.float32 and d.train_y.dtype == torch.int64
    # Alphabetical folder order = CIFAR-10's standard label order (airplane=0 ... truck=9).
    assert CIFAR10_CLASSES == sorted(CIFAR10_CLASSES)
    assert d.train_y.tolist() == [c for c in range(10) for _ in range(3)]
    assert d.test_y.tolist() == list(range(10))
    pixels = to_uint8(d.train_x, "cifar10")
    assert np.array_equal(pixels[3 * 4 + 1], written[("train", "deer", 1)].transpose(2, 0, 1))
    assert np.abs(pixels[2].astype(int) - 128).max() <= 2  # airplane/x.jpg, lossy JPEG

    assert len(list((tmp_path / "cache").glob("imagefolder-*.pt"))) == 1

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again instead of using the cache")

    monkeypatch.setattr(vision, "_decode_images", no_decoding)
    again = load_dataset("cifar10", data_dir=root)
    assert torch.equal(again.train_x, d.train_x) and torch.equal(again.test_y, d.test_y)

    # A changed folder (one more file) must not be served from the stale cache.
    (root / "test" / "cat" / "extra.png").write_bytes(
        (root / "test" / "cat" / "0000.png").read_bytes()
    )
    with pytest.raises(AssertionError, match="decoded again"):
        load_dataset("cifar10", data_dir=root)


@pytest.mark.parametrize("terminal", [False, True])
def test_decoding_draws_its_bar_on_a_terminal_only(tmp_path, monkeypatch, capfd, terminal):
    """The images' decoding bar goes to a terminal (or a notebook), never into a log file
    (pytest's captured stderr stands for one); the images decode the same either way."""
    from flnotes import messages

    monkeypatch.setattr(messages, "on_terminal", lambda: terminal)
    root = tmp_path / "folder"
    write_image_folder(root, CIFAR10_CLASSES, {"train": 1, "test": 1})
    files = sorted(str(f) for f in (root / "train").rglob("*.png"))
    images = vision._decode_images(files, "decoding cifar10/train")
    assert images.shape == (len(files), 3, 32, 32)
    assert ("decoding cifar10/train" in capfd.readouterr().err) == terminal


def test_image_folder_corrupt_image_is_named(tmp_path):
    root = tmp_path / "folder"
    write_image_folder(root, CIFAR10_CLASSES, {"train": 1, "test": 1})
    bad = root / "train" / "dog" / "0000.png"
    bad.write_bytes(b"this is not a png")
    with pytest.raises(ValueError, match="0000.png") as err:
        load_dataset("cifar10", data_dir=root)
    assert str(bad) in str(err.value)


def test_image_folder_with_wrong_class_count(tmp_path):
    root = tmp_path / "folder"
    write_image_folder(root, ["a", "b", "c"], {"train": 1, "test": 1})
    with pytest.raises(ValueError, match="3 class folders"):
        load_dataset("cifar10", data_dir=root)


# ------------------------------------------------------------------ IDX files


def idx_bytes(arr: np.ndarray) -> bytes:
    """Big-endian IDX: 0x0000, type 0x08 (ubyte), ndim, then each dim as int32."""
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def write_idx(folder: Path, gz: bool, n_train: int = 6, n_test: int = 4, seed: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        raw = idx_bytes(arr)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(raw))
        else:
            (folder / name).write_bytes(raw)
    return arrays


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize("name", ["fashion-mnist", "mnist"])
def test_idx_datasets(tmp_path, name, gz):
    arrays = write_idx(tmp_path, gz)
    d = load_dataset(name, data_dir=tmp_path)
    assert d.num_classes == 10 and d.input_shape == (1, 28, 28)
    assert d.train_x.shape == (6, 1, 28, 28) and d.train_x.dtype == torch.float32
    assert d.test_x.shape == (4, 1, 28, 28)
    assert d.train_y.dtype == torch.int64
    assert d.train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert d.test_y.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    assert np.array_equal(to_uint8(d.train_x, name)[:, 0], arrays["train-images-idx3-ubyte"])


def test_idx_in_torchvision_layout(tmp_path):
    arrays = write_idx(tmp_path / "FashionMNIST" / "raw", gz=False, n_train=5)
    d = load_dataset("fashion-mnist", data_dir=tmp_path)
    assert d.train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()


def test_idx_download_goes_through_torchvision(tmp_path, monkeypatch):
    import torchvision

    class FakeMNIST:  # stands in for the network: writes where torchvision would
        def __init__(self, root, download):
            assert download
            write_idx(Path(root) / "MNIST" / "raw", gz=False, n_train=7)

    monkeypatch.setattr(torchvision.datasets, "MNIST", FakeMNIST)
    assert len(load_dataset("mnist", data_dir=tmp_path, download=True).train_y) == 7


def test_missing_idx_lists_places_and_hints(tmp_path, monkeypatch):
    monkeypatch.setattr(vision, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian")
    monkeypatch.setenv("FLNOTES_DATA", str(tmp_path / "default"))
    (tmp_path / "default").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("fashion-mnist")
    msg = str(err.value)
    for place in ("default", "default/FashionMNIST/raw", "no-debian"):
        assert str(tmp_path / place) in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "download=True" in msg
    # A data_dir named is the one read: neither the system copy nor a fallback.
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("fashion-mnist", data_dir=tmp_path / "empty")
    assert "no-debian" not in str(err.value) and str(tmp_path / "empty") in str(err.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset("fashion-mnist", data_dir=tmp_path / "typo")


@pytest.mark.parametrize("damage", ["magic", "truncated", "bad-gzip"])
def test_corrupt_idx_raises_naming_the_file(tmp_path, damage):
    write_idx(tmp_path, gz=damage == "bad-gzip")
    name = "train-images-idx3-ubyte"
    if damage == "bad-gzip":
        path = tmp_path / f"{name}.gz"
        path.write_bytes(path.read_bytes()[:40])
    else:
        path = tmp_path / name
        raw = path.read_bytes()
        raw = b"\x00\x00\x08\x01" + raw[4:] if damage == "magic" else raw[:-100]
        path.write_bytes(raw)
    with pytest.raises(ValueError, match=name) as err:
        load_dataset("mnist", data_dir=tmp_path)
    assert str(path) in str(err.value)


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="dataset-fashion-mnist absent"
)
def test_real_fashion_mnist_from_debian(tmp_path, monkeypatch):
    monkeypatch.setenv("FLNOTES_DATA", str(tmp_path / "empty"))  # no data_dir: the default
    d = load_dataset("fashion-mnist")
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    assert torch.equal(d.train_y.bincount(), torch.full((10,), 6000))
    assert abs(d.train_x.mean().item()) < 0.01 and abs(d.train_x.std().item() - 1) < 0.01


# ------------------------------------------------------------------ synthetic and registry


def test_synthetic_is_deterministic_per_seed():
    a = load_dataset("synthetic", seed=0, num_train=500, num_test=100)
    b = load_dataset("synthetic", seed=0, num_train=500, num_test=100)
    c = load_dataset("synthetic", seed=1, num_train=500, num_test=100)
    assert a.train_x.shape == (500, 1, 28, 28) and a.test_x.shape == (100, 1, 28, 28)
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    assert a.num_classes == 10 and set(a.train_y.tolist()) == set(range(10))
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, c.train_x)


def test_synthetic_is_learnable_but_not_trivial():
    # Seed 0 with 2,000 samples: a small MLP gets about 70% in 2 epochs (about 82% with the
    # default 6,000 samples and 5 epochs); never 100%.
    d = load_dataset("synthetic", seed=0, num_train=2000, num_test=1000)
    accuracy = train_small_mlp(d, epochs=2)  # one thread, as every test (conftest.py)
    assert 0.5 < accuracy < 0.95


def train_small_mlp(d: TensorData, epochs: int) -> float:
    """Test accuracy of a 784-64-10 MLP after a few epochs of SGD."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    for _ in range(epochs):
        for batch in torch.randperm(len(d.train_y)).split(32):
            loss = torch.nn.functional.cross_entropy(model(d.train_x[batch]), d.train_y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return (model(d.test_x).argmax(1) == d.test_y).float().mean().item()


def test_registry_and_unknown_name():
    assert {"synthetic", "cifar10", "cifar100", "fashion-mnist", "mnist"} <= set(dataset_names())
    with pytest.raises(ValueError, match="synthetic"):
        load_dataset("imagenet")


# ------------------------------------------------------------------ loader options


def test_loader_options_come_from_the_real_loaders_signature():
    shakespeare = loader_options("shakespeare")
    assert {"max_roles", "seq_len", "min_samples", "source"} <= set(shakespeare)
    assert shakespeare["max_roles"].kind is int and shakespeare["max_roles"].optional
    assert shakespeare["seq_len"].default == 80 and not shakespeare["seq_len"].optional
    # name is bound by the registry
    assert set(loader_options("cifar10")) == {"coarse", "normalize", "train_share"}
    assert loader_options("cifar10")["train_share"].kind is float
    assert set(loader_options("mnist")) == {"normalize"}
    assert loader_options("synthetic")["noise"].kind is float


@pytest.mark.parametrize("name, options, words", [
    ("synthetic", {"foo": 1}, ["'foo'", "num_train", "max_shift"]),
    ("shakespeare", {"max_rolez": 3}, ["'max_rolez'", "did you mean 'max_roles'"]),
    ("shakespeare", {"max_roles": "abc"}, ["max_roles", "'abc'", "integer >= 1 or None"]),
    ("shakespeare", {"seq_len": -5}, ["seq_len", "-5", "integer >= 1"]),
    ("shakespeare", {"seq_len": 0}, ["seq_len", "integer >= 1"]),
    ("shakespeare", {"min_samples": -1}, ["min_samples", "integer >= 0"]),
    ("shakespeare", {"source": "web"}, ["source", "'auto', 'leaf', 'plays'"]),
    ("shakespeare", {"train_fraction": 1.0}, ["train_fraction", "between 0 and 1"]),
    ("synthetic", {"noise": float("nan")}, ["noise", "finite"]),
    ("synthetic", {"num_train": 2.5}, ["num_train", "integer"]),
    ("cifar100", {"coarse": "yes"}, ["coarse", "true or false"]),
    ("mnist", {"coarse": True}, ["'coarse'", "options are: normalize (str"]),
])
def test_bad_loader_options_are_named_with_what_is_allowed(name, options, words):
    problems = list(data_option_problems(name, options))
    assert len(problems) == 1
    for word in words:
        assert word in problems[0], f"{word!r} missing from: {problems[0]}"


def test_good_loader_options_pass():
    assert not list(data_option_problems("synthetic", {"num_train": 10, "noise": 2,
                                                            "max_shift": 0}))
    assert not list(data_option_problems("shakespeare", {"max_roles": None, "seq_len": 8,
                                                              "layout": "alone"}))
    assert not list(data_option_problems("toy", {"anything": 1}))  # its own task module


def test_load_dataset_refuses_an_unknown_option_before_loading():
    # Without the check the loader itself raises a TypeError that names no valid option.
    with pytest.raises(ValueError, match="has no option 'num_trian'.*did you mean 'num_train'"):
        load_dataset("synthetic", num_trian=10)


def test_a_jpeg_copy_is_recorded_by_a_run_and_marked_in_tables(tmp_path):
    """The JPEG copy of CIFAR-10 re-encodes every image: a run says so, tables mark it."""
    from PIL import Image

    from flnotes.config import RunConfig
    from flnotes.engine.sim import run
    from flnotes.repro import tables

    mixed = tmp_path / "mixed"  # PNG with one JPEG per class: not a JPEG copy
    write_image_folder(mixed, CIFAR10_CLASSES, {"train": 1, "test": 1})
    assert load_dataset("cifar10", data_dir=mixed).source == "an image folder"
    root = tmp_path / "cifar10-jpeg"
    for split in ("train", "test"):
        for label, cls in enumerate(CIFAR10_CLASSES):
            (root / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(np.full((32, 32, 3), 20 * label + i, np.uint8)).save(
                    root / split / cls / f"{i:04d}.jpg")
    assert load_dataset("cifar10", data_dir=root).source == "a JPEG image folder"

    config = RunConfig(dataset="cifar10", data_dir=str(root), model="cnn", partition="iid",
                       num_clients=2, clients_per_round=2, rounds=1, batch_size=10,
                       min_client_size=1, device="cpu", run_dir=str(tmp_path / "runs" / "r"))
    history = run(config, progress=False)
    assert history.environment["data_source"] == "a JPEG image folder"
    result = tables.compare(tables.load_paper_table("fedmut_table1"),
                            tables.aggregate(tables.collect_runs(tmp_path / "runs")),
                            table="fedmut_table1")
    cell = result[(result["dataset"] == "CIFAR-10") & (result["model"] == "CNN")
                  & (result["heterogeneity"] == "iid") & (result["method"] == "FedAvg")]
    assert "*" in tables.side_by_side(cell).iloc[0, 0]
    assert "cifar10 read from a JPEG image folder" in "\n".join(tables.legend(result))


# ------------------------------------------------------------------ input normalisation


def test_normalize_option_scales_pixels_as_each_rule_says(tmp_path):
    """Each rule against a hand computation on the raw pixels of a tiny IDX set, and the
    rules of FedMut's official code (utils/get_dataset.py) per dataset."""
    arrays = write_idx(tmp_path, gz=False)
    raw = torch.from_numpy(arrays["train-images-idx3-ubyte"].astype(np.float32))[:, None] / 255
    half = load_dataset("fashion-mnist", data_dir=tmp_path, normalize="half").train_x
    unit = load_dataset("fashion-mnist", data_dir=tmp_path, normalize="unit").train_x
    default = load_dataset("fashion-mnist", data_dir=tmp_path).train_x
    mean, std = MEAN_STD["fashion-mnist"]
    assert torch.allclose(half, (raw - 0.5) / 0.5, atol=1e-6)
    assert torch.equal(unit, raw)
    assert torch.allclose(default, (raw - mean[0]) / std[0], atol=1e-6)
    # FedMut's code: ToTensor() alone for Fashion-MNIST, MNIST's usual statistics for MNIST.
    code = load_dataset("fashion-mnist", data_dir=tmp_path, normalize="fedmut-code").train_x
    assert torch.equal(code, unit)
    mnist = load_dataset("mnist", data_dir=tmp_path, normalize="fedmut-code").train_x
    assert torch.equal(mnist, load_dataset("mnist", data_dir=tmp_path).train_x)


def test_normalize_fedmut_code_on_cifar(tmp_path, no_md5):
    """CIFAR-10: Normalize((0.5,)*3, (0.5,)*3); CIFAR-100: the code's own constants."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
    for i in range(1, 6):
        dump(tmp_path / "cifar-10-batches-py" / f"data_batch_{i}", {"data": x, "labels": [0] * 4})
    dump(tmp_path / "cifar-10-batches-py" / "test_batch", {"data": x, "labels": [1] * 4})
    dump(tmp_path / "cifar-10-batches-py" / "batches.meta", {"label_names": list("abcdefghij")})
    pixels = torch.from_numpy(x.reshape(4, 3, 32, 32).astype(np.float32)) / 255
    code = load_dataset("cifar10", data_dir=tmp_path, normalize="fedmut-code")
    assert torch.allclose(code.test_x, (pixels - 0.5) / 0.5, atol=1e-6)
    assert torch.equal(code.test_x, load_dataset("cifar10", data_dir=tmp_path,
                                                 normalize="half").test_x)


def test_a_wrong_normalize_is_one_line_naming_the_choices():
    problems = list(data_option_problems("cifar10", {"normalize": "zscore"}))
    assert len(problems) == 1 and "normalize" in problems[0] and "fedmut-code" in problems[0]
    from flnotes.config import RunConfig

    with pytest.raises(ValueError, match="normalize"):
        RunConfig(dataset="cifar10", data_options={"normalize": "zscore"})


def test_cifar_train_share_keeps_a_fixed_share_of_every_class(tmp_path):
    """train_share (a CPU-scale run): round(share * n_c) training images of each class, the
    same ones whatever the run's seed, in their original order; the test set whole."""
    root = tmp_path / "cifar10-jpeg"
    write_image_folder(root, CIFAR10_CLASSES, {"train": 9, "test": 1})  # 10 a class with x.jpg
    whole = load_dataset("cifar10", data_dir=root)
    half = load_dataset("cifar10", data_dir=root, seed=0, train_share=0.5)
    other_seed = load_dataset("cifar10", data_dir=root, seed=7, train_share=0.5)
    assert len(half.train_y) == 50 and torch.bincount(half.train_y).tolist() == [5] * 10
    assert torch.equal(half.train_x, other_seed.train_x)
    assert torch.equal(half.test_x, whole.test_x) and torch.equal(half.test_y, whole.test_y)
    # Every kept image is one of the whole set's, kept in the whole set's order.
    rows = [next(i for i in range(len(whole.train_x))
                 if whole.train_y[i] == y and torch.equal(whole.train_x[i], x))
            for x, y in zip(half.train_x, half.train_y, strict=True)]
    assert rows == sorted(rows) and len(set(rows)) == 50
    assert load_dataset("cifar10", data_dir=root, train_share=1.0).train_x.shape == \
        whole.train_x.shape
    for bad in (0, 1.5, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match="train_share"):
            load_dataset("cifar10", data_dir=root, train_share=bad)
