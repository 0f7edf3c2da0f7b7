"""A checkpoint's file manifest: every file with its bytes and CRC-32; what a missing, truncated, grown or changed
file reads as; and how the ranks share the checksumming."""

import zlib

from launcher.manifest import crc32, file_record, list_files, manifest_problems, share_of


def _folder(root):
    (root / "model").mkdir(parents=True)
    (root / "model" / "__0_0.distcp").write_bytes(b"a" * 1000)
    (root / "trainer.0.pt").write_bytes(b"b" * 10)
    (root / "checkpoint.json").write_text("{}")
    return {rel: file_record(root / rel) for rel in list_files(root, skip=("checkpoint.json",))}


def test_the_manifest_lists_every_file_but_the_skipped_with_its_size_and_crc32(tmp_path):
    files = _folder(tmp_path)
    assert sorted(files) == ["model/__0_0.distcp", "trainer.0.pt"]
    assert files["model/__0_0.distcp"] == {"bytes": 1000, "crc32": f"{zlib.crc32(b'a' * 1000):08x}"}
    assert manifest_problems(tmp_path, files) == []


def test_crc32_streams_a_file_larger_than_its_chunk(tmp_path, monkeypatch):
    import launcher.manifest as manifest

    data = bytes(range(256)) * 100
    (tmp_path / "f").write_bytes(data)
    monkeypatch.setattr(manifest, "CHUNK", 1000)
    assert crc32(tmp_path / "f") == f"{zlib.crc32(data):08x}"


def test_missing_truncated_grown_changed_and_malformed_files_are_each_named(tmp_path):
    files = _folder(tmp_path)
    files["tables/__0_0.distcp"] = {"bytes": 5, "crc32": "00000000"}  # never written
    files["odd"] = {"bytes": "5"}
    with open(tmp_path / "model" / "__0_0.distcp", "r+b") as f:
        f.truncate(400)
    (tmp_path / "trainer.0.pt").write_bytes(b"c" * 10)  # same size, other bytes
    problems = manifest_problems(tmp_path, files)
    assert problems == [
        "model/__0_0.distcp is truncated: 1000 bytes expected, 400 found",
        "odd: its record in the manifest is malformed ({'bytes': '5'})",
        "tables/__0_0.distcp is missing (5 bytes expected)",
        f"trainer.0.pt has changed: the size is right (10 bytes) but its CRC-32 is {zlib.crc32(b'c' * 10):08x}, "
        f"{files['trainer.0.pt']['crc32']} expected",
    ]
    (tmp_path / "trainer.0.pt").write_bytes(b"c" * 11)
    assert "trainer.0.pt is grown: 10 bytes expected, 11 found" in manifest_problems(tmp_path, files)


def test_each_file_is_checksummed_once_by_a_rank_that_sees_it():
    every = ["a", "b", "c", "d", "e"]
    shares = [share_of([every, every], r) for r in (0, 1)]
    assert sorted(shares[0] + shares[1]) == every and shares[0] and shares[1]  # spread over both
    alone = [share_of([["a"], ["a", "only1"]], r) for r in (0, 1)]  # not every rank sees every file (one host each)
    assert "only1" in alone[1] and sorted(alone[0] + alone[1]) == ["a", "only1"]
