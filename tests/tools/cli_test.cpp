// The qkv program end to end: run, check, dump, devices, and bad input with exit status 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/file.hpp"
#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "plot/figure.hpp"

namespace {

namespace fs = std::filesystem;

struct Result {
  int status;
  std::string output;
};

/// Runs a shell command, its stdout and stderr together.
Result shell(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

/// Runs qkv with `args`; `env` (e.g. "-u A B=1") changes its environment through env(1).
Result run(const std::string& args, const std::string& env = "") {
  return shell((env.empty() ? "" : "env " + env + " ") + std::string(QKV_BINARY) + " " + args);
}

/// Whether `text` holds `before` + `after`, or `before` + "_lanes" + digits + `after` (a matmul
/// kernel's name on lavapipe carries the subgroup size its lanes variant was built for).
bool contains_maybe_lanes(const std::string& text, const std::string& before, const std::string& after) {
  if (text.find(before + after) != std::string::npos) return true;
  const std::string lanes = before + "_lanes";
  for (std::size_t at = text.find(lanes); at != std::string::npos; at = text.find(lanes, at + 1)) {
    std::size_t end = at + lanes.size();
    const std::size_t digits = end;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end > digits && text.compare(end, after.size(), after) == 0) return true;
  }
  return false;
}

/// The first line of `output` whose first word is `first`, its runs of spaces squeezed to one
/// (explain's columns pad with spaces); empty if there is none.
std::string squeezed_line(const std::string& output, const std::string& first) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string word, squeezed;
    while (words >> word) squeezed += (squeezed.empty() ? "" : " ") + word;
    if (squeezed.rfind(first + " ", 0) == 0) return squeezed;
  }
  return {};
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qkv_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) { return (dir_ / name).string(); }
  std::string write(const std::string& name, const qkv::Tensor& t) {
    qkv::io::write_npy(path(name), t);
    return path(name);
  }
  fs::path dir_;
};

TEST_F(Cli, RunWritesOutputs) {
  // q = [[1, 0]], k = [[1, 0], [0, 1]], v = [[1, 2], [3, 4]]; scale 1.
  write("q.npy", qkv::Tensor::from<float>({1, 1, 2}, {1, 0}));
  write("k.npy", qkv::Tensor::from<float>({1, 2, 2}, {1, 0, 0, 1}));
  write("v.npy", qkv::Tensor::from<double>({1, 2, 2}, {1, 2, 3, 4}));
  for (const char* backend : {"reference", "cpu"}) {
    Result r = run(std::string("run sdpa --backend ") + backend + " --set scale=1 --in q=" + path("q.npy") + " --in k=" + path("k.npy") +
                   " --in v=" + path("v.npy") + " --out out=" + path("out.npy") + " --out weights=" + path("w.npy"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("-> " + path("out.npy")), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("weights:\n     0.7311   0.2689"), std::string::npos) << r.output;
    qkv::Tensor out = qkv::io::read_npy(path("out.npy"));
    qkv::Tensor w = qkv::io::read_npy(path("w.npy"));
    EXPECT_EQ(out.shape(), (std::vector<std::int64_t>{1, 1, 2}));
    EXPECT_NEAR(out.at(0), 1.537883, 1e-4);
    EXPECT_NEAR(w.at(0), 0.731059, 1e-4);
  }
}

TEST_F(Cli, RunWritesOutputsInEveryDtypeAndReadsSafetensors) {
  // Several outputs into one .safetensors file under their names, in the graph's dtype (bf16);
  // --out-dtype f32 widens them for .npy.
  Result both = run("run sdpa --dtype bf16 --out out=" + path("o.safetensors") + " --out weights=" + path("o.safetensors"));
  ASSERT_EQ(both.status, 0) << both.output;
  const qkv::io::TensorFile written = qkv::io::read_safetensors(path("o.safetensors"));
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(written.at("out").dtype(), qkv::DType::bf16);
  EXPECT_EQ(written.at("weights").shape(), (std::vector<std::int64_t>{2, 8, 8}));
  Result wide = run("run sdpa --dtype bf16 --out-dtype f32 --out out=" + path("o.npy"));
  ASSERT_EQ(wide.status, 0) << wide.output;
  const qkv::Tensor o = qkv::io::read_npy(path("o.npy"));
  EXPECT_EQ(o.dtype(), qkv::DType::f32);
  for (std::int64_t i = 0; i < o.numel(); ++i) ASSERT_EQ(o.at(i), written.at("out").at(i)) << i;  // bf16 widens exactly
  // Inputs from a .safetensors file: the tensor named after the input, or the one after ':'.
  qkv::io::write_safetensors(path("in.safetensors"), {{"q", qkv::Tensor::from<float>({1, 1, 2}, {1, 0})},
                                                      {"keys", qkv::Tensor::from<float>({1, 2, 2}, {1, 0, 0, 1})},
                                                      {"v", qkv::Tensor::from<float>({1, 2, 2}, {1, 2, 3, 4})}});
  const std::string in = path("in.safetensors");
  Result read = run("run sdpa --set scale=1 --in q=" + in + " --in k=" + in + ":keys --in v=" + in + " --out out=" + path("r.npy"));
  ASSERT_EQ(read.status, 0) << read.output;
  EXPECT_NEAR(qkv::io::read_npy(path("r.npy")).at(0), 1.537883, 1e-4);  // as RunWritesOutputs from .npy files
  // Bad requests: exit 2, one line naming what is wrong, nothing written.
  const std::pair<std::string, std::string> bad[] = {
      {"run sdpa --in q=" + in + ":query", "has no tensor 'query' (tensors: keys, q, v)"},
      {"run sdpa --out out=" + path("a.npy") + " --out weights=" + path("a.npy"), "a .npy file holds one tensor: write a .safetensors file"},
      {"run sdpa --out out=" + path("a.txt"), "--out out=" + path("a.txt") + ": a .npy or .safetensors file"},
      {"run sdpa --out-dtype i32 --out out=" + path("a.npy"), "--out-dtype i32: f32, f16 or bf16"},
      {"run sdpa --out out=" + path("a.safetensors") + " --out weights=" + path("missing/w.safetensors"), "does not exist"},
  };
  for (const auto& [args, message] : bad) {
    Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  }
  for (const char* f : {"a.npy", "a.txt", "a.safetensors"}) EXPECT_FALSE(fs::exists(path(f))) << f;
}

TEST_F(Cli, LongCommandsShowProgressOnATerminalOnly) {
  // On a terminal (script(1) gives the command one) fuzz, bench and check all rewrite a progress line on
  // stderr and erase it before their results; through a pipe (as everywhere else in these
  // tests) they print none.
  const std::string shown_at_once = "QKV_PROGRESS_DELAY_MS=0";
  for (const std::string args : {"fuzz --graphs 40 --backend cpu", "bench sdpa --backend cpu --repeat 2000", "check all --backend cpu"}) {
    Result tty = shell("env " + shown_at_once + " script -q -e -c '" + std::string(QKV_BINARY) + " " + args + "' /dev/null");
    ASSERT_EQ(tty.status, 0) << args << "\n" << tty.output;
    const std::string line = args.rfind("fuzz", 0) == 0 ? "fuzz: graph " : args.rfind("bench", 0) == 0 ? "bench cpu: run " : "check all: model ";
    EXPECT_NE(tty.output.find("\r\033[K" + line), std::string::npos) << args << "\n" << tty.output;
    const std::size_t last = tty.output.rfind(line);
    EXPECT_NE(tty.output.find("\r\033[K", last), std::string::npos) << "not erased: " << tty.output;  // erased after the last one
    Result piped = run(args, shown_at_once);
    ASSERT_EQ(piped.status, 0) << piped.output;
    EXPECT_EQ(piped.output.find(line), std::string::npos) << piped.output;
    EXPECT_EQ(piped.output.find('\r'), std::string::npos) << piped.output;
  }
}

TEST_F(Cli, RunPromotesLowerRankFilesAndTakesOptions) {
  write("q.npy", qkv::Tensor::from<float>({2, 2}, {1, 0, 0, 1}));
  write("v.npy", qkv::Tensor::from<float>({2, 1}, {10, 20}));
  write("m.npy", qkv::Tensor::from<bool>({2, 2}, {false, true, false, true}));
  Result r = run("run sdpa --backend cpu --set mask=true --in q=" + path("q.npy") + " --in k=" + path("q.npy") + " --in v=" + path("v.npy") +
                 " --in mask=" + path("m.npy") + " --out out=" + path("o.npy"));
  ASSERT_EQ(r.status, 0) << r.output;
  qkv::Tensor o = qkv::io::read_npy(path("o.npy"));
  EXPECT_EQ(o.shape(), (std::vector<std::int64_t>{2, 1}));  // the batch dim the files lacked is gone again
  EXPECT_NEAR(o.at(0), 20, 1e-5);                           // only key 1 is kept
  EXPECT_NEAR(o.at(1), 20, 1e-5);
  Result causal = run("run sdpa --set causal=true --in q=" + path("q.npy") + " --in k=" + path("q.npy") + " --in v=" + path("v.npy") +
                      " --out out=" + path("c.npy"));
  ASSERT_EQ(causal.status, 0) << causal.output;
  EXPECT_NEAR(qkv::io::read_npy(path("c.npy")).at(0), 10, 1e-5);  // the first query sees only the first key
}

TEST_F(Cli, ModelsListsEveryModelWithInputsWeightsAndOptions) {
  Result r = run("models");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* m : {"sdpa", "mha", "self-attention", "cross-attention", "causal-self-attention", "gqa", "paged-attention", "decoder-block",
                        "encoder-decoder-block"})
    EXPECT_NE(("\n" + r.output).find(std::string("\n") + m + "\n"), std::string::npos) << m;
  EXPECT_NE(r.output.find("weights: in_proj_weight f32[96,32]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("self_attn.in_proj_weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--set causal=false"), std::string::npos) << r.output;
}

TEST_F(Cli, RunLoadsPyTorchWeightsFromSafetensors) {
  const std::string f = std::string(QKV_SOURCE_DIR) + "/tests/fixtures/torch/";
  Result r = run("run mha --backend cpu --weights " + f + "mha32.safetensors --in query=" + f + "mha32/query.npy --in key=" + f +
                 "mha32/key.npy --in value=" + f + "mha32/value.npy --out out=" + path("o.npy") + " --out weights=" + path("w.npy"));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* name : {"out", "weights"}) {
    qkv::Tensor got = qkv::io::read_npy(path(std::string(name == std::string("out") ? "o" : "w") + ".npy"));
    qkv::Tensor torch = qkv::io::read_npy(f + "mha32/" + name + ".npy");
    ASSERT_EQ(got.shape(), torch.shape()) << name;
    for (std::int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(got.at(i), torch.at(i), 2e-6) << name << " " << i;
  }
  Result missing = run("run mha --weights " + f + "dtypes.safetensors");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.output.find("no tensor 'in_proj_weight'"), std::string::npos) << missing.output;
}

// The multi-head models at sizes other than their defaults: built for the options, run and
// checked on every backend; a checkpoint of another size says which tensor and dims differ.
TEST_F(Cli, BuiltInModelsRunAtAnySize) {
  Result r = run("run mha --set embed=48 --set heads=6 --out out=" + path("o.npy") + " --out weights_per_head=" + path("w.npy"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(qkv::io::read_npy(path("o.npy")).shape(), (std::vector<std::int64_t>{2, 8, 48}));
  EXPECT_EQ(qkv::io::read_npy(path("w.npy")).shape(), (std::vector<std::int64_t>{2, 6, 8, 8}));
  // Every backend this machine has (the sanitizer build runs without a Vulkan driver).
  const bool vulkan = run("devices").output.find("vulkan     available") != std::string::npos;
  const char* required = std::getenv("QKV_REQUIRE_VULKAN");
  if (required && std::string(required) == "1") {
    EXPECT_TRUE(vulkan);
  }
  const std::string backends = vulkan ? " --backend all" : " --backend reference,cpu";
  Result gqa = run("check gqa --set embed=96 --set heads=4 --set kv_heads=2 --set rope=true --grad" + backends);
  EXPECT_EQ(gqa.status, 0) << gqa.output;
  Result block = run("check encoder-decoder-block --set embed=24 --set heads=2 --set activation=gelu" + backends);
  EXPECT_EQ(block.status, 0) << block.output;
  // Attention through a block table, forward and backward: pages of 4, tables of 3 pages (on
  // vulkan in tests/backends/paged_attention_test.cpp: lavapipe compiles these kernels for 50 s).
  Result paged =
      run("check paged-attention --set heads=4 --set kv_heads=1 --set pages=12 --dim page=4 --dim NP=3 --dim T=2 --grad --backend reference,cpu");
  EXPECT_EQ(paged.status, 0) << paged.output;
  // The cpu's kernel reads the pages where they are: explain says so of each page_gather.
  Result explained = run("explain paged-attention --backend cpu");
  ASSERT_EQ(explained.status, 0) << explained.output;
  EXPECT_NE(explained.output.find("(pages read through the block table %4 by the attention kernels that read it)"), std::string::npos)
      << explained.output;
  Result models = run("models");
  EXPECT_NE(models.output.find("--set embed=32  embedding size E (any size the heads divide)"), std::string::npos) << models.output;
  const std::string f = std::string(QKV_SOURCE_DIR) + "/tests/fixtures/torch/";
  Result wrong = run("run mha --set embed=64 --weights " + f + "mha32.safetensors");
  EXPECT_EQ(wrong.status, 2);
  EXPECT_NE(wrong.output.find("in_proj_weight"), std::string::npos) << wrong.output;
  EXPECT_NE(wrong.output.find("f32[192,64]"), std::string::npos) << wrong.output;
}

TEST_F(Cli, RunsAGraphFromItsIrText) {
  Result dumped = run("dump causal-self-attention --ir");
  ASSERT_EQ(dumped.status, 0);
  std::ofstream(path("g.qkv")) << dumped.output;
  Result a = run("run " + path("g.qkv") + " --dim B=1 --dim N=4 --seed 3 --out out=" + path("a.npy"));
  ASSERT_EQ(a.status, 0) << a.output;
  Result c = run("check " + path("g.qkv") + " --dim B=1 --dim N=4 --backend reference,cpu");
  EXPECT_EQ(c.status, 0) << c.output;
  std::ofstream(path("bad.qkv")) << "graph { %0 = frob() : f32[] }";
  Result bad = run("run " + path("bad.qkv"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("bad.qkv: ir parse error at line 1"), std::string::npos) << bad.output;
}

TEST_F(Cli, CheckAllModelsOnHostBackends) {
  Result r = run("check all --backend reference,cpu");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("max abs err"), std::string::npos);
  EXPECT_NE(r.output.find("encoder-decoder-block"), std::string::npos);
  Result grad = run("check decoder-block --grad --backend reference,cpu");
  EXPECT_EQ(grad.status, 0) << grad.output;
  EXPECT_NE(grad.output.find("d_self_attn.in_proj_weight"), std::string::npos) << grad.output;
}

TEST_F(Cli, CheckNamesTheFirstFailingNodeAndWritesARepro) {
  // Budgets of a few ulps (factor 0) are too tight for 300-key softmax rows in float32.
  Result r = run("check sdpa --dim N=300 --dim M=300 --dim D=64 --backend cpu --budget-factor 0 --dump-dir " + path("repro"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("first node outside its budget on cpu: %"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(path("repro/node.qkv"))) << r.output;
  EXPECT_TRUE(fs::exists(path("repro/x0.npy"))) << r.output;
  auto cmd = r.output.find("qkv check " + path("repro"));
  ASSERT_NE(cmd, std::string::npos) << r.output;
  std::string line = r.output.substr(cmd + 4, r.output.find('\n', cmd) - cmd - 4);
  Result again = run(line);
  EXPECT_NE(again.output.find("max abs err"), std::string::npos) << again.output;  // the reproduction runs
}

TEST_F(Cli, ExplainBenchVizTrain) {
  Result fused = run("explain sdpa --set weights=false --dim N=64 --dim M=64");
  ASSERT_EQ(fused.status, 0) << fused.output;
  EXPECT_NE(fused.output.find("fused attention (online softmax)"), std::string::npos) << fused.output;
  EXPECT_NE(fused.output.find("score matrix: not materialised"), std::string::npos) << fused.output;
  EXPECT_EQ(fused.output.find("split-KV"), std::string::npos) << fused.output;
  // Decoding: one query against 2048 keys, split along the keys.
  Result decoding = run("explain sdpa --set weights=false --dim N=1 --dim M=2048");
  ASSERT_EQ(decoding.status, 0) << decoding.output;
  EXPECT_NE(decoding.output.find("split-KV: 1 query against 2048 keys, in 4 parts of 512 keys per batch entry (a task each), merged by their "
                                 "log-sum-exp"),
            std::string::npos)
      << decoding.output;
  // Block sparsity as the run found it: causal at N = M = 1024, B = 2, query blocks of 256 rows
  // cut at the diagonal, the tiles it crosses in slices of 16 rows: the 6 tiles of 256 x 256
  // above the diagonal and 15/32 of each of the 4 on it left out per batch entry (49.2%).
  Result skipping = run("explain sdpa --set weights=false --set causal=true --dim N=1024 --dim M=1024");
  ASSERT_EQ(skipping.status, 0) << skipping.output;
  EXPECT_NE(skipping.output.find("block sparsity: %3 attention skipped 49.2% of its 2097152 scores, in blocks wholly masked"), std::string::npos)
      << skipping.output;
  // A score modifier: flex attention, fused on the cpu, its modifier named.
  Result capped = run("explain sdpa --set weights=false --set softcap=30 --set causal=true --dim N=64 --dim M=64 --grad");
  ASSERT_EQ(capped.status, 0) << capped.output;
  EXPECT_NE(capped.output.find("fused flex attention (online softmax), mod = tanh(score / 30) * 30"), std::string::npos) << capped.output;
  EXPECT_NE(capped.output.find("score matrix: not materialised: fused flex attention"), std::string::npos) << capped.output;
  EXPECT_EQ(capped.output.find(" softmax "), std::string::npos) << capped.output;  // no softmax node
  // Dropout on the weights: drawn inside the fused kernels, forward and backward; a bad p is refused.
  Result dropped = run("explain sdpa --set weights=false --set dropout=0.1 --set causal=true --dim N=64 --dim M=64 --grad");
  ASSERT_EQ(dropped.status, 0) << dropped.output;
  EXPECT_NE(dropped.output.find("fused flex attention (online softmax), mod = score, dropout 0.1"), std::string::npos) << dropped.output;
  EXPECT_EQ(dropped.output.find("dropout_mask"), std::string::npos) << dropped.output;
  Result bad_p = run("run sdpa --set dropout=1.5");
  EXPECT_EQ(bad_p.status, 2) << bad_p.output;
  EXPECT_NE(bad_p.output.find("the dropout probability p must lie in [0, 1)"), std::string::npos) << bad_p.output;
  Result full = run("explain sdpa --backend reference");
  EXPECT_NE(full.output.find("score matrix: materialised"), std::string::npos) << full.output;
  Result bench = run("bench sdpa --backend reference,cpu --repeat 3");
  ASSERT_EQ(bench.status, 0) << bench.output;
  EXPECT_NE(bench.output.find("GFLOP/s"), std::string::npos);
  EXPECT_NE(bench.output.find("\ncpu "), std::string::npos) << bench.output;
  Result viz = run("viz mha --png-dir " + path("viz") + " --labels a,b,c");
  ASSERT_EQ(viz.status, 0) << viz.output;
  for (const char* f : {"weights.png", "weights_per_head.png", "causal_vs_full.png", "positions.png"})
    EXPECT_TRUE(qkv::plot::png_size(qkv::io::read_file(path("viz/") + f))) << f;
  Result train = run("train --steps 40 --png " + path("loss.png"));
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_NE(train.output.find("step   40/40 [##############################]"), std::string::npos) << train.output;
  EXPECT_EQ(qkv::plot::png_size(qkv::io::read_file(path("loss.png"))), (std::pair<std::int64_t, std::int64_t>{1280, 720}));  // 640 x 360, twice
  // Mixed precision: f16 with loss scaling, bf16 without; a dtype it cannot train in is refused.
  Result f16 = run("train --steps 40 --dtype f16");
  ASSERT_EQ(f16.status, 0) << f16.output;
  EXPECT_NE(f16.output.find("mixed precision: matmuls and attention in f16, f32 parameters, dynamic loss scaling"), std::string::npos) << f16.output;
  EXPECT_NE(f16.output.find("loss scale 65536; 0 of 40 steps skipped"), std::string::npos) << f16.output;
  Result bf16 = run("train --steps 2 --dtype bf16");
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  EXPECT_EQ(bf16.output.find("loss scale"), std::string::npos) << bf16.output;
  Result f64 = run("train --steps 2 --dtype f64");
  EXPECT_EQ(f64.status, 2) << f64.output;
  EXPECT_NE(f64.output.find("--dtype f64: f32, f16 or bf16"), std::string::npos) << f64.output;
}

// --dtype runs a built-in model with its float values in f16 or bf16: every model within its
// budgets against the float64 reference (forward, and bf16 backward), f32 files converted to it,
// and what cannot be done named.
TEST_F(Cli, ModelsRunAndCheckInHalfPrecision) {
  Result f16 = run("check all --dtype f16 --backend cpu");
  EXPECT_EQ(f16.status, 0) << f16.output;
  EXPECT_NE(f16.output.find("decoder-block (activation=relu, embed=32, heads=4) in f16, seed 1"), std::string::npos) << f16.output;
  Result bf16 = run("check mha --dtype bf16 --grad --backend cpu");
  EXPECT_EQ(bf16.status, 0) << bf16.output;
  Result file = run("run sdpa --dtype f16 --in q=" + std::string(QKV_SOURCE_DIR) + "/examples/data/journey.npy --out out=" + path("o.npy"));
  EXPECT_EQ(file.status, 0) << file.output;
  EXPECT_EQ(qkv::io::read_npy(path("o.npy")).dtype(), qkv::DType::f16);
  Result bf16_npy = run("run sdpa --dtype bf16 --out out=" + path("b.npy"));
  EXPECT_EQ(bf16_npy.status, 2) << bf16_npy.output;
  EXPECT_NE(bf16_npy.output.find("'out' is bf16, which .npy cannot hold: write a .safetensors file, or widen it with --out-dtype f32"),
            std::string::npos)
      << bf16_npy.output;
  EXPECT_FALSE(std::filesystem::exists(path("b.npy")));
  Result bench = run("bench decoder-block --dtype bf16 --backend cpu --repeat 2");
  EXPECT_EQ(bench.status, 0) << bench.output;
  EXPECT_NE(bench.output.find("\ncpu "), std::string::npos) << bench.output;
  // explain in half precision: the cpu reads half q, k and v where they are and writes the
  // output rounded from the attention's kernel; every backend explains its own lowering.
  Result explain = run("explain sdpa --dtype f16 --set weights=false --backend cpu");
  EXPECT_EQ(explain.status, 0) << explain.output;
  EXPECT_NE(explain.output.find("(input, read in place)"), std::string::npos) << explain.output;
  EXPECT_NE(explain.output.find("(written in place by %6's kernel, rounded to f16)"), std::string::npos) << explain.output;
  // Its bytes in the dtypes held: q, k and v read and the output written in 16 bits (4 x 256 x 2).
  EXPECT_EQ(squeezed_line(explain.output, "%6"), "%6 attention (2, 8, 16) fused attention (online softmax) 0.008 0.002") << explain.output;
  // The storage plan the explanation read: what the attention's kernel writes, and where.
  Result storage = run("dump sdpa --dtype f16 --set weights=false --storage cpu");
  EXPECT_EQ(storage.status, 0) << storage.output;
  EXPECT_NE(storage.output.find("%6 = attention : f32[B,N,Dv]  held f16  kernel, written into %7\n"), std::string::npos) << storage.output;
  EXPECT_NE(storage.output.find("%7 = cast : f16[B,N,Dv]  held f16  no kernel: written in place by %6's kernel, rounded to f16\n"), std::string::npos)
      << storage.output;
  EXPECT_EQ(run("dump sdpa --storage gpu").status, 2) << "an unknown backend";
  const bool vulkan = run("devices").output.find("vulkan     available") != std::string::npos;
  for (const char* backend : {"reference", "vulkan"}) {
    if (std::string(backend) == "vulkan" && !vulkan) continue;  // no device here (EveryModelCommandRunsOnVulkan says so)
    Result other = run("explain decoder-block --dtype bf16 --grad --backend " + std::string(backend));
    EXPECT_EQ(other.status, 0) << backend << "\n" << other.output;
  }
  Result f64 = run("check sdpa --dtype f64");
  EXPECT_EQ(f64.status, 2) << f64.output;
  EXPECT_NE(f64.output.find("--dtype f64: f32, f16 or bf16"), std::string::npos) << f64.output;
}

TEST_F(Cli, EveryModelCommandRunsOnVulkan) {
  Result devices = run("devices");
  if (devices.output.find("vulkan     available") == std::string::npos) {
    if (const char* req = std::getenv("QKV_REQUIRE_VULKAN"); req && std::string(req) == "1") FAIL() << devices.output;
    GTEST_SKIP() << "no Vulkan device: " << devices.output;
  }
  for (const std::string& c :
       std::vector<std::string>{"run gqa --set rope=true", "run decoder-block --grad", "explain encoder-decoder-block",
                                "bench cross-attention --repeat 2", "viz causal-self-attention --png-dir " + path("v"), "train --steps 2"}) {
    Result r = run(c + " --backend vulkan");
    EXPECT_EQ(r.status, 0) << c << "\n" << r.output;
  }
  // The flash kernels count the scores they compute: causal at N = M = 256 skips tiles above the
  // diagonal in every kernel (how many depends on the device's launch geometry).
  Result skipping = run("explain sdpa --backend vulkan --set weights=false --set causal=true --dim N=256 --dim M=256 --grad");
  ASSERT_EQ(skipping.status, 0) << skipping.output;
  for (const char* kernel : {"attention skipped", "attention_lse skipped", "attention_grad skipped"})
    EXPECT_NE(skipping.output.find(kernel), std::string::npos) << kernel << "\n" << skipping.output;
  // Decoding in a GPU's geometry: one query against 2048 keys takes the forward's decode layout,
  // its keys split over workgroups of 512 (lavapipe's geometry keeps the query layout, unsplit).
  Result gpu = run("explain sdpa --backend vulkan --set weights=false --dim N=1 --dim M=2048", "QKV_VULKAN_TUNING=gpu");
  ASSERT_EQ(gpu.status, 0) << gpu.output;
  EXPECT_NE(gpu.output.find("decode layout: 1 query against 2048 keys, 1 query row per workgroup shared by its 32 invocations"), std::string::npos)
      << gpu.output;
  EXPECT_NE(gpu.output.find("split-KV: 1 query against 2048 keys in 4 workgroups of 512 keys per row block"), std::string::npos) << gpu.output;
  Result profile = run("bench sdpa --backend vulkan,cpu --repeat 3 --profile");
  ASSERT_EQ(profile.status, 0) << profile.output;
  EXPECT_NE(profile.output.find("device ms"), std::string::npos) << profile.output;
  EXPECT_NE(profile.output.find("glsl fused_mul_softmax_r3"), std::string::npos) << profile.output;  // the scale inside the softmax
  EXPECT_NE(profile.output.find("cpu does not time its kernels"), std::string::npos) << profile.output;
  // explain --profile: a device-time column on each kernel's row, and their total.
  Result timed = run("explain decoder-block --backend vulkan --profile");
  ASSERT_EQ(timed.status, 0) << timed.output;
  EXPECT_NE(timed.output.find("device ms"), std::string::npos) << timed.output;
  EXPECT_NE(timed.output.find("device time: "), std::string::npos) << timed.output;
  const std::string ln = squeezed_line(timed.output, "%15");
  EXPECT_EQ(std::count(ln.begin(), ln.end(), ' '), 9) << "the layer norm's row has a device time (10 words): " << ln;
  // The decoder block's forward: 9 kernels with elementwise chains, broadcasts and matmul
  // epilogues fused, each layer norm one row kernel (its mean and variance, then its elements),
  // the packed projection's slices read in place and the heads read and written in place by the
  // flash kernel (51 without), the nodes inside them named by the kernel that computes them and
  // moving no bytes of their own.
  Result fused = run("explain decoder-block --backend vulkan");
  ASSERT_EQ(fused.status, 0) << fused.output;
  EXPECT_NE(fused.output.find("kernels: 9, computing 29 nodes more inside them (fused)"), std::string::npos) << fused.output;
  EXPECT_NE(fused.output.find("(view of %26 read through strides)"), std::string::npos) << fused.output;
  EXPECT_NE(fused.output.find("(written in place by %44's kernel through its strides)"), std::string::npos) << fused.output;
  EXPECT_NE(fused.output.find("glsl fused_reduce_sum_div_sub_mul_reduce_sum_div_add_sqrt_div_mul_add_r3"), std::string::npos) << fused.output;
  // The ReLU in the store of the lanes kernel (lavapipe's, the subgroup size in its name) or of the
  // tiled one (a GPU's).
  EXPECT_TRUE(contains_maybe_lanes(fused.output, "glsl fused_matmul", "_add_max_r3")) << fused.output;
  EXPECT_EQ(squeezed_line(fused.output, "%66"), "%66 matmul (2, 8, 128) (in %70's kernel) 0.131 0.000") << fused.output;
  EXPECT_EQ(squeezed_line(fused.output, "%28"), "%28 slice (1, 32, 32) (view of %17 at byte 4096) 0.000 0.000") << fused.output;
}

TEST_F(Cli, BadInputExitsWithTwoAndNamesTheProblem) {
  write("q.npy", qkv::Tensor::from<float>({2, 4}, std::vector<float>(8, 1)));
  write("k.npy", qkv::Tensor::from<float>({3, 5}, std::vector<float>(15, 1)));
  write("ids.npy", qkv::Tensor::from<std::int32_t>({3, 4}, std::vector<std::int32_t>(12, 1)));
  std::FILE* f = std::fopen(path("junk.npy").c_str(), "wb");
  std::fputs("not numpy", f);
  std::fclose(f);
  auto expect = [&](const std::string& args, const std::string& message) {
    Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
  };
  expect("run sdpa --in k=" + path("absent.npy"), "absent.npy: cannot open");
  expect("run sdpa --in k=" + path("junk.npy"), "not a .npy file");
  expect("run sdpa --in q=" + path("q.npy") + " --in k=" + path("k.npy"), "dim D is 5, but input 'q' set it to 4");
  expect("run sdpa --in q=" + path("ids.npy"), "input 'q' must be f32, got int32");
  expect("run sdpa --in nope=" + path("q.npy"),
         "sdpa (causal=false, dropout=0, mask=false, scale=auto, softcap=none, weights=true) has no input 'nope'");
  expect("run sdpa --in q", "--in expects NAME=VALUE, got 'q'");
  expect("run sdpa --out nope=" + path("o.npy"), "has no output 'nope' (outputs: out, weights)");
  expect("run sdpa --set nope=1", "sdpa has no option 'nope' (options: causal, mask, scale, softcap, dropout, weights)");
  expect("run sdpa --set causal=maybe", "option causal=maybe: expected true or false");
  expect("run mha --set embed=48 --set heads=5", "mha: embed=48 is not divisible by heads=5");
  expect("run gqa --set kv_heads=3", "gqa: heads=8 is not divisible by kv_heads=3");
  expect("run nosuchmodel", "no model 'nosuchmodel' (models: sdpa, mha");
  expect("run sdpa --backend nope", "nope");
  expect("check sdpa --backend cpu,nope", "no backend 'nope'");
  expect("bench sdpa --repeat 0", "--repeat must be at least 1");
  expect("frobnicate", "no command 'frobnicate'");
  expect("run mha --weights " + path("absent"), "no such file or folder");
}

TEST_F(Cli, HelpOnEveryCommandVersionDevicesOps) {
  EXPECT_EQ(run("--help").status, 0);
  for (const char* c : {"devices", "ops", "models", "run", "check", "dump", "explain", "bench", "viz", "train"}) {
    Result h = run(std::string(c) + " --help");
    EXPECT_EQ(h.status, 0) << c;
    EXPECT_NE(h.output.find("Usage"), std::string::npos) << c << ": " << h.output;
  }
  Result v = run("--version");
  EXPECT_EQ(v.status, 0);
  EXPECT_NE(v.output.find("qkv 0.1.0"), std::string::npos);
  Result ops = run("ops");
  EXPECT_EQ(ops.status, 0);
  EXPECT_NE(ops.output.find("| `masked_attention` | 4 |"), std::string::npos) << ops.output;
  EXPECT_NE(ops.output.find("| `softmax` | 1 | decomposed | kernel | kernel | rule |"), std::string::npos) << ops.output;
  EXPECT_EQ(ops.output.find("MISSING"), std::string::npos) << ops.output;
  Result d = run("devices");
  EXPECT_EQ(d.status, 0);
  EXPECT_NE(d.output.find("vulkan"), std::string::npos);
  if (d.output.find("vulkan     available") != std::string::npos) {  // each device's capabilities under it
    EXPECT_NE(d.output.find("  vulkan device 0: "), std::string::npos) << d.output;
    EXPECT_NE(d.output.find(" KiB shared memory, "), std::string::npos) << d.output;
    EXPECT_NE(d.output.find(", cooperative matrix "), std::string::npos) << d.output;
  }
}

TEST_F(Cli, DumpPrintsIrDotGlslAndBackward) {
  Result ir = run("dump sdpa --ir --set causal=true");
  EXPECT_EQ(ir.status, 0);
  EXPECT_NE(ir.output.find("causal_mask"), std::string::npos);
  Result backward = run("dump sdpa --grad --set weights=false");
  EXPECT_EQ(backward.status, 0);
  EXPECT_NE(backward.output.find("input \"dout\""), std::string::npos) << backward.output;
  EXPECT_NE(backward.output.find("d_k=%"), std::string::npos) << backward.output;
  EXPECT_NE(run("dump sdpa --dot").output.find("digraph qkv"), std::string::npos);
  // The shaders the device runs: the packed projection's slices read in place, the matmuls with
  // their epilogues, each kernel headed by the nodes it computes.
  Result glsl = run("dump decoder-block --glsl");
  ASSERT_EQ(glsl.status, 0) << glsl.output;
  EXPECT_NE(glsl.output.find("%28 = slice : f32[1,32,32] (no kernel: view of %17 at byte 4096)"), std::string::npos) << glsl.output;
  EXPECT_TRUE(contains_maybe_lanes(glsl.output, "(kernel fused_matmul", "_add_max_r3, computing %66 matmul, %68 add, %69 constant, %70 max)"))
      << glsl.output;
  EXPECT_NE(glsl.output.find("float qkv_epilogue(float acc, uint row, uint col)"), std::string::npos) << glsl.output;
  // With no device (no driver found), the shaders a GPU with common limits would run, said so.
  Result generic = run("dump decoder-block --glsl", "VK_ICD_FILENAMES=/nonexistent VK_DRIVER_FILES=/nonexistent");
  ASSERT_EQ(generic.status, 0) << generic.output;
  EXPECT_EQ(generic.output.rfind("// No Vulkan device here: the shaders for a GPU", 0), 0u) << generic.output;
  EXPECT_NE(generic.output.find("(kernel fused_matmul_add_max_r3, computing %66 matmul, %68 add, %69 constant, %70 max)"), std::string::npos)
      << generic.output;
}

TEST_F(Cli, RunGradWritesInputGradients) {
  // One query, one key: the weight is 1 whatever q and k are, so d_q = d_k = 0 and d_v = dout.
  write("q.npy", qkv::Tensor::from<float>({1, 2}, {0.3f, -0.2f}));
  write("k.npy", qkv::Tensor::from<float>({1, 2}, {0.5f, 0.1f}));
  write("v.npy", qkv::Tensor::from<float>({1, 3}, {1, 2, 3}));
  write("dout.npy", qkv::Tensor::from<float>({1, 3}, {0.5f, -1, 2}));
  std::string base = "run sdpa --set weights=false --backend cpu --in q=" + path("q.npy") + " --in k=" + path("k.npy") + " --in v=" + path("v.npy");
  Result r = run(base + " --grad --in dout=" + path("dout.npy") + " --out d_v=" + path("dv.npy") + " --out d_q=" + path("dq.npy"));
  ASSERT_EQ(r.status, 0) << r.output;
  qkv::Tensor dv = qkv::io::read_npy(path("dv.npy")), dq = qkv::io::read_npy(path("dq.npy"));
  EXPECT_EQ(dv.shape(), (std::vector<std::int64_t>{1, 3}));
  EXPECT_NEAR(dv.at(2), 2.0, 1e-6);
  EXPECT_EQ(dq.shape(), (std::vector<std::int64_t>{1, 2}));
  EXPECT_NEAR(dq.at(0), 0.0, 1e-6);
  write("bad.npy", qkv::Tensor::from<float>({1, 2}, {0, 0}));
  Result bad = run(base + " --grad --in dout=" + path("bad.npy"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("dout"), std::string::npos) << bad.output;
}

TEST_F(Cli, RunJvpWritesOutputTangents) {
  // One query, one key: the weight is 1 whatever q and k are, so out = v and t_out = t_v.
  write("q.npy", qkv::Tensor::from<float>({1, 2}, {0.3f, -0.2f}));
  write("k.npy", qkv::Tensor::from<float>({1, 2}, {0.5f, 0.1f}));
  write("v.npy", qkv::Tensor::from<float>({1, 3}, {1, 2, 3}));
  write("tv.npy", qkv::Tensor::from<float>({1, 3}, {0.5f, -1, 2}));
  std::string base = "run sdpa --set weights=false --backend cpu --in q=" + path("q.npy") + " --in k=" + path("k.npy") + " --in v=" + path("v.npy");
  Result r = run(base + " --jvp --in t_v=" + path("tv.npy") + " --out t_out=" + path("tout.npy"));
  ASSERT_EQ(r.status, 0) << r.output;
  qkv::Tensor t = qkv::io::read_npy(path("tout.npy"));
  ASSERT_EQ(t.shape(), (std::vector<std::int64_t>{1, 3}));
  EXPECT_NEAR(t.at(0), 0.5, 1e-6);
  EXPECT_NEAR(t.at(1), -1.0, 1e-6);
  EXPECT_NEAR(t.at(2), 2.0, 1e-6);
  // Two keys: q's and k's tangents count too (zero tangents give a zero t_out).
  write("k2.npy", qkv::Tensor::from<float>({2, 2}, {0.5f, 0.1f, -0.3f, 0.8f}));
  write("v2.npy", qkv::Tensor::from<float>({2, 3}, {1, 2, 3, -1, 0, 4}));
  write("tq.npy", qkv::Tensor::from<float>({1, 2}, {1, -1}));
  write("zq.npy", qkv::Tensor::from<float>({1, 2}, {0, 0}));
  write("zk.npy", qkv::Tensor::from<float>({2, 2}, {0, 0, 0, 0}));
  write("zv.npy", qkv::Tensor::from<float>({2, 3}, {0, 0, 0, 0, 0, 0}));
  const std::string two = "run sdpa --set weights=false --backend cpu --jvp --in q=" + path("q.npy") + " --in k=" + path("k2.npy") +
                          " --in v=" + path("v2.npy") + " --in t_k=" + path("zk.npy") + " --in t_v=" + path("zv.npy");
  ASSERT_EQ(run(two + " --in t_q=" + path("tq.npy") + " --out t_out=" + path("moved.npy")).status, 0);
  ASSERT_EQ(run(two + " --in t_q=" + path("zq.npy") + " --out t_out=" + path("still.npy")).status, 0);
  const qkv::Tensor moved = qkv::io::read_npy(path("moved.npy")), still = qkv::io::read_npy(path("still.npy"));
  double moved_norm = 0;
  for (std::int64_t i = 0; i < 3; ++i) {
    moved_norm += std::abs(moved.at(i));
    EXPECT_EQ(still.at(i), 0.0);
  }
  EXPECT_GT(moved_norm, 1e-3) << "q's tangent moves the output";
  Result both = run(base + " --jvp --grad");
  EXPECT_EQ(both.status, 2) << both.output;
  Result unknown = run(base + " --jvp --in t_nope=" + path("tv.npy"));
  EXPECT_EQ(unknown.status, 2);
  EXPECT_NE(unknown.output.find("tangents with --jvp: t_k, t_q, t_v"), std::string::npos) << unknown.output;
  Result check = run("check mha --jvp --backend reference,cpu");
  EXPECT_EQ(check.status, 0) << check.output;
  EXPECT_NE(check.output.find("t_out"), std::string::npos) << check.output;
  // explain: the forward computed in its tangent's kernel, one pass; what the bits guarantee.
  Result explained = run("explain sdpa --set weights=false --set causal=true --jvp --backend cpu --dim N=300 --dim M=300");
  ASSERT_EQ(explained.status, 0) << explained.output;
  EXPECT_NE(explained.output.find("%7    attention_jvp      (2, 300, 16)           fused attention tangent (forward mode: the output and its "
                                  "tangent in one online-softmax pass)"),
            std::string::npos)
      << explained.output;
  EXPECT_NE(explained.output.find("%6    attention          (2, 300, 16)           (in %7's kernel)"), std::string::npos) << explained.output;
  EXPECT_NE(explained.output.find("deterministic: every kernel: the same bits every run and at any thread count"), std::string::npos)
      << explained.output;
}

}  // namespace

namespace {

TEST(Docs, OpsTableIsGenerated) {
  std::ifstream in(std::string(QKV_SOURCE_DIR) + "/docs/ir.md");
  std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string begin = "<!-- qkv ops -->\n", end = "<!-- end qkv ops -->";
  auto b = page.find(begin), e = page.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/ir.md has no " << begin;
  ASSERT_NE(e, std::string::npos) << "docs/ir.md has no " << end;
  EXPECT_EQ(page.substr(b + begin.size(), e - b - begin.size()), run("ops").output) << "regenerate docs/ir.md's table with: qkv ops";
}

}  // namespace

namespace {

// Each finding of the trust review, reproduced as the user met it.
TEST_F(Cli, DumpedGraphMeansTheModelAtEveryHeadDim) {
  // The default scale 1/sqrt(D) of a dumped sdpa is resolved when D is bound: dump at the default
  // size, run at D = 3, and get the model's numbers at D = 3.
  Result dump = run("dump sdpa --set weights=false");
  ASSERT_EQ(dump.status, 0) << dump.output;
  EXPECT_NE(dump.output.find("rsqrt_of=D"), std::string::npos) << dump.output;
  std::ofstream(path("sdpa.qkv")) << dump.output;
  std::vector<float> q(12), k(12), v(12);
  for (std::size_t i = 0; i < 12; ++i)
    q[i] = 0.5f * static_cast<float>(i % 5) - 1, k[i] = 0.3f * static_cast<float>(i % 7) - 1, v[i] = static_cast<float>(i);
  const std::string ins = " --in q=" + write("q.npy", qkv::Tensor::from<float>({1, 4, 3}, q)) +
                          " --in k=" + write("k.npy", qkv::Tensor::from<float>({1, 4, 3}, k)) +
                          " --in v=" + write("v.npy", qkv::Tensor::from<float>({1, 4, 3}, v));
  ASSERT_EQ(run("run " + path("sdpa.qkv") + ins + " --out out=" + path("a.npy")).status, 0);
  ASSERT_EQ(run("run sdpa --set weights=false" + ins + " --out out=" + path("b.npy")).status, 0);
  ASSERT_EQ(run("run sdpa --set weights=false --set scale=0.5773502691896258" + ins + " --out out=" + path("c.npy")).status, 0);
  const qkv::Tensor a = qkv::io::read_npy(path("a.npy")), b = qkv::io::read_npy(path("b.npy")), c = qkv::io::read_npy(path("c.npy"));
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_EQ(a.at(i), b.at(i)) << i;
    EXPECT_NEAR(a.at(i), c.at(i), 1e-6) << i;
  }
}

TEST_F(Cli, GradientSeedsAreTheBackwardsOwnInputs) {
  // An input named like a seed ("data" starts with d) is data, not a seed.
  std::ofstream(path("g.qkv")) << "graph {\n  %0 = input \"data\" : f32[2]\n  %1 = mul(%0, %0) : f32[2]\n  return out=%1\n}\n";
  write("data.npy", qkv::Tensor::from<float>({2}, {3, -1}));
  write("dout.npy", qkv::Tensor::from<float>({2}, {1, 1}));
  Result r =
      run("run " + path("g.qkv") + " --grad --in data=" + path("data.npy") + " --in dout=" + path("dout.npy") + " --out d_data=" + path("d.npy"));
  ASSERT_EQ(r.status, 0) << r.output;
  const qkv::Tensor d = qkv::io::read_npy(path("d.npy"));
  EXPECT_EQ(d.at(0), 6.0);  // d/dx x^2 = 2x at the file's x, not at random values
  EXPECT_EQ(d.at(1), -2.0);
  Result bad = run("run " + path("g.qkv") + " --grad --in dx=" + path("dout.npy"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("gradient seeds with --grad: dout"), std::string::npos) << bad.output;
}

TEST_F(Cli, SdpaTakesAnyLeadingBatchDimsWithBroadcastMasks) {
  // q (2, 3, 5, 4) with a mask (2, 1, 5, 5): torch's scaled_dot_product_attention shapes.
  std::vector<float> x(2 * 3 * 5 * 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  write("q4.npy", qkv::Tensor::from<float>({2, 3, 5, 4}, x));
  std::vector<bool> keep(2 * 5 * 5);
  for (std::size_t i = 0; i < keep.size(); ++i) keep[i] = (i % 5) <= (i / 5) % 5;  // causal, as a mask
  write("m.npy", qkv::Tensor::from<bool>({2, 1, 5, 5}, keep));
  const std::string in = " --in q=" + path("q4.npy") + " --in k=" + path("q4.npy") + " --in v=" + path("q4.npy");
  Result masked = run("run sdpa --set mask=true" + in + " --in mask=" + path("m.npy") + " --out out=" + path("o1.npy"));
  ASSERT_EQ(masked.status, 0) << masked.output;
  Result causal = run("run sdpa --set causal=true" + in + " --out out=" + path("o2.npy"));
  ASSERT_EQ(causal.status, 0) << causal.output;
  const qkv::Tensor a = qkv::io::read_npy(path("o1.npy")), b = qkv::io::read_npy(path("o2.npy"));
  EXPECT_EQ(a.shape(), (std::vector<std::int64_t>{2, 3, 5, 4}));
  for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.at(i), b.at(i), 1e-6) << i;
  write("m_bad.npy", qkv::Tensor::from<bool>({3, 1, 5, 5}, std::vector<bool>(75, true)));
  Result bad = run("run sdpa --set mask=true" + in + " --in mask=" + path("m_bad.npy"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("do not broadcast"), std::string::npos) << bad.output;
}

TEST_F(Cli, NothingIsHalfWritten) {
  // A bad second destination: nothing written, and the run does not start.
  Result r = run("run sdpa --out out=" + path("a.npy") + " --out weights=" + path("missing/dir/w.npy"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("missing/dir does not exist"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("a.npy")));
  Result t = run("train --steps 3 --png " + path("missing/x.png"));
  EXPECT_EQ(t.status, 2);
  EXPECT_EQ(t.output.find("step"), std::string::npos) << "trained before failing: " << t.output;
  std::ofstream(path("afile")) << "x";
  Result c = run("check sdpa --backend cpu --dump-dir " + path("afile"));
  EXPECT_EQ(c.status, 2) << c.output;
  EXPECT_NE(c.output.find("is a file; name a folder"), std::string::npos) << c.output;
  for (const auto& e : fs::directory_iterator(dir_)) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

TEST_F(Cli, EveryBadInputIsOneLineAndExitTwo) {
  write("q.npy", qkv::Tensor::from<float>({1, 4, 8}, std::vector<float>(32, 1)));
  {  // np.zeros((1, 4, 8), dtype=np.int64)
    std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 4, 8), }";
    header.append(128 - 10 - header.size() - 1, ' ');
    std::ofstream(path("ids64.npy"), std::ios::binary)
        << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size() + 1) << '\0' << header << '\n'
        << std::string(256, '\0');
  }
  std::ofstream(path("noreturn.qkv")) << "graph {\n  %0 = input \"a\" : f32[2]\n}\n";
  std::ofstream(path("typo.qkv")) << "graph {\n  %0 = input \"a\" : f32[2]\n  %1 = exp(%0) : f32[3]\n  return out=%1\n}\n";
  auto expect = [&](const std::string& args, const std::string& message) {
    Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
  };
  expect("run sdpa --dim n=4", "--dim n=4: sdpa (causal=false, dropout=0, mask=false, scale=auto, softcap=none, weights=true) has no dim 'n'");
  expect("run sdpa --dim N=8abc", "--dim N=8abc: expected a size");
  expect("run sdpa --dim N=-1", "--dim N=-1: expected a size");
  expect("run sdpa --seed -1", "a seed is a whole number >= 0, got '-1'");
  expect("run sdpa --in q=" + dir_.string(), "is a folder, not a file");
  expect("run sdpa --in q=" + path("q.npy") + " --in q=" + path("q.npy"), "--in q is given twice");
  expect("run sdpa --weights " + path("q.npy"), "sdpa (causal=false, dropout=0, mask=false, scale=auto, softcap=none, weights=true) has no weights");
  expect("run " + path("noreturn.qkv"), "no 'return' line");
  expect("run " + path("typo.qkv"), "line 3: %1 is written f32[3] but exp gives f32[2]");
  expect("run sdpa --in q=" + path("ids64.npy"), "input 'q' must be f32, got int64");
  expect("viz sdpa --png-dir " + path("q.npy"), "is a file; name a folder");
  expect("viz sdpa --grad --png-dir " + path("v"), "--grad");
  expect("run sdpa --in q=" + path("unreadable/none.npy"), "cannot open (No such file or directory)");
  expect("run sdpa --in q=/dev/zero", "/dev/zero: is not a regular file");  // was read forever
  expect("run sdpa --in q=", "--in q=: no value after '='");
  expect("bench sdpa --backend nope", "no backend 'nope'");
}

TEST_F(Cli, VizSaysWhenThereAreNoWeightsToDraw) {
  for (const std::string& args : {std::string("viz sdpa --set weights=false"), std::string("viz gqa")}) {
    Result r = run(args + " --png-dir " + path("v"));
    ASSERT_EQ(r.status, 0) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("has no attention weights to draw"), std::string::npos) << r.output;
    EXPECT_TRUE(qkv::plot::png_size(qkv::io::read_file(path("v/positions.png"))));
  }
}

/// Every <text> element of class `cls` in an SVG, in order.
std::vector<std::string> svg_texts(const std::string& svg, const std::string& cls) {
  std::vector<std::string> out;
  const std::string open = "<text class=\"" + cls + "\"";
  for (std::size_t at = svg.find(open); at != std::string::npos; at = svg.find(open, at + 1)) {
    const std::size_t begin = svg.find('>', at) + 1;
    out.push_back(svg.substr(begin, svg.find("</text>", begin) - begin));
  }
  return out;
}

TEST_F(Cli, VizDrawsTheSeedsFigureInOneCommand) {
  // The tutorials' figure: two heads side by side, annotated, whole token labels, one colour bar.
  const std::vector<std::string> words = {"Your", "journey", "starts", "with", "one", "step"};
  Result r = run("viz mha --set heads=2 --labels Your,journey,starts,with,one,step --dir " + path("figs") + " --format svg,png,pdf");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string svg = qkv::io::read_file(path("figs/weights_per_head.svg"));
  EXPECT_EQ(svg_texts(svg, "title"), (std::vector<std::string>{"head 1", "head 2"}));
  std::vector<std::string> twice = words;
  twice.insert(twice.end(), words.begin(), words.end());
  EXPECT_EQ(svg_texts(svg, "xtick"), twice);  // six tokens: the sequence is as long as the labels
  EXPECT_EQ(svg_texts(svg, "ytick"), twice);
  const auto cells = svg_texts(svg, "annotation");
  ASSERT_EQ(cells.size(), 72u);
  double row = 0;
  for (std::size_t i = 0; i < 6; ++i) row += std::stod(cells[i]);
  EXPECT_NEAR(row, 1.0, 0.004);  // a row of weights, written to three decimals
  std::size_t bars = 0;
  for (std::size_t at = svg.find("class=\"colour-bar\""); at != std::string::npos; at = svg.find("class=\"colour-bar\"", at + 1)) ++bars;
  EXPECT_EQ(bars, 1u);  // one colour bar for both heads
  for (const char* name : {"weights", "weights_per_head", "causal_vs_full", "positions"}) {
    EXPECT_TRUE(qkv::plot::png_size(qkv::io::read_file(path("figs/") + name + ".png"))) << name;
    EXPECT_EQ(qkv::io::read_file(path("figs/") + name + ".pdf").rfind("%PDF-", 0), 0u) << name;
  }
  // Causal next to full: the causal panel hatches the 15 future keys and writes no number there.
  const std::string both = qkv::io::read_file(path("figs/causal_vs_full.svg"));
  EXPECT_EQ(svg_texts(both, "title"), (std::vector<std::string>{"full", "causal"}));
  EXPECT_EQ(svg_texts(both, "annotation").size(), 36u + 21u);
  // The explorer too, into the same folder, and into a folder --dir makes (however it is spelled).
  Result html = run("viz mha --labels a,b,c --html " + path("figs/explorer.html"));
  ASSERT_EQ(html.status, 0) << html.output;
  Result fresh = run("viz mha --labels a,b,c --dir " + path("fresh/") + " --format svg --html " + path("fresh/explorer.html"));
  ASSERT_EQ(fresh.status, 0) << fresh.output;
  EXPECT_TRUE(fs::exists(path("fresh/explorer.html")));
  const std::string page = qkv::io::read_file(path("figs/explorer.html"));
  EXPECT_NE(page.find("\"tokens\":[\"a\",\"b\",\"c\"]"), std::string::npos);
  EXPECT_EQ(page.find("/*QKV_DATA*/"), std::string::npos);
}

TEST_F(Cli, VizAndTrainRefuseWhatTheyCannotWrite) {
  auto expect = [&](const std::string& args, const std::string& message) {
    Result r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
  };
  expect("viz mha --dir " + path("f") + " --format png,jpg", "'jpg' is not a figure format (png, svg, pdf)");
  expect("viz mha", "name a folder for the figures (--dir), an explorer file (--html), or both");
  expect("viz mha --html " + path("missing/e.html"), "missing does not exist");
  expect("viz sdpa --set weights=false --html " + path("e.html"), "has no attention weights to explore");
  expect("train --steps 3 --plot " + path("loss.jpg"), "--plot " + path("loss.jpg") + ": name a .png, .svg or .pdf file");
  EXPECT_FALSE(fs::exists(path("f")));
  EXPECT_FALSE(fs::exists(path("e.html")));
}

}  // namespace

namespace {

/// Malformed Vulkan tuning variables name themselves and what they take, wherever the backend
/// would start (no device is needed to see the mistake).
TEST_F(Cli, BadVulkanTuningVariablesAreNamed) {
  for (const auto& [env, message] : std::vector<std::pair<std::string, std::string>>{
           {"QKV_VULKAN_TUNING=fast", "QKV_VULKAN_TUNING is 'fast'; give cpu, gpu or auto"},
           {"QKV_VULKAN_ATTENTION_GEOMETRY=3,1,32", "QKV_VULKAN_ATTENTION_GEOMETRY is '3,1,32'; give INVOCATIONS,ROWS,TILE"},
           {"QKV_VULKAN_ATTENTION_GEOMETRY=64,1", "QKV_VULKAN_ATTENTION_GEOMETRY is '64,1'"},
           {"QKV_VULKAN_ATTENTION_GEOMETRY=64,1,32x", "QKV_VULKAN_ATTENTION_GEOMETRY is '64,1,32x'"},
           {"QKV_DETERMINISTIC=yes", "QKV_DETERMINISTIC is 'yes'; give 1 (packed batches batch-invariant on every device) or 0 (the default)"},
           {"QKV_VULKAN_FUSION=2", "QKV_VULKAN_FUSION is '2'; give 1 (fuse, the default) or 0"}}) {
    Result devices = run("devices", env);
    EXPECT_EQ(devices.status, 0) << env;
    EXPECT_NE(devices.output.find("vulkan     unavailable vulkan: " + message), std::string::npos) << env << "\n" << devices.output;
    Result r = run("run sdpa --backend vulkan --dim N=3 --dim M=3", env);
    EXPECT_NE(r.status, 0) << env;
    EXPECT_NE(r.output.find(message), std::string::npos) << env << "\n" << r.output;
  }
}

TEST_F(Cli, ACorruptShaderCacheIsRecompiled) {
  // A truncated cache entry broke every Vulkan run until the user deleted it.
  Result devices = run("devices");
  if (devices.output.find("vulkan     available") == std::string::npos) {
    if (const char* req = std::getenv("QKV_REQUIRE_VULKAN"); req && std::string(req) == "1") FAIL() << devices.output;
    GTEST_SKIP() << "no Vulkan device: " << devices.output;
  }
  auto run_vulkan = [&] { return run("run sdpa --backend vulkan --dim N=3 --dim M=3", "-u QKV_NO_SHADER_CACHE XDG_CACHE_HOME=" + path("cache")); };
  Result first = run_vulkan();
  ASSERT_EQ(first.status, 0) << first.output;
  int entries = 0;
  for (const auto& e : fs::directory_iterator(path("cache/qkv"))) {
    fs::resize_file(e.path(), fs::file_size(e.path()) / 2);
    ++entries;
  }
  ASSERT_GT(entries, 0);
  Result second = run_vulkan();
  EXPECT_EQ(second.status, 0) << second.output;
  for (const auto& e : fs::directory_iterator(path("cache/qkv"))) EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

}  // namespace

namespace {

TEST_F(Cli, OutOfMemoryIsAnErrorNamingTheValueAndBytes) {
  // A 10^6 x 10^6 score matrix: bad_alloc after 16 s and an abort before; now exit 1 at planning.
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer's operator new reports a failed allocation and exits instead of throwing bad_alloc";
#endif
  for (const char* backend : {"cpu", "reference"}) {
    Result r = run(std::string("run sdpa --backend ") + backend + " --dim B=1 --dim D=1 --dim Dv=1 --dim N=1000000 --dim M=1000000");
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find(std::string(backend) + ": out of memory"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("matmul f32[1,1000000,1000000]"), std::string::npos) << r.output;
  }
  Result input = run("run sdpa --dim N=100000000000");  // the random q itself cannot be had
  EXPECT_EQ(input.status, 1) << input.output;
  EXPECT_NE(input.output.find("input 'q': out of memory: f32[2,100000000000,16] needs 12800000000000 bytes"), std::string::npos) << input.output;
}

}  // namespace

namespace {

TEST_F(Cli, AGraphFileTakesTheWeightsTheFileNames) {
  // Before, --weights was silently ignored for a graph file; now the inputs it names come from it.
  std::ofstream(path("w.qkv")) << "graph {\n  %0 = input \"x\" : f32[2,32]\n  %1 = input \"in_proj_bias\" : f32[96]\n"
                                  "  %2 = add(%0, %0) : f32[2,32]\n  return out=%2, b=%1\n}\n";
  Result r = run("run " + path("w.qkv") + " --weights " + QKV_SOURCE_DIR + "/tests/fixtures/torch/mha32.safetensors");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("in_proj_bias             (96,)            from " + std::string(QKV_SOURCE_DIR)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("x                        (2, 32)          from seed 1"), std::string::npos) << r.output;
}

}  // namespace
