// GPT-2 and Llama from model folders written by transformers (tests/fixtures/make_hf_fixtures.py): the
// reflected module's names and shapes, the checkpoint's errors, and logits on every backend
// against transformers' within the float64 reference's budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "backends/equivalence.hpp"
#include "backends/reference/reference_backend.hpp"
#include "io/safetensors.hpp"
#include "ir/passes/passes.hpp"
#include "models/config.hpp"
#include "models/generate.hpp"
#include "models/gpt2.hpp"
#include "models/llama.hpp"
#include "models/pretrained.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = std::string(QKV_SOURCE_DIR) + "/tests/fixtures/hf/gpt2-tiny";

/// input_ids and position_ids 0..T-1 for the ids [1, T].
backend::TensorMap prompt_inputs(const Tensor& ids) {
  Tensor positions(DType::i32, ids.shape());
  for (std::int64_t i = 0; i < ids.numel(); ++i) positions.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % ids.shape().back());
  return {{"input_ids", ids}, {"position_ids", positions}};
}

TEST(Gpt2, ParametersCarryTransformersNames) {
  models::Gpt2Config c{};
  c.vocab_size = 50, c.n_positions = 16, c.n_embd = 8, c.n_layer = 2, c.n_head = 2;
  const auto named = models::named_parameters(models::make_gpt2(c));
  ASSERT_EQ(named.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(named[0].first, "transformer.wte.weight");
  EXPECT_EQ(named[0].second, (std::vector<std::int64_t>{50, 8}));
  EXPECT_EQ(named[2].first, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(named[4].first, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(named[4].second, (std::vector<std::int64_t>{8, 24}));
  EXPECT_EQ(named[10].second, (std::vector<std::int64_t>{8, 32}));  // mlp.c_fc: n_inner defaults to 4 n_embd
  EXPECT_EQ(named.back().first, "transformer.ln_f.bias");
  c.tie_word_embeddings = false;
  EXPECT_EQ(models::named_parameters(models::make_gpt2(c)).back().first, "lm_head.weight");
}

TEST(Gpt2, ConfigKeysAreCheckedByName) {
  const fs::path dir = fs::path(::testing::TempDir()) / "gpt2_bad_config";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "vocab_size": 10, "n_positions": 8, "n_embd": "8", "n_layer": 1, "n_head": 2})";
  try {
    models::load_pretrained(dir.string());
    FAIL() << "a string n_embd loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: \"n_embd\" is a string, expected an integer"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "vocab_size": 10, "n_positions": 8, "n_layer": 1, "n_head": 2})";
  try {
    models::load_pretrained(dir.string());
    FAIL() << "a config without n_embd loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: no \"n_embd\""), std::string::npos) << e.what();
  }
}

TEST(Llama, NestedConfigKeysAndListElementsAreNamedByTheirPath) {
  const std::string base = R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "max_position_embeddings": 32)";
  auto read = [&](const std::string& rest) {
    return models::read_config<models::LlamaConfig>(models::JsonDocument::parse(base + rest, "x/config.json").root(), "x/config.json");
  };
  const models::LlamaConfig c = read(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8}, "eos_token_id": [1, 2]})");
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->factor, 8.0);  // an integer where a number is meant
  EXPECT_EQ(c.eos_token_id, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(read(R"(, "eos_token_id": 7})").eos_token_id, (std::vector<std::int64_t>{7}));  // one id where a list is meant
  EXPECT_FALSE(read(R"(, "rope_scaling": null})").rope_scaling);
  auto error = [&](const std::string& rest) {
    try {
      read(rest);
    } catch (const IoError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(R"(, "rope_scaling": {"factor": "8"}})"), "x/config.json: \"rope_scaling.factor\" is a string, expected a number");
  EXPECT_EQ(error(R"(, "eos_token_id": [1, 2.5]})"), "x/config.json: \"eos_token_id[1]\" is a number, expected an integer");
  EXPECT_EQ(error(R"(, "rope_scaling": [1]})"), "x/config.json: \"rope_scaling\" is a list, expected an object");
  EXPECT_EQ(error("}"), "no error");
  EXPECT_EQ(error(R"(, "hidden_size": null})"), "x/config.json: \"hidden_size\" is null, expected an integer");
  EXPECT_NE(error(R"(, "vocab_size": })").find("x/config.json: not valid JSON"), std::string::npos);
}

TEST(Gpt2, CheckpointThatDoesNotFitIsOneError) {
  const fs::path dir = fs::path(::testing::TempDir()) / "gpt2_bad_weights";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kTiny + "/config.json", dir / "config.json");
  io::TensorFile w = io::read_safetensors(kTiny + "/model.safetensors");
  w.erase("transformer.h.1.ln_2.bias");                                    // missing
  w["transformer.h.0.attn.c_proj.weight"] = Tensor(DType::f32, {64, 63});  // wrong shape
  w["transformer.extra"] = Tensor(DType::f32, {1});                        // unexpected
  io::write_safetensors((dir / "model.safetensors").string(), w);
  try {
    models::load_pretrained(dir.string());
    FAIL() << "a checkpoint that does not fit loaded";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("missing: transformer.h.1.ln_2.bias"), std::string::npos) << m;
    EXPECT_NE(m.find("wrong: transformer.h.0.attn.c_proj.weight is [64, 63], the config gives [64, 64]"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected: transformer.extra"), std::string::npos) << m;
  }
}

TEST(Sampling, TopKTopPAndTemperatureChooseAsTransformers) {
  const std::vector<float> logits{1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  // Greedy: the first of the largest, as torch.argmax.
  EXPECT_EQ(models::pick_token(logits.data(), 5, {}, 0), 1);
  std::map<std::int32_t, int> seen;
  for (std::uint64_t step = 0; step < 400; ++step) ++seen[models::pick_token(logits.data(), 5, {1.0, 3, 1.0, 9}, step)];
  EXPECT_EQ(seen.size(), 3u);  // top-k 3: tokens 1, 3 and 2 only
  EXPECT_FALSE(seen.contains(0) || seen.contains(4));
  EXPECT_GT(seen[1] + seen[3], 2 * seen[2]);  // e^3 vs e^2 each
  seen.clear();
  // top-p 0.5: tokens 1 and 3 hold 0.42 each of the mass; the smallest prefix reaching 0.5 is both.
  for (std::uint64_t step = 0; step < 200; ++step) ++seen[models::pick_token(logits.data(), 5, {1.0, 0, 0.5, 9}, step)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.contains(1) && seen.contains(3));
  // A low temperature is nearly greedy; the same seed and step give the same token.
  EXPECT_EQ(models::pick_token(logits.data(), 5, {0.01, 0, 1.0, 5}, 3), models::pick_token(logits.data(), 5, {0.01, 0, 1.0, 5}, 3));
}

/// Each architecture's fixture folder on each backend.
/// A copy of the GPT-2 fixture folder whose checkpoint `change` rewrites.
fs::path gpt2_copy(const std::string& name, const std::function<void(const fs::path&, io::TensorFile&)>& change) {
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kTiny + "/config.json", dir / "config.json");
  io::TensorFile w = io::read_safetensors(kTiny + "/model.safetensors");
  change(dir, w);
  return dir;
}

std::string load_error(const fs::path& dir) {
  try {
    models::load_pretrained(dir.string());
  } catch (const IoError& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(Checkpoint, ShardedLoadsAsOneFile) {
  const fs::path dir = gpt2_copy("gpt2_sharded", [](const fs::path& d, io::TensorFile& w) {
    io::TensorFile first, second;
    nlohmann::json index;
    for (auto& [name, t] : w) {
      const bool early = name < "transformer.h.1";
      (early ? first : second).emplace(name, t);
      index["weight_map"][name] = early ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    io::write_safetensors((d / "model-00001-of-00002.safetensors").string(), first);
    io::write_safetensors((d / "model-00002-of-00002.safetensors").string(), second);
    std::ofstream(d / "model.safetensors.index.json") << index.dump();
  });
  const models::Pretrained sharded = models::load_pretrained(dir.string());
  const models::Pretrained single = models::load_pretrained(kTiny);
  ASSERT_EQ(sharded.weights.size(), single.weights.size());
  for (const auto& [name, t] : single.weights) EXPECT_EQ(std::memcmp(sharded.weights.at(name).raw(), t.raw(), t.nbytes()), 0) << name;
  // A shard cut short is named; nothing is returned.
  const fs::path shard = dir / "model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  EXPECT_NE(load_error(dir).find("model-00002-of-00002.safetensors"), std::string::npos) << load_error(dir);
}

TEST(Checkpoint, WrongDtypeIsNamed) {
  const fs::path dir = gpt2_copy("gpt2_int_weight", [](const fs::path& d, io::TensorFile& w) {
    w["transformer.ln_f.bias"] = Tensor(DType::i32, {64});
    io::write_safetensors((d / "model.safetensors").string(), w);
  });
  EXPECT_NE(load_error(dir).find("wrong: transformer.ln_f.bias is i32, not a float"), std::string::npos) << load_error(dir);
}

TEST(Checkpoint, HalfCheckpointIsHeldInItsDtypeAndRunsAsItsWeightsRounded) {
  // A bf16 checkpoint's weights stay bf16, read in place from the mapped file, and the graphs
  // declare them so; it computes what the f32 checkpoint does with its weights rounded to bf16.
  io::TensorFile rounded;
  const fs::path dir = gpt2_copy("gpt2_bf16", [&](const fs::path& d, io::TensorFile& w) {
    for (auto& [name, t] : w) {
      t = t.to(DType::bf16);
      rounded.emplace(name, t.to(DType::f32));
    }
    io::write_safetensors((d / "model.safetensors").string(), w);
  });
  const models::Pretrained half = models::load_pretrained(dir.string());
  models::LoadOptions in_f32;
  in_f32.weights = models::WeightDtype::f32;
  const models::Pretrained widened = models::load_pretrained(dir.string(), in_f32);
  for (const auto& [name, t] : rounded) {
    const Tensor& held = half.weights.at(name);
    EXPECT_EQ(held.dtype(), DType::bf16) << name;
    EXPECT_TRUE(held.is_view()) << name;
    EXPECT_EQ(std::memcmp(held.to(DType::f32).raw(), t.raw(), t.nbytes()), 0) << name;
    EXPECT_EQ(std::memcmp(widened.weights.at(name).raw(), t.raw(), t.nbytes()), 0) << name;
  }
  for (const ir::Graph* g : {&half.graph, &half.step_graph}) {
    for (const ir::ValueId v : g->inputs()) {
      if (rounded.contains(g->node(v).name)) {
        EXPECT_EQ(g->node(v).dtype, DType::bf16) << g->node(v).name;
      }
    }
  }
  // The logits of both, on the reference (the casts are exact: the same numbers) and the cpu
  // (its kernels read the bf16 weights as they stream them) for prefill and one-row steps.
  const models::Pretrained full = models::load_pretrained(kTiny);
  for (const std::int64_t t : {1, 8}) {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(t));
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(7 * i + 3);
    backend::TensorMap in = prompt_inputs(Tensor::from<std::int32_t>({1, t}, tokens)), in16 = in;
    for (const auto& [name, w] : rounded) in.emplace(name, w);
    for (const auto& [name, w] : half.weights) in16.emplace(name, w);
    for (const char* name : {"reference", "cpu"}) {
      auto b = backend::create(name);
      const Tensor want = b->compile(full.graph)->run(in).at("logits");
      const Tensor got = b->compile(half.graph)->run(in16).at("logits");
      ASSERT_EQ(got.shape(), want.shape());
      for (std::int64_t i = 0; i < got.numel(); ++i)
        ASSERT_NEAR(got.at(i), want.at(i), std::string(name) == "reference" ? 0.0 : 1e-5 * (1 + std::abs(want.at(i))))
            << name << " T " << t << " at " << i;
    }
  }
}

class HfModels : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  std::string dir() const { return std::string(QKV_SOURCE_DIR) + "/tests/fixtures/hf/" + std::get<0>(GetParam()); }
  std::string backend() const { return std::get<1>(GetParam()); }
  io::TensorFile expected() const { return io::read_safetensors(dir() + "/expected.safetensors"); }
  /// The fixture's prompt, transformers' greedy continuation of it, and prompts of three lengths:
  /// its first half, itself, and three tokens.
  std::tuple<std::vector<std::int32_t>, std::vector<std::int32_t>, std::vector<std::vector<std::int32_t>>> three_prompts() const {
    const io::TensorFile hf = expected();
    const Tensor& ids = hf.at("input_ids");
    const Tensor& greedy = hf.at("greedy_ids");
    std::vector<std::int32_t> prompt(ids.data<std::int32_t>(), ids.data<std::int32_t>() + ids.numel());
    std::vector<std::int32_t> want(greedy.data<std::int32_t>() + ids.numel(), greedy.data<std::int32_t>() + greedy.numel());
    std::vector<std::vector<std::int32_t>> prompts = {
        {prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(prompt.size() / 2)}, prompt, {5, 6, 7}};
    return {std::move(prompt), std::move(want), std::move(prompts)};
  }
};

TEST_P(HfModels, LogitsMatchTransformers) {
  QKV_GET_BACKEND_OR_SKIP(b, backend());
  models::LoadOptions with_hidden;
  with_hidden.outputs.hidden = true;
  const models::Pretrained m = models::load_pretrained(dir(), with_hidden);
  const io::TensorFile hf = expected();
  backend::TensorMap inputs = prompt_inputs(hf.at("input_ids"));
  for (const auto& [name, t] : m.weights) inputs.emplace(name, t);
  auto oracle = backend::make_reference_backend({backend::Precision::f64, true})->compile(m.graph)->run(inputs);
  auto plain = backend::make_reference_backend({backend::Precision::f32, true})->compile(m.graph)->run(inputs);
  auto got = b->compile(m.graph)->run(inputs);
  // transformers in float64 computes what qkv's float64 reference computes.
  const Tensor& hf64 = hf.at("logits_f64");
  ASSERT_EQ(oracle.at("logits").shape(), hf64.shape());
  double worst64 = 0;
  for (std::int64_t i = 0; i < hf64.numel(); ++i) worst64 = std::max(worst64, std::abs(oracle.at("logits").at(i) - hf64.at(i)));
  // transformers computes rotary embeddings' cos and sin in float32 even in a float64 model.
  EXPECT_LT(worst64, std::get<0>(GetParam()) == "llama-tiny" ? 1e-5 : 1e-9);
  for (const char* out : {"logits"}) {
    const auto torch_vs_f64 = backend::compare_output(out, hf.at(out), oracle.at(out), plain.at(out));
    EXPECT_TRUE(torch_vs_f64.pass) << "transformers' f32 " << out << " is " << torch_vs_f64.max_abs_error << " from float64, budget "
                                   << torch_vs_f64.budget;
    const auto ours = backend::compare_output(out, got.at(out), oracle.at(out), plain.at(out));
    EXPECT_TRUE(ours.pass) << backend() << "'s " << out << " is " << ours.max_abs_error << " from float64, budget " << ours.budget;
  }
  const auto hidden = backend::compare_output("hidden", got.at("hidden"), oracle.at("hidden"), plain.at("hidden"));
  EXPECT_TRUE(hidden.pass) << hidden.max_abs_error << " vs budget " << hidden.budget;
  double worst_hidden = 0;
  for (std::int64_t i = 0; i < hf.at("last_hidden_state").numel(); ++i)
    worst_hidden = std::max(worst_hidden, std::abs(oracle.at("hidden").at(i) - hf.at("last_hidden_state").at(i)));
  EXPECT_LT(worst_hidden, 1e-4);
}

TEST_P(HfModels, GreedyGenerationGivesTransformersTokens) {
  QKV_GET_BACKEND_OR_SKIP(b, backend());
  const models::Pretrained m = models::load_pretrained(dir());
  const io::TensorFile hf = expected();
  const Tensor& ids = hf.at("input_ids");
  const Tensor& greedy = hf.at("greedy_ids");
  std::vector<std::int32_t> prompt(ids.data<std::int32_t>(), ids.data<std::int32_t>() + ids.numel());
  models::Generator gen(m, *b, 48);
  models::GenerationOptions o;
  o.max_new_tokens = 32;
  o.use_model_stop_tokens = false;
  std::vector<std::int32_t> streamed;
  const std::vector<std::int32_t> got = gen.generate(prompt, o, [&](std::int32_t t) {
    streamed.push_back(t);
    return true;
  });
  const std::vector<std::int32_t> want(greedy.data<std::int32_t>() + ids.numel(), greedy.data<std::int32_t>() + greedy.numel());
  EXPECT_EQ(got, want);
  EXPECT_EQ(streamed, got);
  // A second generation on the same executable (its cache as the first left it: every slot it
  // reads it writes first) gives the same tokens, and so does a prompt fed in chunks of 4.
  EXPECT_EQ(gen.generate(prompt, o), want);
  o.prefill_chunk = 4;
  EXPECT_EQ(gen.generate(prompt, o), want);
}

// Prompts of different lengths in one batch (the shorter padded on the left, each step reading
// the weights once for all) continue as each does alone: the fixture's prompt as transformers
// continues it, and shorter ones as a generator of one sequence continues them.
TEST_P(HfModels, ABatchOfPromptsOfDifferentLengthsContinuesEachAsAlone) {
  QKV_GET_BACKEND_OR_SKIP(b, backend());
  const models::Pretrained m = models::load_pretrained(dir());
  const auto [prompt, want, prompts] = three_prompts();
  models::GenerationOptions o;
  o.max_new_tokens = 12;
  o.use_model_stop_tokens = false;
  models::Generator batch(m, *b, 48, 3);
  std::vector<std::size_t> seen(3, 0);
  const auto got = batch.generate(prompts, o, [&](std::size_t i, std::int32_t) {
    ++seen[i];
    return i != 2 || seen[2] < 5;  // the third sequence stops after 5 tokens, the others go on
  });
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1], std::vector<std::int32_t>(want.begin(), want.begin() + 12));
  models::Generator one(m, *b, 48);
  EXPECT_EQ(got[0], one.generate(prompts[0], o));
  const std::vector<std::int32_t> third = one.generate(prompts[2], o);
  EXPECT_EQ(got[2], std::vector<std::int32_t>(third.begin(), third.begin() + 5));
  EXPECT_EQ(seen, (std::vector<std::size_t>{12, 12, 5}));
  // A batch generator takes as many prompts as its batch.
  EXPECT_THROW(batch.generate(prompt, o), UsageError);
  EXPECT_THROW(batch.generate(std::vector<std::vector<std::int32_t>>{prompt}, o), UsageError);
}

// A paged cache (pages of 4: a boundary every 4 positions, crossed in prefill and in decoding)
// continues prompts of different lengths as a contiguous cache continues each alone, the
// fixture's prompt as transformers does; a prompt fed in chunks of 3 likewise.
TEST_P(HfModels, APagedCacheContinuesEachPromptAsAlone) {
  QKV_GET_BACKEND_OR_SKIP(b, backend());
  const models::Pretrained m = models::load_pretrained(dir());
  const auto [prompt, want, prompts] = three_prompts();
  models::GenerationOptions o;
  o.max_new_tokens = 12;
  o.use_model_stop_tokens = false;
  o.prefill_chunk = 3;
  // On vulkan pages of 16 (still crossed: each new table width is a new shape, whose kernels
  // lavapipe compiles anew).
  models::Generator paged(m, *b, models::CachePages{64, backend() == "vulkan" ? 16 : 4});
  const auto got = paged.generate(prompts, o);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1], std::vector<std::int32_t>(want.begin(), want.begin() + 12));
  models::Generator one(m, *b, 48);
  EXPECT_EQ(got[0], one.generate(prompts[0], o));
  EXPECT_EQ(got[2], one.generate(prompts[2], o));
  EXPECT_EQ(paged.page_use().peak_batch, 3);
  // A prompt that could need more pages than the cache has is refused before anything runs.
  models::Generator small(m, *b, models::CachePages{3, 4});
  EXPECT_THROW(small.generate(prompts, o), UsageError);
  // A cache of no pages, or of pages of no positions, is refused when the generator is made.
  EXPECT_THROW(models::Generator(m, *b, models::CachePages{0, 4}), UsageError);
  EXPECT_THROW(models::Generator(m, *b, models::CachePages{4, 0}), UsageError);
}

// Sequences come and go through a cache with room for about two: each takes pages as it grows and
// gives them back when it stops (after a number of tokens drawn at random), the next prompt
// waiting for them; every sequence continues as it does alone in a contiguous cache, and pages
// given back are taken again.
TEST_P(HfModels, PagesGrowShrinkAndAreReusedAsSequencesComeAndGo) {
  // The schedule is the host's; vulkan's kernels for these steps are the test above's (lavapipe
  // would compile them again for each new batch size: 23 s).
  if (backend() == "vulkan") GTEST_SKIP() << "the page schedule is the generator's, the same on every backend";
  QKV_GET_BACKEND_OR_SKIP(b, backend());
  const models::Pretrained m = models::load_pretrained(dir());
  std::mt19937_64 rng(17);
  std::vector<std::vector<std::int32_t>> prompts(7);
  std::vector<std::size_t> stop_after(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    prompts[i].resize(1 + rng() % 11);
    for (std::int32_t& t : prompts[i]) t = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(m.vocab_size));
    stop_after[i] = 1 + rng() % 9;
  }
  models::GenerationOptions o;
  o.max_new_tokens = 9;
  o.use_model_stop_tokens = false;
  const models::CachePages cache{14, 3};  // a sequence needs up to ceil((11 + 9) / 3) = 7
  models::Generator paged(m, *b, cache);
  std::vector<std::size_t> seen(prompts.size(), 0);
  const auto got = paged.generate(prompts, o, [&](std::size_t i, std::int32_t) { return ++seen[i] < stop_after[i]; });
  models::Generator one(m, *b, 24);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    models::GenerationOptions alone = o;
    alone.max_new_tokens = static_cast<std::int64_t>(stop_after[i]);
    EXPECT_EQ(got[i], one.generate(prompts[i], alone));
  }
  const auto& use = paged.page_use();
  EXPECT_LE(use.peak_pages, cache.pages);
  EXPECT_GE(use.peak_batch, 2);
  EXPECT_LT(use.peak_batch, 7);  // prompts waited for pages
  EXPECT_GT(use.reused_pages, 0);
}

// Each layer's attention weights as an output (what qkv viz draws): [B, heads, T, T], causal,
// each query's row a distribution.
TEST_P(HfModels, AttentionWeightsOfEachLayerAreCausalDistributions) {
  QKV_GET_BACKEND_OR_SKIP(b, backend());
  models::LoadOptions with_weights;
  with_weights.outputs.attention_weights = true;
  const models::Pretrained m = models::load_pretrained(dir(), with_weights);
  const io::TensorFile hf = expected();
  backend::TensorMap inputs = prompt_inputs(hf.at("input_ids"));
  for (const auto& [name, t] : m.weights) inputs.emplace(name, t);
  const auto out = b->compile(m.graph)->run(inputs);
  const std::int64_t t = hf.at("input_ids").shape().back();
  for (std::int64_t layer = 0; layer < m.layers; ++layer) {
    const Tensor& w = out.at("weights." + std::to_string(layer));
    ASSERT_EQ(w.rank(), 4);
    EXPECT_EQ(w.shape()[2], t);
    EXPECT_EQ(w.shape()[3], t);
    const std::int64_t heads = w.shape()[1];
    EXPECT_GE(heads, m.kv_heads);
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < t; ++i) {
        double total = 0;
        for (std::int64_t j = 0; j < t; ++j) {
          const double x = w.at((h * t + i) * t + j);
          if (j > i) {
            EXPECT_EQ(x, 0.0) << layer << " head " << h << " query " << i << " key " << j;
          }
          total += x;
        }
        EXPECT_NEAR(total, 1.0, 1e-5) << layer << " head " << h << " query " << i;
      }
  }
}

// A decode step writes its key and value into the held cache in place: the memory it plans does
// not grow with the cache's length (a copy of the cache per layer would be 2 x layers x S rows).
TEST_P(HfModels, DecodeStepPlansNoCopyOfTheCache) {
  if (backend() == "reference") GTEST_SKIP() << "the reference computes every value anew";
  QKV_GET_BACKEND_OR_SKIP(b, backend());
  const models::Pretrained m = models::load_pretrained(dir());
  auto planned = [&](std::int64_t cache_length) {
    models::Generator gen(m, *b, cache_length);
    models::GenerationOptions o;
    o.max_new_tokens = 3;
    o.use_model_stop_tokens = false;
    gen.generate({5, 6, 7}, o);  // the last run is a decode step of one token
    return gen.executable().planned_bytes();
  };
  // The caches themselves (on vulkan they live in the arena the plan sizes; on cpu, in the
  // executable's state), and nothing more per position.
  auto cache_bytes = [&](std::int64_t length) { return 2 * m.layers * m.kv_heads * length * m.head_dim * 4; };
  const std::int64_t short_cache = planned(8), long_cache = planned(64);
  EXPECT_GT(short_cache, 0);
  const std::int64_t held_in_plan = backend() == "vulkan" ? cache_bytes(64) - cache_bytes(8) : 0;
  EXPECT_LE(long_cache - short_cache, held_in_plan);
}

// Fine-tuning's loss and its gradient for every parameter, against transformers' loss with
// labels = the prompt and its backward (a tied embedding's gradient sums both of its uses).
TEST_P(HfModels, NextTokenLossAndGradientsMatchTransformers) {
  QKV_GET_BACKEND_OR_SKIP(b, backend());
  const models::Pretrained m = models::load_pretrained(dir());
  const io::TensorFile hf = expected();
  const ir::Graph loss = models::lm_loss_graph(m);
  std::vector<std::string> params;
  for (const auto& [name, shape] : m.parameters) params.push_back(name);
  const ir::Graph backward = ir::build_backward(loss, {"loss", params, {}});
  const Tensor& ids = hf.at("input_ids");
  backend::TensorMap in = prompt_inputs(ids);
  Tensor targets(DType::i32, ids.shape());
  for (std::int64_t i = 0; i < ids.numel(); ++i) targets.data<std::int32_t>()[i] = i + 1 < ids.numel() ? ids.data<std::int32_t>()[i + 1] : -1;
  in.emplace("targets", targets);
  for (const auto& [name, t] : m.weights) in.emplace(name, t);
  auto oracle = backend::make_reference_backend({backend::Precision::f64, true})->compile(backward)->run(in);
  auto plain = backend::make_reference_backend({backend::Precision::f32, true})->compile(backward)->run(in);
  auto got = b->compile(backward)->run(in);
  EXPECT_NEAR(oracle.at("loss").at(0), hf.at("loss").at(0), 1e-5);
  int checked = 0;
  for (const std::string& p : params) {
    SCOPED_TRACE(p);
    const std::string out = "d_" + p;
    const auto torch_vs_f64 = backend::compare_output(out, hf.at("grad." + p), oracle.at(out), plain.at(out));
    EXPECT_TRUE(torch_vs_f64.pass) << "transformers' " << torch_vs_f64.max_abs_error << ", budget " << torch_vs_f64.budget;
    const auto ours = backend::compare_output(out, got.at(out), oracle.at(out), plain.at(out));
    EXPECT_TRUE(ours.pass) << backend() << "'s " << ours.max_abs_error << ", budget " << ours.budget;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(m.parameters.size()));
}

INSTANTIATE_TEST_SUITE_P(All, HfModels,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama-tiny"), ::testing::Values("reference", "cpu", "vulkan")),
                         [](const auto& param_info) {
                           std::string name = std::get<0>(param_info.param) + "_" + std::get<1>(param_info.param);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(Llama, RotaryFrequenciesAreTransformersBuffer) {
  const std::string dir = std::string(QKV_SOURCE_DIR) + "/tests/fixtures/hf/llama-tiny";
  const models::Pretrained m = models::load_pretrained(dir);
  const Tensor& ours = m.weights.at(models::kInvFreq);
  const io::TensorFile expected = io::read_safetensors(dir + "/expected.safetensors");
  const Tensor& hf = expected.at("model.rotary_emb.inv_freq");
  ASSERT_EQ(ours.shape(), hf.shape());
  for (std::int64_t i = 0; i < hf.numel(); ++i) EXPECT_NEAR(ours.at(i), hf.at(i), 1e-7 * std::abs(hf.at(i))) << i;
  EXPECT_EQ(m.kv_heads, 2);
  EXPECT_EQ(m.parameters.back().first, "lm_head.weight");
  EXPECT_EQ(m.parameters[2].first, "model.layers.0.self_attn.q_proj.weight");
}

}  // namespace
}  // namespace qkv
