// The profiler behind `strata profile`: measures this machine through the runtime's own paths
// (the Backend's pinned copies and ops, the DiskStore's io_uring I/O) so the hardware profile holds
// what the runtime achieves, not what a datasheet promises.
#pragma once
#include <cstddef>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>

#include "strata/profile/hardware.h"

namespace strata {

class Backend;
struct ProfileOptions;
// Applied last to a full (not quick) measurement, on the measured device, with the profiler's
// options: the engine's own runs fitting the terms the bare rates miss (job/engine_calibration.h).
using ProfileRefinement =
    std::function<HardwareProfile(const HardwareProfile& measured, Backend& device, const ProfileOptions& options)>;

struct ProfileOptions {
  bool quick = false;                      // seconds, small buffers and fewer points (CI)
  std::string backend = "auto";            // "auto", "cpu" or "cuda": the device of the "gpu" tier
  std::filesystem::path offload_dir;       // where disk I/O is measured; empty: default_offload_dir()
  int threads = 0;                         // CPU backend threads (0: all cores)
  std::function<void(const std::string&)> progress;  // one line per finished measurement, or null
  ProfileRefinement refine;  // null: the bare rates
};

// Measures capacities, link bandwidths, the GEMM curve, decode attention and CPU FLOP/s. Throws
// strata::Error when a device or the offload directory is unusable. Allocates at most about a
// quarter of free memory on each tier and removes its disk file before returning.
HardwareProfile profile_machine(const ProfileOptions& options);

// How many copies of a `matrix_bytes` weight matrix the CPU linear's calls take in turn, so that
// no call finds its weights in a cache (the engine reads the CPU tier's weights once a step, from
// memory): enough for `want_bytes` in all, within a quarter of `free_bytes`; at least 1.
size_t cold_weight_copies(size_t matrix_bytes, size_t want_bytes, size_t free_bytes);

// Where `strata profile` writes by default and `--policy auto` looks first:
// ${STRATA_CACHE:-~/.cache/strata}/hardware.yaml.
std::filesystem::path default_hardware_profile_path();

// This machine's profile for a command that needs one (`--policy auto`, `strata bench`): the cached
// one at default_hardware_profile_path(), else measured with `options` (a minute or two; --quick
// seconds) and cached there for the next command. `who` opens each line written to `log`.
HardwareProfile cached_or_measured_profile(const ProfileOptions& options, std::ostream& log, const std::string& who);

}  // namespace strata
