#!/usr/bin/env python3
"""Writes the seed corpus of the state-machine fuzzer (tests/fuzz/corpus/) and the hand-reduced
inputs of its findings (tests/fuzz/regressions/).

Each seed is a short readable program in the input format of state_machine.hpp; the fuzzer mutates
them into the programs it explores, and the replay test (replay_test.cpp) runs them all in CI.
Run it again after changing the format: `python3 tests/fuzz/make_seeds.py`.
"""
import os
import struct

# Opcodes (state_machine.cpp, runner::run) and operand codes (state_machine.hpp).
PUSH, POP, ALLOC, FREE, OFFLOAD, RELOAD, SWAP, EMPTY, REWRITE, FAULT, HOST, MISUSE = range(12)
NAMES = {"t0": 0, "t1": 1, "t2": 2, "kv": 3, "ghost": 4, "": 5, "has space": 6, "long": 7,
         None: 8}
DEV0, DEV1, CURRENT, BADDEV = 0, 3, 6, 7
BACKUP, DISCARD, BADMODE = 0, 2, 4
SMALL, KIB, MEDIUM, LARGE, ZERO, OVER, HUGE, EDGE = range(8)
FAULT_ENTRIES = [None, "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
                 "cuMemcpyDtoHAsync", "cuMemcpyHtoDAsync", "cuStreamSynchronize",
                 "cuCtxSynchronize", "cuMemHostRegister", "cuMemAddressReserve", "cuEventRecord",
                 "cuStreamWaitEvent", "cuEventCreate", "cuMemGetInfo", "cuCtxSetCurrent",
                 "cuCtxGetCurrent", "cuStreamCreate", "cuDevicePrimaryCtxRetain",
                 "cuMemHostUnregister", "cuMemHostAlloc", "cuMemFreeHost"]
OOM, UNKNOWN, INVALID_VALUE, LAUNCH_FAILED = range(4)


class Program:
    def __init__(self, config=0, dev0=4, dev1=4):
        self.b = bytearray([config, dev0, dev1])  # sizes 24 + 8 * n MiB

    def push(self, name):
        self.b += bytes([PUSH, NAMES[name]])

    def pop(self):
        self.b += bytes([POP])

    def alloc(self, name, dev, cls, v, stream=0):
        if name is False:  # in the current scope's tag
            self.b += bytes([ALLOC, stream << 1, dev, cls]) + struct.pack("<H", v)
        else:
            self.b += bytes([ALLOC, 1 | stream << 1, NAMES[name], dev, cls]) + struct.pack("<H", v)

    def free(self, kind, index=0, stream=0):
        self.b += bytes([FREE, kind, index, stream])

    def names(self, names):
        self.b += bytes([len(names)] + [NAMES[n] for n in names])

    def offload(self, names, dev=DEV0, mode=BACKUP):
        self.b += bytes([OFFLOAD])
        self.names(names)
        self.b += bytes([dev, mode])

    def reload(self, names, dev=DEV0):
        self.b += bytes([RELOAD])
        self.names(names)
        self.b += bytes([dev])

    def swap(self, out, into, dev=DEV0, mode=BACKUP):
        self.b += bytes([SWAP])
        self.names(out)
        self.names(into)
        self.b += bytes([dev, mode])

    def empty_cache(self, dev=DEV0):
        self.b += bytes([EMPTY, dev])

    def rewrite(self, index):
        self.b += bytes([REWRITE, index, 0, 0, 0])

    def fault(self, entry, nth, error):
        self.b += bytes([FAULT, FAULT_ENTRIES.index(entry), nth - 1, error])

    def host(self, kind, v):
        self.b += bytes([HOST, kind]) + struct.pack("<H", v)

    def misuse(self, kind):
        self.b += bytes([MISUSE, kind])


def fill(p, name, dev=DEV0, stream=0):
    p.alloc(name, dev, SMALL, 100, stream)
    p.alloc(name, dev, KIB, 3000, stream)
    p.alloc(name, dev, MEDIUM, 9000, stream)
    p.alloc(name, dev, SMALL, 4000, stream)
    p.alloc(name, dev, EDGE, 2, stream)


def seeds():
    s = {}
    p = Program()
    fill(p, "t0")
    p.alloc("t0", DEV0, LARGE, 100)
    p.offload(["t0"])
    p.reload(["t0"])
    p.rewrite(1)
    p.offload(["t0"])
    p.reload(["t0"])
    for i in range(6):
        p.free(0, 0)
    s["backup_cycle"] = p

    p = Program()
    fill(p, "kv")
    p.offload(["kv"], mode=DISCARD)
    p.reload(["kv"])
    p.offload(["kv"], mode=DISCARD)
    p.free(0, 2)
    p.reload(["kv"])
    s["discard_cycle"] = p

    p = Program(dev0=3)
    fill(p, "t0")
    fill(p, "t1")
    fill(p, "t2")
    p.alloc("kv", DEV0, MEDIUM, 100)
    p.offload(["t2", "kv"], mode=BACKUP)
    for _ in range(3):
        p.swap(["t0", "t1"], ["t2", "kv"])
        p.rewrite(3)
        p.swap(["t2", "kv"], ["t0", "t1"])
    s["trainer_engine_swaps"] = p

    p = Program()
    fill(p, "t0", DEV0)
    fill(p, "t0", DEV1, stream=1)
    p.alloc("kv", DEV1, MEDIUM, 5000, 2)
    p.offload(["t0", "kv"], dev=DEV1, mode=BACKUP)
    p.offload(["t0"], dev=DEV0, mode=DISCARD)
    p.reload(["kv"], dev=DEV1)
    p.reload(["t0"], dev=CURRENT)
    p.reload(["t0"], dev=DEV1)
    p.empty_cache(DEV1)
    s["two_devices"] = p

    p = Program()
    p.alloc("t0", DEV0, SMALL, 10)
    p.alloc("", DEV0, SMALL, 10)
    p.alloc("has space", DEV0, SMALL, 10)
    p.alloc("long", DEV0, SMALL, 10)
    p.alloc(None, DEV0, SMALL, 10)
    p.alloc("t0", BADDEV, SMALL, 10)
    p.alloc("t0", DEV0, ZERO, 0)
    p.alloc("t0", DEV0, OVER, 0)
    p.alloc("t0", DEV0, HUGE, 0)
    p.offload(["ghost"])
    p.offload(["t0", "t0"])
    p.offload(["t0"], mode=BADMODE)
    p.offload(["t0"], dev=BADDEV)
    p.reload(["t0"])
    p.offload(["t0"])
    p.offload(["t0"])
    p.offload(["t0"], mode=DISCARD)
    p.alloc("t0", DEV0, SMALL, 10)
    p.swap(["t0"], [])
    p.swap([], ["t0", "t0"])
    p.swap(["kv"], ["t0"])
    p.free(2, 0, 0)
    p.free(3, 0, 0)
    p.free(4)
    p.free(5)
    p.pop()
    p.push("")
    for k in range(8):
        p.misuse(k)
    p.reload(["t0"])
    p.free(0)
    p.free(3)
    s["invalid_calls"] = p

    p = Program(dev0=0)  # 24 MiB device
    p.alloc("t0", DEV0, LARGE, 8000)
    p.alloc("t0", DEV0, SMALL, 77)
    p.offload(["t0"])
    p.alloc("t1", DEV0, LARGE, 1)
    p.reload(["t0"])
    p.free(0, 0)
    p.reload(["t0"])
    p.empty_cache(DEV0)
    p.reload(["t0"])
    s["reload_out_of_memory"] = p

    p = Program()
    fill(p, "t0")
    fill(p, "t1")
    entries = ["cuMemcpyDtoHAsync", "cuMemUnmap", "cuMemRelease", "cuMemCreate", "cuMemMap",
               "cuMemSetAccess", "cuMemcpyHtoDAsync", "cuStreamSynchronize", "cuCtxSynchronize"]
    for i, e in enumerate(entries):
        p.fault(e, 1 + i % 3, i % 4)
        p.offload(["t0", "t1"])
        p.fault(e, 1 + i % 2, i % 4)
        p.reload(["t0", "t1"])
        p.reload(["t0", "t1"])
        p.reload(["t0"])
        p.reload(["t1"])
    p.fault(None, 5, UNKNOWN)
    p.alloc("t2", DEV1, SMALL, 5)
    p.fault("cuMemCreate", 1, OOM)
    p.alloc("t2", DEV0, MEDIUM, 5)
    s["driver_faults"] = p

    p = Program()
    p.push("t1")
    p.alloc(False, DEV0, SMALL, 9)
    p.push("kv")
    p.alloc(False, CURRENT, KIB, 9)
    p.pop()
    p.alloc(False, DEV1, SMALL, 9)
    p.pop()
    p.alloc(False, DEV0, SMALL, 9)
    p.pop()
    s["tag_scope"] = p

    p = Program()
    for i in range(6):
        p.alloc("t0", DEV0, KIB, 200 + i, stream=1)
    for i in range(3):
        p.free(0, i, stream=1)
    for i in range(4):
        p.alloc("t0", DEV0, KIB, 100 + i, stream=2)
    p.empty_cache(DEV0)
    p.free(0, 1, stream=2)
    s["streams_and_cache"] = p

    p = Program()
    p.host(0, 4000)
    fill(p, "t0")
    p.offload(["t0"])
    p.host(1, 0)
    p.reload(["t0"])
    p.host(1, 0)
    p.host(2, 60000)
    p.offload(["t0"])
    p.reload(["t0"])
    s["host_store"] = p

    p = Program(config=1 | 1 << 1 | 1 << 3 | 1 << 4)  # 4 MiB chunks, 8 MiB arenas, small pieces
    fill(p, "t0")
    fill(p, "t0")
    p.alloc("t0", DEV0, LARGE, 20)
    p.offload(["t0"])
    p.reload(["t0"])
    p.swap(["t0"], [], mode=DISCARD)
    p.reload(["t0"])
    s["small_arenas_and_mappings"] = p

    # Frees at a thread's exit (free kind + 6 * where: 2 as the thread's first call, 3 after it
    # used tagmem), of live, stale and NULL pointers, resident and offloaded.
    p = Program()
    fill(p, "t0")
    fill(p, "kv", DEV1)
    p.free(0 + 6 * 2, 0)
    p.free(0 + 6 * 3, 1)
    p.free(3 + 6 * 2, 0)
    p.free(4 + 6 * 3, 0)
    p.offload(["t0"])
    p.free(0 + 6 * 3, 0)
    p.reload(["t0"])
    p.free(0 + 6 * 2, 2, stream=1)
    s["frees_at_thread_exit"] = p

    # The release clock's page (header bits 6-7): fresh, a hostile value, truncated.
    for state, name in ((1, "fresh"), (2, "hostile_value"), (3, "truncated")):
        p = Program(config=state << 6)
        fill(p, "kv")
        p.offload(["kv"], mode=DISCARD)
        fill(p, "t0")
        p.offload(["t0"])
        p.reload(["t0"])
        p.reload(["kv"])
        s["clock_page_" + name] = p
    return s


def regressions():
    """Findings, reduced to the operations that show them (regressions/README.md says which)."""
    r = {}
    p = Program()
    p.alloc("t0", DEV0, SMALL, 100)
    p.fault("cuMemRelease", 1, UNKNOWN)
    p.offload(["t0"])
    p.reload(["t0"])
    p.offload(["t0"])
    p.reload(["t0"])
    r["offload_release_failure_leaked_the_handle"] = p

    p = Program()
    p.alloc("t0", DEV0, SMALL, 100)
    p.alloc("t1", DEV0, SMALL, 100)
    p.free(0, 0)
    p.fault("cuMemRelease", 1, OOM)
    p.empty_cache(DEV0)
    p.alloc("t0", DEV0, SMALL, 200)
    p.alloc("t0", DEV0, KIB, 200)
    p.empty_cache(DEV0)
    r["empty_cache_release_failure_kept_unmapped_segments"] = p

    p = Program(dev0=0)
    p.alloc("t0", DEV0, LARGE, 8000)
    p.alloc("t0", DEV0, MEDIUM, 60000)
    r["allocated_bytes_counted_whole_blocks"] = p

    p = Program()
    p.alloc("t0", DEV0, SMALL, 100)
    p.offload(["t0"], mode=BADMODE)
    p.swap(["t0"], [], mode=BADMODE)
    r["invalid_offload_mode_was_undefined_behaviour"] = p

    p = Program()
    p.alloc("t0", DEV0, KIB, 1000)
    p.offload(["t0"])
    p.reload(["t0"])
    p.fault("cuMemHostUnregister", 1, UNKNOWN)
    p.host(1, 0)
    p.offload(["t0"])
    p.reload(["t0"])
    r["trim_unregister_failure_unmapped_pinned_memory"] = p
    return r


def write(directory, programs):
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), directory)
    os.makedirs(out, exist_ok=True)
    for name, program in programs.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes(program.b))


def main():
    write("corpus", seeds())
    write("regressions", regressions())


if __name__ == "__main__":
    main()
