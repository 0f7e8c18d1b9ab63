// The disk tier: one file under the offload directory, read and written with O_DIRECT in
// 4 KiB-aligned pieces through io_uring, or through plain pread/pwrite where io_uring is
// unavailable (sandboxes that forbid it) or O_DIRECT is refused (tmpfs). Calls block the calling
// thread; the offloading schedule calls them from its one disk thread, and io_uring keeps many
// chunks of one request in flight so a single thread reaches the device's bandwidth.
//
// STRATA_DISK_IO=pread|io_uring|auto (environment) picks the mode of a store constructed with
// DiskIoMode::Auto; an explicit DiskIoMode from the caller wins. Forcing io_uring where the kernel
// or sandbox refuses it is an error rather than a silent fallback.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace strata {

enum class DiskIoMode : uint8_t { Auto, IoUring, Pread };  // Auto: io_uring, else pread

// One piece of a scattered transfer: `bytes` at `offset` in the file, to or from `host`.
struct DiskRange {
  size_t offset;
  void* host;
  size_t bytes;
};

struct DiskIoStats {
  uint64_t bytes_read = 0, bytes_written = 0;
  double read_seconds = 0, write_seconds = 0;  // wall time inside read() / write()
};

// For tests: make the next I/O of a kind fail as a device would.
enum class DiskFault : uint8_t { None, ReadError /* EIO */, DiskFull /* ENOSPC on write */ };

class DiskStore {
public:
  static constexpr size_t kAlign = 4096;

  // Creates a new file `strata-offload-<pid>-<n>.bin` under `dir` (created if missing) able to hold
  // `capacity` bytes. Fails before anything is written, naming the directory, the need and the
  // free space, when the file system has less free space than `capacity`. The file spans
  // `capacity` bytes from the start (sparse: no blocks until written), so a range never written
  // reads as zeros. The file is removed by the destructor, at normal exit, and on SIGINT/SIGTERM:
  // each construction (re)installs a handler that removes this process's files and then passes
  // the signal on to the previous disposition (an ignored signal stays ignored).
  DiskStore(const std::filesystem::path& dir, size_t capacity, DiskIoMode mode = DiskIoMode::Auto);
  ~DiskStore();
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Reserves `bytes` (rounded up to kAlign) and returns its kAlign-aligned offset. Throws when the
  // capacity is exceeded.
  size_t allocate(size_t bytes);

  // Blocking I/O. offset, bytes and the host pointer must be kAlign-aligned (bytes may be rounded
  // up by the caller). Errors (a short read, EIO, ENOSPC) throw strata::Error naming the file, the
  // offset and the size, and the OS's reason; "disk full" is said as such.
  void read(size_t offset, void* dst, size_t bytes);
  void write(size_t offset, const void* src, size_t bytes);
  // Scattered I/O in one call: the pieces of every range in flight together (through io_uring),
  // so many small ranges (a KV cache's rows of each sequence) reach the device's bandwidth where
  // one call per range would wait out each one's latency. Ranges that meet in the file and in
  // memory go as one; ranges that overlap in the file must overlap in memory the same way. The
  // same alignment rules and errors as above; an error names its range. Returns the bytes moved
  // (a page two ranges share counts once).
  size_t read(const std::vector<DiskRange>& ranges);
  size_t write(const std::vector<DiskRange>& ranges);

  const std::filesystem::path& path() const { return path_; }
  size_t capacity() const { return capacity_; }
  size_t allocated() const { return next_offset_; }
  const char* io_name() const;  // "io_uring" or "pread", and "+O_DIRECT" or "+buffered"
  DiskIoStats stats() const;

  void inject_fault(DiskFault fault);  // tests only: the next read (ReadError) or write (DiskFull) fails

  struct Impl;

private:
  std::filesystem::path path_;
  size_t capacity_ = 0, next_offset_ = 0;
  std::unique_ptr<Impl> impl_;
};

// Where the runtime and the profiler put disk-tier files by default:
// ${STRATA_CACHE:-~/.cache/strata}/offload.
std::filesystem::path default_offload_dir();

// Free bytes on the file system holding `dir` (statvfs f_bavail * f_frsize).
size_t free_disk_space(const std::filesystem::path& dir);

}  // namespace strata
