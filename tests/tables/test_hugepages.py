"""Host tables moved onto transparent huge pages (launcher/tables/hugepages.py): the pages under a table change, its
values and its training do not; the plan says what the host allows."""

from __future__ import annotations

import contextlib
import ctypes
import mmap

import pytest
import torch
from torch import nn

from launcher import native
from launcher.plan import TablePlan
from launcher.procfs import huge_pages_mode
from launcher.tables import build_tables, hugepages
from launcher.tables.partition import RowPartition

MODE = huge_pages_mode()
ROWS, DIM = 1 << 16, 64  # 16 MiB of fp32: whole huge pages inside it wherever it lands


def _fields(start: int, end: int, name: str) -> list[list[str]]:
    """The values of /proc/self/smaps field ``name`` (e.g. AnonHugePages:) of this process's mappings that overlap
    [start, end)."""
    out, inside = [], False
    with open("/proc/self/smaps") as f:
        for line in f:
            head, *rest = line.split()
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < end and hi > start
            elif inside and head == name:
                out.append(rest)
    return out


def _huge_kib(start: int, end: int) -> int:
    """AnonHugePages (KiB) of this process's mappings that overlap [start, end)."""
    return sum(int(kib) for kib, *_ in _fields(start, end, "AnonHugePages:"))


def _advised(start: int, end: int) -> bool:
    """A mapping of this process inside [start, end) is advised MADV_HUGEPAGE (VmFlags hg): the whole huge pages of
    the block, split off as a mapping of their own."""
    return any("hg" in flags for flags in _fields(start, end, "VmFlags:"))


def _resident_advised_kib(start: int, end: int) -> int:
    """Rss (KiB) of the advised mappings inside [start, end): the block's whole huge pages, already in memory."""
    rss, flags = _fields(start, end, "Rss:"), _fields(start, end, "VmFlags:")
    return sum(int(kib) for (kib, *_), f in zip(rss, flags) if "hg" in f)


def _fallbacks() -> int:
    """Huge-page faults the kernel served with small pages (no free huge page, or a cgroup's limit), machine-wide."""
    with open("/proc/vmstat") as f:
        return sum(int(v) for k, v in (line.split() for line in f) if k.startswith("thp_fault_fallback"))


def _kernel_grants_huge_now() -> bool:
    """A control: an anonymous 8 MiB mapping advised MADV_HUGEPAGE and written gets a huge page now. Under a loaded
    machine's memory the kernel can serve such faults with small pages without counting a fallback."""
    with contextlib.closing(mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)) as area:
        area.madvise(mmap.MADV_HUGEPAGE)
        area.write(b"\1" * len(area))
        view = ctypes.c_char.from_buffer(area)
        start = ctypes.addressof(view)
        del view  # the mapping cannot close while a view of it is held
        return _huge_kib(start, start + len(area)) > 0


def test_the_setting_is_read_from_the_kernel_file(tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert huge_pages_mode(setting) == "madvise"
    setting.write_text("[never] madvise always\n")
    assert huge_pages_mode(setting) == "never"
    assert huge_pages_mode(tmp_path / "missing") == ""


def test_spans_are_the_whole_huge_pages_inside_each_table():
    table = torch.empty(ROWS, DIM)
    (start, length), = hugepages.spans([table])
    begin, end = table.data_ptr(), table.data_ptr() + table.numel() * 4
    assert start % hugepages.HUGE == 0 and length % hugepages.HUGE == 0
    assert begin <= start and start + length <= end and length >= end - begin - 2 * hugepages.HUGE
    assert hugepages.spans([torch.empty(100, DIM), torch.empty(ROWS, DIM, device="meta")]) == []


def test_turned_off_it_leaves_the_tables_alone(monkeypatch):
    monkeypatch.setenv(native.PAGES_ENV, "0")
    assert hugepages.back({"t": ("host", torch.empty(ROWS, DIM), [])}) is None
    assert native.pages_choice() == f"tables on 4 KiB pages ({native.PAGES_ENV}=0)"


@pytest.mark.skipif(MODE not in ("always", "madvise"),
                    reason=f"this kernel's transparent huge pages are {MODE or 'missing'}: nothing to move onto")
def test_a_store_s_tables_move_onto_huge_pages_and_train_as_before(monkeypatch):
    monkeypatch.setenv(native.PAGES_ENV, "1")
    assert "transparent huge pages in the background" in native.pages_choice()
    torch.manual_seed(0)
    models = [nn.Sequential(nn.EmbeddingBag(ROWS, DIM, mode="sum")) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    plan = (TablePlan("0", ROWS, DIM, "host", "rowwise_adagrad", 0.1, (0.9, 0.999), 1e-8, 0.0, 0.0, -0.5, 0.1),)
    monkeypatch.setenv(native.PAGES_ENV, "0")
    plain = build_tables([models[0]], plan, torch.device("cpu"), torch.float32)
    monkeypatch.setenv(native.PAGES_ENV, "1")
    huge = build_tables([models[1]], plan, torch.device("cpu"), torch.float32)
    assert plain.huge_pages is None and huge.huge_pages is not None
    before = plain.tables["0"].weight.clone()
    moved = huge.huge_pages.wait(timeout=60)
    if moved == 0:
        pytest.skip(f"the kernel collapsed no page ({huge.huge_pages.error}: MADV_COLLAPSE needs Linux 6.1)")
    weight = huge.tables["0"].weight
    assert torch.equal(weight, before)  # the pages changed, not the values
    assert _huge_kib(weight.data_ptr(), weight.data_ptr() + weight.numel() * 4) * 1024 >= moved
    assert moved == huge.huge_pages.bytes >= weight.numel() * 4 - 2 * hugepages.HUGE
    mib = moved >> 20
    assert huge.huge_pages.words() == f"host tables on huge pages: {mib:,} of {mib:,} MiB"
    ids = torch.randint(0, ROWS, (256, 3), generator=torch.Generator().manual_seed(1))
    for step in range(3):
        for model, store in ((models[0], plain), (models[1], huge)):
            model(ids[:, step:step + 1]).square().sum().backward()
            store.collect()
            store.step()
    assert torch.equal(plain.tables["0"].weight, huge.tables["0"].weight)


@pytest.mark.skipif(MODE not in ("always", "madvise"), reason=f"transparent huge pages are {MODE or 'absent'} here")
def test_a_fresh_block_glibc_maps_comes_on_huge_pages_when_written(monkeypatch):
    """hugepages.fresh: a buffer of 32 MiB or more (glibc maps it afresh at each allocation) is advised before its
    first write, so its pages fault in huge; a smaller one (glibc's heap keeps and reuses it) is left alone."""
    monkeypatch.delenv(native.PAGES_ENV, raising=False)
    big = hugepages.fresh(torch.empty(hugepages.MAPPED_ALWAYS // 4 + 1024))
    start, fallbacks = big.data_ptr(), _fallbacks()
    assert _advised(start, start + big.numel() * 4)
    if _resident_advised_kib(start, start + big.numel() * 4) > 0:  # advice comes too late for pages already there
        pytest.skip("glibc served the block from memory its heap already had (its pages in memory before the first "
                    "write), not from a fresh mapping: a long-lived process's free top chunk can hold 32 MiB")
    big.fill_(1.0)
    if _huge_kib(start, start + big.numel() * 4) == 0 and _fallbacks() > fallbacks:  # advised; none to be had
        pytest.skip(f"the kernel had no free huge page for the advised block (thp_fault_fallback rose by "
                    f"{_fallbacks() - fallbacks} while it was written): memory too fragmented now")
    if _huge_kib(start, start + big.numel() * 4) == 0 and not _kernel_grants_huge_now():
        pytest.skip("the kernel gave no huge page to the advised block, nor to a plain mapping advised the same way "
                    "right after (no fallback counted): none to be had on this loaded machine now")
    assert _huge_kib(start, start + big.numel() * 4) > 0
    assert bool((big == 1.0).all())
    small = torch.empty(1 << 20)
    assert hugepages.fresh(small) is small


@pytest.mark.skipif(MODE not in ("always", "madvise"), reason=f"transparent huge pages are {MODE or 'absent'} here")
def test_an_optimizer_state_is_filled_onto_huge_pages(monkeypatch):
    """hugepages.full (a table's optimizer state): advised before it is filled, it comes on huge pages at once, with
    the values torch.full gives; the background collapse has no copy of it to make."""
    monkeypatch.delenv(native.PAGES_ENV, raising=False)
    like = torch.empty(1, DIM)
    state = hugepages.full((4 * ROWS, 2, DIM), 0.5, like)
    assert torch.equal(state, torch.full((4 * ROWS, 2, DIM), 0.5))
    start = state.data_ptr()
    assert _huge_kib(start, start + state.numel() * 4) > 0


@pytest.mark.skipif(MODE not in ("always", "madvise"), reason=f"transparent huge pages are {MODE or 'absent'} here")
def test_a_table_the_model_builds_is_born_on_huge_pages(monkeypatch):
    """hugepages.born_huge around a model's construction: the nn.EmbeddingBag weight of a host table's shape comes on
    huge pages as it is initialised (no collapse to wait for), with the values the same seed gives without it; a
    weight of another shape is left alone; HL_TABLE_HUGEPAGES=0 turns it off."""
    monkeypatch.delenv(native.PAGES_ENV, raising=False)
    torch.manual_seed(0)
    with hugepages.born_huge({(4 * ROWS, DIM)}):
        table, other = nn.EmbeddingBag(4 * ROWS, DIM), nn.EmbeddingBag(8 * ROWS, DIM)
    torch.manual_seed(0)
    plain = nn.EmbeddingBag(4 * ROWS, DIM)
    assert torch.equal(table.weight, plain.weight)
    start = table.weight.data_ptr()
    assert _huge_kib(start, start + table.weight.numel() * 4) > 0
    start = other.weight.data_ptr()
    if MODE == "madvise":  # ("always" gives any large mapping huge pages)
        assert _huge_kib(start, start + other.weight.numel() * 4) == 0
    monkeypatch.setenv(native.PAGES_ENV, "0")
    assert isinstance(hugepages.born_huge({(4 * ROWS, DIM)}), contextlib.nullcontext)


@pytest.mark.skipif(MODE not in ("always", "madvise"), reason=f"transparent huge pages are {MODE or 'absent'} here")
def test_a_split_table_s_block_is_born_on_huge_pages(monkeypatch):
    """A rank's block of a split table (RowPartition.block_of: a copy out of the whole one) comes on huge pages as it
    is copied, with the whole table's rows."""
    monkeypatch.delenv(native.PAGES_ENV, raising=False)
    whole = torch.randn(8 * ROWS, DIM)
    block = RowPartition(8 * ROWS, 2).block_of(whole, 1)
    assert torch.equal(block, whole[4 * ROWS:])
    start = block.data_ptr()
    assert _huge_kib(start, start + block.numel() * 4) > 0
