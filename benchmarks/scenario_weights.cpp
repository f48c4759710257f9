// scenario_weights.cpp — BACKUP offload and reload of one tag, cycle after cycle: the *weights*
// scenario (291 tensors shaped like an 8B model) and *many small* (the same bytes in 10,000+
// tensors), with or without pre-pinning the host store.
//
// Cycle 1 is reported apart: it is the one that pins the host store (unless pre-pinned) and
// that unmaps the segments the allocations were made in (later cycles unmap the few large
// mappings reload made, Note [reload coalescing]). Steady state is the median of cycles 2..N.
// Pre-pinning calls tagmem_host_reserve(bytes, wait=0) before filling the tensors, then waits
// for the background pinning before cycle 1; how long that pinning took is reported too.
#include <cstdio>
#include <thread>

#include "scenarios.hpp"

namespace tagmem::bench {

void run_weights(env& e, const std::string& name, const std::vector<std::size_t>& sizes,
                 bool prepin) {
  session s;
  const char* tag = "weights";
  dataset d(tag, sizes);
  tagmem_tag_stats st = tag_stats(tag);
  const std::size_t mapped = st.mapped_bytes;
  const std::uint64_t mappings_before = st.mappings;
  double pin_seconds = 0, pin_wait = 0;
  auto t_reserve = clock::now();
  if (prepin) check(tagmem_host_reserve(mapped, 0), "tagmem_host_reserve");
  d.fill(e.pat, 0);
  if (prepin) {
    auto t_wait = clock::now();
    while (device_stats().host_pinned_bytes < mapped) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (seconds_since(t_wait) > 300) throw std::runtime_error("background pinning never ended");
    }
    pin_wait = seconds_since(t_wait);
    pin_seconds = seconds_since(t_reserve);
  }
  const char* tags[] = {tag};
  std::vector<double> off, rel;
  std::vector<std::size_t> high_water;
  std::uint64_t mappings_after = 0;
  for (int c = 1; c <= e.opt.cycles; ++c) {
    sync_device();
    auto t0 = clock::now();
    check(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), "tagmem_offload");
    off.push_back(seconds_since(t0));
    t0 = clock::now();
    check(tagmem_reload(tags, 1, 0), "tagmem_reload");
    rel.push_back(seconds_since(t0));
    high_water.push_back(device_stats().host_pinned_high_water);
    mappings_after = tag_stats(tag).mappings;
    std::printf("[%s] cycle %d: offload %.1f ms, reload %.1f ms\n", name.c_str(), c,
                off.back() * 1e3, rel.back() * 1e3);
    verify(e, d, name, c, c == 1);
    d.fill(e.pat, c);  // new bytes for the next cycle: a stale backup cannot pass
  }
  const double gb = d.bytes() / 1e9;
  std::vector<double> off_steady(off.begin() + 1, off.end()),
      rel_steady(rel.begin() + 1, rel.end());
  double off_ss = gb / median(off_steady), rel_ss = gb / median(rel_steady);
  double off_c1 = gb / off[0], rel_c1 = gb / rel[0];
  const char* target_ratio = d.count() > 1000 ? ">= 0.90" : ">= 0.95";
  e.out.add(
      name, "tensors / user bytes / mapped bytes",
      std::to_string(d.count()) + " / " + fixed(gb, 2) + " GB / " + fixed(mapped / 1e9, 2) + " GB");
  e.out.add(name, "offload GB/s cycle 1", fixed(off_c1, 2),
            fixed(off_c1 / e.link.d2h, 2) + " of link D2H");
  e.out.add(name, "offload GB/s steady (median c2..)", fixed(off_ss, 2),
            fixed(off_ss / e.link.d2h, 3) + " of link D2H (target " + target_ratio + ")");
  e.out.add(name, "reload GB/s cycle 1", fixed(rel_c1, 2),
            fixed(rel_c1 / e.link.h2d, 2) + " of link H2D");
  e.out.add(name, "reload GB/s steady (median c2..)", fixed(rel_ss, 2),
            fixed(rel_ss / e.link.h2d, 3) + " of link H2D (target " + target_ratio + ")");
  e.out.add(name, "cycle 1 / steady time (offload, reload)",
            fixed(off[0] / median(off_steady), 2) + ", " + fixed(rel[0] / median(rel_steady), 2),
            prepin ? "target <= 1.5 (pre-pinned)" : "not pre-pinned: cycle 1 pins the store");
  if (prepin) {
    e.out.add(name, "background pinning s (reserve -> done)", fixed(pin_seconds, 2),
              "of which " + fixed(pin_wait, 2) + " s after the fill ended");
  }
  e.out.add(name, "pinned high-water GB c1 -> last",
            fixed(high_water.front() / 1e9, 2) + " -> " + fixed(high_water.back() / 1e9, 2),
            high_water.front() == high_water.back() ? "flat" : "GREW after cycle 1");
  e.out.add(name, "mappings before c1 -> after reload",
            std::to_string(mappings_before) + " -> " + std::to_string(mappings_after),
            "cycle 1 unmaps each of the first");
}

}  // namespace tagmem::bench
