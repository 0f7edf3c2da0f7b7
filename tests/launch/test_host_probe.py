"""The host probe does not take a GPU host for a CPU host in silence (issue 21): with NVIDIA device files but no
nvidia-smi, torch is still asked; a probe that fails is said in a note the CLI prints. The memory the planner budgets:
the smallest device's, from the same child, and the host's, from /proc/meminfo or a lower cgroup limit."""

import subprocess
import sys

from launcher.facts.host import cuda_devices, host_memory


def test_no_driver_means_no_devices_and_no_torch_probe(tmp_path):
    def probe():
        raise AssertionError("torch must not be asked on a host without NVIDIA's driver")

    assert cuda_devices({"PATH": str(tmp_path)}, dev=tmp_path, probe=probe) == (0, 0, "")


def test_device_files_without_nvidia_smi_still_ask_torch(tmp_path):
    (tmp_path / "nvidia0").touch()
    (tmp_path / "nvidia1").touch()
    assert cuda_devices({"PATH": str(tmp_path)}, dev=tmp_path, probe=lambda: 2) == (2, 0, "")


def test_a_probe_that_fails_on_a_gpu_host_is_said(tmp_path):
    (tmp_path / "nvidia0").touch()

    def probe():  # what a broken CUDA install does: the child exits non-zero
        return subprocess.run([sys.executable, "-c", "raise SystemExit('CUDA driver version is insufficient')"],
                              capture_output=True, text=True, check=True)

    count, _, note = cuda_devices({"PATH": str(tmp_path)}, dev=tmp_path, probe=probe)
    assert count == 0 and "nvidia0" in note and "insufficient" in note and "cluster.device=cuda" in note


def test_cuda_visible_devices_empty_hides_them_all(tmp_path):
    (tmp_path / "nvidia0").touch()
    assert cuda_devices({"CUDA_VISIBLE_DEVICES": "", "PATH": ""}, dev=tmp_path, probe=lambda: 8) == (0, 0, "")


def test_the_child_reports_each_devices_memory_and_the_smallest_is_taken(tmp_path):
    (tmp_path / "nvidia0").touch()
    assert cuda_devices({"PATH": str(tmp_path)}, dev=tmp_path, probe=lambda: (2, (80 << 30, 40 << 30))) == (
        2, 40 << 30, "")
    assert cuda_devices({"PATH": str(tmp_path)}, dev=tmp_path, probe=lambda: 2) == (2, 0, "")  # a count alone
    assert cuda_devices({"PATH": str(tmp_path)}, dev=tmp_path / "none", probe=lambda: (1, (1,))) == (0, 0, "")


MEMINFO = "MemTotal:       24684100 kB\nMemFree:        20004288 kB\nMemAvailable:   23511144 kB\n"


def _files(folder, meminfo=MEMINFO, v2=None, v1=None):
    """(a fake /proc/meminfo, (cgroup v2's memory.max, v1's memory.limit_in_bytes)) in folder; None: no such file."""
    folder.mkdir(exist_ok=True)
    paths = folder / "meminfo", folder / "memory.max", folder / "memory.limit_in_bytes"
    for path, text in zip(paths, (meminfo, v2, v1)):
        if text is not None:
            path.write_text(text)
    return paths[0], paths[1:]


def test_host_memory_is_memtotal_without_a_cgroup_limit(tmp_path):
    meminfo, limits = _files(tmp_path)
    assert host_memory(meminfo, limits) == 24684100 * 1024


def test_a_lower_cgroup_limit_wins(tmp_path):
    meminfo, limits = _files(tmp_path, v2="8589934592\n")
    assert host_memory(meminfo, limits) == 8 << 30
    meminfo, limits = _files(tmp_path / "v1", v1="4294967296\n")
    assert host_memory(meminfo, limits) == 4 << 30
    meminfo, limits = _files(tmp_path / "big", v2="1" + "0" * 12)
    assert host_memory(meminfo, limits) == 24684100 * 1024  # a limit above the RAM: the RAM


def test_no_cgroup_limit_max_or_v1_unlimited(tmp_path):
    meminfo, limits = _files(tmp_path, v2="max\n", v1="9223372036854771712\n")
    assert host_memory(meminfo, limits) == 24684100 * 1024


def test_unreadable_or_odd_files_give_0_without_an_exception(tmp_path):
    missing = tmp_path / "nothing"
    assert host_memory(missing, (missing, missing)) == 0
    assert host_memory(tmp_path, (tmp_path,)) == 0  # a folder: OSError
    meminfo, limits = _files(tmp_path, meminfo="MemFree: 12 kB\nMemTotal: lots kB\n", v2="\xff garbage", v1="")
    assert host_memory(meminfo, limits) == 0
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00MemTotal")
    assert host_memory(tmp_path / "binary", ()) == 0
