"""The runtime banner: quick on a CPU and in CI, the stored sweeps' configuration on a GPU."""

from __future__ import annotations

import torch

from relbias.book.runtime import CPU_REASON, GPU_CONFIG, choose_config, runtime_banner


def test_configuration_by_device_ci_and_environment(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("RELBIAS_CONFIG", raising=False)
    assert choose_config(cpu) == ("quick", CPU_REASON)
    assert choose_config(cuda) == (GPU_CONFIG, "on a GPU: the stored sweeps' configuration")
    assert GPU_CONFIG == "medium"
    monkeypatch.setenv("RELBIAS_CONFIG", "full")
    assert choose_config(cuda) == ("full", "RELBIAS_CONFIG")
    monkeypatch.setenv("CI", "1")  # CI: quick, whatever else is set, in a CPU's words
    assert choose_config(cuda) == ("quick", CPU_REASON)
    assert choose_config(cpu) == ("quick", CPU_REASON)
    assert choose_config(cuda, "medium") == ("medium", "asked for")


def test_the_banner_says_what_ran_and_why(monkeypatch, capsys):
    monkeypatch.setenv("CI", "1")
    rt = runtime_banner()
    out = capsys.readouterr().out.splitlines()
    assert rt.quick and rt.device.type == "cpu"
    assert out[0].endswith("device: CPU | configuration: quick (train_len=64, 1000 steps)")
    assert out[1] == f"(why this configuration: {CPU_REASON})"
