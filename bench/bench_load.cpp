// Load benchmark: how fast a GGUF file's tensors become the backend's dtype on the host, the
// conversion every load runs (WeightSource::read, src/model/gguf_model.cpp): ggml block types
// dequantized row by row, on one thread and on pools of more. Elements per second per ggml type,
// and the whole file's seconds, each the fastest of --repeat passes (the first pass also faults
// the mapped file into the page cache, so it is not timed).
// Usage: bench_load FILE.gguf [--threads 1,2,4] [--dtype f16|f32] [--repeat 3] [--lora DIR]
// --lora: the file read through a PEFT LoRA adapter merged at load (include/strata/model/lora.h;
// an adapter to time: bench/make_lora_adapter.py), the adapted tensors' rows counted under their
// ggml type.
// A file to time: bench/make_synthetic_gguf.py (llama.cpp's Q4_K_M mix of random blocks).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "strata/core/dtype.h"
#include "strata/core/error.h"
#include "strata/core/thread_pool.h"
#include "strata/model/gguf.h"
#include "strata/model/lora.h"
#include "strata/model/weight_source.h"

using namespace strata;
using bench::Clock;
using bench::seconds;

namespace {

struct Args {
  std::string file;
  std::vector<int> threads{1, 2};
  DType dtype = DType::F16;
  int repeat = 3;
  std::string lora;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) STRATA_FAIL(arg << " needs a value");
      return argv[++i];
    };
    if (arg == "--threads") {
      a.threads.clear();
      std::stringstream list(value());
      for (std::string t; std::getline(list, t, ',');) a.threads.push_back(std::max(1, std::atoi(t.c_str())));
    } else if (arg == "--dtype") {
      const std::string d = value();
      if (d != "f16" && d != "f32") STRATA_FAIL("--dtype is f16 or f32, not " << d);
      a.dtype = d == "f16" ? DType::F16 : DType::F32;
    } else if (arg == "--lora") {
      a.lora = value();
    } else if (arg == "--repeat") {
      a.repeat = std::max(1, std::atoi(value().c_str()));
    } else if (a.file.empty() && arg[0] != '-') {
      a.file = arg;
    } else {
      STRATA_FAIL("unknown argument " << arg << " (usage: bench_load FILE.gguf [--threads 1,2] [--dtype f16|f32] [--repeat 3] [--lora DIR])");
    }
  }
  if (a.file.empty()) STRATA_FAIL("usage: bench_load FILE.gguf [--threads 1,2] [--dtype f16|f32] [--repeat 3]");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  const GgufFile file = GgufFile::open(a.file);
  std::unique_ptr<WeightSource> src = make_gguf_source(file);
  if (!a.lora.empty()) {
    LoraSummary summary;
    src = lora_source(std::move(src), a.lora, config_from_gguf(file), &summary);
    std::printf("%s\n", lora_load_note(a.lora, summary).c_str());
  }
  // The ggml type under each Hugging Face name: the source lists names in the file's order,
  // leaving out the RoPE factor tensors (part of the config, not weights).
  const std::vector<std::string> names = src->names();
  std::map<std::string, std::string> type_of;
  std::map<std::string, int64_t> elements_of_type;
  size_t i = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.name.rfind("rope_", 0) == 0 || i >= names.size()) continue;
    const std::string type = ggml_type_info(uint32_t(t.type))->name;
    type_of[names[i++]] = type;
    elements_of_type[type] += t.numel;
  }
  size_t largest = 0;
  int64_t total = 0;
  for (const auto& [type, n] : elements_of_type) total += n;
  for (const GgufTensorInfo& t : file.tensors()) largest = std::max(largest, size_t(t.numel));
  std::vector<uint8_t> dst(largest * dtype_size(a.dtype));
  std::printf("%s: %zu tensors, %.3f G elements, as %s; host threads %u\n", a.file.c_str(), names.size(),
              double(total) / 1e9, dtype_name(a.dtype), std::thread::hardware_concurrency());

  // Seconds per ggml type for one pass over every tensor, on `pool` (nullptr: this thread).
  auto pass = [&](ThreadPool* pool) {
    std::map<std::string, double> secs;
    for (const std::string& name : names) {
      const auto t0 = Clock::now();
      src->read(name, a.dtype, dst.data(), pool);
      secs[type_of[name]] += seconds(t0, Clock::now());
    }
    return secs;
  };
  pass(nullptr);  // page the file in

  std::printf("| threads | type | M elements/s | speed-up |\n|---|---|---|---|\n");
  std::map<std::string, double> one_thread;
  for (int threads : a.threads) {
    std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
    std::map<std::string, double> best;
    for (int r = 0; r < a.repeat; ++r)
      for (const auto& [type, s] : pass(pool.get()))
        best[type] = best.count(type) ? std::min(best[type], s) : s;
    double all = 0;
    for (const auto& [type, s] : best) all += s;
    best["all"] = all;
    for (const auto& [type, s] : best) {
      const double elements = type == "all" ? double(total) : double(elements_of_type[type]);
      if (threads == a.threads.front()) one_thread[type] = s;
      std::printf("| %d | %s | %.0f | %.2fx |\n", threads, type.c_str(), elements / s / 1e6, one_thread[type] / s);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_load: %s\n", e.what());
  return 1;
}
