"""Triton's cache key is computed on a side thread on CUDA devices, and only there."""
import pytest
import torch

from detectron.ops import triton_cache

needs_triton = pytest.mark.skipif(triton_cache.triton_key is None, reason='Triton is not installed (CPU-only torch)')


def test_no_thread_on_the_cpu():
    assert triton_cache.start_key_hashing(torch.device('cpu')) is None


@needs_triton
def test_the_key_is_ready_after_the_thread():
    key = triton_cache.triton_key
    key.cache_clear()
    thread = triton_cache.start_key_hashing(torch.device('cuda'))  # a device name: no GPU is touched
    assert thread is not None and thread.daemon
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert key.cache_info().currsize == 1
    hits = key.cache_info().hits
    computed = key()  # what the first kernel asks for: served from the memo, not hashed again
    assert key.cache_info().hits == hits + 1
    key.cache_clear()
    assert key() == computed  # the same key as a fresh computation in this thread


def test_no_thread_without_triton(monkeypatch):
    monkeypatch.setattr(triton_cache, 'triton_key', None)
    assert triton_cache.start_key_hashing(torch.device('cuda')) is None
