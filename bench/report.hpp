// Helpers the benchmark programs' ratio tables share.
#pragma once

#include <benchmark/benchmark.h>

#include <string>

namespace qkv::bench {

/// Whether a run is the one row a benchmark reports in a ratio table: its median over
/// repetitions, or its only run (errors and other aggregates are not).
inline bool reported_row(const benchmark::BenchmarkReporter::Run& r) {
  using Run = benchmark::BenchmarkReporter::Run;
  if (r.error_occurred || (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median")) return false;
  return !(r.run_type == Run::RT_Iteration && r.repetitions > 1);
}

/// "sgemm" and "B1_H8_N128_D64" from the row name "sgemm/B1_H8_N128_D64".
inline std::pair<std::string, std::string> row_name_parts(const benchmark::BenchmarkReporter::Run& r) {
  const std::string& name = r.run_name.function_name;
  const auto slash = name.find('/');
  return {name.substr(0, slash), name.substr(slash + 1)};
}

}  // namespace qkv::bench
