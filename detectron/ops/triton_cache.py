"""Triton's cache key, computed on a side thread while a tool starts.

Before it compiles or loads its first kernel, Triton hashes its own sources and its library once
per process (triton.runtime.cache.triton_key, memoised), which delays the first training
iteration (BENCHMARKS.md, "Start-up"). Started while the model loads and the loader
makes its first batch, the key is ready when the first kernel runs; hashlib releases the GIL while
it digests the library."""
import threading

try:
    from triton.runtime.cache import triton_key
except ImportError:  # CPU-only installs (no Triton), or a Triton that keys its cache otherwise
    triton_key = None


def start_key_hashing(device):
    """On a CUDA device with Triton, a started daemon thread computing Triton's cache key; else None.
    Call it after the loader's workers are forked: a child forked mid-import could deadlock."""
    if device.type != 'cuda' or triton_key is None:
        return None
    thread = threading.Thread(target=triton_key, name='triton-cache-key', daemon=True)
    thread.start()
    return thread
