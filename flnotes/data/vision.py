"""Image datasets as tensors: a synthetic task, CIFAR-10/100 (pickles or image folders),
(Fashion-)MNIST. Each loader returns a :class:`~flnotes.data.tensors.TensorData`.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from flnotes.data.tensors import TensorData, default_cache_dir, default_data_dir
from flnotes.messages import bar_wanted

# Per-channel statistics of the training sets (the usual published values).
MEAN_STD = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
}


# How inputs are scaled (the loaders' ``normalize`` option). "dataset" standardises each
# channel with the training set's published mean/std (MEAN_STD). The others reproduce code
# that scales differently, so that a run can be compared with it on the same pixels:
# "half" maps [0,1] to [-1,1] (Normalize((0.5,)*C, (0.5,)*C)); "unit" keeps [0,1] (ToTensor
# alone); "fedmut-code" is what FedMut's official code does per dataset (utils/get_dataset.py
# of github.com/HMHelloWorld/FedMut, read 2026-11): CIFAR-10 "half", CIFAR-100 the code's
# constants below, Fashion-MNIST "unit", MNIST "dataset".
NORMALIZATIONS = ("dataset", "half", "unit", "fedmut-code")
# FedMut's code normalises CIFAR-100 with CIFAR-10's channel means and a widely copied std
# (0.2023, 0.1994, 0.2010), not CIFAR-100's own statistics; kept as the code has it.
FEDMUT_CODE_CIFAR100 = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))


def _mean_std(name: str, normalize: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Channel (mean, std) to standardise with; None: leave the [0,1] values as they are."""
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize={normalize!r}: choose one of {list(NORMALIZATIONS)}")
    if normalize == "fedmut-code":
        normalize = {"cifar10": "half", "fashion-mnist": "unit"}.get(name, "dataset")
        if name == "cifar100":
            return FEDMUT_CODE_CIFAR100
    channels = len(MEAN_STD[name][0])
    if normalize == "half":
        return (0.5,) * channels, (0.5,) * channels
    return None if normalize == "unit" else MEAN_STD[name]


def _normalise(x_uint8: torch.Tensor, name: str, normalize: str = "dataset") -> torch.Tensor:
    """uint8 (N,C,H,W) -> float32 in [0,1], then standardised as ``normalize`` says."""
    x = x_uint8.float().div_(255)
    stats = _mean_std(name, normalize)
    if stats is None:
        return x
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in stats)
    return x.sub_(mean).div_(std)  # in place: no 600 MB temporaries


# ---------------------------------------------------------------- synthetic


def load_synthetic(data_dir: Path, download: bool, seed: int, num_train: int = 6000,
                   num_test: int = 1000, noise: float = 4.0, max_shift: int = 4) -> TensorData:
    """Ten smooth random 28x28 prototypes, randomly shifted, plus Gaussian pixel noise."""
    rng = np.random.default_rng(seed)
    # Smooth prototypes: white noise low-passed with a Gaussian (about 2 px correlation).
    freq = np.fft.fftfreq(28)
    lowpass = np.exp(-(freq[:, None] ** 2 + freq[None, :] ** 2) * (2 * np.pi * 2.0) ** 2 / 2)
    protos = np.fft.ifft2(np.fft.fft2(rng.standard_normal((10, 28, 28))) * lowpass).real
    protos -= protos.mean(axis=(1, 2), keepdims=True)
    protos /= protos.std(axis=(1, 2), keepdims=True)  # unit contrast per class
    n = num_train + num_test
    y = rng.permutation(np.arange(n) % 10)  # balanced classes
    # Circular shifts of up to max_shift px are a nuisance no linear map undoes, so with the
    # default noise a small MLP lands near 80-90% test accuracy instead of 100%.
    padded = np.pad(protos, ((0, 0), (max_shift, max_shift), (max_shift, max_shift)), "wrap")
    dy, dx = rng.integers(0, 2 * max_shift + 1, size=(2, n))
    rows = (dy[:, None] + np.arange(28))[:, :, None]
    cols = (dx[:, None] + np.arange(28))[:, None, :]
    x = padded[y[:, None, None], rows, cols] + noise * rng.standard_normal((n, 28, 28))
    x = torch.from_numpy(x.astype(np.float32)).unsqueeze(1)
    x = (x - x[:num_train].mean()) / x[:num_train].std()
    y = torch.from_numpy(y.astype(np.int64))
    return TensorData("synthetic", x[:num_train], y[:num_train], x[num_train:], y[num_train:], 10)


# ---------------------------------------------------------------- image folders


# torchvision's ImageFolder extensions (copied so that listing a folder never imports torchvision)
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _image_files(split_dir: Path) -> tuple[list[str], list[str], list[int], int]:
    """Classes, files, labels and total bytes; ImageFolder rules: classes and files sorted."""
    # os.scandir, not Path.iterdir + stat: listing 60k files must stay well under a second.
    classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
    files, labels, total_size = [], [], 0
    for label, cls in enumerate(classes):
        for e in sorted(os.scandir(split_dir / cls), key=lambda e: e.name):
            if os.path.splitext(e.name)[1].lower() in IMG_EXTENSIONS and e.is_file():
                files.append(e.path)
                labels.append(label)
                total_size += e.stat().st_size
    return classes, files, labels, total_size


def _decode_images(files: list[str], desc: str) -> torch.Tensor:
    """Decode image files to one uint8 tensor (N,3,H,W); every image must have the same size."""
    from PIL import Image  # lazy: only a JPEG folder needs it

    arrays = []
    for f in tqdm(files, desc=desc, unit="img", mininterval=1.0, disable=not bar_wanted()):
        try:
            with Image.open(f) as im:
                arr = np.asarray(im.convert("RGB"))
        except Exception as e:  # PIL raises several types for bad files
            raise ValueError(f"cannot decode image {f}: {e}") from e
        if arrays and arr.shape != arrays[0].shape:
            raise ValueError(f"image {f} is {arr.shape}, expected {arrays[0].shape} like the rest")
        arrays.append(arr)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def load_image_folder(root: Path, cache_dir: Path | None = None) -> dict:
    """Decoded uint8 train/test tensors and class names of root/{train,test}/<class>/*, cached."""
    root = root.resolve()
    listing = {split: _image_files(root / split) for split in ("train", "test")}
    if listing["train"][0] != listing["test"][0]:
        raise ValueError(f"{root}/train and {root}/test have different class folders")
    count = sum(len(v[1]) for v in listing.values())
    total_size = sum(v[3] for v in listing.values())
    # Key by folder, file count and total size: a changed copy gets a fresh cache entry.
    key = hashlib.sha256(f"{root}|{count}|{total_size}".encode()).hexdigest()[:16]
    cache = (cache_dir or default_cache_dir()) / f"imagefolder-{key}.pt"
    if cache.exists():
        return torch.load(cache, weights_only=True)
    out: dict = {"classes": listing["train"][0]}
    suffixes = {os.path.splitext(f)[1].lower() for v in listing.values() for f in v[1]}
    out["jpeg"] = bool(suffixes) and suffixes <= {".jpg", ".jpeg"}  # lossy re-encoding
    for split, (_, files, labels, _) in listing.items():
        if not files:
            raise FileNotFoundError(f"no image files under {root / split}")
        out[f"{split}_x"] = _decode_images(files, f"decoding {root.name}/{split}")
        out[f"{split}_y"] = torch.tensor(labels, dtype=torch.int64)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    torch.save(out, tmp)
    tmp.replace(cache)  # atomic, so a killed run never leaves half a cache file
    return out


# ---------------------------------------------------------------- CIFAR


def load_cifar(data_dir: Path, download: bool, seed: int, name: str = "cifar10",
               coarse: bool = False, normalize: str = "dataset",
               train_share: float = 1.0) -> TensorData:
    """CIFAR-10/100 from an image folder or torchvision's pickles (downloaded if asked).

    ``normalize``: how pixels are scaled (see NORMALIZATIONS); "dataset" by default.
    ``train_share``: keep this share of the training images, the same share of every class
    (a CPU-scale run; the test set is kept whole). The images kept are drawn once, from a
    fixed stream independent of the run's seed, so every seed of a study trains on the same
    images, and they are split over clients as the whole set would be.
    """
    _mean_std(name, normalize)  # a wrong value fails before any file is read
    if isinstance(train_share, bool) or not isinstance(train_share, (int, float)) \
            or not 0 < train_share <= 1:
        raise ValueError(f"train_share={train_share!r}: give a share of the training images "
                         "in (0, 1], e.g. 0.2 for a fifth")
    data = _load_cifar(data_dir, download, name, coarse, normalize)
    return data if train_share == 1 else _keep_share(data, float(train_share))


def _keep_share(data: TensorData, share: float) -> TensorData:
    """``data`` with ``share`` of each class's training rows (round(share * n_c), at least
    one), chosen by a fixed permutation, kept in their original order."""
    g = torch.Generator().manual_seed(0)  # fixed: the same images for every run seed
    keep = []
    for c in range(data.num_classes):
        rows = torch.nonzero(data.train_y == c).flatten()
        if len(rows):
            count = max(1, round(share * len(rows)))
            keep.append(rows[torch.randperm(len(rows), generator=g)[:count]])
    rows = torch.cat(keep).sort().values
    return TensorData(data.name, data.train_x[rows], data.train_y[rows], data.test_x,
                      data.test_y, data.num_classes, source=data.source)


def _load_cifar(data_dir: Path, download: bool, name: str, coarse: bool,
                normalize: str) -> TensorData:
    """The whole of CIFAR-10/100 (load_cifar's reading, before any share is taken)."""
    if coarse and name != "cifar100":
        raise ValueError(f"coarse=True exists only for cifar100, not {name}")
    num_classes = 10 if name == "cifar10" else (20 if coarse else 100)
    folder_roots = [data_dir, data_dir / name]
    for root in folder_roots:
        if (root / "train").is_dir() and (root / "test").is_dir():
            if coarse:
                raise ValueError(f"coarse=True needs CIFAR-100's pickles; {root} is an "
                                 "image folder")
            d = load_image_folder(root)
            if len(d["classes"]) != num_classes:
                raise ValueError(f"{root} has {len(d['classes'])} class folders, not {num_classes}")
            xs = [_normalise(d[k], name, normalize) for k in ("train_x", "test_x")]
            # A cache written before "jpeg" was recorded: look at the files again.
            jpeg = d["jpeg"] if "jpeg" in d else all(
                os.path.splitext(f)[1].lower() in (".jpg", ".jpeg")
                for f in _image_files(root / "train")[1])
            return TensorData(name, xs[0], d["train_y"], xs[1], d["test_y"], num_classes,
                              source="a JPEG image folder" if jpeg else "an image folder")
    pickle_dir = data_dir / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
    if not pickle_dir.is_dir() and not download:
        looked = [str(r / s) for r in folder_roots for s in ("train", "test")]
        raise FileNotFoundError(
            f"{name} not found: looked for an image folder ({', '.join(looked)}) and for "
            f"torchvision's pickles ({pickle_dir}). Get it with load_dataset({name!r}, "
            "download=True) (command line: --download), or point data_dir (or $FLNOTES_DATA) at "
            "an ImageFolder copy with train/<class>/*.jpg and test/<class>/*.jpg.")
    import torchvision  # slow to import: only when needed

    cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    splits = []
    for train, (file_name, _) in ((True, cls.train_list[0]), (False, cls.test_list[0])):
        try:
            ds = cls(root=str(data_dir), train=train, download=download)
        except RuntimeError as e:  # torchvision's md5 check failed
            raise RuntimeError(f"{name} pickles in {pickle_dir} are incomplete: {e}") from e
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW uint8
        y = ds.targets
        if coarse:
            # torchvision keeps only fine labels; CIFAR-100's raw pickle ('train' or 'test',
            # one file each) also holds the 20 superclass labels.
            with open(pickle_dir / file_name, "rb") as f:
                y = pickle.load(f, encoding="latin1")["coarse_labels"]
        splits += [_normalise(x, name, normalize), torch.tensor(y, dtype=torch.int64)]
    return TensorData(name, *splits, num_classes)


# ---------------------------------------------------------------- IDX (MNIST family)

# Where Debian's package dataset-fashion-mnist installs the four .gz files.
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
             "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}


def read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes (optionally gzipped) into a uint8 array."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise ValueError(f"cannot read IDX file {path}: {e}") from e
    magic = int.from_bytes(raw[:4], "big")
    # Magic = 0x0000, type 0x08 (ubyte), number of dimensions: 2049 labels, 2051 images.
    if magic != 0x0800 + expected_ndim:
        raise ValueError(f"{path} is not an IDX ubyte file with {expected_ndim} dims: "
                         f"magic {magic:#010x}, expected {0x0800 + expected_ndim:#010x}")
    header = 4 + 4 * expected_ndim
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(expected_ndim)]
    if len(raw) < header or len(raw) - header != int(np.prod(dims)):
        raise ValueError(f"IDX file {path} is truncated or padded: {len(raw) - header} data "
                         f"bytes, dims {dims}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _find_idx_dir(dirs: list[Path]) -> dict[str, Path] | None:
    """Paths of the four IDX files in the first directory holding all of them (raw or .gz)."""
    for d in dirs:
        found = {k: next((p for p in (d / f, d / f"{f}.gz") if p.is_file()), None)
                 for k, f in IDX_FILES.items()}
        if all(found.values()):
            return found
    return None


def load_idx_dataset(data_dir: Path, download: bool, seed: int, name: str = "fashion-mnist",
                     normalize: str = "dataset") -> TensorData:
    """MNIST or Fashion-MNIST from IDX files, via torchvision's download if asked.

    ``normalize``: how pixels are scaled (see NORMALIZATIONS); "dataset" by default.
    """
    _mean_std(name, normalize)  # a wrong value fails before any file is read
    tv_name = "FashionMNIST" if name == "fashion-mnist" else "MNIST"
    dirs = [data_dir, data_dir / tv_name / "raw"]  # the second is torchvision's layout
    chosen = Path(data_dir).expanduser() != default_data_dir()
    if chosen and not download and not Path(data_dir).is_dir():
        # A data_dir given but missing (a typo): never fall back to another copy unasked.
        then = f", then {DEBIAN_FASHION_MNIST}" if name == "fashion-mnist" else ""
        raise FileNotFoundError(f"data_dir {data_dir} does not exist (asked for {name}); "
                                "fix the path, or leave data_dir unset to use the default "
                                f"({default_data_dir()}{then})")
    if name == "fashion-mnist" and not chosen:
        # The system copy only when no data_dir was given: a data_dir named is the one read.
        dirs.append(DEBIAN_FASHION_MNIST)
    files = _find_idx_dir(dirs)
    if files is None and download:
        import torchvision  # lazy: slow to import, only to download MNIST or Fashion-MNIST

        getattr(torchvision.datasets, tv_name)(root=str(data_dir), download=True)
        files = _find_idx_dir(dirs)
    if files is None:
        hint = "apt-get install dataset-fashion-mnist, or " if name == "fashion-mnist" else ""
        raise FileNotFoundError(
            f"{name} IDX files ({', '.join(IDX_FILES.values())}, optionally .gz) not found in "
            f"any of: {', '.join(map(str, dirs))}. Get them with {hint}load_dataset({name!r}, "
            "download=True) (command line: --download), or point data_dir at a folder holding them."
        )
    a = {k: read_idx(p, 3 if k.endswith("_x") else 1) for k, p in files.items()}
    for s in ("train", "test"):
        if len(a[f"{s}_x"]) != len(a[f"{s}_y"]):
            raise ValueError(f"{files[s + '_x']} and {files[s + '_y']} differ in length")
    # copy(): frombuffer arrays are read-only, torch wants writable memory.
    xs = [_normalise(torch.from_numpy(a[k].copy()).unsqueeze(1), name, normalize)
          for k in ("train_x", "test_x")]
    ys = [torch.from_numpy(a[k].astype(np.int64)) for k in ("train_y", "test_y")]
    return TensorData(name, xs[0], ys[0], xs[1], ys[1], 10)
