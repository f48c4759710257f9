#!/usr/bin/env python3
"""Writes the seed corpus of the rendezvous fuzzer (tests/fuzz/rendezvous_corpus): one valid
message per decoder, byte for byte as allocator/peers/messages.cpp,
integrations/nccl/collective_messages.cpp and allocator/handoff/handoff_messages.cpp encode it, behind the selector byte that
rendezvous_fuzz.cpp reads first. Run it again only if the encoding changes."""
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "rendezvous_corpus")


def u32(v): return struct.pack("<I", v)
def i32(v): return struct.pack("<i", v)
def u64(v): return struct.pack("<Q", v)
def s(b): return u32(len(b)) + b


seeds = {
    "hello": (0, u32(3) + u32(1) + i32(1) + i32(2) + s(b"torchrun:3f6c") + s(b"nccl") + u32(1)
              + u32(0) + s(b"")),
    "welcome": (1, s(b"torchrun:3f6c") + s(b"nccl") + u32(2) + u64(100) + u64(5000) + u64(101)
                + u64(5001)),
    "abort": (2, u32(11) + s(b"rank 1 (pid 101) closed the connection")),
    "routed": (3, i32(1) + s(b"\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")),
    "outcome": (4, u32(0) + s(b"")),
    "list": (5, u32(3) + s(b"a") + s(b"") + s(b"ccc")),
    "match_letter": (6, u64(7) + u64(12)),
    "claims": (7, i32(0) + u64(7) + u32(1) + i32(1) + u64(9) + u32(0)),
    "decisions": (8, u64(7) + u32(1) + u64(9) + u32(0)),
    "needs": (9, i32(0) + u64(7) + i32(1) + u64(3)),
    "handle_letter": (10, u64(7) + u32(1)),
    "frame": (11, u32(0x4e4d4754) + u32(4) + u32(12) + u32(2) + bytes([2])),
    "hoff_hello": (12, u32(1) + s(b"ray:rl-1") + s(bytes(range(16))) + u64(2 << 20) + i32(101)
                   + u64(5000) + u64(1 << 30)),
    "hoff_welcome": (13, s(b"ray:rl-1") + s(bytes(range(16))) + u64(2 << 20) + i32(102)
                     + u64(5001) + u32(2) + u64(1 << 34) + u64(1 << 30) + u64(123456789)),
    "hoff_refuse": (14, u32(11) + s(b"process 7 belongs to job 'a', this process to job 'b'")),
    "hoff_give": (15, u64(3) + u32(2) + u64(1 << 30) + u64(2 << 20)),
    "hoff_taken": (16, u64(3) + u32(1) + u64(1 << 29)),
    "hoff_done": (17, u64(1 << 31)),
}
os.makedirs(out, exist_ok=True)
for name, (selector, payload) in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([selector]) + payload)
