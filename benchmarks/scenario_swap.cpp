// scenario_swap.cpp — a trainer <-> engine phase switch: the trainer's weights go out while the
// engine's come in, as one tagmem_swap, against tagmem_offload then tagmem_reload of the same
// tags in the same run (target: swap <= 0.65x of offload-then-reload on the H200).
//
// Both sides are weights-shaped tags of the same size. The first switch pair is a warm-up (it
// pins the store for both backups and coalesces the mappings); then each measured cycle does a
// baseline pair and a swap pair, trainer bytes changing before each time they go out. In the
// tight variant a ballast allocation leaves free only 1/16 of one side next to the resident
// side, so the in-tags fit only as the out-tags leave (Note [unmap as copied] in
// offload_engine.cpp).
#include <cstdio>

#include "scenarios.hpp"

namespace tagmem::bench {

void run_swap(env& e, bool tight) {
  const std::string name = tight ? "swap (memory-tight)" : "swap";
  session s;
  auto sizes = weights_sizes(e.opt.scale);
  dataset engine("engine", sizes);
  engine.fill(e.pat, 1000);
  const char* eng[] = {"engine"};
  const char* trn[] = {"trainer"};
  check(tagmem_offload(eng, 1, 0, TAGMEM_BACKUP), "tagmem_offload (engine)");
  dataset trainer("trainer", sizes);
  std::uint64_t gen = 2000;
  trainer.fill(e.pat, gen);
  const std::size_t side = tag_stats("engine").host_bytes;
  void* ballast = nullptr;
  if (tight) {
    std::size_t free_now = device_stats().device_free_bytes;
    std::size_t leave = side / 16;
    if (free_now > leave + (64u << 20)) {
      std::size_t n = (free_now - leave) / (2u << 20) * (2u << 20);
      check(tagmem_malloc_tagged(&ballast, n, "ballast", 0, nullptr), "ballast");
    }
    std::printf("[%s] free device memory with the trainer resident: %.2f GB; engine side %.2f GB\n",
                name.c_str(), device_stats().device_free_bytes / 1e9, side / 1e9);
  }
  auto timed = [](auto&& f) {
    sync_device();
    auto t0 = clock::now();
    f();
    return seconds_since(t0);
  };
  auto to_engine_base = [&] {
    check(tagmem_offload(trn, 1, 0, TAGMEM_BACKUP), "tagmem_offload (trainer)");
    check(tagmem_reload(eng, 1, 0), "tagmem_reload (engine)");
  };
  auto to_trainer_base = [&] {
    check(tagmem_offload(eng, 1, 0, TAGMEM_BACKUP), "tagmem_offload (engine)");
    check(tagmem_reload(trn, 1, 0), "tagmem_reload (trainer)");
  };
  auto to_engine_swap = [&] { check(tagmem_swap(trn, 1, eng, 1, 0, TAGMEM_BACKUP), "swap"); };
  auto to_trainer_swap = [&] { check(tagmem_swap(eng, 1, trn, 1, 0, TAGMEM_BACKUP), "swap"); };

  double warm = timed(to_engine_swap);
  verify(e, engine, name, 0, true);
  warm += timed(to_trainer_swap);
  verify(e, trainer, name, 0, false);
  std::printf("[%s] warm-up switch pair %.1f ms\n", name.c_str(), warm * 1e3);
  std::vector<double> base_fwd, base_back, swap_fwd, swap_back;
  for (int c = 1; c <= e.opt.swap_cycles; ++c) {
    trainer.fill(e.pat, ++gen);
    base_fwd.push_back(timed(to_engine_base));
    verify(e, engine, name + " baseline", c, false);
    base_back.push_back(timed(to_trainer_base));
    verify(e, trainer, name + " baseline", c, false);
    trainer.fill(e.pat, ++gen);
    swap_fwd.push_back(timed(to_engine_swap));
    verify(e, engine, name, c, false);
    swap_back.push_back(timed(to_trainer_swap));
    verify(e, trainer, name, c, false);
    std::printf("[%s] cycle %d: offload+reload %.1f / %.1f ms, swap %.1f / %.1f ms\n", name.c_str(),
                c, base_fwd.back() * 1e3, base_back.back() * 1e3, swap_fwd.back() * 1e3,
                swap_back.back() * 1e3);
  }
  if (ballast) tagmem_free(ballast, nullptr);
  double bf = median(base_fwd), bb = median(base_back), sf = median(swap_fwd),
         sb = median(swap_back);
  double moved = 2.0 * engine.bytes() / 1e9;  // one side out, the other in
  e.out.add(name, "bytes each way", format_bytes(engine.bytes()));
  e.out.add(name, "offload-then-reload ms (to engine / to trainer)",
            fixed(bf * 1e3, 1) + " / " + fixed(bb * 1e3, 1));
  e.out.add(name, "swap ms (to engine / to trainer)",
            fixed(sf * 1e3, 1) + " / " + fixed(sb * 1e3, 1),
            fixed(moved / sf, 1) + " GB/s = " + fixed(moved / sf / e.link.bidir, 2) +
                " of link bidirectional");
  e.out.add(name, "swap / offload-then-reload", fixed(sf / bf, 3) + " / " + fixed(sb / bb, 3),
            "target <= 0.65");
  e.out.add(name, "pinned high-water GB", fixed(device_stats().host_pinned_high_water / 1e9, 2),
            "two backups: both sides' bytes");
}

}  // namespace tagmem::bench
