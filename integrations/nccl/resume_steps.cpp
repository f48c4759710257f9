// resume_steps.cpp — the steps of the NCCL resume (see header; the protocol is in collective.cpp).
#include "resume_steps.hpp"

#include <exception>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "backup_extents.hpp"
#include "bounded_wait.hpp"
#include "collective_messages.hpp"
#include "peers/fd_identity.hpp"
#include "peers/messages.hpp"
#include "record_moves.hpp"
#include "tagmem/tagmem_nccl.h"

namespace tagmem::nccl::detail {

using namespace peers;  // the group session, its messages and descriptor passing

namespace {

// What undoing a rebuild takes, copied out of the records so that a late wait can do it.
struct unbuild {
  CUmemGenericAllocationHandle handle = 0;
  std::vector<std::pair<CUdeviceptr, std::size_t>> mappings;  // empty when not mapped
};

std::vector<unbuild> to_unbuild(const std::vector<rebuilt>& done) {
  std::vector<unbuild> out;
  for (const rebuilt& r : done) {
    unbuild u{r.handle, {}};
    if (r.mapped)
      for (const mapping_record& m : r.a->mappings) u.mappings.emplace_back(m.va, m.size);
    out.push_back(std::move(u));
  }
  return out;
}

void run_unbuild(const std::vector<unbuild>& list) {
  for (const unbuild& u : list) {
    for (auto [va, size] : u.mappings) driver::api().cuMemUnmap(va, size);
    driver::api().cuMemRelease(u.handle);
  }
}

// Rebuilds and refills the released local records of one device, in `out`. On failure, what it
// rebuilt is undone: now, or — while copies may still fill it — by the late wait once they end.
void rebuild_device(const runtime::hold& rt, int device, const std::vector<allocation*>& list,
                    int timeout_ms, std::vector<rebuilt>& out) {
  if (!settle_late_wait(device, deadline_after(timeout_ms)))
    fail(TAGMEM_ERROR_TIMEOUT, "device " + std::to_string(device) +
                                   " is still busy with work that outlived an earlier timeout "
                                   "(waited " +
                                   ms(timeout_ms) + ")");
  tagmem::device& dev = rt.dev(device);
  context_guard scope(dev.context());
  std::vector<rebuilt> here;
  std::exception_ptr failed;
  {
    copy_queue copies(dev);
    try {
      here.reserve(list.size());
      for (allocation* a : list) {
        CUmemGenericAllocationHandle h = 0;
        TAGMEM_CU(cuMemCreate, &h, a->size, &a->prop, 0);
        here.push_back({a, h, false});
        map_everywhere(*a, h);
        here.back().mapped = true;
        for (const backup_piece& p : pieces_of(*a, rt.settings().copy_piece_bytes))
          copies.to_device(p, TAGMEM_NCCL_TAG);
      }
    } catch (...) {
      failed = std::current_exception();
    }
  }
  auto pending = std::make_shared<std::vector<unbuild>>(to_unbuild(here));
  CUresult status = wait_for_copies(dev, timeout_ms, [pending] { run_unbuild(*pending); });
  if (failed || status != CUDA_SUCCESS) {
    run_unbuild(*pending);
    if (failed) std::rethrow_exception(failed);
    driver::check(status, "cuStreamSynchronize");
  }
  out.insert(out.end(), here.begin(), here.end());
}

}  // namespace

void undo(const runtime::hold& rt, std::vector<rebuilt>& done) {
  for (const rebuilt& r : done) {
    try {
      context_guard scope(rt.dev(device_of(*r.a)).context());
      run_unbuild(to_unbuild({r}));
    } catch (const error&) {
      run_unbuild(to_unbuild({r}));  // the calls need no context of their own
    }
  }
  done.clear();
}

std::vector<rebuilt> rebuild_local(const runtime::hold& rt, int timeout_ms) {
  std::vector<rebuilt> out;
  std::map<int, std::vector<allocation*>> by_device;
  records().for_each([&](allocation& a) {
    if (local(a) && a.released) by_device[device_of(a)].push_back(&a);
  });
  try {
    for (auto& [device, list] : by_device) rebuild_device(rt, device, list, timeout_ms, out);
  } catch (...) {
    undo(rt, out);
    throw;
  }
  return out;
}

void commit(std::vector<rebuilt>& done) {
  for (rebuilt& r : done) {
    allocation& a = *r.a;
    a.real = r.handle;
    a.real_held = true;
    if (a.from == origin::created && a.app_refs == 0) {  // NCCL had let go of its handle
      release_or_keep(r.handle);
      a.real_held = false;
    }
    a.released = false;
    for (const host_extent& e : a.backup) g_state.bytes_restored += e.size;
    give_back_backups({&a});
  }
}

void reshare(const runtime::hold& rt, group_session& s) {
  std::vector<need> needs;
  std::string failures;
  tagmem_status code = TAGMEM_ERROR_DRIVER;  // PEER once a process was not the right one
  records().for_each([&](allocation& b) {
    if (b.from != origin::imported || !b.released) return;
    if (std::string mismatch = owner_mismatch(s, b); !mismatch.empty()) {
      failures += " " + mismatch + ";";
      code = TAGMEM_ERROR_PEER;
    } else {
      needs.push_back({b.source_rank, b.source_id});
    }
  });
  std::vector<std::string> all = s.all_gather(encode_needs(needs), "asking owners for new handles");
  std::vector<letter> outbox;
  std::vector<int> exported;
  for (int rank = 0; rank < s.size(); ++rank) {
    std::set<std::uint64_t> sent;
    for (const need& n : decode_from(s.describe(rank), "asking for handles",
                                     [&] { return decode_needs(all[rank]); })) {
      if (n.owner != s.rank() || !sent.insert(n.id).second) continue;
      allocation* a = records().by_id(n.id);
      int fd = -1;
      CUresult res = CUDA_ERROR_INVALID_VALUE;
      std::string refusal = claim_refusal(s, rank, n.id, a);
      if (refusal.empty() && !a->released && !a->mappings.empty()) {
        // NCCL may hold no handle of its own (then neither does the shim): borrow one.
        CUmemGenericAllocationHandle h = a->real;
        bool borrowed = !a->real_held;
        if (borrowed) {
          res = driver::api().cuMemRetainAllocationHandle(
              &h, reinterpret_cast<void*>(a->mappings.front().va));
        }
        if (!borrowed || res == CUDA_SUCCESS) {
          res = driver::api().cuMemExportToShareableHandle(
              &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
          if (borrowed) release_or_keep(h);
        }
      }
      letter l;
      l.to = rank;
      l.blob = encode_handle_letter({n.id, res == CUDA_SUCCESS});
      if (res == CUDA_SUCCESS) {
        l.fds.push_back(fd);
        exported.push_back(fd);
      } else if (!refusal.empty()) {
        failures += " " + refusal + ";";
        code = TAGMEM_ERROR_PEER;
      } else {
        failures += " cannot export buffer " + std::to_string(n.id) + " for rank " +
                    std::to_string(rank) + ";";
      }
      outbox.push_back(std::move(l));
    }
  }
  auto on_letter = [&](int from, const std::string& blob, owned_fds& fds) {
    handle_letter l = decode_from(s.describe(from), "handing out handles",
                                  [&] { return decode_handle_letter(blob); });
    bool ok = l.ok && fds.size() == 1;
    records().for_each([&](allocation& b) {
      if (b.from != origin::imported || !b.released || b.source_rank != from ||
          b.source_id != l.id || !owner_mismatch(s, b).empty())
        return;
      if (!ok) {
        failures +=
            " " + s.describe(from) + " did not re-export buffer " + std::to_string(l.id) + ";";
        return;
      }
      try {
        maybe_device_scope scope(rt, device_of(b));
        CUmemGenericAllocationHandle h = 0;
        TAGMEM_CU(cuMemImportFromShareableHandle, &h,
                  reinterpret_cast<void*>(static_cast<std::intptr_t>(fds[0])),
                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        try {
          map_everywhere(b, h);
        } catch (...) {
          release_or_keep(h);
          throw;
        }
        b.real = h;
        b.real_held = true;
        if (b.app_refs == 0) {
          release_or_keep(h);
          b.real_held = false;
        }
        b.released = false;
      } catch (const error& e) {
        failures += std::string(" ") + e.what() + ";";
      }
    });
  };
  try {
    s.mail(outbox, on_letter, "handing new handles to the ranks that map them");
  } catch (...) {
    for (int fd : exported) close_quietly(fd);
    throw;
  }
  for (int fd : exported) close_quietly(fd);
  if (!failures.empty()) fail(code, "re-sharing NCCL's buffers failed:" + failures);
}

}  // namespace tagmem::nccl::detail
