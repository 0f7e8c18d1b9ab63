// A full disk (or another write error) while the batch job writes OUT.partial: a clear error that
// names the file and the cause, only complete lines left in the file, no OUT, and a rerun after
// space is freed that resumes without loss or duplicates. The disk fills through OutputSink, the
// writer's seam: a sink that takes a byte budget, writes a short piece, then fails with ENOSPC.
#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/job/batch_job.h"
#include "strata/job/output.h"
#include "temp_files.h"
#include "test_paths.h"

using namespace strata;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path temp_dir() { return test::temp_dir("fulldisk"); }

// The real file, until `budget` bytes are spent: then a short write, then ENOSPC (what write(2)
// does on a full disk). sync and truncate can be made to fail too.
struct Disk {
  int64_t budget = INT64_MAX;
  int sync_errno = 0;       // fsync fails with this (0: works)
  bool truncate_fails = false;
  int writes_refused = 0;
};

class FullDiskSink final : public OutputSink {
public:
  FullDiskSink(const fs::path& p, Disk& disk) : file_(open_output_file(p)), disk_(disk) {}
  ssize_t write(const char* data, size_t n) override {
    if (disk_.budget <= 0) {
      ++disk_.writes_refused;
      errno = ENOSPC;
      return -1;
    }
    const ssize_t w = file_->write(data, size_t(std::min<int64_t>(int64_t(n), disk_.budget)));
    if (w > 0) disk_.budget -= w;
    return w;
  }
  int sync() override {
    if (disk_.sync_errno != 0) {
      errno = disk_.sync_errno;
      return -1;
    }
    return file_->sync();
  }
  int truncate(uint64_t size) override {
    if (disk_.truncate_fails) {
      errno = EIO;
      return -1;
    }
    return file_->truncate(size);
  }

private:
  std::unique_ptr<OutputSink> file_;
  Disk& disk_;
};

// Installs the failing sink for the writers made in its scope.
struct FullDiskScope {
  explicit FullDiskScope(Disk& disk)
      : previous(set_output_sink_factory([&disk](const fs::path& p) { return std::make_unique<FullDiskSink>(p, disk); })) {}
  ~FullDiskScope() { set_output_sink_factory(previous); }
  OutputSinkFactory previous;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

fs::path fresh(const std::string& name) {
  const fs::path out = temp_dir() / name;
  fs::remove(out);
  fs::remove(out.string() + ".partial");
  return out;
}

const std::string kLine1 = R"({"completion":"one","id":1})", kLine2 = R"({"completion":"two","id":2})";

}  // namespace

TEST_CASE("a full disk while writing OUT.partial keeps the finished lines and names the cause", "[job][enospc]") {
  const fs::path out = fresh("full1.jsonl");
  const std::string partial = out.string() + ".partial";
  Disk disk;
  {
    FullDiskScope scope(disk);
    OutputWriter w(out);
    w.write({{"id", 1}, {"completion", "one"}});
    w.write({{"id", 2}, {"completion", "two"}});
    w.flush();
    disk.budget = 10;  // the third line is torn after 10 bytes
    w.write({{"id", 3}, {"completion", "three"}});
    w.write({{"id", 4}, {"completion", "four"}});
    REQUIRE_THROWS_WITH(w.flush(), partial + ": No space left on device; finished lines are kept, free space and rerun to resume");
    CHECK(test::read_file(partial) == kLine1 + "\n" + kLine2 + "\n");  // the torn line is gone already
    // The writer takes nothing more, and never renames a file that lacks answers.
    CHECK_THROWS_AS(w.write({{"id", 5}}), Error);
    CHECK_THROWS_AS(w.finish(), Error);
    CHECK_FALSE(fs::exists(out));
  }
  CHECK(disk.writes_refused == 1);
  CHECK(test::read_file(partial) == kLine1 + "\n" + kLine2 + "\n");
  CHECK_FALSE(fs::exists(out));

  // Space freed: the rerun keeps 1 and 2 and writes the rest once.
  OutputWriter w(out);
  CHECK(w.done_ids().size() == 2);
  CHECK(w.done_ids().contains("1"));
  CHECK(w.done_ids().contains("2"));
  w.write({{"id", 3}, {"completion", "three"}});
  w.write({{"id", 4}, {"completion", "four"}});
  w.finish();
  CHECK(test::read_file(out) == kLine1 + "\n" + kLine2 + "\n" + R"({"completion":"three","id":3})" + "\n" +
                                    R"({"completion":"four","id":4})" + "\n");
  CHECK_FALSE(fs::exists(partial));
}

TEST_CASE("a quota or I/O error while writing OUT.partial is named too", "[job][enospc]") {
  const fs::path out = fresh("full2.jsonl");
  const std::string partial = out.string() + ".partial";
  Disk disk;
  FullDiskScope scope(disk);
  OutputWriter w(out);
  w.write({{"id", 1}, {"completion", "one"}});
  w.flush();
  w.write({{"id", 2}, {"completion", "two"}});
  disk.sync_errno = EIO;  // the lines reached the page cache, but fsync says they may not be on disk
  REQUIRE_THROWS_WITH(w.flush(), partial + ": Input/output error; finished lines are kept, rerun to resume");
  CHECK(test::read_file(partial) == kLine1 + "\n");  // only what fsync confirmed

  const fs::path out2 = fresh("full3.jsonl");
  disk = Disk{};
  OutputWriter w2(out2);
  disk.sync_errno = EDQUOT;
  w2.write({{"id", 1}});
  CHECK_THROWS_WITH(w2.flush(), Catch::Contains("Disk quota exceeded; finished lines are kept, free space and rerun"));
}

TEST_CASE("a torn last line left by a full disk is dropped on resume and answered again", "[job][enospc]") {
  const fs::path out = fresh("full4.jsonl");
  const std::string partial = out.string() + ".partial";
  Disk disk;
  disk.truncate_fails = true;  // the writer cannot trim the torn line itself: the resume must
  {
    FullDiskScope scope(disk);
    OutputWriter w(out);
    w.write({{"id", 1}, {"completion", "one"}});
    w.flush();
    disk.budget = int64_t(kLine2.size()) - 3;
    w.write({{"id", 2}, {"completion", "two"}});
    CHECK_THROWS_WITH(w.flush(), Catch::Contains("No space left on device") && Catch::Contains("torn last line"));
  }
  CHECK(test::read_file(partial) == kLine1 + "\n" + kLine2.substr(0, kLine2.size() - 3));
  OutputWriter w(out);
  CHECK(w.done_ids().size() == 1);
  CHECK(w.done_ids().contains("1"));
  CHECK(test::read_file(partial) == kLine1 + "\n");
  w.write({{"id", 2}, {"completion", "two"}});
  w.finish();
  CHECK(test::read_file(out) == kLine1 + "\n" + kLine2 + "\n");
}

TEST_CASE("resume drops a line of broken JSON or zeros and everything after it", "[job][enospc]") {
  // A line that ends in '\n' can still be broken: a filesystem that lost unsynced pages leaves
  // zeros. The first bad line ends what is kept; the lines after it are answered again.
  for (const std::string& bad : {std::string("{\"id\":3,\"compl\n"), std::string(12, '\0') + "\n", std::string("[3]\n"),
                                 std::string("{\"other\":3}\n"), std::string(5, '\0')}) {
    const fs::path out = fresh("full5.jsonl");
    test::write_file(out.string() + ".partial", kLine1 + "\n" + bad + kLine2 + "\n");
    OutputWriter w(out);
    CHECK(w.done_ids().size() == 1);
    CHECK(w.done_ids().contains("1"));
    CHECK(test::read_file(out.string() + ".partial") == kLine1 + "\n");
  }
}

TEST_CASE("a batch job on a full disk fails clearly and a rerun resumes without loss or duplicates", "[job][enospc]") {
  const fs::path dir = temp_dir();
  std::string prompts_text;
  for (int i = 0; i < 7; ++i)
    prompts_text += json{{"id", i}, {"prompt", "The number " + std::to_string(i * 37) + " is"}, {"max_new_tokens", 3 + i % 3}}.dump() + "\n";
  const fs::path prompts = test::write_file(dir / "prompts.jsonl", prompts_text);
  JobOptions opt;
  opt.model = std::string(STRATA_FIXTURES_DIR) + "/models/tiny-opt";
  opt.prompts = prompts;
  opt.device = "cpu";
  opt.batch_size = 2;
  opt.threads = 1;
  opt.progress = false;
  std::ostringstream log;

  opt.out = fresh("job_ref.jsonl");
  run_batch_job(opt, log);
  const std::vector<std::string> ref = lines_of(test::read_file(opt.out));
  REQUIRE(ref.size() == 7);
  std::map<json, std::string> ref_by_id;
  for (const std::string& l : ref) ref_by_id[json::parse(l)["id"]] = l;

  opt.out = fresh("job_full.jsonl");
  const std::string partial = opt.out.string() + ".partial";
  Disk disk;
  // Enough for the first batch and a piece of the second's first line: the disk fills mid-line.
  disk.budget = int64_t(ref[0].size() + ref[1].size() + 2 + ref[2].size() / 2);
  {
    FullDiskScope scope(disk);
    REQUIRE_THROWS_WITH(run_batch_job(opt, log),
                        partial + ": No space left on device; finished lines are kept, free space and rerun to resume");
  }
  CHECK_FALSE(fs::exists(opt.out));
  const std::vector<std::string> kept = lines_of(test::read_file(partial));
  CHECK(test::read_file(partial).back() == '\n');
  REQUIRE(kept.size() == 2);
  for (const std::string& l : kept) CHECK(ref_by_id.at(json::parse(l)["id"]) == l);

  // Space freed: the rerun answers the other five, each once, the same as the uninterrupted run.
  const JobSummary sum = run_batch_job(opt, log);
  CHECK(sum.resumed == 2);
  CHECK_FALSE(fs::exists(partial));
  const std::vector<std::string> all = lines_of(test::read_file(opt.out));
  REQUIRE(all.size() == 7);
  std::map<json, std::string> by_id;
  for (const std::string& l : all) CHECK(by_id.emplace(json::parse(l)["id"], l).second);  // no duplicates
  CHECK(by_id == ref_by_id);
}
