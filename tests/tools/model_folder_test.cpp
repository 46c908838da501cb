// The qkv program on a model folder as transformers saves one (tests/fixtures/hf/gpt2-tiny):
// generate streams transformers' greedy continuation, and run, check and explain take the folder
// as they take a built-in model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/file.hpp"
#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "io/tokenizer.hpp"
#include "plot/figure.hpp"
#include "tests/support/backend_fixture.hpp"

namespace {

const std::string kTiny = std::string(QKV_SOURCE_DIR) + "/tests/fixtures/hf/gpt2-tiny";

struct Result {
  int status;
  std::string out;  // stdout and stderr
};

Result qkv(const std::string& args) {
  FILE* p = popen((std::string(QKV_BINARY) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  return {WEXITSTATUS(pclose(p)), out};
}

TEST(ModelFolder, GenerateStreamsTransformersGreedyText) {
  const qkv::io::Tokenizer t = qkv::io::Tokenizer::from_folder(kTiny);
  const auto hf = qkv::io::read_safetensors(kTiny + "/expected.safetensors");
  const qkv::Tensor& greedy = hf.at("greedy_ids");
  const std::vector<std::int32_t> ids(greedy.data<std::int32_t>(), greedy.data<std::int32_t>() + greedy.numel());
  for (const char* backend : {"cpu", "vulkan"}) {
    SCOPED_TRACE(backend);
    std::string why;
    if (!qkv::testing::backend_or_reason(backend, why)) {
      if (qkv::testing::vulkan_required()) ADD_FAILURE() << backend << ": " << why;
      continue;  // no device here (the sanitizer build's run): the cpu half still ran
    }
    const Result r = qkv("generate " + kTiny + " --prompt 'The quick brown fox' --max-tokens 32 --ignore-eos --backend " + backend);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out.substr(0, r.out.find("\nqkv: ")), t.decode(ids, true)) << r.out;
    // A paged cache by default on both (the first token after the prompt's prefill).
    EXPECT_NE(r.out.find("qkv: 10 prompt tokens, the first token after "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(", 32 new tokens, "), std::string::npos) << r.out;
  }
}

TEST(ModelFolder, GenerateContinuesSeveralPromptsAsOneBatch) {
  // Prompts of different lengths continued together print each continuation as the prompt alone
  // gives it (the longer one's is transformers' greedy text).
  const qkv::io::Tokenizer t = qkv::io::Tokenizer::from_folder(kTiny);
  const auto hf = qkv::io::read_safetensors(kTiny + "/expected.safetensors");
  const qkv::Tensor& greedy = hf.at("greedy_ids");
  const std::vector<std::int32_t> ids(greedy.data<std::int32_t>(), greedy.data<std::int32_t>() + greedy.numel());
  const Result alone = qkv("generate " + kTiny + " --prompt 'Hi' --max-tokens 32 --ignore-eos --backend cpu");
  ASSERT_EQ(alone.status, 0) << alone.out;
  const std::string want = t.decode(ids, true) + "\n\n" + alone.out.substr(0, alone.out.find("\nqkv: ")) + "\n";
  // A paged cache (the default) with room for both; with room for one, the second prompt waiting
  // for the first's pages; and contiguous caches, the shorter prompt padded on the left.
  const std::string both = "generate " + kTiny + " --prompt 'The quick brown fox' --prompt 'Hi' --max-tokens 32 --ignore-eos --backend cpu";
  for (const auto& [flags, layout] :
       {std::pair<std::string, std::string>{"", "at most 6 of its 6 pages of 16 positions in use, 0 taken again; up to 2 sequences"},
        {" --page-size 8 --cache-pages 6", "at most 6 of its 6 pages of 8 positions in use, 5 taken again; up to 1 sequence "},
        {" --page-size 0", "2 sequences padded to 10"}}) {
    SCOPED_TRACE(flags);
    const Result r = qkv(both + flags);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out.substr(0, r.out.find("qkv: ")), want) << r.out;
    EXPECT_NE(r.out.find(layout), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(", 64 new tokens, "), std::string::npos) << r.out;
  }
  for (const std::string& bad : {std::string(" --page-size -2"), std::string(" --cache-pages -1")}) {
    const Result refused = qkv(both + bad);
    EXPECT_EQ(refused.status, 2) << bad << refused.out;
    EXPECT_NE(refused.out.find("at least 0"), std::string::npos) << refused.out;
  }
  const Result small = qkv(both + " --page-size 8 --cache-pages 5");
  EXPECT_EQ(small.status, 2);
  EXPECT_EQ(small.out.find("qkv: --cache-pages 5: a prompt of 10 tokens and 32 new ones need 6 pages of 8 positions"), 0u) << small.out;
}

TEST(ModelFolder, VizDrawsEachLayerAndHeadWithTheTokens) {
  const std::string dir = ::testing::TempDir() + "qkv_viz_gpt2";
  const Result r = qkv("viz " + kTiny + " --prompt 'The quick brown fox' --dir " + dir + " --format png,svg --backend cpu");
  ASSERT_EQ(r.status, 0) << r.out;
  // gpt2-tiny: 2 layers of 4 heads, a figure each: the heads side by side and their mean.
  for (int layer = 0; layer < 2; ++layer) {
    const std::string svg = qkv::io::read_file(dir + "/weights." + std::to_string(layer) + ".svg");
    for (const char* title : {">head 1<", ">head 4<", ">mean over heads<"}) EXPECT_NE(svg.find(title), std::string::npos) << layer << title;
    EXPECT_TRUE(qkv::plot::png_size(qkv::io::read_file(dir + "/weights." + std::to_string(layer) + ".png"))) << layer;
  }
  // The axes carry the prompt's tokens as the tokenizer cut it.
  const qkv::io::Tokenizer t = qkv::io::Tokenizer::from_folder(kTiny);
  const std::vector<std::int32_t> ids = t.encode("The quick brown fox");
  std::string labels, text;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    labels += (i ? "|" : "") + t.piece(ids[i], i == 0);
    text += t.piece(ids[i], i == 0);
  }
  EXPECT_NE(r.out.find("token labels: " + labels + "\n"), std::string::npos) << r.out;
  EXPECT_EQ(text, "The quick brown fox");
  const std::string svg = qkv::io::read_file(dir + "/weights.0.svg");
  EXPECT_NE(svg.find("class=\"xtick\""), std::string::npos);
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_NE(svg.find(">" + t.piece(ids[i], i == 0) + "</text>"), std::string::npos) << i;
  // Byte-level tokens that are pieces of a character (CJK, an emoji) are drawn as U+FFFD.
  const Result wide =
      qkv("viz " + kTiny + " --prompt '日本語 😀 ok' --dir " + dir + "_utf8 --format svg,png --html " + dir + "_utf8/e.html --backend cpu");
  ASSERT_EQ(wide.status, 0) << wide.out;
  EXPECT_NE(qkv::io::read_file(dir + "_utf8/weights.0.svg").find("\uFFFD"), std::string::npos);
}

TEST(ModelFolder, SampledGenerationIsRepeatableBySeed) {
  const std::string base = "generate " + kTiny + " --prompt 'Attention' --max-tokens 12 --temperature 0.9 --top-k 40 --top-p 0.95 --ignore-eos";
  const Result a = qkv(base + " --seed 7"), b = qkv(base + " --seed 7"), c = qkv(base + " --seed 8");
  ASSERT_EQ(a.status, 0) << a.out;
  auto text = [](const Result& r) { return r.out.substr(0, r.out.find("\nqkv: ")); };
  EXPECT_EQ(text(a), text(b));
  EXPECT_NE(text(a), text(c));
}

TEST(ModelFolder, RunCheckAndExplainTakeTheFolder) {
  const Result check = qkv("check " + kTiny + " --prompt 'Hello, world!' --backend reference,cpu");
  ASSERT_EQ(check.status, 0) << check.out;
  EXPECT_NE(check.out.find("(gpt2, 129792 parameters)"), std::string::npos) << check.out;
  EXPECT_NE(check.out.find("all backends within budget"), std::string::npos) << check.out;
  const Result explain = qkv("explain " + kTiny + " --backend cpu --dim T=16");
  ASSERT_EQ(explain.status, 0) << explain.out;
  EXPECT_NE(explain.out.find("score matrix: not materialised"), std::string::npos) << explain.out;
  const Result run = qkv("run " + kTiny + " --prompt 'The quick brown fox'");
  ASSERT_EQ(run.status, 0) << run.out;
  EXPECT_NE(run.out.find("input_ids                (1, 10)          from --prompt"), std::string::npos) << run.out;
}

TEST(ModelFolder, EmbedGivesSentenceTransformersEmbeddings) {
  QKV_MINILM_OR_SKIP(minilm);
  const std::string out = std::string(::testing::TempDir()) + "/minilm.npy";
  const Result r = qkv("embed " + minilm + " --file " + std::string(QKV_SOURCE_DIR) + "/tests/fixtures/hf/minilm/sentences.txt --out " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("(384 dims)  A man is playing a guitar."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cosine similarity:"), std::string::npos) << r.out;
  const qkv::Tensor got = qkv::io::read_npy(out);
  const auto fixture = qkv::io::read_safetensors(std::string(QKV_SOURCE_DIR) + "/tests/fixtures/hf/minilm/expected.safetensors");
  const qkv::Tensor& want = fixture.at("sentence_embedding");
  ASSERT_EQ(got.shape(), want.shape());
  for (std::int64_t row = 0; row < want.shape()[0]; ++row) {
    double dot = 0, aa = 0, bb = 0;
    for (std::int64_t i = 0; i < want.shape()[1]; ++i) {
      const double a = got.at(row * want.shape()[1] + i), b = want.at(row * want.shape()[1] + i);
      dot += a * b, aa += a * a, bb += b * b;
    }
    EXPECT_LT(1 - dot / std::sqrt(aa * bb), 1e-4) << row;
  }
  const Result decoder = qkv("embed " + kTiny + " --text hi");
  EXPECT_EQ(decoder.status, 2);
  EXPECT_NE(decoder.out.find("has no sentence embeddings"), std::string::npos) << decoder.out;
}

TEST(ModelFolder, FineTuningSavesAFolderWithTheCheckpointsNames) {
  const std::string text = std::string(::testing::TempDir()) + "/finetune.txt";
  {
    std::ofstream f(text);
    for (int i = 0; i < 4; ++i) f << "The quick brown fox jumps over the lazy dog. A key/value cache holds the keys and values.\n";
  }
  const std::string out = std::string(::testing::TempDir()) + "/gpt2-finetuned";
  std::filesystem::remove_all(out);
  const Result r = qkv("train " + kTiny + " --text " + text + " --steps 6 --batch 2 --seq 24 --lr 0.01 --save " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("AdamW lr 0.01, weight decay 0.01, clip 1"), std::string::npos) << r.out;
  // The loss falls on a text this short, and the folder holds the checkpoint's tensors, trained.
  const auto arrow = r.out.find(" -> ", r.out.rfind("loss "));
  ASSERT_NE(arrow, std::string::npos) << r.out;
  const double first = std::stod(r.out.substr(r.out.rfind("loss ", arrow) + 5)), last = std::stod(r.out.substr(arrow + 4));
  EXPECT_LT(last, first) << r.out;
  const auto before = qkv::io::read_safetensors(kTiny + "/model.safetensors");
  const auto after = qkv::io::read_safetensors(out + "/model.safetensors");
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, t] : before) {
    ASSERT_TRUE(after.contains(name)) << name;
    EXPECT_EQ(after.at(name).shape(), t.shape()) << name;
  }
  EXPECT_NE(after.at("transformer.h.0.attn.c_attn.weight").at(0), before.at("transformer.h.0.attn.c_attn.weight").at(0));
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.json") && std::filesystem::exists(out + "/config.json"));
  const Result run = qkv("run " + out + " --prompt 'The quick'");
  EXPECT_EQ(run.status, 0) << run.out;
  // Mistakes: no text, a text without a model, an encoder.
  EXPECT_EQ(qkv("train " + kTiny + " --steps 2").status, 2);
  EXPECT_EQ(qkv("train --text " + text).status, 2);
  const Result bert = qkv("train " + std::string(QKV_SOURCE_DIR) + "/tests/fixtures/hf/bert-tiny --text " + text);
  EXPECT_EQ(bert.status, 2);
  EXPECT_NE(bert.out.find("has no next-token logits to train"), std::string::npos) << bert.out;
}

TEST(ModelFolder, MistakesExitWithTwo) {
  const Result set = qkv("run " + kTiny + " --set heads=2");
  EXPECT_EQ(set.status, 2);
  EXPECT_NE(set.out.find("is a model folder (its config.json sets it)"), std::string::npos) << set.out;
  const Result prompt = qkv("run sdpa --prompt hi");
  EXPECT_EQ(prompt.status, 2);
  EXPECT_NE(prompt.out.find("--prompt is for model folders"), std::string::npos) << prompt.out;
  const Result viz_prompt = qkv("viz sdpa --prompt hi --png-dir " + ::testing::TempDir() + "qkv_viz_sdpa");
  EXPECT_EQ(viz_prompt.status, 2);
  EXPECT_NE(viz_prompt.out.find("--prompt is for model folders"), std::string::npos) << viz_prompt.out;
  const Result folder = qkv("generate /nonexistent --prompt hi");
  EXPECT_EQ(folder.status, 2);
  EXPECT_NE(folder.out.find("/nonexistent: not a model folder"), std::string::npos) << folder.out;
  const Result top_p = qkv("generate " + kTiny + " --prompt hi --top-p 1.5");
  EXPECT_EQ(top_p.status, 2);
  const std::string missing = std::string(::testing::TempDir()) + "/no_weights";
  std::filesystem::create_directories(missing);
  std::filesystem::copy_file(kTiny + "/config.json", missing + "/config.json", std::filesystem::copy_options::overwrite_existing);
  const Result weights = qkv("run " + missing);
  EXPECT_EQ(weights.status, 2);
  EXPECT_NE(weights.out.find("no model.safetensors or model.safetensors.index.json"), std::string::npos) << weights.out;
}

}  // namespace
