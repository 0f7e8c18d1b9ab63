// Disk tier benchmark in the units of the limit (docs/design.md, Habits): writes --size bytes
// through a DiskStore in --chunk requests, reads them back, and prints achieved GB/s for each
// direction and the I/O mode. Compare with bench/fio_disk.sh run on the same directory, block and
// file size (the goal: the store reaches >= 80% of fio's sequential O_DIRECT read bandwidth).
// Usage: bench_disk [--dir build/tmp] [--size 1GiB] [--chunk 64MiB] [--mode auto|io_uring|pread]
//                   [--reps 3]
// With O_DIRECT the reads come from the device; a "+buffered" mode reads from the page cache and
// its read figure is not the disk's.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "bench_common.h"
#include "strata/backend/blas_core.h"
#include "strata/core/error.h"
#include "strata/core/size.h"
#include "strata/offload/disk_store.h"

using namespace strata;
using bench::Clock;
using bench::seconds_since;

namespace {

struct Args {
  std::string dir = "build/tmp", mode = "auto";
  size_t size = size_t(1) << 30, chunk = size_t(64) << 20;
  int reps = 3;
};

// Flags only, each followed by its value (bench_generate's convention; bench targets link
// strata_lib alone).
Args parse(int argc, char** argv) {
  Args a;
  bench::for_each_option(argc, argv, [&a](const std::string& k, const std::string& v) {
    if (k == "--dir") a.dir = v;
    else if (k == "--size") a.size = parse_size(v, "--size");
    else if (k == "--chunk") a.chunk = parse_size(v, "--chunk");
    else if (k == "--mode") a.mode = v;
    else if (k == "--reps") a.reps = std::stoi(v);
    else STRATA_FAIL("unknown option " << k << " (expected --dir, --size, --chunk, --mode, --reps)");
  });
  STRATA_CHECK(a.chunk > 0 && a.chunk % DiskStore::kAlign == 0, "--chunk must be a positive multiple of 4096");
  STRATA_CHECK(a.size >= a.chunk && a.size % a.chunk == 0, "--size must be a multiple of --chunk");
  STRATA_CHECK(a.reps > 0, "--reps must be positive");
  return a;
}

DiskIoMode mode_of(const std::string& m) {
  if (m == "auto") return DiskIoMode::Auto;
  if (m == "io_uring") return DiskIoMode::IoUring;
  if (m == "pread") return DiskIoMode::Pread;
  STRATA_FAIL("--mode must be auto, io_uring or pread, got '" << m << "'");
}

}  // namespace

int main(int argc, char** argv) try {
  strata::use_best_blas_core(argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe (tee, a log) as they are printed
  const Args args = parse(argc, argv);
  DiskStore store(args.dir, args.size, mode_of(args.mode));
  std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(std::aligned_alloc(DiskStore::kAlign, args.chunk)), &std::free);
  STRATA_CHECK(buf, "cannot allocate a " << format_bytes(double(args.chunk)) << " buffer");
  for (size_t i = 0; i < args.chunk; ++i) buf.get()[i] = char(i * 131 + 7);  // touch every page
  const size_t base = store.allocate(args.size);
  const size_t n = args.size / args.chunk;

  std::printf("disk store %s (%s), file %s of %s, %s requests, %d passes\n", store.io_name(), args.mode.c_str(),
              store.path().c_str(), format_bytes(double(args.size)).c_str(), format_bytes(double(args.chunk)).c_str(),
              args.reps);
  // Like fio's --loops, the figures are averages over all passes; writes leave out pass 1, which
  // allocates blocks (done once per weight in the runtime), and report it separately.
  double first_write_s = 0, overwrite_s = 0;
  for (int r = 0; r < args.reps; ++r) {
    auto t0 = Clock::now();
    for (size_t i = 0; i < n; ++i) store.write(base + i * args.chunk, buf.get(), args.chunk);
    const double ws = seconds_since(t0);
    (r == 0 ? first_write_s : overwrite_s) += ws;
    t0 = Clock::now();
    for (size_t i = 0; i < n; ++i) store.read(base + i * args.chunk, buf.get(), args.chunk);
    const double rs = seconds_since(t0);
    std::printf("  pass %d: write %.2f GB/s%s, read %.2f GB/s\n", r + 1, double(args.size) / ws / 1e9,
                r == 0 ? " (allocating)" : "", double(args.size) / rs / 1e9);
  }
  const DiskIoStats st = store.stats();
  const double gb = double(args.size) / 1e9;
  char overwrite[32] = "-";
  if (args.reps > 1) std::snprintf(overwrite, sizeof overwrite, "%.2f", gb * (args.reps - 1) / overwrite_s);
  std::printf("write %.2f GB/s (allocating), %s GB/s (overwrite); read %.2f GB/s\n", gb / first_write_s, overwrite,
              double(st.bytes_read) / st.read_seconds / 1e9);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_disk: %s\n", e.what());
  return 1;
}
