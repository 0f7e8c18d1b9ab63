// Each `strata` subcommand registers itself on the app; the callbacks are thin layers over modules.
#pragma once
#include <CLI/CLI.hpp>

namespace strata::cli {

void add_run_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_policy_command(CLI::App& app);
void add_bench_command(CLI::App& app);

}  // namespace strata::cli
