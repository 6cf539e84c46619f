"""KV caches committed at load (specdec-serve --preallocate_kv): their pages are mapped before any request."""


from specdec.runtime import kv_cache
from specdec.runtime.kv_cache import KVCache, commit_host_caches

MB = 2**20


def release_pages(buf) -> None:
    """Hand ``buf``'s whole pages back to the OS (madvise DONTNEED: they read as zeros again and are mapped on the next
    write), as a fresh np.zeros leaves them. In a long test process numpy's zeros may come from reused heap memory that
    calloc has already written, so the state a server starts from is made here rather than assumed."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start = -(-buf.ctypes.data // page) * page
    end = (buf.ctypes.data + buf.nbytes) // page * page
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if end > start and libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 4) != 0:  # 4: MADV_DONTNEED
        raise OSError(ctypes.get_errno(), "madvise failed")


def resident_bytes(buf) -> int:
    """Bytes of ``buf``'s pages the OS has mapped (mincore on its own address range): unlike the process's RSS, no
    other allocation or free in the test process moves it."""
    import ctypes
    import mmap

    import numpy as np

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start = buf.ctypes.data // page * page
    length = buf.ctypes.data + buf.nbytes - start
    vec = np.zeros((length + page - 1) // page, np.uint8)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec.ctypes.data_as(ctypes.c_void_p)) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return int((vec & 1).sum()) * page


def cache(mb: int = 128) -> KVCache:
    # 1 layer x K and V x [4 slots, 2 heads, capacity, 64] float32 = mb MiB: each buffer past glibc's largest mmap
    # threshold (32 MiB), so numpy gets fresh, unmapped pages whatever the process freed before
    capacity = mb * MB // (2 * 4 * 2 * 64 * 4)
    return KVCache(1, 4, 2, capacity, 64, capacity, layout="bnsh")


def test_on_maps_every_page_before_any_request():
    c = cache()
    assert c.host_bytes == 128 * MB
    buffers = (*c.keys, *c.values)
    for buf in buffers:
        release_pages(buf)
    assert sum(map(resident_bytes, buffers)) <= 0.01 * c.host_bytes
    note = commit_host_caches("on", [c])
    assert note.startswith("KV caches committed at load: 0.12 GiB")
    assert sum(map(resident_bytes, buffers)) >= 0.99 * c.host_bytes
    assert not any(buf.any() for buf in (*c.keys, *c.values))


def test_auto_leaves_caches_unmapped_when_they_would_take_over_half_the_memory(monkeypatch):
    c = cache()
    monkeypatch.setattr(kv_cache, "_memory_available", lambda: c.host_bytes)
    buffers = (*c.keys, *c.values)
    for buf in buffers:
        release_pages(buf)
    note = commit_host_caches("auto", [c])
    assert "not committed at load" in note and "--preallocate_kv on" in note
    assert sum(map(resident_bytes, buffers)) <= 0.1 * c.host_bytes
    monkeypatch.setattr(kv_cache, "_memory_available", lambda: 4 * c.host_bytes)
    assert commit_host_caches("auto", [c]).startswith("KV caches committed")
    assert sum(map(resident_bytes, buffers)) >= 0.99 * c.host_bytes
    assert commit_host_caches("off", [c]) is None


def test_a_cache_that_holds_tokens_is_left_alone():
    c = cache(8)
    c.keys[0][1, :, :3] = 1.5
    c.lengths[1] = 3
    assert c.commit() is False and commit_host_caches("on", [c]) is None
    assert c.keys[0][1, 0, 0, 0] == 1.5


def test_every_host_cache_is_known_to_commit_host_caches():
    """Every cache with numpy storage is known to commit_host_caches (the target's, the prefix pool's, a draft's)."""
    c = cache(1)
    assert c in kv_cache._HOST_CACHES
    assert KVCache(2, 4, 2, 8, 64, 8, storage=False) not in kv_cache._HOST_CACHES
