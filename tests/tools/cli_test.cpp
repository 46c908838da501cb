// The qkv program end to end: run, check, dump, devices, and bad input with exit status 2.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "io/npy.hpp"

namespace {

namespace fs = std::filesystem;

struct Result {
  int status;
  std::string output;
};

Result run(const std::string& args) {
  std::string cmd = std::string(QKV_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
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

TEST_F(Cli, RunWritesOutputsWithBatchDimsKept) {
  // q = [[1, 0]], k = [[1, 0], [0, 1]], v = [[1, 2], [3, 4]] in a (1, 1, ...) batch; scale 1.
  write("q.npy", qkv::Tensor::from<float>({1, 1, 1, 2}, {1, 0}));
  write("k.npy", qkv::Tensor::from<float>({1, 1, 2, 2}, {1, 0, 0, 1}));
  write("v.npy", qkv::Tensor::from<double>({1, 1, 2, 2}, {1, 2, 3, 4}));
  for (const char* backend : {"reference", "cpu"}) {
    Result r = run(std::string("run sdpa --backend ") + backend + " --scale 1 --in q=" + path("q.npy") + " --in k=" + path("k.npy") +
                   " --in v=" + path("v.npy") + " --out out=" + path("out.npy") + " --out weights=" + path("w.npy"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("out (1, 1, 1, 2) -> "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("weights:\n     0.7311   0.2689"), std::string::npos) << r.output;
    qkv::Tensor out = qkv::io::read_npy(path("out.npy"));
    qkv::Tensor w = qkv::io::read_npy(path("w.npy"));
    EXPECT_EQ(out.shape(), (std::vector<std::int64_t>{1, 1, 1, 2}));
    EXPECT_NEAR(out.at(0), 1.537883, 1e-4);
    EXPECT_NEAR(w.at(0), 0.731059, 1e-4);
  }
}

TEST_F(Cli, RunWithMaskAndCausal) {
  write("q.npy", qkv::Tensor::from<float>({2, 2}, {1, 0, 0, 1}));
  write("k.npy", qkv::Tensor::from<float>({2, 2}, {1, 0, 0, 1}));
  write("v.npy", qkv::Tensor::from<float>({2, 1}, {10, 20}));
  write("m.npy", qkv::Tensor::from<bool>({1, 2}, {false, true}));
  Result r = run("run sdpa --backend cpu --in q=" + path("q.npy") + " --in k=" + path("k.npy") + " --in v=" + path("v.npy") +
                 " --in mask=" + path("m.npy") + " --out out=" + path("o.npy"));
  ASSERT_EQ(r.status, 0) << r.output;
  qkv::Tensor o = qkv::io::read_npy(path("o.npy"));
  EXPECT_NEAR(o.at(0), 20, 1e-5);  // only key 1 is kept
  EXPECT_NEAR(o.at(1), 20, 1e-5);
}

TEST_F(Cli, CheckPassesOnHostBackends) {
  Result r = run("check sdpa --backends reference,cpu --causal");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("max abs err"), std::string::npos);
  EXPECT_NE(r.output.find("all backends within budget"), std::string::npos);
}

TEST_F(Cli, CheckFailsForUnknownBackend) {
  Result r = run("check sdpa --backends cpu,nope");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("unknown backend 'nope'"), std::string::npos);
}

TEST_F(Cli, BadInputExitsWithTwoAndNamesTheProblem) {
  write("q.npy", qkv::Tensor::from<float>({2, 4}, std::vector<float>(8, 1)));
  write("k.npy", qkv::Tensor::from<float>({3, 5}, std::vector<float>(15, 1)));
  write("v.npy", qkv::Tensor::from<float>({3, 4}, std::vector<float>(12, 1)));
  std::FILE* f = std::fopen(path("junk.npy").c_str(), "wb");
  std::fputs("not numpy", f);
  std::fclose(f);
  auto args = [&](const std::string& k) {
    return "run sdpa --backend cpu --in q=" + path("q.npy") + " --in k=" + k + " --in v=" + path("v.npy");
  };
  Result missing = run(args(path("absent.npy")));
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.output.find("absent.npy: cannot open"), std::string::npos) << missing.output;
  Result junk = run(args(path("junk.npy")));
  EXPECT_EQ(junk.status, 2);
  EXPECT_NE(junk.output.find("not a .npy file"), std::string::npos) << junk.output;
  Result dims = run(args(path("k.npy")));
  EXPECT_EQ(dims.status, 2);
  EXPECT_NE(dims.output.find("tensor 'k' has head dim 5, q has 4"), std::string::npos) << dims.output;
  write("mask.npy", qkv::Tensor::from<float>({2, 3}, std::vector<float>(6, 1)));
  Result mask = run(args(path("v.npy")) + " --in mask=" + path("mask.npy"));
  EXPECT_EQ(mask.status, 2);
  EXPECT_NE(mask.output.find("mask must be a bool array"), std::string::npos) << mask.output;
  Result no_v = run("run sdpa --in q=" + path("q.npy") + " --in k=" + path("q.npy"));
  EXPECT_EQ(no_v.status, 2);
  EXPECT_NE(no_v.output.find("missing --in v=FILE.npy"), std::string::npos) << no_v.output;
  EXPECT_EQ(run("run nosuchmodel").status, 2);
  EXPECT_EQ(run("frobnicate").status, 2);
}

TEST_F(Cli, DumpPrintsIrDotAndGlsl) {
  Result ir = run("dump sdpa --ir --causal");
  EXPECT_EQ(ir.status, 0);
  EXPECT_NE(ir.output.find("causal_mask"), std::string::npos);
  Result backward = run("dump sdpa --backward --causal");
  EXPECT_EQ(backward.status, 0);
  EXPECT_NE(backward.output.find("input \"dout\""), std::string::npos) << backward.output;
  EXPECT_NE(backward.output.find("d_k=%"), std::string::npos) << backward.output;
  Result dot = run("dump sdpa --dot");
  EXPECT_NE(dot.output.find("digraph qkv"), std::string::npos);
}

TEST_F(Cli, HelpVersionDevices) {
  EXPECT_EQ(run("--help").status, 0);
  EXPECT_EQ(run("run --help").status, 0);
  Result v = run("--version");
  EXPECT_EQ(v.status, 0);
  EXPECT_NE(v.output.find("qkv 0.1.0"), std::string::npos);
  Result ops = run("ops");
  EXPECT_EQ(ops.status, 0);
  EXPECT_NE(ops.output.find("| `masked_attention` | 4 |"), std::string::npos) << ops.output;
  EXPECT_NE(ops.output.find("| `softmax` | 1 | decomposed | kernel | kernel | rule |"), std::string::npos) << ops.output;
  EXPECT_NE(ops.output.find("| `one_hot` | 1 | kernel | kernel | kernel | none: integer input |"), std::string::npos) << ops.output;
  EXPECT_EQ(ops.output.find("MISSING"), std::string::npos) << ops.output;
  Result d = run("devices");
  EXPECT_EQ(d.status, 0);
  EXPECT_NE(d.output.find("reference"), std::string::npos);
  EXPECT_NE(d.output.find("vulkan"), std::string::npos);
}

}  // namespace

namespace {

TEST_F(Cli, RunGradWritesInputGradients) {
  // One query, one key: the weight is 1 whatever q and k are, so d_q = d_k = 0 and d_v = dout.
  write("q.npy", qkv::Tensor::from<float>({1, 2}, {0.3f, -0.2f}));
  write("k.npy", qkv::Tensor::from<float>({1, 2}, {0.5f, 0.1f}));
  write("v.npy", qkv::Tensor::from<float>({1, 3}, {1, 2, 3}));
  write("dout.npy", qkv::Tensor::from<float>({1, 3}, {0.5f, -1, 2}));
  std::string base = "run sdpa --backend cpu --in q=" + path("q.npy") + " --in k=" + path("k.npy") + " --in v=" + path("v.npy");
  Result r = run(base + " --grad --in dout=" + path("dout.npy") + " --out d_v=" + path("dv.npy") + " --out d_q=" + path("dq.npy"));
  ASSERT_EQ(r.status, 0) << r.output;
  qkv::Tensor dv = qkv::io::read_npy(path("dv.npy")), dq = qkv::io::read_npy(path("dq.npy"));
  EXPECT_EQ(dv.shape(), (std::vector<std::int64_t>{1, 3}));
  EXPECT_NEAR(dv.at(2), 2.0, 1e-6);
  EXPECT_EQ(dq.shape(), (std::vector<std::int64_t>{1, 2}));
  EXPECT_NEAR(dq.at(0), 0.0, 1e-6);
  Result no_dout = run(base + " --grad");
  EXPECT_EQ(no_dout.status, 2);
  EXPECT_NE(no_dout.output.find("--grad needs --in dout"), std::string::npos) << no_dout.output;
  write("bad.npy", qkv::Tensor::from<float>({1, 2}, {0, 0}));
  Result bad = run(base + " --grad --in dout=" + path("bad.npy"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("tensor 'dout' (the gradient of out) has shape (1, 2), out has (1, 3)"), std::string::npos) << bad.output;
}

TEST_F(Cli, CheckGradPassesOnHostBackends) {
  Result r = run("check sdpa --grad --causal --backends reference,cpu");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("d_k"), std::string::npos) << r.output;
}

}  // namespace

namespace {

TEST(Readme, OpsTableIsGenerated) {
  std::ifstream in(std::string(QKV_SOURCE_DIR) + "/README.md");
  std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string begin = "<!-- qkv ops -->\n", end = "<!-- end qkv ops -->";
  auto b = readme.find(begin), e = readme.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(readme.substr(b + begin.size(), e - b - begin.size()), run("ops").output) << "regenerate it with: qkv ops";
}

}  // namespace
