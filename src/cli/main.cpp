// strata: the command-line entry. Library errors (strata::Error) become one line on stderr and
// exit code 1; usage errors exit with CLI11's code.
#include <iostream>

#include "commands.h"
#include "strata/backend/blas_core.h"
#include "strata/core/error.h"

int main(int argc, char** argv) {
  strata::use_best_blas_core(argv);
  CLI::App app{"strata: high-throughput LLM batch generation with GPU, CPU and disk offloading"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");
  strata::cli::add_run_command(app);
  strata::cli::add_tokenize_command(app);
  strata::cli::add_perplexity_command(app);
  strata::cli::add_profile_command(app);
  strata::cli::add_policy_command(app);
  strata::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const strata::Error& e) {
    std::cerr << "strata: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "strata: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
