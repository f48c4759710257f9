// replica_tier.cpp — Note [replicated offload] in replica_tier.hpp.
#include "replica/replica_tier.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>

#include "base/error.hpp"
#include "driver/context_guard.hpp"
#include "driver/driver.hpp"
#include "observe/log.hpp"
#include "offload/offload_engine.hpp"
#include "peers/group.hpp"
#include "peers/wire.hpp"
#include "replica/replica_layout.hpp"
#include "replica/replication.hpp"
#include "replica/share_copy.hpp"
#include "replica/solo_offload.hpp"

namespace tagmem {
namespace {

// The replicas' session, or none for a group of one.
class replicas {
 public:
  replicas(const replication_spec& s, const char* tag_name, int timeout_ms) : spec_(s) {
    if (s.size == 1) return;
    peers::group_spec g{s.job, replica_session_name(s.group, tag_name), s.rank, s.size, timeout_ms};
    session_ = peers::group_session::join(g, peers::group_op::replicate, true, TAGMEM_SUCCESS, {});
  }
  std::vector<std::string> all_gather(const std::string& blob, const char* what) {
    if (!session_) return {blob};
    return session_->all_gather(blob, what);
  }
  std::string describe(int r) const {
    return session_ ? session_->describe(r) : "rank " + std::to_string(r);
  }
  pid_t pid_of(int r) const { return session_ ? session_->member(r).pid : ::getpid(); }
  // Every replica's outcome; throws the first failure, naming its rank, on every replica.
  void agree(const peers::rank_outcome& mine, const char* what) {
    std::vector<peers::rank_outcome> all{mine};
    if (session_) all = session_->outcomes(mine, what);
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (all[r].status != TAGMEM_SUCCESS) {
        throw error(all[r].status, describe(static_cast<int>(r)) + ": " + all[r].message);
      }
    }
  }
  // Hands rank 0's descriptor, and what it describes, to the others; `receive` adopts it (it
  // must not throw).
  void send_copy(int fd, const std::string& about,
                 const std::function<void(int, const std::string&, peers::owned_fds&)>& receive,
                 const char* what) {
    if (!session_) return;
    std::vector<peers::letter> out;
    if (fd >= 0) {
      for (int r = 1; r < spec_.size; ++r) out.push_back({r, about, {fd}});
    }
    session_->mail(out, receive, what);
  }

 private:
  replication_spec spec_;
  std::unique_ptr<peers::group_session> session_;
};

peers::rank_outcome outcome_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const error& x) {
    return {x.code(), x.what()};
  } catch (const std::exception& x) {
    return {TAGMEM_ERROR_INTERNAL, x.what()};
  } catch (...) {
    return {TAGMEM_ERROR_INTERNAL, "an exception that is not a std::exception"};
  }
}

std::string who(const tag& t, const replication_spec& s) {
  return "replicated tag '" + std::string(t.name()) + "' (group '" + s.group + "')";
}

// Step 1: the replicas' layouts and sampled bytes agree, or every replica throws.
std::vector<replica_layout> compare(device& dev, tag& t, const replication& rep, replicas& group) {
  const std::uint64_t seed = rep.spec.rank == 0 ? std::random_device{}() : 0;
  replica_layout mine = layout_of(t, seed);
  if (rep.spare && rep.spare->bytes() == mine.bytes && rep.spare->shares() == rep.spec.size) {
    mine.spare = rep.spare->token();
    mine.generation = rep.generation;
  }
  std::vector<replica_layout> all;
  for (const std::string& b : group.all_gather(encode_layout(mine), "comparing replicas")) {
    all.push_back(decode_layout(b));
  }
  for (std::size_t r = 1; r < all.size(); ++r) {
    TAGMEM_EXPECTS(all[r].same_as(all[0]) && all[r].bytes == all[0].bytes,
                   TAGMEM_ERROR_INVALID_ARGUMENT,
                   "its replicas differ: " + group.describe(static_cast<int>(r)) + " holds " +
                       all[r].describe() + ", " + group.describe(0) + " " + all[0].describe());
  }
  const std::uint64_t sum = sampled_checksum(dev, t, all[0].seed);
  peers::wire_writer w;
  w.u64(sum);
  const std::vector<std::string> sums = group.all_gather(w.take(), "comparing replicas' bytes");
  for (std::size_t r = 1; r < sums.size(); ++r) {
    TAGMEM_EXPECTS(sums[r] == sums[0], TAGMEM_ERROR_INVALID_ARGUMENT,
                   "its replicas hold different bytes: the sampled checksum of " +
                       group.describe(static_cast<int>(r)) + " differs from " + group.describe(0) +
                       "'s");
  }
  return all;
}

// Step 2: the shared copy in every replica, and the generation of this offload through it (or an
// exception in all). Note [shared copy reuse]: when every replica kept the same copy, it is used
// again, one generation on; else every kept copy goes and rank 0 makes a new one.
std::unique_ptr<shared_buffer> share(device& dev, tag& t, replication& rep, replicas& group,
                                     const std::vector<replica_layout>& all,
                                     std::uint32_t& generation) {
  const replication_spec& s = rep.spec;
  bool reuse = all[0].spare != 0;
  generation = 0;
  for (const replica_layout& l : all) {
    reuse = reuse && l.spare == all[0].spare;
    generation = std::max(generation, l.generation);
  }
  ++generation;
  if (reuse) return std::move(rep.spare);
  rep.spare.reset();  // its memory goes before the new copy's is taken
  generation = 1;
  const std::uint64_t identity = replica_identity(s, t.name());
  std::unique_ptr<shared_buffer> copy;
  std::exception_ptr failed;
  if (s.rank == 0) {
    try {
      copy = shared_buffer::create(dev, identity, all[0].bytes, s.size);
      for (int r = 0; r < s.size; ++r) copy->set_pid(r, group.pid_of(r));
    } catch (...) {
      failed = std::current_exception();
    }
  }
  group.send_copy(
      copy ? copy->fd() : -1, copy ? std::to_string(static_cast<int>(copy->way())) : "",
      [&](int from, const std::string& about, peers::owned_fds& fds) {
        try {
          TAGMEM_EXPECTS(from == 0 && fds.size() == 1, TAGMEM_ERROR_PEER,
                         group.describe(from) + " sent something else than the shared host copy");
          const auto way = static_cast<host_share_way>(about == "1" ? 1 : about == "2" ? 2 : 0);
          copy = shared_buffer::adopt(dev, fds.take(0), way, identity, all[0].bytes, s.size,
                                      group.describe(from));
        } catch (...) {
          if (!failed) failed = std::current_exception();
        }
      },
      "handing out the shared host copy");
  if (!copy && !failed) {
    failed = std::make_exception_ptr(
        error(TAGMEM_ERROR_PEER, "no shared host copy came from " + group.describe(0)));
  }
  group.agree(failed ? outcome_of(failed) : peers::rank_outcome{}, "setting up the shared copy");
  return copy;
}

}  // namespace

void offload_replicated(device& dev, tag& t, host_store& store, const config& cfg, int timeout_ms) {
  replication& rep = *replication_of(t);
  tag* self = &t;
  const replication_spec s = rep.spec;
  {
    context_guard guard(dev.context());
    TAGMEM_CU(cuCtxSynchronize, dev.context());  // Note [offload waits]
  }
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f",
                  std::chrono::duration<double, std::milli>(b - a).count());
    return std::string(text);
  };
  const clock::time_point start = clock::now();
  clock::time_point met, copied, agreed;
  std::unique_ptr<shared_buffer> copy;
  std::uint32_t generation = 0;
  std::size_t moved = 0;
  {
    std::optional<replicas> group;
    try {
      group.emplace(s, t.name(), timeout_ms);
      copy = share(dev, t, rep, *group, compare(dev, t, rep, *group), generation);
    } catch (const error& e) {  // every tag untouched: say which one
      throw error(e.code(), "offloading " + who(t, s) + ": " + e.what());
    }
    met = clock::now();
    std::exception_ptr own;  // step 3: this replica's share
    try {
      moved += copy_share(dev, t, *copy, s.rank, generation, cfg.copy_piece_bytes);
      note_group_offload(dev, t, *copy, s.rank, generation);  // Note [offload alone]
    } catch (...) {
      copy->set_needs(s.rank, 0);
      own = std::current_exception();
    }
    copied = clock::now();
    try {  // step 4: the others', bounded; a replica gone or late is covered below
      group->agree(own ? outcome_of(own) : peers::rank_outcome{}, "writing the shares");
    } catch (...) {
    }
    agreed = clock::now();
    if (own) std::rethrow_exception(own);  // the tag is untouched; the others fill this share
  }
  int filled = 0;
  for (int k = 0; k < s.size; ++k) {
    if (copy->written(k, generation)) continue;
    moved += copy_share(dev, t, *copy, k, generation, cfg.copy_piece_bytes);
    ++filled;
  }
  if (logging(log_level::info)) {  // the offload's own line follows, from the pipeline
    log_line(who(t, s) + " rank=" + std::to_string(s.rank) + "/" + std::to_string(s.size) +
             " generation=" + std::to_string(generation) +
             " copied_bytes=" + std::to_string(moved) + " filled_shares=" + std::to_string(filled) +
             " meet_ms=" + ms(start, met) + " share_ms=" + ms(met, copied) +
             " wait_ms=" + ms(copied, agreed) + " fill_ms=" + ms(agreed, clock::now()));
  }
  try {  // step 5
    offload_tags(dev, &self, 1, TAGMEM_DISCARD, store, cfg);
  } catch (...) {
    if (t.offloaded()) {  // partial: the shared copy holds what was unmapped
      rep.copy = std::move(copy);
      rep.generation = generation;
      t.set_offload_mode(TAGMEM_BACKUP);
    } else {
      copy->set_needs(s.rank, 0);
    }
    throw;
  }
  rep.copy = std::move(copy);
  rep.generation = generation;
  t.counters().bytes_offloaded += moved;
  t.set_offloaded(TAGMEM_BACKUP);
}

void reload_replicated(device& dev, tag& t, host_store& store, const config& cfg) {
  replication& rep = *replication_of(t);
  tag* self = &t;
  shared_buffer& b = *rep.copy;
  // A share not written is still in the mappings it lies in (Note [offload alone]), or lost to
  // this replica for now.
  for (int k = 0; k < b.shares(); ++k) {
    TAGMEM_EXPECTS(
        b.written(k, rep.generation) || run_resident(t, b.share(k).begin, b.share(k).end),
        TAGMEM_ERROR_PEER,
        "the shared host copy of " + who(t, rep.spec) + " lacks the share of rank " +
            std::to_string(k) + " (pid " + std::to_string(b.pid_of(k)) +
            "), which never wrote it; the tag stays offloaded");
  }
  const bool waited = t.partial();  // mappings that waited for shares keep their bytes
  t.set_offload_mode(TAGMEM_DISCARD);
  try {
    reload_tags(dev, &self, 1, store, cfg);
  } catch (...) {
    if (t.offloaded()) t.set_offload_mode(TAGMEM_BACKUP);
    throw;
  }
  std::size_t copied = 0;
  try {
    for (int k = 0; k < b.shares(); ++k) {
      if (!b.written(k, rep.generation)) continue;
      const auto [lo, hi] = b.share(k);
      copy_to_device(dev, t, lo, hi, b.data() + lo, cfg.copy_piece_bytes);
      copied += hi - lo;
    }
  } catch (...) {
    // The bytes are not all back: unmap again what the copy holds and keep it (retryable).
    try {
      if (waited) {
        discard_mappings(dev, t, written_only(t, b, rep.generation), store, cfg);
      } else {
        offload_tags(dev, &self, 1, TAGMEM_DISCARD, store, cfg);
        t.counters().offload_count--;  // neither the reload nor this offload happened
      }
      t.counters().reload_count--;
    } catch (...) {  // left partial (or resident) by the pipeline: the copy stays with it
    }
    if (t.offloaded()) t.set_offload_mode(TAGMEM_BACKUP);
    throw;
  }
  t.counters().bytes_reloaded += copied;
  b.set_needs(rep.spec.rank, 0);
  rep.spare = std::move(rep.copy);  // Note [shared copy reuse]
}

}  // namespace tagmem
