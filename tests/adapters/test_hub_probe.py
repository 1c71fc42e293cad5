"""Without a network, the hub is probed once and the process goes offline at once (no retries)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

import comlrl.adapters.hub as hub


@pytest.fixture
def fresh(monkeypatch):
    """A process that has not probed yet, with every offline switch restored after the test."""
    monkeypatch.setattr(hub, "_probed", {})
    for name in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    return hub


def refused(address, timeout):
    raise OSError("Temporary failure in name resolution")


def test_an_unreachable_hub_switches_the_libraries_offline_once(fresh):
    said, calls = [], []

    def counting(address, timeout):
        calls.append(address)
        return refused(address, timeout)

    assert fresh.go_offline_if_unreachable(log=said.append, connect=counting) is True
    assert fresh.go_offline_if_unreachable(log=said.append, connect=counting) is True
    assert len(calls) == 1 and len(said) == 1  # probed and said once per process
    assert "huggingface.co:443" in said[0] and "HF_HUB_OFFLINE=1" in said[0]
    import datasets.config
    import huggingface_hub.constants

    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["HF_DATASETS_OFFLINE"] == "1"
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True and datasets.config.HF_HUB_OFFLINE is True


def test_a_probe_that_hangs_gives_up_at_its_timeout(fresh):
    release = threading.Event()

    def hanging(address, timeout):  # a name resolution that never answers
        release.wait(5)
        raise OSError("timed out")

    assert fresh.go_offline_if_unreachable(connect=hanging, timeout=0.2) is True
    probe = [thread for thread in threading.enumerate() if thread.name == "comlrl-hub-probe"]
    assert probe and probe[0].is_alive()  # it returned while the connection attempt still hangs
    release.set()


def test_a_reachable_hub_changes_nothing(fresh):
    class Socket:
        def close(self):
            pass

    assert fresh.go_offline_if_unreachable(connect=lambda address, timeout: Socket()) is False
    assert "HF_HUB_OFFLINE" not in os.environ


def test_the_users_own_offline_mode_skips_the_probe(fresh, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert fresh.go_offline_if_unreachable(connect=lambda *a, **k: pytest.fail("probed")) is True


def test_the_endpoint_follows_hf_endpoint(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example:8080")
    assert hub.hub_address() == ("mirror.example", 8080)


def test_comlrl_train_without_a_network_fails_with_the_clear_error_without_retries(fresh, monkeypatch, tmp_path, chat_models, capsys):
    """The real dataset on an unreachable hub: one probe, then the libraries' offline error at once."""
    from comlrl.cli.main import main

    lookups = []

    def no_network(*args, **kwargs):  # every later request would resolve the hub's name first: count them
        lookups.append(args[0] if args else None)
        raise OSError("Temporary failure in name resolution")

    monkeypatch.setattr(hub.socket, "create_connection", refused)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    code = main(["train", "--config", "magrpo_tldr_config.yaml", "--output-dir", str(tmp_path / "run"),
                 "--override", f"agent_model.name={chat_models['llama']}"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot be reached" in err and "working offline" in err
    assert "--offline" in err and "allow_sample_fallback" in err and "OfflineModeIsEnabled" in err and "Traceback" not in err
    assert lookups == []  # after the probe nothing tried the network: no retries
