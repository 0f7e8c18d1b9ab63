#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/offload/disk_store.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

// O_DIRECT needs kAlign-aligned host memory.
struct AlignedBuf {
  std::unique_ptr<unsigned char, decltype(&std::free)> p{nullptr, &std::free};
  size_t n = 0;
  explicit AlignedBuf(size_t bytes) : p(static_cast<unsigned char*>(std::aligned_alloc(DiskStore::kAlign, bytes)), &std::free), n(bytes) {
    REQUIRE(p);
  }
  unsigned char* data() { return p.get(); }
};

void fill_random(AlignedBuf& b, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t i = 0; i < b.n; i += 4) {
    const uint32_t v = rng();
    std::memcpy(b.data() + i, &v, std::min<size_t>(4, b.n - i));
  }
}

// A fresh directory per test under the system temp dir (tmpfs or a disk: both must work).
struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("strata-test-disk-" + std::to_string(getpid()) + "-" + std::to_string(n++));
    fs::remove_all(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  size_t files() const {
    if (!fs::exists(path)) return 0;
    return size_t(std::distance(fs::directory_iterator(path), fs::directory_iterator()));
  }
};

bool io_uring_available() {
  TempDir d;
  try {
    DiskStore s(d.path, 0, DiskIoMode::IoUring);
    return true;
  } catch (const Error& e) {
    WARN("io_uring unavailable here, skipping the forced io_uring mode: " << e.what());
    return false;
  }
}

std::vector<DiskIoMode> modes() {
  std::vector<DiskIoMode> m = {DiskIoMode::Pread, DiskIoMode::Auto};
  if (io_uring_available()) m.push_back(DiskIoMode::IoUring);
  return m;
}

const char* mode_name(DiskIoMode m) { return m == DiskIoMode::Pread ? "Pread" : m == DiskIoMode::IoUring ? "IoUring" : "Auto"; }

void round_trip(const fs::path& dir, DiskIoMode mode) {
  DiskStore store(dir, 32 * kMiB, mode);
  INFO("mode " << mode_name(mode) << ", io " << store.io_name() << ", file " << store.path());
  if (mode == DiskIoMode::Pread) CHECK(std::string(store.io_name()).rfind("pread+", 0) == 0);
  if (mode == DiskIoMode::IoUring) CHECK(std::string(store.io_name()).rfind("io_uring+", 0) == 0);
  CHECK(fs::exists(store.path()));

  // Sizes that are not multiples of the 1 MiB chunk, several regions, written out of order.
  const std::vector<size_t> sizes = {5 * kMiB + 3 * 4096, 4096, 3 * kMiB, 7 * kMiB + 4096};
  std::vector<size_t> offsets;
  std::vector<AlignedBuf> data;
  for (size_t i = 0; i < sizes.size(); ++i) {
    offsets.push_back(store.allocate(sizes[i]));
    data.emplace_back(sizes[i]);
    fill_random(data.back(), uint32_t(17 + i));
  }
  for (size_t i = sizes.size(); i-- > 0;) store.write(offsets[i], data[i].data(), sizes[i]);
  for (size_t i = 0; i < sizes.size(); ++i) {
    AlignedBuf back(sizes[i]);
    std::memset(back.data(), 0xA5, back.n);  // poison, so an unread page shows
    store.read(offsets[i], back.data(), sizes[i]);
    CHECK(std::memcmp(back.data(), data[i].data(), sizes[i]) == 0);
  }
  // A piece from the middle of a region.
  AlignedBuf mid(kMiB + 8192);
  store.read(offsets[0] + 2 * 4096, mid.data(), mid.n);
  CHECK(std::memcmp(mid.data(), data[0].data() + 2 * 4096, mid.n) == 0);
  // Overwrite in place and read back.
  fill_random(data[2], 99);
  store.write(offsets[2], data[2].data(), sizes[2]);
  AlignedBuf back(sizes[2]);
  store.read(offsets[2], back.data(), sizes[2]);
  CHECK(std::memcmp(back.data(), data[2].data(), sizes[2]) == 0);

  size_t total = 0;
  for (size_t s : sizes) total += s;
  const DiskIoStats st = store.stats();
  CHECK(st.bytes_written == total + sizes[2]);
  CHECK(st.bytes_read == total + mid.n + sizes[2]);
  CHECK(st.read_seconds > 0);
  CHECK(st.write_seconds > 0);
}

}  // namespace

TEST_CASE("disk store round trip of random bytes in every I/O mode", "[disk]") {
  TempDir dir;
  for (DiskIoMode m : modes()) round_trip(dir.path, m);
  CHECK(dir.files() == 0);
}

TEST_CASE("disk store works on tmpfs, falling back from O_DIRECT if refused", "[disk]") {
  if (!fs::is_directory("/dev/shm") || access("/dev/shm", W_OK) != 0) {
    WARN("no writable /dev/shm; skipped");
    return;
  }
  const fs::path dir = fs::path("/dev/shm") / ("strata-test-disk-" + std::to_string(getpid()));
  for (DiskIoMode m : modes()) round_trip(dir, m);
  fs::remove_all(dir);
}

TEST_CASE("STRATA_DISK_IO chooses the mode of an Auto store", "[disk]") {
  TempDir dir;
  setenv("STRATA_DISK_IO", "pread", 1);
  {
    DiskStore s(dir.path, kMiB);
    CHECK(std::string(s.io_name()).rfind("pread+", 0) == 0);
  }
  setenv("STRATA_DISK_IO", "mmap", 1);
  CHECK_THROWS_WITH(DiskStore(dir.path, kMiB), Catch::Contains("STRATA_DISK_IO") && Catch::Contains("mmap"));
  unsetenv("STRATA_DISK_IO");
}

TEST_CASE("disk store rejects unaligned and out-of-range arguments", "[disk]") {
  TempDir dir;
  DiskStore store(dir.path, 4 * kMiB, DiskIoMode::Pread);
  AlignedBuf buf(2 * 4096);
  unsigned char* p = buf.data();
  CHECK_THROWS_WITH(store.write(100, p, 4096), Catch::Contains("aligned") && Catch::Contains("offset 100"));
  CHECK_THROWS_WITH(store.write(0, p, 100), Catch::Contains("aligned"));
  CHECK_THROWS_WITH(store.write(0, p + 1, 4096), Catch::Contains("aligned"));
  CHECK_THROWS_WITH(store.read(4096, p + 8, 4096), Catch::Contains("aligned"));
  CHECK_THROWS_WITH(store.read(4 * kMiB, p, 4096), Catch::Contains("capacity"));
  CHECK_THROWS_WITH(store.write(4 * kMiB - 4096, p, 8192), Catch::Contains("capacity"));
  CHECK_NOTHROW(store.write(4 * kMiB - 4096, p, 4096));
}

TEST_CASE("disk store allocation rounds to the alignment and stops at capacity", "[disk]") {
  TempDir dir;
  DiskStore store(dir.path, 5 * 4096, DiskIoMode::Pread);
  CHECK(store.allocate(1) == 0);
  CHECK(store.allocate(4096) == 4096);
  CHECK(store.allocate(5000) == 2 * 4096);
  CHECK(store.allocated() == 4 * 4096);
  CHECK_THROWS_WITH(store.allocate(4097), Catch::Contains("disk store of 20480 bytes") && Catch::Contains("full"));
  CHECK(store.allocate(4096) == 4 * 4096);
  CHECK_THROWS_WITH(store.allocate(1), Catch::Contains("full"));
  CHECK_THROWS_WITH(store.allocate(size_t(-1)), Catch::Contains("full"));
}

TEST_CASE("disk store refuses a capacity beyond the free space before creating anything", "[disk]") {
  TempDir dir;
  CHECK_THROWS_WITH(DiskStore(dir.path, size_t(1) << 60),
                    Catch::Contains(dir.path.string()) && Catch::Contains("free") && Catch::Contains("1.00 EiB"));
  CHECK(dir.files() == 0);
  CHECK(free_disk_space(dir.path) > 0);
}

TEST_CASE("disk store reports injected read and disk-full errors with path and offset", "[disk]") {
  TempDir dir;
  for (DiskIoMode m : modes()) {
    DiskStore store(dir.path, 8 * kMiB, m);
    INFO("io " << store.io_name());
    AlignedBuf buf(3 * kMiB);
    fill_random(buf, 5);
    store.write(kMiB, buf.data(), buf.n);

    store.inject_fault(DiskFault::ReadError);
    try {
      store.read(kMiB, buf.data(), buf.n);
      FAIL("read did not throw");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains(store.path().string()) && Catch::Contains("read of 3145728 bytes at offset 1048576") &&
                          Catch::Contains(std::strerror(EIO)));
    }
    CHECK_NOTHROW(store.read(kMiB, buf.data(), buf.n));  // the fault was for one read only

    store.inject_fault(DiskFault::DiskFull);
    CHECK_NOTHROW(store.read(kMiB, buf.data(), buf.n));  // a write fault leaves reads alone
    try {
      store.write(4 * kMiB, buf.data(), buf.n);
      FAIL("write did not throw");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains(store.path().string()) && Catch::Contains("write of 3145728 bytes at offset 4194304") &&
                          Catch::Contains("disk full"));
    }
    CHECK_NOTHROW(store.write(4 * kMiB, buf.data(), buf.n));
    // Failed calls are not counted.
    CHECK(store.stats().bytes_read == 2 * buf.n);
    CHECK(store.stats().bytes_written == 2 * buf.n);
  }
}

// Scattered transfers: more ranges than the queue holds, one longer than a 4 MiB piece, ranges
// that meet or share pages (which go once), checked byte by byte against a page-level model of
// the file built here.
TEST_CASE("disk store scattered reads and writes move every range's bytes in every I/O mode", "[disk]") {
  constexpr size_t P = DiskStore::kAlign, kPages = 4096;  // 16 MiB of file and of each buffer
  TempDir dir;
  for (DiskIoMode m : modes()) {
    DiskStore store(dir.path, kPages * P, m);
    INFO("io " << store.io_name());
    AlignedBuf src(kPages * P), back(kPages * P), whole(kPages * P);
    fill_random(src, 23);
    std::mt19937 rng(7);
    // 40 ranges at random pages of file and memory (the same displacement for all, as a KV cache's
    // pinned mirror has), with a 5 MiB one, two that meet and two that share a page.
    std::vector<DiskRange> ranges;
    std::vector<bool> written(kPages, false);
    auto add = [&](size_t page, size_t pages) {
      ranges.push_back({page * P, src.data() + page * P, pages * P});
      for (size_t i = page; i < page + pages; ++i) written[i] = true;
    };
    add(10, 5 * 256);    // 5 MiB: two pieces and a part
    add(2000, 3), add(2003, 2);  // meet
    add(2100, 4), add(2103, 3);  // share page 2103
    for (int i = 0; i < 35; ++i) add(2200 + size_t(i) * 50 + rng() % 20, 1 + rng() % 25);
    std::shuffle(ranges.begin(), ranges.end(), rng);
    const size_t pages_written = size_t(std::count(written.begin(), written.end(), true));
    CHECK(store.write(ranges) == pages_written * P);
    CHECK(store.stats().bytes_written == pages_written * P);

    std::memset(whole.data(), 0xA5, whole.n);
    store.read(0, whole.data(), whole.n);
    size_t wrong = 0;
    for (size_t page = 0; page < kPages; ++page) {  // never-written pages of the sparse file read as zeros
      const unsigned char* got = whole.data() + page * P;
      if (written[page]) wrong += std::memcmp(got, src.data() + page * P, P) != 0;
      else wrong += size_t(std::count(got, got + P, 0)) != P;
    }
    CHECK(wrong == 0);

    // Read the same ranges back into a poisoned buffer: the ranges' pages hold the file's bytes,
    // every other page keeps its poison.
    std::memset(back.data(), 0xA5, back.n);
    std::vector<DiskRange> reads = ranges;
    for (DiskRange& r : reads) r.host = back.data() + r.offset;
    CHECK(store.read(reads) == pages_written * P);
    wrong = 0;
    for (size_t page = 0; page < kPages; ++page) {
      const unsigned char* got = back.data() + page * P;
      if (written[page]) wrong += std::memcmp(got, src.data() + page * P, P) != 0;
      else wrong += size_t(std::count(got, got + P, 0xA5)) != P;
    }
    CHECK(wrong == 0);
    CHECK(store.read(std::vector<DiskRange>{}) == 0);
  }
}

TEST_CASE("disk store scattered I/O refuses ranges that overlap in the file but not in memory", "[disk]") {
  TempDir dir;
  DiskStore store(dir.path, 4 * kMiB, DiskIoMode::Pread);
  AlignedBuf a(4 * 4096);
  const std::vector<DiskRange> ranges = {{0, a.data(), 2 * 4096}, {4096, a.data() + 2 * 4096, 2 * 4096}};
  CHECK_THROWS_WITH(store.write(ranges), Catch::Contains("overlap in the file but not in memory"));
  CHECK_THROWS_WITH(store.read({{0, a.data() + 1, 4096}}), Catch::Contains("aligned"));
  CHECK(store.stats().bytes_written == 0);
}

TEST_CASE("a failed scattered read names its range and leaves the store usable", "[disk]") {
  TempDir dir;
  for (DiskIoMode m : modes()) {
    DiskStore store(dir.path, 8 * kMiB, m);
    INFO("io " << store.io_name());
    AlignedBuf buf(8 * 4096);
    fill_random(buf, 3);
    const std::vector<DiskRange> ranges = {{kMiB, buf.data(), 4 * 4096}, {3 * kMiB, buf.data() + 4 * 4096, 4 * 4096}};
    store.write(ranges);
    store.inject_fault(DiskFault::ReadError);
    try {
      store.read(ranges);
      FAIL("read did not throw");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains(store.path().string()) && Catch::Contains("read of 16384 bytes at offset ") &&
                          Catch::Contains(std::strerror(EIO)));
      CHECK((msg.find("offset 1048576") != std::string::npos || msg.find("offset 3145728") != std::string::npos));
    }
    CHECK(store.read(ranges) == 8 * 4096);
  }
}

TEST_CASE("a read past the end of the file is a short read error", "[disk]") {
  TempDir dir;
  for (DiskIoMode m : modes()) {
    DiskStore store(dir.path, 4 * kMiB, m);
    INFO("io " << store.io_name());
    AlignedBuf buf(2 * kMiB);
    // The file spans the capacity from the start (sparse): a range never written reads as zeros,
    // as the offloading engine expects of KV cache pages past a short sequence.
    std::memset(buf.data(), 0xA5, buf.n);
    store.read(kMiB, buf.data(), 2 * kMiB);
    CHECK(std::all_of(buf.data(), buf.data() + buf.n, [](unsigned char c) { return c == 0; }));
    fill_random(buf, 3);
    store.write(0, buf.data(), 2 * kMiB);
    // The file shrinking under us (someone truncated it) ends a read early: a short read error.
    fs::resize_file(store.path(), kMiB);
    CHECK_THROWS_WITH(store.read(0, buf.data(), 2 * kMiB),
                      Catch::Contains("short read") && Catch::Contains(store.path().string()) &&
                          Catch::Contains("2097152 bytes at offset 0") && Catch::Contains("failed at offset 1048576"));
    CHECK_THROWS_WITH(store.read(3 * kMiB, buf.data(), 4096), Catch::Contains("short read") && Catch::Contains("offset 3145728"));
    CHECK_NOTHROW(store.read(0, buf.data(), kMiB));
  }
}

TEST_CASE("disk store removes its file in the destructor", "[disk]") {
  TempDir dir;
  fs::path p;
  {
    DiskStore a(dir.path / "nested" / "dir", kMiB, DiskIoMode::Auto);
    DiskStore b(dir.path / "nested" / "dir", kMiB, DiskIoMode::Auto);
    p = a.path();
    CHECK(fs::exists(p));
    CHECK(a.path() != b.path());
    CHECK(p.filename().string().rfind("strata-offload-" + std::to_string(getpid()) + "-", 0) == 0);
    CHECK(p.extension() == ".bin");
  }
  CHECK_FALSE(fs::exists(p));
  CHECK(fs::is_empty(dir.path / "nested" / "dir"));
}

namespace {

// Runs `child` in a fork()ed process that reports the store's path through a pipe; returns the
// path and the wait status.
template <typename F>
std::pair<std::string, int> run_child(F child) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::fflush(nullptr);  // nothing buffered may be written twice
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    // Default dispositions, as in a freshly started CLI (the test framework has its own handlers).
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    try {
      child(fds[1]);
    } catch (...) {
      _exit(3);
    }
    _exit(4);
  }
  close(fds[1]);
  std::string path;
  char c;
  while (::read(fds[0], &c, 1) == 1) path += c;
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return {path, status};
}

void send_path(int fd, const DiskStore& s) {
  const std::string p = s.path().string();
  if (::write(fd, p.data(), p.size()) != ssize_t(p.size())) _exit(5);
  close(fd);
}

}  // namespace

TEST_CASE("a SIGINT or SIGTERM removes the offload file and still kills the process", "[disk]") {
  TempDir dir;
  for (int sig : {SIGINT, SIGTERM}) {
    auto [path, status] = run_child([&](int fd) {
      DiskStore s(dir.path, kMiB);
      AlignedBuf buf(4096);
      s.write(0, buf.data(), 4096);
      send_path(fd, s);
      raise(sig);
      _exit(6);  // not reached: the signal must still terminate us
    });
    INFO("signal " << sig << ", path " << path << ", status " << status);
    REQUIRE(!path.empty());
    CHECK(WIFSIGNALED(status));
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == sig);
    CHECK_FALSE(fs::exists(path));
  }
}

TEST_CASE("normal exit removes an offload file that was never destroyed", "[disk]") {
  TempDir dir;
  auto [path, status] = run_child([&](int fd) {
    auto* leaked = new DiskStore(dir.path, kMiB);
    send_path(fd, *leaked);
    std::exit(0);
  });
  INFO("path " << path << ", status " << status);
  REQUIRE(!path.empty());
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("a forked child does not delete its parent's offload files", "[disk]") {
  TempDir dir;
  DiskStore parent_store(dir.path, kMiB);
  auto [path, status] = run_child([&](int fd) {
    DiskStore s(dir.path, kMiB);
    send_path(fd, s);
    raise(SIGTERM);
  });
  CHECK(WIFSIGNALED(status));
  CHECK_FALSE(fs::exists(path));
  CHECK(fs::exists(parent_store.path()));
}

namespace {

#if defined(__x86_64__) || defined(__aarch64__)
// Makes this process look like a sandbox without io_uring (io_uring_setup: EPERM, as Docker's
// default seccomp profile answers) on a file system that refuses O_DIRECT (open: EINVAL, as tmpfs
// before Linux 6.6). Returns false where seccomp filters cannot be installed.
bool sandbox_without_uring_and_odirect() {
#if defined(__x86_64__)
  constexpr uint32_t arch = AUDIT_ARCH_X86_64;
#else
  constexpr uint32_t arch = AUDIT_ARCH_AARCH64;
#endif
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),  // flags, low word
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}
#endif

}  // namespace

TEST_CASE("without io_uring and O_DIRECT the store falls back to buffered pread", "[disk]") {
#if defined(__x86_64__) || defined(__aarch64__)
  TempDir dir;
  // The child reports "<io_name>|<forced io_uring error>|<path>" or "skip" / "error: ...".
  auto [report, status] = run_child([&](int fd) {
    auto say = [&](const std::string& s) {
      if (::write(fd, s.data(), s.size()) != ssize_t(s.size())) _exit(5);
      close(fd);
      _exit(0);
    };
    if (!sandbox_without_uring_and_odirect()) say("skip");
    std::string forced;
    try {
      DiskStore s(dir.path, kMiB, DiskIoMode::IoUring);
    } catch (const Error& e) {
      forced = e.what();
    }
    std::string result;
    try {
      DiskStore s(dir.path, 4 * kMiB, DiskIoMode::Auto);
      AlignedBuf a(3 * kMiB), b(3 * kMiB);
      fill_random(a, 11);
      s.write(kMiB, a.data(), a.n);
      s.read(kMiB, b.data(), b.n);
      result = std::memcmp(a.data(), b.data(), a.n) != 0 ? "error: data differs"
                                                          : std::string(s.io_name()) + "|" + forced + "|" + s.path().string();
    } catch (const std::exception& e) {
      result = std::string("error: ") + e.what();
    }
    say(result);  // after the store's destructor
  });
  INFO("child said: " << report);
  REQUIRE(WIFEXITED(status));
  if (report == "skip") {
    WARN("cannot install a seccomp filter here; skipped");
    return;
  }
  const size_t bar1 = report.find('|'), bar2 = report.rfind('|');
  REQUIRE(bar1 != std::string::npos);
  REQUIRE(bar2 != bar1);
  CHECK(report.substr(0, bar1) == "pread+buffered");
  CHECK_THAT(report.substr(bar1 + 1, bar2 - bar1 - 1), Catch::Contains("io_uring is unavailable") && Catch::Contains("STRATA_DISK_IO=pread"));
  CHECK_FALSE(fs::exists(report.substr(bar2 + 1)));
  CHECK(dir.files() == 0);
#else
  WARN("seccomp test written for x86-64 and aarch64 only");
#endif
}
