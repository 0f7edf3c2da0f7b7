"""The host probe does not take a GPU host for a CPU host in silence (issue 21): with NVIDIA device files but no
nvidia-smi, torch is still asked; a probe that fails is said in a note the CLI prints."""

import subprocess
import sys

from launcher.launch.host import count_cuda_devices


def test_no_driver_means_no_devices_and_no_torch_probe(tmp_path):
    def probe():
        raise AssertionError("torch must not be asked on a host without NVIDIA's driver")

    assert count_cuda_devices({"PATH": str(tmp_path)}, dev=tmp_path, probe=probe) == (0, "")


def test_device_files_without_nvidia_smi_still_ask_torch(tmp_path):
    (tmp_path / "nvidia0").touch()
    (tmp_path / "nvidia1").touch()
    assert count_cuda_devices({"PATH": str(tmp_path)}, dev=tmp_path, probe=lambda: 2) == (2, "")


def test_a_probe_that_fails_on_a_gpu_host_is_said(tmp_path):
    (tmp_path / "nvidia0").touch()

    def probe():  # what a broken CUDA install does: the child exits non-zero
        return subprocess.run([sys.executable, "-c", "raise SystemExit('CUDA driver version is insufficient')"],
                              capture_output=True, text=True, check=True)

    count, note = count_cuda_devices({"PATH": str(tmp_path)}, dev=tmp_path, probe=probe)
    assert count == 0 and "nvidia0" in note and "insufficient" in note and "cluster.device=cuda" in note


def test_cuda_visible_devices_empty_hides_them_all(tmp_path):
    (tmp_path / "nvidia0").touch()
    assert count_cuda_devices({"CUDA_VISIBLE_DEVICES": "", "PATH": ""}, dev=tmp_path, probe=lambda: 8) == (0, "")
