"""The importing process of test_ipc.py: one command per line on stdin, one answer per line.

  open <pickled handle, hex>  -> "opened <nbytes> <device>" | "error <ExceptionName> <message>"
  check <seed>                -> "same" | "differs"   (the open range against seeded bytes)
  write <seed>                -> "written"
  close                       -> "closed"
  drop                        -> "dropped"  (the mapping's last reference goes: it closes itself)
  stats                       -> the ipc_stats dict
  exit
"""

import gc
import pickle
import random
import sys

import tagmem
from device_io import DeviceIO


def seeded(seed, n):
    return random.Random(seed).randbytes(n)


def main():
    io = DeviceIO(0)
    mapping = None
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "exit":
            return 0
        try:
            if cmd == "open":
                mapping = tagmem.ipc_open(pickle.loads(bytes.fromhex(arg)))
                answer = f"opened {mapping.nbytes} {mapping.device}"
            elif cmd == "check":
                same = io.read(mapping.ptr, mapping.nbytes) == seeded(int(arg), mapping.nbytes)
                answer = "same" if same else "differs"
            elif cmd == "write":
                io.write(mapping.ptr, seeded(int(arg), mapping.nbytes))
                answer = "written"
            elif cmd == "close":
                mapping.close()
                answer = "closed"
            elif cmd == "drop":
                mapping = None
                gc.collect()
                answer = "dropped"
            elif cmd == "stats":
                answer = repr(tagmem.ipc_stats())
            else:
                answer = f"error unknown command {cmd}"
        except tagmem.TagmemError as e:
            answer = f"error {type(e).__name__} {e}"
        print(answer, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
