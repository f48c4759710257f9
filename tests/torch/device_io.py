"""Device memory access for the torch-free Python tests, through the CUDA driver API.

The tests read and write tagmem allocations with synchronous driver copies (cuMemcpyHtoD/DtoH)
from the library tagmem itself loads: TAGMEM_LIBCUDA when set (the emulated driver, whose state is
per loaded copy, so the same file must be opened: dlopen hands back the same instance), else
libcuda.so.1. So the same tests run on the emulator and on a GPU; nothing here assumes device
memory is host-visible.
"""

import ctypes
import os
import threading


class DriverError(RuntimeError):
    pass


class DeviceIO:
    """Synchronous copies to and from device addresses on one device's primary context."""

    def __init__(self, device=0):
        self.path = os.environ.get("TAGMEM_LIBCUDA") or "libcuda.so.1"
        self.cu = ctypes.CDLL(self.path)
        self._check(self.cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self._check(self.cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        self._check(
            self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), dev),
            "cuDevicePrimaryCtxRetain",
        )
        self._local = threading.local()
        self.cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        self.cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self.cu.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2

    @staticmethod
    def _check(result, what):
        if result != 0:
            raise DriverError(f"{what} failed with CUresult {result}")

    def _make_current(self):
        if not getattr(self._local, "current", False):
            self._check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            self._local.current = True

    def write(self, address, data):
        """Copies the bytes `data` to device address `address`."""
        self._make_current()
        buffer = ctypes.create_string_buffer(bytes(data), len(data))
        self._check(self.cu.cuMemcpyHtoD_v2(address, buffer, len(data)), "cuMemcpyHtoD")

    def read(self, address, nbytes):
        """The `nbytes` bytes at device address `address`."""
        self._make_current()
        buffer = ctypes.create_string_buffer(nbytes)
        self._check(self.cu.cuMemcpyDtoH_v2(buffer, address, nbytes), "cuMemcpyDtoH")
        return buffer.raw

    def free_bytes(self):
        """Free device memory as the driver reports it."""
        self._make_current()
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self.cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return free.value

    def is_emulator(self):
        """Whether the driver is tagmem's emulated one (it exports the emulator's control API)."""
        return hasattr(self.cu, "tagmem_emu_device_count")
