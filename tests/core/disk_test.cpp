// disk_test.cpp — TAGMEM_BACKUP_DISK: tags offloaded to files and reloaded byte for byte, with
// the file system's failures injected through the disk tier's seam (disk/disk_io.hpp): a full
// disk, EIO, short writes, and files removed, truncated or changed before the reload. Each
// failure is an error with a message, the tag keeps its bytes, and no file stays behind.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "disk/disk_io.hpp"
#include "test_support.hpp"

namespace tagmem::test {
namespace {

namespace fs = std::filesystem;

// Fails the n-th pwrite or pread (counting from 1) with `err`, or makes writes short.
class faulty_io : public disk_io {
 public:
  std::atomic<int> writes{0}, reads{0};
  int fail_write_at = 0, fail_read_at = 0, write_errno = 0, read_errno = 0;
  bool halve_writes = false;  // every write does half of what it is asked (a short write)
  bool zero_writes = false;   // every write makes no progress

  ssize_t pwrite(int fd, const void* buf, std::size_t n, off_t offset) override {
    const int k = ++writes;
    if (k == fail_write_at) {
      errno = write_errno;
      return -1;
    }
    if (zero_writes) return 0;
    if (halve_writes && n > 1) n /= 2;
    return disk_io::pwrite(fd, buf, n, offset);
  }
  ssize_t pread(int fd, void* buf, std::size_t n, off_t offset) override {
    const int k = ++reads;
    if (k == fail_read_at) {
      errno = read_errno;
      return -1;
    }
    return disk_io::pread(fd, buf, n, offset);
  }
};

class Disk : public tagmem_test {
 protected:
  void SetUp() override {
    tagmem_test::SetUp();
    char tmpl[] = "/tmp/tagmem_disk_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    TAGMEM_OK(tagmem_set_disk_dir(dir_.c_str()));
    TAGMEM_OK(tagmem_set_disk_file_bytes(2 << 20));  // several files per mapping
  }
  void TearDown() override {
    replace_disk_io(nullptr);
    tagmem_test::TearDown();
    std::error_code ec;
    EXPECT_EQ(files().size(), 0u) << "files left in " << dir_ << " after shutdown";
    fs::remove_all(dir_, ec);
  }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) out.push_back(e.path().string());
    return out;
  }
  std::uintmax_t disk_bytes() const {
    std::uintmax_t n = 0;
    for (const auto& f : files()) n += fs::file_size(f);
    return n;
  }
  static tagmem_status offload(const char* tag) {
    const char* tags[] = {tag};
    return tagmem_offload(tags, 1, 0, TAGMEM_BACKUP_DISK);
  }
  static tagmem_status reload(const char* tag) {
    const char* tags[] = {tag};
    return tagmem_reload(tags, 1, 0);
  }
  std::string dir_;
};

std::size_t mapped_bytes_of(const char* tag) {
  tagmem_tag_stats s{};
  EXPECT_EQ(tagmem_tag_stats_get(tag, 0, &s), TAGMEM_SUCCESS) << tagmem_last_error();
  return s.mapped_bytes;
}

TEST_F(Disk, OffloadAndReloadKeepEveryByteAndLeaveNoFile) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 3, (5 << 20) + 4321);
  auto small = fill(rng, "w", 4, 777);
  all.insert(all.end(), small.begin(), small.end());
  std::uintmax_t first_size = 0;
  for (int cycle = 0; cycle < 3; ++cycle) {
    TAGMEM_OK(offload("w"));
    EXPECT_EQ(state_of("w"), TAGMEM_OFFLOADED_DISK);
    EXPECT_EQ(mapped_bytes_of("w"), 0u);
    EXPECT_GE(files().size(), 2u) << "files of at most 2 MiB";
    EXPECT_GE(disk_bytes(), 3u * ((5 << 20) + 4321));
    if (cycle == 0) first_size = disk_bytes();
    EXPECT_EQ(disk_bytes(), first_size) << "disk usage changed across cycles";
    TAGMEM_OK(reload("w"));
    EXPECT_EQ(state_of("w"), TAGMEM_RESIDENT);
    EXPECT_EQ(corrupted(all), 0u);
    EXPECT_EQ(files().size(), 0u) << "a reload left its files";
    refill(rng, all);
  }
  free_all(all);
}

TEST_F(Disk, EachCycleWritesTheSameFilesOnePerMapping) {
  // Reloading from disk keeps the mappings as they were: they are not coalesced, so the next
  // offload writes a file per mapping again, not one for all of them.
  TAGMEM_OK(tagmem_set_disk_file_bytes(0));  // TAGMEM_DISK_FILE_BYTES: 1 GiB, no cut here
  auto rng = rng_for_test();
  auto all = fill(rng, "m", 2, (3 << 20) + 99);
  auto small = fill(rng, "m", 1, 5);
  all.insert(all.end(), small.begin(), small.end());
  std::size_t first = 0;
  for (int cycle = 0; cycle < 3; ++cycle) {
    TAGMEM_OK(offload("m"));
    if (cycle == 0) first = files().size();
    EXPECT_GE(files().size(), 2u);
    EXPECT_EQ(files().size(), first) << "cycle " << cycle;
    TAGMEM_OK(reload("m"));
    EXPECT_EQ(corrupted(all), 0u);
    refill(rng, all);
  }
  free_all(all);
}

// PyTorch's shape in a MemPool: a 2 MiB segment and a 14 MiB one, which tagmem serves from one
// 20 MiB mapping. Each allocation gets its own file (torch_memory_saver's callers count them),
// and what the mapping holds beyond its allocations is not written; a freed allocation is not.
TEST_F(Disk, EachAllocationIsAFileAndFreeMemoryIsNotWritten) {
  TAGMEM_OK(tagmem_set_disk_file_bytes(0));  // TAGMEM_DISK_FILE_BYTES: 1 GiB, no cut here
  auto rng = rng_for_test();
  auto small = fill(rng, "p", 1, 2 << 20);
  auto big = fill(rng, "p", 1, 14 << 20);
  ASSERT_EQ(mapped_bytes_of("p"), std::size_t{20} << 20) << "the two should share one mapping";
  for (int cycle = 0; cycle < 2; ++cycle) {
    TAGMEM_OK(offload("p"));
    EXPECT_EQ(files().size(), 2u) << "cycle " << cycle;
    EXPECT_EQ(disk_bytes(), std::uintmax_t{16} << 20) << "cycle " << cycle;
    TAGMEM_OK(reload("p"));
    EXPECT_EQ(corrupted(small), 0u);
    EXPECT_EQ(corrupted(big), 0u);
    refill(rng, small);
    refill(rng, big);
  }
  free_all(small);
  TAGMEM_OK(offload("p"));
  EXPECT_EQ(files().size(), 1u);
  EXPECT_EQ(disk_bytes(), std::uintmax_t{14} << 20);
  TAGMEM_OK(reload("p"));
  EXPECT_EQ(corrupted(big), 0u);
  free_all(big);
}

// Note [a freed allocation's disk copy]: freeing an allocation of a tag on disk removes its file
// at once; the reload reads the others' bytes back, and then no file is left.
TEST_F(Disk, AFreeWhileOnDiskRemovesThatAllocationsFileAtOnce) {
  TAGMEM_OK(tagmem_set_disk_file_bytes(0));  // one file per allocation
  auto rng = rng_for_test();
  auto all = fill(rng, "d", 3, 3 << 20);
  TAGMEM_OK(offload("d"));
  ASSERT_EQ(files().size(), 3u);
  const std::uintmax_t before = disk_bytes();
  TAGMEM_OK(tagmem_free(all[1].ptr, nullptr));
  EXPECT_EQ(files().size(), 2u) << "the freed allocation's file stayed until the reload";
  EXPECT_EQ(disk_bytes(), before - (3u << 20));
  EXPECT_EQ(state_of("d"), TAGMEM_OFFLOADED_DISK);
  all.erase(all.begin() + 1);
  TAGMEM_OK(reload("d"));
  EXPECT_EQ(corrupted(all), 0u);
  EXPECT_EQ(files().size(), 0u);
  // Every allocation freed while on disk: no file is left, and the tag reloads empty.
  TAGMEM_OK(offload("d"));
  free_all(all);
  EXPECT_EQ(files().size(), 0u);
  TAGMEM_OK(reload("d"));
}

// Files are whole 4 KiB pages (O_DIRECT): four 1 KiB allocations side by side in one page of a
// small segment share that page's file.
TEST_F(Disk, SmallAllocationsSharingAPageShareItsFile) {
  auto rng = rng_for_test();
  auto small = fill(rng, "s", 4, 777);  // rounded to 1 KiB each
  TAGMEM_OK(offload("s"));
  EXPECT_EQ(files().size(), 1u);
  EXPECT_EQ(disk_bytes(), std::uintmax_t{4096});
  TAGMEM_OK(reload("s"));
  EXPECT_EQ(corrupted(small), 0u);
  free_all(small);
}

TEST_F(Disk, SeveralTagsAndOtherModesReloadTogether) {
  auto rng = rng_for_test();
  auto a = fill(rng, "a", 2, 3 << 20);
  auto b = fill(rng, "b", 2, 3 << 20);
  const char* both[] = {"a", "b"};
  TAGMEM_OK(tagmem_offload(both, 1, 0, TAGMEM_BACKUP));
  TAGMEM_OK(offload("b"));
  EXPECT_EQ(state_of("a"), TAGMEM_OFFLOADED_BACKUP);
  EXPECT_EQ(state_of("b"), TAGMEM_OFFLOADED_DISK);
  const char* in[] = {"b", "a"};
  TAGMEM_FAILS_WITH(tagmem_swap(nullptr, 0, in, 1, 0, TAGMEM_BACKUP),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_OK(tagmem_reload(in, 2, 0));
  EXPECT_EQ(corrupted(a), 0u);
  EXPECT_EQ(corrupted(b), 0u);
  EXPECT_EQ(files().size(), 0u);
}

TEST_F(Disk, WithoutADirectoryTheOffloadIsRefused) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 1, 1 << 20);
  TAGMEM_FAILS_WITH(tagmem_set_disk_dir("/nonexistent/tagmem"), TAGMEM_ERROR_INVALID_ARGUMENT);
  TAGMEM_OK(tagmem_set_disk_dir(nullptr));  // TAGMEM_DISK_DIR, unset here
  TAGMEM_FAILS_WITH(offload("w"), TAGMEM_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(state_of("w"), TAGMEM_RESIDENT);
  EXPECT_EQ(corrupted(all), 0u);
  const char* tags[] = {"w"};
  TAGMEM_FAILS_WITH(tagmem_swap(tags, 1, nullptr, 0, 0, TAGMEM_BACKUP_DISK),
                    TAGMEM_ERROR_INVALID_ARGUMENT);
}

TEST_F(Disk, ShortWritesGoOnAndAWriteWithoutProgressFails) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 2, (3 << 20) + 5);
  faulty_io io;
  io.halve_writes = true;
  replace_disk_io(&io);
  TAGMEM_OK(offload("w"));
  EXPECT_GT(io.writes.load(), 2);
  TAGMEM_OK(reload("w"));
  EXPECT_EQ(corrupted(all), 0u);

  io.halve_writes = false;
  io.zero_writes = true;
  TAGMEM_FAILS_WITH(offload("w"), TAGMEM_ERROR_IO);
  EXPECT_NE(std::string(tagmem_last_error()).find("short write"), std::string::npos)
      << tagmem_last_error();
  EXPECT_EQ(state_of("w"), TAGMEM_RESIDENT);
  EXPECT_EQ(corrupted(all), 0u);
  EXPECT_EQ(files().size(), 0u);
}

class DiskWriteFault : public Disk, public ::testing::WithParamInterface<int> {};

// A full disk or an I/O error on a write, first or later: the tag stays resident with its bytes.
TEST_P(DiskWriteFault, TheTagStaysResidentWithItsBytes) {
  auto rng = rng_for_test();
  restart_with_env("TAGMEM_DISK_PIECE_BYTES", "1MiB");  // many writes
  TAGMEM_OK(tagmem_set_disk_dir(dir_.c_str()));
  TAGMEM_OK(tagmem_set_disk_file_bytes(2 << 20));
  auto all = fill(rng, "w", 3, (4 << 20) + 99);
  faulty_io io;
  io.write_errno = GetParam();
  for (int at : {1, 3, 6}) {
    io.writes = 0;
    io.fail_write_at = at;
    replace_disk_io(&io);
    TAGMEM_FAILS_WITH(offload("w"), TAGMEM_ERROR_IO);
    EXPECT_NE(std::string(tagmem_last_error()).find(std::strerror(GetParam())), std::string::npos)
        << tagmem_last_error();
    EXPECT_EQ(state_of("w"), TAGMEM_RESIDENT);
    EXPECT_EQ(corrupted(all), 0u);
    EXPECT_EQ(files().size(), 0u) << "a failed offload left files";
  }
  replace_disk_io(nullptr);
  TAGMEM_OK(offload("w"));  // and the next try works
  TAGMEM_OK(reload("w"));
  EXPECT_EQ(corrupted(all), 0u);
}

INSTANTIATE_TEST_SUITE_P(Errors, DiskWriteFault, ::testing::Values(ENOSPC, EIO));

TEST_F(Disk, AReadErrorLeavesTheTagOffloadedAndARetryWorks) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 3, (4 << 20) + 1);
  TAGMEM_OK(offload("w"));
  const std::size_t on_disk = files().size();
  faulty_io io;
  io.read_errno = EIO;
  io.fail_read_at = 2;
  replace_disk_io(&io);
  TAGMEM_FAILS_WITH(reload("w"), TAGMEM_ERROR_IO);
  EXPECT_EQ(state_of("w"), TAGMEM_OFFLOADED_DISK);
  EXPECT_EQ(mapped_bytes_of("w"), 0u);
  EXPECT_EQ(files().size(), on_disk);
  replace_disk_io(nullptr);
  TAGMEM_OK(reload("w"));
  EXPECT_EQ(corrupted(all), 0u);
  EXPECT_EQ(files().size(), 0u);
}

TEST_F(Disk, AFileRemovedBeforeReloadIsStillReadThroughItsDescriptor) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 2, (3 << 20) + 17);
  TAGMEM_OK(offload("w"));
  for (const auto& f : files()) ASSERT_EQ(::unlink(f.c_str()), 0);
  TAGMEM_OK(reload("w"));
  EXPECT_EQ(corrupted(all), 0u);
}

TEST_F(Disk, ATruncatedFileIsAnErrorAndTheTagStaysOffloaded) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 2, (3 << 20) + 17);
  TAGMEM_OK(offload("w"));
  auto names = files();
  ASSERT_FALSE(names.empty());
  // The largest file, cut to half: a file may be a single page (the tail of a range cut at
  // TAGMEM_DISK_FILE_BYTES), which a cut to one page would leave whole.
  const auto largest = *std::max_element(
      names.begin(), names.end(),
      [](const auto& a, const auto& b) { return fs::file_size(a) < fs::file_size(b); });
  const auto size = fs::file_size(largest);
  ASSERT_GT(size, 4096u);
  ASSERT_EQ(::truncate(largest.c_str(), static_cast<off_t>(size / 2)), 0);
  TAGMEM_FAILS_WITH(reload("w"), TAGMEM_ERROR_IO);
  EXPECT_NE(std::string(tagmem_last_error()).find("truncated"), std::string::npos)
      << tagmem_last_error();
  EXPECT_EQ(state_of("w"), TAGMEM_OFFLOADED_DISK);
  EXPECT_EQ(mapped_bytes_of("w"), 0u);
  TAGMEM_FAILS_WITH(reload("w"), TAGMEM_ERROR_IO);  // those bytes are gone: it fails again
  EXPECT_EQ(state_of("w"), TAGMEM_OFFLOADED_DISK);
}

TEST_F(Disk, ChangedBytesOnDiskFailTheChecksum) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 1, 3 << 20);
  TAGMEM_OK(offload("w"));
  auto names = files();
  ASSERT_FALSE(names.empty());
  const int fd = ::open(names.front().c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const auto junk = random_bytes(rng, 512);
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 8192), 512);
  ::close(fd);
  TAGMEM_FAILS_WITH(reload("w"), TAGMEM_ERROR_IO);
  EXPECT_NE(std::string(tagmem_last_error()).find("checksum"), std::string::npos)
      << tagmem_last_error();
  EXPECT_EQ(state_of("w"), TAGMEM_OFFLOADED_DISK);
}

class EmulatorDisk : public Disk {};

// The pipeline fails while unmapping after the files are written: the tag it restored is resident
// again with the bytes read back from the files (a DISCARD restore alone would not have them).
TEST_F(EmulatorDisk, AnUnmapThatFailsLeavesTheTagResidentWithItsBytes) {
  ASSERT_TRUE(emulator().fail_call && emulator().clear_faults);
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 4, (24 << 20) + 3);  // one mapping each
  ASSERT_EQ(emulator().fail_call("cuMemUnmap", 2, CUDA_ERROR_UNKNOWN), 0);
  const tagmem_status s = offload("w");
  emulator().clear_faults();
  EXPECT_NE(s, TAGMEM_SUCCESS);
  const tagmem_tag_state st = state_of("w");
  if (st == TAGMEM_RESIDENT) {
    EXPECT_EQ(corrupted(all), 0u);
    EXPECT_EQ(files().size(), 0u);
  } else {  // left partial: it keeps its files, refuses another offload, and reloads whole
    EXPECT_EQ(st, TAGMEM_OFFLOADED_DISK);
    TAGMEM_FAILS_WITH(offload("w"), TAGMEM_ERROR_TAG_OFFLOADED);
    const char* tags[] = {"w"};
    TAGMEM_FAILS_WITH(tagmem_offload(tags, 1, 0, TAGMEM_BACKUP), TAGMEM_ERROR_TAG_OFFLOADED);
    TAGMEM_OK(reload("w"));
    EXPECT_EQ(corrupted(all), 0u);
  }
  TAGMEM_OK(offload("w"));  // and a later one works
  TAGMEM_OK(reload("w"));
  EXPECT_EQ(corrupted(all), 0u);
}

// Each offload and reload takes pinned bounce buffers on threads of its own and gives every one
// back to the driver before it returns.
TEST_F(EmulatorDisk, BounceBuffersGoBackToTheDriver) {
  const std::size_t pinned = emulator().pinned_host_bytes();
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 3, (5 << 20) + 11);
  for (int round = 0; round < 2; ++round) {
    TAGMEM_OK(offload("w"));
    EXPECT_EQ(emulator().pinned_host_bytes(), pinned) << "after offload " << round;
    TAGMEM_OK(reload("w"));
    EXPECT_EQ(emulator().pinned_host_bytes(), pinned) << "after reload " << round;
    EXPECT_EQ(corrupted(all), 0u);
  }
}

TEST_F(Disk, ShutdownRemovesTheFilesOfTagsStillOnDisk) {
  auto rng = rng_for_test();
  auto all = fill(rng, "w", 2, 2 << 20);
  TAGMEM_OK(offload("w"));
  EXPECT_GE(files().size(), 1u);
  ASSERT_EQ(tagmem_shutdown(), TAGMEM_SUCCESS) << tagmem_last_error();
  EXPECT_EQ(files().size(), 0u);
  ASSERT_EQ(tagmem_init(nullptr), TAGMEM_SUCCESS) << tagmem_last_error();
}

}  // namespace
}  // namespace tagmem::test
