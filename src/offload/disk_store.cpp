// The disk tier's one file: creation with a free-space check, O_DIRECT I/O through io_uring or
// pread/pwrite, and removal of the file on every way out of the process that runs code.
#include "strata/offload/disk_store.h"

#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "strata/core/error.h"
#include "strata/core/size.h"

namespace strata {
namespace {

// 4 MiB pieces, up to 32 in flight. The depth lets one thread keep a device busy (NVMe wants tens
// of outstanding large requests); 4 MiB is the largest request many block devices take whole
// (max_sectors_kb; the block layer splits it further where the device wants less), and on the
// development VM it read ~25% faster than 1 MiB pieces with the same depth. A short transfer only
// resubmits the rest of its piece.
constexpr size_t kChunk = size_t(4) << 20;
constexpr unsigned kQueueDepth = 32;

// ---- Registry of live offload files -------------------------------------------------------------
// A signal handler may only call async-signal-safe functions, so the paths live in fixed char
// buffers (no allocation, no locks) and each slot's owner pid is a lock-free atomic that publishes
// it: 0 = free. The pid also keeps a fork()ed child, which inherits a copy of the table, from
// deleting its parent's files when the child exits.
constexpr int kMaxLiveFiles = 64;
char g_paths[kMaxLiveFiles][PATH_MAX];
std::atomic<pid_t> g_owner[kMaxLiveFiles];
static_assert(std::atomic<pid_t>::is_always_lock_free, "the signal handler needs lock-free atomics");
std::mutex g_registry_mutex;  // serializes register/unregister between threads (never the handler)
struct sigaction g_old_sigint, g_old_sigterm;

void unlink_registered() noexcept {
  const pid_t self = getpid();
  for (int i = 0; i < kMaxLiveFiles; ++i)
    if (g_owner[i].load(std::memory_order_acquire) == self) ::unlink(g_paths[i]);
}

extern "C" void strata_disk_on_signal(int sig) {
  const int saved_errno = errno;
  unlink_registered();
  // Hand the signal to whoever had it before us (usually SIG_DFL, which then terminates the
  // process with this signal, so the parent still sees "killed by SIGINT"). The signal is blocked
  // while this handler runs; raise() leaves it pending until we return.
  ::sigaction(sig, sig == SIGINT ? &g_old_sigint : &g_old_sigterm, nullptr);
  ::raise(sig);
  errno = saved_errno;
}

extern "C" void strata_disk_at_exit() { unlink_registered(); }

// Called under g_registry_mutex for every new store, not once per process: whoever installed a
// handler after us (a test framework that restores its saved handlers when a test ends, a library)
// may have replaced ours, and the files must still go. The handler we displace is chained to.
void install_cleanup_locked() {
  static bool at_exit_registered = false;
  if (!at_exit_registered) at_exit_registered = std::atexit(strata_disk_at_exit) == 0;
  // Keep our own thread from taking the signal while g_old_* is half written.
  sigset_t block, saved;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &block, &saved);
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction cur {};
    ::sigaction(sig, nullptr, &cur);
    // An ignored signal (nohup, a non-interactive shell's background job) stays ignored:
    // installing a handler would make the process killable by a signal its parent shielded it from.
    if (cur.sa_handler == SIG_IGN || cur.sa_handler == strata_disk_on_signal) continue;
    (sig == SIGINT ? g_old_sigint : g_old_sigterm) = cur;
    struct sigaction sa {};
    sa.sa_handler = strata_disk_on_signal;
    sa.sa_mask = block;
    ::sigaction(sig, &sa, nullptr);
  }
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

int register_path(const std::string& path) {
  STRATA_CHECK(path.size() < PATH_MAX, "offload file path too long: " << path);
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  install_cleanup_locked();
  const pid_t self = getpid();
  for (int i = 0; i < kMaxLiveFiles; ++i) {
    // A slot owned by another pid was inherited through fork(): it is ours to reuse.
    if (g_owner[i].load(std::memory_order_relaxed) == self) continue;
    g_owner[i].store(0, std::memory_order_release);
    std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
    g_owner[i].store(self, std::memory_order_release);
    return i;
  }
  STRATA_FAIL("offload dir: more than " << kMaxLiveFiles << " disk stores are open in this process");
}

void unregister_path(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_owner[slot].store(0, std::memory_order_release);
}

std::string errno_text(int err) {
  std::string s = std::strerror(err);
  if (err == ENOSPC) return "disk full (" + s + ")";
  return s;
}

// STRATA_DISK_IO refines DiskIoMode::Auto; an explicit mode from the caller wins.
DiskIoMode mode_from_env(DiskIoMode mode) {
  if (mode != DiskIoMode::Auto) return mode;
  const char* env = std::getenv("STRATA_DISK_IO");
  if (!env || !*env) return mode;
  const std::string v = env;
  if (v == "pread") return DiskIoMode::Pread;
  if (v == "io_uring") return DiskIoMode::IoUring;
  if (v == "auto") return DiskIoMode::Auto;
  STRATA_FAIL("STRATA_DISK_IO must be 'pread', 'io_uring' or 'auto', got '" << v << "'");
}

}  // namespace

std::filesystem::path default_offload_dir() {
  const char* cache = std::getenv("STRATA_CACHE");
  const char* home = std::getenv("HOME");
  const std::filesystem::path root =
      cache && *cache ? std::filesystem::path(cache) : std::filesystem::path(home && *home ? home : ".") / ".cache" / "strata";
  return root / "offload";
}

size_t free_disk_space(const std::filesystem::path& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0)
    STRATA_FAIL("offload dir " << dir.string() << ": statvfs failed: " << std::strerror(errno));
  return size_t(st.f_bavail) * size_t(st.f_frsize);
}

struct DiskStore::Impl {
  std::string path;  // for messages
  int fd = -1;
  int slot = -1;
  bool direct = false;
  bool uring = false;
  struct io_uring ring {};
  std::atomic<DiskFault> fault{DiskFault::None};
  // read()/write() run on the disk thread; stats() may be called from any thread.
  mutable std::mutex stats_mutex;
  DiskIoStats stats;

  ~Impl();

  // An injected fault replaces the result of the next completed transfer of its kind, so it takes
  // exactly the path a real failure takes.
  int take_fault(bool is_write) {
    DiskFault want = is_write ? DiskFault::DiskFull : DiskFault::ReadError;
    if (fault.load(std::memory_order_relaxed) != want) return 0;
    if (!fault.compare_exchange_strong(want, DiskFault::None)) return 0;
    return is_write ? ENOSPC : EIO;
  }

  [[noreturn]] void fail(bool is_write, size_t offset, size_t bytes, size_t at, const std::string& why) const {
    STRATA_FAIL("disk store " << path << ": " << (is_write ? "write" : "read") << " of " << bytes
                              << " bytes at offset " << offset << " failed at offset " << at << ": " << why);
  }

  size_t transfer(bool is_write, std::vector<DiskRange> ranges);
  void transfer_pread(bool is_write, const DiskRange& r);
  void transfer_uring(bool is_write, const std::vector<DiskRange>& ranges);
};

// Ranges in file order, each joined with the next where the two meet or overlap in the file and
// lie the same way in memory (a KV cache's neighbouring rows, or two rows' shared page): fewer,
// larger pieces for the device, and no page moved twice.
static std::vector<DiskRange> merged_ranges(std::vector<DiskRange> ranges) {
  std::erase_if(ranges, [](const DiskRange& r) { return r.bytes == 0; });
  std::sort(ranges.begin(), ranges.end(), [](const DiskRange& a, const DiskRange& b) { return a.offset < b.offset; });
  auto memory_at = [](const DiskRange& r, size_t offset) { return static_cast<char*>(r.host) + (offset - r.offset); };
  std::vector<DiskRange> out;
  for (const DiskRange& r : ranges) {
    if (!out.empty()) {
      DiskRange& last = out.back();
      const size_t last_end = last.offset + last.bytes;
      if (r.offset <= last_end && memory_at(last, r.offset) == r.host) {
        last.bytes = std::max(last_end, r.offset + r.bytes) - last.offset;
        continue;
      }
      // Pieces in flight complete in any order: two places in memory for one byte of the file
      // would leave which one wins to chance.
      STRATA_CHECK(r.offset >= last_end, "disk store: ranges at offsets " << last.offset << " and " << r.offset
                                                                          << " overlap in the file but not in memory");
    }
    out.push_back(r);
  }
  return out;
}

size_t DiskStore::Impl::transfer(bool is_write, std::vector<DiskRange> ranges) {
  ranges = merged_ranges(std::move(ranges));
  if (ranges.empty()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (uring) transfer_uring(is_write, ranges);
  else
    for (const DiskRange& r : ranges) transfer_pread(is_write, r);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t bytes = 0;
  for (const DiskRange& r : ranges) bytes += r.bytes;
  std::lock_guard<std::mutex> lock(stats_mutex);
  (is_write ? stats.bytes_written : stats.bytes_read) += bytes;
  (is_write ? stats.write_seconds : stats.read_seconds) += s;
  return bytes;
}

void DiskStore::Impl::transfer_pread(bool is_write, const DiskRange& range) {
  // One call for the whole range: with O_DIRECT the block layer splits it into device-sized
  // pieces in parallel. Loop for short transfers (the kernel caps one call at ~2 GiB).
  char* buf = static_cast<char*>(range.host);
  size_t done = 0;
  while (done < range.bytes) {
    const size_t at = range.offset + done;
    ssize_t r = is_write ? ::pwrite(fd, buf + done, range.bytes - done, off_t(at))
                         : ::pread(fd, buf + done, range.bytes - done, off_t(at));
    int err = r < 0 ? errno : 0;
    if (int injected = take_fault(is_write)) err = injected, r = -1;
    if (r < 0) {
      if (err == EINTR) continue;
      fail(is_write, range.offset, range.bytes, at, errno_text(err));
    }
    if (r == 0) fail(is_write, range.offset, range.bytes, at, is_write ? "no bytes written" : "short read (end of file)");
    done += size_t(r);
  }
}

void DiskStore::Impl::transfer_uring(bool is_write, const std::vector<DiskRange>& ranges) {
  struct Piece {
    size_t at, len;
    char* buf;
    size_t range;  // which of `ranges` it is part of, for the error
  };
  Piece pieces[kQueueDepth];
  unsigned free_list[kQueueDepth], n_free = kQueueDepth;
  for (unsigned i = 0; i < kQueueDepth; ++i) free_list[i] = kQueueDepth - 1 - i;

  auto queue = [&](unsigned idx) {
    struct io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    // Never more than kQueueDepth pieces are live and the SQ has kQueueDepth entries.
    STRATA_CHECK(sqe != nullptr, "io_uring submission queue full");
    const Piece& p = pieces[idx];
    if (is_write) io_uring_prep_write(sqe, fd, p.buf, unsigned(p.len), p.at);
    else io_uring_prep_read(sqe, fd, p.buf, unsigned(p.len), p.at);
    io_uring_sqe_set_data64(sqe, idx);
  };

  size_t range = 0, next = 0;  // the first byte not yet handed to a piece: `next` bytes into `range`
  unsigned live = 0;
  int first_err = 0;
  size_t err_range = 0, err_at = 0;
  std::string err_why;
  while (range < ranges.size() || live > 0) {
    // On an error, stop issuing but drain what is in flight: the kernel may still be writing into
    // the caller's buffer, which must not be released while we throw.
    while (first_err == 0 && range < ranges.size() && n_free > 0) {
      const DiskRange& r = ranges[range];
      const unsigned idx = free_list[--n_free];
      pieces[idx] = Piece{r.offset + next, std::min(kChunk, r.bytes - next), static_cast<char*>(r.host) + next, range};
      next += pieces[idx].len;
      if (next == r.bytes) ++range, next = 0;
      queue(idx);
      ++live;
    }
    int rc = io_uring_submit_and_wait(&ring, 1);
    if (rc < 0) {
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
      // The ring itself failed: nothing more can be reaped, so in-flight pieces are lost. This
      // does not happen short of a kernel bug; say so instead of hanging.
      const DiskRange& r = ranges[std::min(range, ranges.size() - 1)];
      fail(is_write, r.offset, r.bytes, r.offset + next, std::string("io_uring_submit_and_wait: ") + std::strerror(-rc));
    }
    struct io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&ring, &cqe) == 0 && cqe) {
      const unsigned idx = unsigned(io_uring_cqe_get_data64(cqe));
      int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      Piece& p = pieces[idx];
      if (int injected = take_fault(is_write)) res = -injected;
      if (res == -EINTR || res == -EAGAIN) {
        if (first_err == 0) {
          queue(idx);
          continue;
        }
        res = -ECANCELED;  // draining: treat as a failure but keep the first error's message
      }
      bool done = false;
      if (res < 0) {
        if (first_err == 0) first_err = -res, err_range = p.range, err_at = p.at, err_why = errno_text(-res);
        done = true;
      } else if (res == 0) {
        if (first_err == 0) {
          first_err = EIO, err_range = p.range, err_at = p.at;
          err_why = is_write ? "no bytes written" : "short read (end of file)";
        }
        done = true;
      } else if (size_t(res) < p.len && first_err == 0) {
        p.at += size_t(res), p.buf += res, p.len -= size_t(res);  // short transfer: resubmit the rest
        queue(idx);
      } else {
        done = true;
      }
      if (done) {
        free_list[n_free++] = idx;
        --live;
      }
    }
  }
  if (first_err != 0) fail(is_write, ranges[err_range].offset, ranges[err_range].bytes, err_at, err_why);
}

DiskStore::Impl::~Impl() {
  if (uring) io_uring_queue_exit(&ring);
  if (fd >= 0) ::close(fd);
  if (slot >= 0) {
    ::unlink(path.c_str());  // before unregistering, so a signal in between still finds the path
    unregister_path(slot);
  }
}

// Cleanup lives in Impl's destructor so that a constructor that throws after creating the file
// (impl_ is then a fully built member) still removes it.
DiskStore::DiskStore(const std::filesystem::path& dir, size_t capacity, DiskIoMode mode)
    : capacity_(capacity), impl_(std::make_unique<Impl>()) {
  mode = mode_from_env(mode);
  if (mode != DiskIoMode::Pread) {
    const int rc = io_uring_queue_init(kQueueDepth, &impl_->ring, 0);
    if (rc == 0) impl_->uring = true;
    else if (mode == DiskIoMode::IoUring)
      STRATA_FAIL("disk store: io_uring is unavailable (io_uring_queue_init: "
                  << std::strerror(-rc) << "); run with STRATA_DISK_IO=pread to use pread/pwrite");
    // Auto: sandboxes (seccomp, kernel.io_uring_disabled) refuse io_uring; pread still works.
  }

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) STRATA_FAIL("offload dir " << dir.string() << ": cannot create it: " << ec.message());
  // Absolute, because the cleanup handlers may run after the process changed directory.
  const std::filesystem::path abs_dir = std::filesystem::absolute(dir, ec);
  if (ec) STRATA_FAIL("offload dir " << dir.string() << ": " << ec.message());

  const size_t free_bytes = free_disk_space(abs_dir);
  if (free_bytes < capacity)
    STRATA_FAIL("offload dir " << abs_dir.string() << ": needs " << format_bytes(double(capacity)) << " but only "
                               << format_bytes(double(free_bytes)) << " are free");

  static std::atomic<unsigned> counter{0};
  for (int attempt = 0;; ++attempt) {
    path_ = abs_dir / ("strata-offload-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".bin");
    impl_->path = path_.string();
    // Registered before the file exists, so a signal at any moment after creation removes it.
    impl_->slot = register_path(impl_->path);
    int fd = ::open(path_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    bool direct = true;
    if (fd < 0 && errno == EINVAL) {
      // O_DIRECT refused (tmpfs before Linux 6.6, some FUSE file systems). The kernel checks
      // O_EXCL before O_DIRECT, so EINVAL means the name was free, and open() may already have
      // created the file: open it again without O_EXCL.
      fd = ::open(path_.c_str(), O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
      direct = false;
      if (fd < 0) {
        const int err = errno;
        ::unlink(path_.c_str());
        errno = err;
      }
    }
    if (fd >= 0) {
      impl_->fd = fd;
      impl_->direct = direct;
      break;
    }
    const int err = errno;
    unregister_path(impl_->slot);
    impl_->slot = -1;
    if (err == EEXIST && attempt < 100) continue;  // a stale file of a dead process with our pid
    STRATA_FAIL("offload dir " << abs_dir.string() << ": cannot create " << path_.string() << ": " << errno_text(err));
  }
  // No preallocation: on ext4/xfs fallocate would turn every first write into an unwritten-extent
  // conversion without making it faster, and where a file system lacks fallocate glibc's
  // posix_fallocate writes zeros (minutes for hundreds of GB). The free-space check above is the
  // guard; a later ENOSPC is reported as "disk full".
  // The file is only extended (sparse, no blocks written) to its capacity, so a read of a range
  // never written (a KV cache page beyond a short sequence) returns zeros instead of a short read.
  if (::ftruncate(impl_->fd, off_t(capacity)) != 0)
    STRATA_FAIL("offload dir " << abs_dir.string() << ": cannot size " << path_.string() << " to " << capacity
                               << " bytes: " << errno_text(errno));
}

DiskStore::~DiskStore() = default;

size_t DiskStore::allocate(size_t bytes) {
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded < bytes || rounded > capacity_ - next_offset_)
    STRATA_FAIL("offload dir " << path_.parent_path().string() << ": disk store of " << capacity_ << " bytes ("
                               << format_bytes(double(capacity_)) << ") is full: " << next_offset_
                               << " bytes allocated, " << bytes << " more requested");
  const size_t offset = next_offset_;
  next_offset_ += rounded;
  return offset;
}

static void check_args(const DiskStore& s, const char* op, size_t offset, const void* ptr, size_t bytes) {
  constexpr size_t A = DiskStore::kAlign;
  STRATA_CHECK(offset % A == 0 && bytes % A == 0 && reinterpret_cast<uintptr_t>(ptr) % A == 0,
               "disk store " << s.path().string() << ": " << op << " needs " << A << "-byte aligned offset, size and "
                             << "buffer (O_DIRECT), got offset " << offset << ", " << bytes << " bytes, buffer " << ptr);
  STRATA_CHECK(offset <= s.capacity() && bytes <= s.capacity() - offset,
               "disk store " << s.path().string() << ": " << op << " of " << bytes << " bytes at offset " << offset
                             << " is past its capacity of " << s.capacity() << " bytes");
}

void DiskStore::read(size_t offset, void* dst, size_t bytes) { read({DiskRange{offset, dst, bytes}}); }

void DiskStore::write(size_t offset, const void* src, size_t bytes) {
  // io_uring and pwrite take the buffer as non-const for symmetry with reads; they only read it.
  write({DiskRange{offset, const_cast<void*>(src), bytes}});
}

size_t DiskStore::read(const std::vector<DiskRange>& ranges) {
  for (const DiskRange& r : ranges) check_args(*this, "read", r.offset, r.host, r.bytes);
  return impl_->transfer(false, ranges);
}

size_t DiskStore::write(const std::vector<DiskRange>& ranges) {
  for (const DiskRange& r : ranges) check_args(*this, "write", r.offset, r.host, r.bytes);
  return impl_->transfer(true, ranges);
}

const char* DiskStore::io_name() const {
  if (impl_->uring) return impl_->direct ? "io_uring+O_DIRECT" : "io_uring+buffered";
  return impl_->direct ? "pread+O_DIRECT" : "pread+buffered";
}

DiskIoStats DiskStore::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  return impl_->stats;
}

void DiskStore::inject_fault(DiskFault fault) { impl_->fault.store(fault); }

}  // namespace strata
