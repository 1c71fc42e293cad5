"""The CoMLRL 1.4.x import paths ``comlrl.utils.*`` / ``comlrl.schedulers.*`` are faces: every
name 1.4.3 exported there still imports, is the very object of the module that defines it, and
no face module defines a function or class of its own."""

import importlib
import inspect
import pkgutil

import pytest

import comlrl.schedulers
import comlrl.utils

# 1.4.3's public names per face path (docs: ../shared/spec/api-core.md, section 0) -> the real home
FACES = {
    "comlrl.utils": {
        "read_checkpoint_metadata": "comlrl.checkpoint.layout",
        "build_formatters": "comlrl.rollout.formatters",
        "ensure_pad_token": "comlrl.models.tokenizers",
        "ensure_tokenizer": "comlrl.models.tokenizers",
        "apply_tokenizer_specials": "comlrl.models.tokenizers",
        "resolve_tokenizers": "comlrl.models.tokenizers",
        "infer_model_name": "comlrl.models.sources",
        "resolve_model_sources": "comlrl.models.sources",
        "clone_reference_models": "comlrl.trainers.reference_kl",
        "load_reference_models_from_sources": "comlrl.trainers.reference_kl",
        "reference_kl_coef": "comlrl.trainers.reference_kl",
        "reference_kl_enabled": "comlrl.trainers.reference_kl",
        "reference_kl_for_sequence": "comlrl.trainers.reference_kl",
        "resolve_reference_devices": "comlrl.trainers.reference_kl",
        "validate_reference_kl_config": "comlrl.trainers.reference_kl",
        "RewardProcessors": "comlrl.rollout.reward_processors",
        "call_reward_function": "comlrl.rollout.rewards",
        "normalize_reward_lengths": "comlrl.rollout.rewards",
        "resolve_reward_range": "comlrl.rollout.rewards",
        "set_reward_range": "comlrl.rollout.rewards",
        "DistributedContext": "comlrl.parallel.context",
        "local_context": "comlrl.parallel.context",
        "unwrap_model": "comlrl.parallel.context",
    },
    "comlrl.utils.checkpoint": {
        "read_checkpoint_metadata": "comlrl.checkpoint.layout",
        "TrainingCheckpointMixin": "comlrl.checkpoint.store",
        "capture_rng_state": "comlrl.checkpoint.state",
        "restore_rng_state": "comlrl.checkpoint.state",
    },
    "comlrl.utils.wandb_utils": {"wandb_init_kwargs": "comlrl.telemetry.wandb_sink",
                                 "verbose_from_wandb_config": "comlrl.telemetry.wandb_sink"},
    "comlrl.utils.model_loading": {"resolve_model_kwargs": "comlrl.models.loading", "freeze_model": "comlrl.models.loading",
                                   "infer_model_name": "comlrl.models.sources", "resolve_model_sources": "comlrl.models.sources"},
    "comlrl.utils.reward_processor": {"RewardProcessors": "comlrl.rollout.reward_processors"},
    "comlrl.utils.reward_utils": {"set_reward_range": "comlrl.rollout.rewards",
                                  "normalize_reward_lengths": "comlrl.rollout.rewards"},
    "comlrl.utils.tokenizer_utils": {"apply_tokenizer_specials": "comlrl.models.tokenizers"},
    "comlrl.utils.reference_kl": {"reference_kl_for_sequence": "comlrl.trainers.reference_kl"},
    "comlrl.utils.distributed": {"DistributedContext": "comlrl.parallel.context"},
    "comlrl.schedulers": {"DeviceScheduler": "comlrl.parallel.devices"},
    "comlrl.schedulers.device_scheduler": {"DeviceScheduler": "comlrl.parallel.devices",
                                           "normalize_parallel_training": "comlrl.parallel.devices"},
}


@pytest.mark.parametrize("face, names", sorted(FACES.items()))
def test_every_143_name_imports_from_its_face_and_is_the_real_object(face, names):
    module = importlib.import_module(face)
    for name, home in names.items():
        real = getattr(importlib.import_module(home), name)
        assert getattr(module, name) is real, f"{face}.{name} is not {home}.{name}"
        assert real.__module__ == home, f"{name} is defined in {real.__module__}, expected {home}"


def _face_modules():
    for package in (comlrl.utils, comlrl.schedulers):
        yield package.__name__
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            yield info.name


@pytest.mark.parametrize("face", sorted(_face_modules()))
def test_face_modules_define_nothing_of_their_own(face):
    module = importlib.import_module(face)
    own = [name for name, value in vars(module).items()
           if (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == face]
    assert own == [], f"{face} defines {own}; move them to the layer they belong to and re-export them"
    assert getattr(module, "__all__", None), f"{face} has no __all__"
    for name in module.__all__:
        assert hasattr(module, name), f"{face}.__all__ names {name!r}, which it does not have"
