"""GGUF files as a model source: `model: path/to/file.gguf`, or a folder holding one `.gguf` file
and no config.json (docs/model-format.md, "GGUF files").

transformers reads the file with its GGUF support: the config and the tokenizer from the file's
metadata, every tensor dequantised to float32 (`GgufConfig(dequantize=True)`: a plain Hugging Face
model, no quantizer state left on it), Llama's permuted q/k rows put back.  That model is wrapped as
a Hugging Face directory's is (loading.load_transformers, the bridge boot_transformers builds), and
the tokenizer the file describes is put on the bridge.  transformers is pointed at an empty folder
and the file's absolute path, so nothing but the .gguf file is read.

The file's header (metadata and tensor table, not the weights) is read here with the standard library
(`read_header`: ~0.05 s where the gguf package's GGUFReader takes ~5 s on a 49k-token vocabulary), so
`harness validate` gets the layers and heads (`shape`) fast and without torch.  Loading needs the gguf
package (`pip install 'harness[gguf]'`); the evidence records the file's sha256 (`file_hash`: exactly
the bytes of the .gguf file) and its quantisation (`quantization`: the file type and the tensor types).
"""

from __future__ import annotations

import functools
import hashlib
import math
import mmap
import os
import re
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from ..spec.names import Shape
from . import families
from .devices import resolve_device
from .hf_loader import load_transformers, offline
from .loaded import LoadedModel
from .model_dir import CONFIG, hash_file
from .tensors import one_line, physical_memory

SUFFIX = ".gguf"
EXTRA = "pip install 'harness[gguf]'"
MAGIC = b"GGUF"
# metadata value types (GGUF spec): fixed-size scalars, and the two of variable size
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_SMALL_ARRAY = 4096  # numeric arrays up to this length are kept (per-layer head counts); longer ones skipped
# GGUF architecture names transformers spells otherwise (modeling_gguf_pytorch_utils.load_gguf_checkpoint)
_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}


@dataclass(frozen=True)
class Header:
    """What a GGUF file says about itself, without its tensor data."""

    architecture: str  # general.architecture, e.g. "llama"
    metadata: dict[str, Any]  # scalars, strings, numeric arrays up to _SMALL_ARRAY long; other arrays: their length
    tensors: tuple[tuple[str, int, int], ...]  # (name, ggml type id, elements), in file order

    def get(self, key: str) -> Any:
        """`ARCHITECTURE.key` of the metadata (e.g. `block_count`), or None."""
        return self.metadata.get(f"{self.architecture}.{key}")


def is_named(path: Path) -> bool:
    """Whether `path` names a GGUF file by its suffix (and is not a directory)."""
    return path.name.lower().endswith(SUFFIX) and not path.is_dir()


def folder_files(folder: Path) -> list[Path]:
    """The .gguf files directly in `folder` (none when it holds config.json: a Hugging Face directory)."""
    try:
        if not folder.is_dir() or (folder / CONFIG).exists():
            return []
        return sorted(f for f in folder.iterdir() if f.name.lower().endswith(SUFFIX) and f.is_file())
    except OSError:  # unreadable: the directory loader says why
        return []


def is_gguf(path: Path) -> bool:
    """Whether `path` is a GGUF model: a .gguf file (present or not), or a folder without config.json
    holding .gguf files."""
    return is_named(path) or bool(folder_files(path))


def single_file(folder: Path) -> Path | None:
    """The one .gguf file of a folder without config.json, else None (ModelRef.parse: the folder is that file)."""
    found = folder_files(folder)
    return found[0] if len(found) == 1 else None


def find_file(path: Path) -> Path:
    """The GGUF file `path` names (the file, or the one .gguf file of a folder); ModelLoadError, one line, otherwise."""
    if path.is_dir():
        found = folder_files(path)
        if len(found) != 1:
            names = ", ".join(f.name for f in found) or "none"
            raise ModelLoadError(f"{path} holds {len(found)} .gguf files ({names}): a folder without config.json "
                                 "loads when it holds exactly one; name the file to load (FOLDER/NAME.gguf)")
        return found[0]
    if not path.exists():
        raise ModelLoadError(f"model file {path} does not exist")
    if not path.is_file():
        raise ModelLoadError(f"model path {path} is not a file")
    return path


class _Cursor:
    """Little-endian reads from a buffer; ModelLoadError (`file` is truncated) past its end."""

    def __init__(self, data: Any, file: Path):
        self.data, self.file, self.pos, self.size = data, file, 0, len(data)

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        end = self.pos + struct.calcsize(fmt)
        if end > self.size:
            raise ModelLoadError(f"{self.file}: not a complete GGUF file (its header ends early at byte {self.size})")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos = end
        return values

    def skip(self, n: int) -> None:
        if n > self.size - self.pos:
            raise ModelLoadError(f"{self.file}: not a complete GGUF file (its header ends early at byte {self.size})")
        self.pos += n

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        start = self.pos
        self.skip(n)
        return bytes(self.data[start:self.pos]).decode("utf-8", "replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALAR:
            return self.unpack(_SCALAR[kind])[0]
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ModelLoadError(f"{self.file}: metadata value of unknown type {kind} at byte {self.pos}")
        element, count = self.unpack("<IQ")
        if element in _SCALAR:
            width = struct.calcsize(_SCALAR[element])
            if count <= _SMALL_ARRAY:
                return list(self.unpack(f"<{count}{_SCALAR[element][1]}"))
            self.skip(count * width)
            return count
        if count > self.size - self.pos:  # every element takes at least a byte
            raise ModelLoadError(f"{self.file}: not a complete GGUF file (its header ends early at byte {self.size})")
        if element == _STRING:  # a vocabulary or merge table: walk it, keep its length
            for _ in range(count):
                (n,) = self.unpack("<Q")
                self.skip(n)
            return count
        for _ in range(count):
            self.value(element)
        return count


def read_header(file: Path) -> Header:
    """The metadata and tensor table of GGUF `file` (versions 2 and 3), read without its tensor data;
    ModelLoadError (one line naming the file) when it is not a readable GGUF file."""
    try:
        with open(file, "rb") as stream:
            if os.fstat(stream.fileno()).st_size < 24:
                raise ModelLoadError(f"{file}: not a GGUF file (shorter than a GGUF header)")
            with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(_Cursor(data, file))
    except OSError as exc:
        raise ModelLoadError(f"{file}: cannot read: {exc.strerror or exc}") from None


def _parse(c: _Cursor) -> Header:
    if bytes(c.data[:4]) != MAGIC:
        raise ModelLoadError(f"{c.file}: not a GGUF file (it does not start with the bytes 'GGUF')")
    c.pos = 4
    version, n_tensors, n_values = c.unpack("<IQQ")
    if version not in (2, 3):
        raise ModelLoadError(f"{c.file}: GGUF version {version}; versions 2 and 3 (little-endian) are read")
    metadata: dict[str, Any] = {}
    for _ in range(min(n_values, c.size)):
        key = c.string()
        metadata[key] = c.value(c.unpack("<I")[0])
    tensors = []
    for _ in range(min(n_tensors, c.size)):
        name = c.string()
        (n_dims,) = c.unpack("<I")
        if n_dims > 8:
            raise ModelLoadError(f"{c.file}: tensor {name} has {n_dims} dimensions (GGUF tensors have at most 4)")
        dims = c.unpack(f"<{n_dims}Q")
        kind, _offset = c.unpack("<IQ")
        tensors.append((name, int(kind), math.prod(dims)))
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise ModelLoadError(f"{c.file}: the GGUF metadata has no general.architecture")
    return Header(architecture, metadata, tuple(tensors))


def _count(value: Any) -> int | None:
    """A positive layer or head count from the metadata (a per-layer list: when all layers agree)."""
    if isinstance(value, list) and value and all(v == value[0] for v in value):
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def shape(path: Path) -> Shape | None:
    """Layers and heads from the GGUF metadata (`ARCH.block_count`, `ARCH.attention.head_count`), without
    torch or the weights; None when they cannot be read (loading says why)."""
    header = read_header(find_file(path))
    n_layers, n_heads = _count(header.get("block_count")), _count(header.get("attention.head_count"))
    return Shape(n_layers, n_heads, True) if n_layers is not None and n_heads is not None else None


def file_hash(file: Path) -> str:
    """sha256 of the file's bytes (what `sha256sum FILE` prints)."""
    h = hashlib.sha256()
    hash_file(h, file)
    return h.hexdigest()


def quantization(header: Header) -> dict[str, str]:
    """`tensor_types`: the ggml types of the file's tensors, most elements first (`"Q4_1, Q8_0, F32"`);
    `file_type`: the file type its metadata states (`general.file_type`, as llama.cpp names it: `"Q4_K_M"`),
    when it states one.  Names from the gguf package."""
    import gguf

    def name(enum: Any, value: int) -> str:
        try:
            return str(enum(value).name)
        except ValueError:
            return str(value)

    counts: dict[str, int] = {}
    for _, kind, n in header.tensors:
        t = name(gguf.GGMLQuantizationType, kind)
        counts[t] = counts.get(t, 0) + n
    out = {"tensor_types": ", ".join(sorted(counts, key=lambda t: (-counts[t], t)))}
    file_type = header.metadata.get("general.file_type")
    if isinstance(file_type, int) and file_type != int(gguf.LlamaFileType.GUESSED):
        out["file_type"] = re.sub(r"^(MOSTLY|ALL)_", "", name(gguf.LlamaFileType, file_type))
    return out


def _require_package(file: Path) -> None:
    """ModelLoadError naming the extra when the gguf package (>= 0.10, what transformers needs) is missing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        import gguf  # noqa: F401

        found = version("gguf")
    except ImportError:
        found = None
    except PackageNotFoundError:  # imported from a source tree: trust it
        return
    numbers = tuple(int(n) for n in re.findall(r"\d+", found or "")[:2])
    if found is None or numbers < (0, 10):
        have = f" (found {found})" if found else ""
        raise ModelLoadError(f"model {file}: reading GGUF files needs the gguf package >= 0.10{have}: {EXTRA}")


def _check_architecture(file: Path, header: Header) -> None:
    """ModelLoadError when transformers cannot read this GGUF architecture."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    readable = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}
    try:
        from transformers.integrations.gguf import GGUF_ARCHS

        readable |= set(GGUF_ARCHS)
    except ImportError:  # transformers before its GGUF quantizer
        pass
    arch = header.architecture
    if arch not in readable and _ALIASES.get(arch, arch) not in readable:
        import transformers

        raise ModelLoadError(f"{file}: GGUF architecture {arch!r} cannot be read by transformers "
                             f"{transformers.__version__} (it reads {', '.join(sorted(readable))})")


def _check_family(file: Path, header: Header) -> None:
    """ModelLoadError when no model family harness supports writes this GGUF architecture (model.families)."""
    if families.of_gguf(header.architecture) is None:
        raise ModelLoadError(f"{file}: GGUF architecture {header.architecture!r} is not one harness supports; it "
                             f"supports {', '.join(families.supported_gguf())} (a family is added as in "
                             "docs/architecture.md)")


def _check_size(file: Path, header: Header, dtype: Any) -> None:
    """ModelLoadError when the metadata's layer count disagrees with the tensors, or the dequantised
    weights and the file would not fit in this machine's memory."""
    import torch

    blocks = {int(m.group(1)) for name, _, _ in header.tensors if (m := re.match(r"blk\.(\d+)\.", name))}
    n_layers = _count(header.get("block_count"))
    if blocks and n_layers != max(blocks) + 1:
        raise ModelLoadError(f"{file}: {header.architecture}.block_count is {header.get('block_count')!r}, but its "
                             f"tensors are for {max(blocks) + 1} layers (blk.0 … blk.{max(blocks)})")
    itemsize = torch.empty((), dtype=dtype or torch.float32).element_size()
    need = file.stat().st_size + sum(n for _, _, n in header.tensors) * itemsize
    total = physical_memory()
    if total is not None and need > total:
        raise ModelLoadError(f"{file}: loading needs about {need / 2**30:,.1f} GiB (the file and its weights "
                             f"dequantised), more than this machine's {total / 2**30:,.1f} GiB of memory")


@contextmanager
def _parsed_once() -> Iterator[None]:
    """While transformers reads one GGUF file: the gguf package's GGUFReader built once per file
    (transformers parses the whole file for the config, again for the weights and again for the
    tokenizer), its tensor-name map built once (transformers builds one for each of the model's modules,
    400 for a 30-layer Llama), no progress bar.  Both are read-only there; the same weights load
    (tests/test_gguf.py), in a fifth of the time."""
    import gguf
    import transformers.modeling_gguf_pytorch_utils as legacy

    saved: dict[str, Any] = {"GGUFReader": gguf.GGUFReader, "get_tensor_name_map": gguf.get_tensor_name_map}
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = saved["GGUFReader"](path, mode)
        return readers[key]

    bar = getattr(legacy, "tqdm", None)
    setattr(gguf, "GGUFReader", reader)  # noqa: B010
    setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(saved["get_tensor_name_map"]))  # noqa: B010
    if bar is not None:
        setattr(legacy, "tqdm", lambda items, *args, **kwargs: items)  # noqa: B010
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(gguf, name, value)
        if bar is not None:
            setattr(legacy, "tqdm", bar)  # noqa: B010
        readers.clear()


def _tokenizer(empty: str, file: Path, header: Header) -> Any:
    """The tokenizer the file's metadata describes (transformers: AutoTokenizer with `gguf_file`), or None
    when it describes none."""
    if "tokenizer.ggml.model" not in header.metadata:
        return None
    from transformers import AutoTokenizer

    try:
        with offline():
            return AutoTokenizer.from_pretrained(empty, gguf_file=str(file), local_files_only=True)
    except Exception as exc:  # transformers raises many types for metadata it cannot build a tokenizer from
        raise ModelLoadError(f"{file}: cannot build the tokenizer its metadata describes: {one_line(exc)}") from None


def load(path: Path, dtype: Any = None, device: str | None = None) -> LoadedModel:
    """The GGUF model `path` names (a .gguf file, or a folder holding one and no config.json) onto `device`
    (devices.resolve_device), in `dtype` (default float32), with its tokenizer; kind "gguf", source the
    file, sha256 of the file, its quantisation recorded.  ModelLoadError, one line, for every problem."""
    file = find_file(Path(path)).resolve()
    header = read_header(file)
    _require_package(file)
    _check_architecture(file, header)
    _check_family(file, header)
    _check_size(file, header, dtype)
    device = resolve_device(device)
    digest = file_hash(file)
    with tempfile.TemporaryDirectory(prefix="harness-gguf-") as empty, _parsed_once():
        try:
            bridge = load_transformers(empty, dtype, device, gguf_file=str(file), shown=f"GGUF file {file}")
        except ModelLoadError:
            raise
        except Exception as exc:  # transformers' GGUF reader raises many types for a file it cannot read
            raise ModelLoadError(f"cannot load GGUF file {file}: {type(exc).__name__}: {one_line(exc)}") from None
        bridge.tokenizer = _tokenizer(empty, file, header)
    bridge.cfg.model_name = str(file)
    return LoadedModel(bridge, str(file), "gguf", digest, quantization=quantization(header))
