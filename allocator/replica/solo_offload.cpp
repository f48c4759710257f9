// solo_offload.cpp — Note [offload alone] in solo_offload.hpp.
#include "replica/solo_offload.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "base/error.hpp"
#include "base/exit_flag.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "observe/log.hpp"
#include "offload/offload_engine.hpp"
#include "replica/replica_layout.hpp"
#include "replica/replication.hpp"
#include "replica/share_copy.hpp"

namespace tagmem {
namespace {

// Whether process `pid` still runs (a zombie, not yet reaped by its parent, has died).
bool alive(pid_t pid) noexcept {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* f = std::fopen(path, "re");
  if (f == nullptr) return true;  // no /proc to ask: kill() said it exists
  char text[512];
  const std::size_t n = std::fread(text, 1, sizeof text - 1, f);
  std::fclose(f);
  text[n] = '\0';
  const char* end = std::strrchr(text, ')');  // the state follows the command name
  return end == nullptr || end[1] != ' ' || (end[2] != 'Z' && end[2] != 'X');
}

std::string who(tag& t, const replication& rep) {
  return "replicated tag '" + std::string(t.name()) + "' (group '" + rep.spec.group + "')";
}

std::string rank_text(const shared_buffer& b, int r) {
  return "rank " + std::to_string(r) + " (pid " + std::to_string(b.pid_of(r)) + ")";
}

// The sample's offsets for offload `generation` through the copy: the same in every replica,
// different for every offload.
std::uint64_t sample_seed(const shared_buffer& b, std::uint32_t generation) noexcept {
  return b.token() ^ (std::uint64_t{generation} * 0x9e3779b97f4a7c15ull);
}

replica_digest digest_of(device& dev, tag& t, std::uint64_t layout, const shared_buffer& b,
                         std::uint32_t generation) {
  return {generation, layout, sampled_checksum(dev, t, sample_seed(b, generation))};
}

// Whether every share that overlaps the run's bytes [lo, hi) holds offload `generation`.
bool shares_written(const shared_buffer& b, std::size_t lo, std::size_t hi,
                    std::uint32_t generation) noexcept {
  for (int k = 0; k < b.shares(); ++k) {
    const auto [s, e] = b.share(k);
    if (e <= lo || s >= hi) continue;  // an empty share (s == e) overlaps nothing
    if (!b.written(k, generation)) return false;
  }
  return true;
}

// A live replica other than `me` that needs an offload through the copy, else -1.
int needing(const shared_buffer& b, int me, std::uint32_t only = 0) noexcept {
  for (int r = 0; r < b.shares(); ++r) {
    if (r == me) continue;
    const std::uint32_t n = b.needs(r);
    if (n != 0 && (only == 0 || n == only) && alive(b.pid_of(r))) return r;
  }
  return -1;
}

std::string still_needed(tag& t, const replication& rep, const shared_buffer& b, int r) {
  return "offloading " + who(t, rep) + " alone: " + rank_text(b, r) +
         " is offloaded through the shared copy and has not reloaded it; another offload would "
         "overwrite its shares. Reload every replica before offloading one again";
}

}  // namespace

mapping_filter written_only(tag& t, const shared_buffer& b, std::uint32_t generation) {
  auto offsets = std::make_shared<meta_map<CUdeviceptr, std::size_t>>();
  std::size_t at = 0;
  for (const auto& [va, m] : t.arena().mappings()) {
    (*offsets)[va] = at;
    at += m.size;
  }
  return [offsets, &b, generation](CUdeviceptr va, std::size_t bytes) {
    const auto it = offsets->find(va);
    return it != offsets->end() && shares_written(b, it->second, it->second + bytes, generation);
  };
}

bool run_resident(tag& t, std::size_t lo, std::size_t hi) noexcept {
  std::size_t at = 0;
  for (const auto& [va, m] : t.arena().mappings()) {
    if (at < hi && at + m.size > lo && !m.resident) return false;
    at += m.size;
  }
  return true;
}

bool can_offload_alone(tag& t) noexcept {
  const replication* rep = replication_of(t);
  return rep != nullptr && rep->spec.size > 1 && rep->spare != nullptr &&
         rep->spare->shares() == rep->spec.size && rep->spare->bytes() == run_bytes(t) &&
         rep->generation != 0;
}

void note_group_offload(device& dev, tag& t, shared_buffer& b, int me, std::uint32_t generation) {
  b.publish(me, digest_of(dev, t, layout_hash(layout_of(t, 0)), b, generation));
  b.set_needs(me, generation);
  b.raise_current(generation);
}

bool offload_alone(device& dev, tag& t, host_store& store, const config& cfg) {
  replication& rep = *replication_of(t);
  shared_buffer& b = *rep.spare;
  const int me = rep.spec.rank;
  {
    context_guard guard(dev.context());
    TAGMEM_CU(cuCtxSynchronize, dev.context());  // Note [offload waits]
  }
  const std::uint64_t layout = layout_hash(layout_of(t, 0));
  std::uint32_t g = 0;  // step 1: the offload this replica takes part in
  for (int attempt = 0; g == 0; ++attempt) {
    TAGMEM_EXPECTS(attempt < 16, TAGMEM_ERROR_PEER,
                   "offloading " + who(t, rep) +
                       " alone: the other replicas kept starting offloads through the shared copy");
    const std::uint32_t c = b.current();
    int differs = -1;
    if (c != 0 && rep.generation != c) {  // it did not take part in c: join it if it can
      std::optional<replica_digest> mine;
      int same = -1;
      for (int r = 0; r < b.shares() && same < 0; ++r) {
        replica_digest theirs;
        if (r == me || !b.published(r, c, &theirs)) continue;
        if (!mine) mine = digest_of(dev, t, layout, b, c);
        if (theirs.layout == mine->layout && theirs.sampled == mine->sampled) {
          same = r;
        } else if (b.needs(r) == c && alive(b.pid_of(r))) {
          differs = r;
        }
      }
      if (same >= 0) {
        b.publish(me, *mine);
        b.set_needs(me, c);
        if (b.current() == c) {  // else another replica started the next one meanwhile
          g = c;
          break;
        }
        b.set_needs(me, 0);
        continue;
      }
    }
    TAGMEM_EXPECTS(differs < 0, TAGMEM_ERROR_INVALID_ARGUMENT,
                   "offloading " + who(t, rep) +
                       " alone: its replicas differ: " + rank_text(b, differs) +
                       " offloaded other bytes or another layout through the shared copy");
    if (const int r = needing(b, me); r >= 0) fail(TAGMEM_ERROR_PEER, still_needed(t, rep, b, r));
    b.publish(me, digest_of(dev, t, layout, b, c + 1));
    if (!b.advance(c, c + 1)) continue;  // another replica started it first: join it
    if (const int r = needing(b, me, c); r >= 0)
      fail(TAGMEM_ERROR_PEER, still_needed(t, rep, b, r));
    b.set_needs(me, c + 1);
    g = c + 1;
  }
  std::size_t moved = 0;  // step 2
  try {
    if (!b.written(me, g)) moved = copy_share(dev, t, b, me, g, cfg.copy_piece_bytes);
  } catch (...) {
    b.set_needs(me, 0);  // resident and untouched; the others copy this share themselves
    throw;
  }
  rep.copy = std::move(rep.spare);
  rep.generation = g;
  try {  // step 3
    discard_mappings(dev, t, written_only(t, b, g), store, cfg);
  } catch (...) {
    if (t.offloaded()) {  // partial: the copy and the mappings left hold every byte
      t.set_offload_mode(TAGMEM_BACKUP);
    } else {
      rep.spare = std::move(rep.copy);
      b.set_needs(me, 0);
    }
    throw;
  }
  t.set_offload_mode(TAGMEM_BACKUP);
  t.counters().offload_count++;
  t.counters().bytes_offloaded += moved;
  if (logging(log_level::info)) {
    log_line(who(t, rep) + " rank=" + std::to_string(me) + "/" + std::to_string(rep.spec.size) +
             " offloaded alone generation=" + std::to_string(g) + " copied_bytes=" +
             std::to_string(moved) + " waiting_bytes=" + std::to_string(t.arena().mapped_bytes()));
  }
  return t.partial();
}

void wait_for_shares(device& dev, tag& t, host_store& store, const config& cfg, int timeout_ms,
                     const std::atomic<bool>& stop) {
  watch_exit();  // a waiter stops at exit instead of holding exit() for the bound
  const shared_buffer* copy = nullptr;
  std::uint32_t g = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  int seen = -1;  // shares written when the mappings were last looked at
  for (unsigned tick = 0; !stop.load() && !exiting(); ++tick) {
    if (tick) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard lock(t.mutex());
    replication* rep = replication_of(t);
    if (rep == nullptr || rep->copy == nullptr || !t.partial()) return;
    if (copy == nullptr) {
      copy = rep->copy.get();
      g = rep->generation;
    }
    if (rep->copy.get() != copy || rep->generation != g) return;  // reloaded meanwhile
    shared_buffer& b = *rep->copy;
    const bool late = std::chrono::steady_clock::now() >= deadline;
    try {
      std::size_t moved = 0;
      int written = 0;
      for (int k = 0; k < b.shares(); ++k) {
        if (!b.written(k, g)) {
          // Copied here when its replica is late or gone (checked every 50 ms).
          const auto [lo, hi] = b.share(k);
          if ((late || (tick % 50 == 0 && !alive(b.pid_of(k)))) && run_resident(t, lo, hi)) {
            moved += copy_share(dev, t, b, k, g, cfg.copy_piece_bytes);
            if (logging(log_level::info)) {
              log_line(who(t, *rep) + ": copied the share of " + rank_text(b, k) +
                       (late ? ", late," : ", gone,") + " itself");
            }
          }
        }
        written += b.written(k, g) ? 1 : 0;
      }
      t.counters().bytes_offloaded += moved;
      if (written != seen) {
        discard_mappings(dev, t, written_only(t, b, g), store, cfg);
        t.set_offload_mode(TAGMEM_BACKUP);
        seen = written;
      }
    } catch (const std::exception& e) {
      if (logging(log_level::info)) {
        log_line(who(t, *rep) + ": " + std::to_string(t.arena().mapped_bytes()) +
                 " bytes stay mapped until its reload: " + e.what());
      }
      return;
    }
    if (!t.partial() || late) return;
  }
}

}  // namespace tagmem
