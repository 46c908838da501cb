// BERT from model folders: a random 2-layer one written by transformers (a padded batch, token
// types) and the real all-MiniLM-L6-v2 (scripts/fetch_models.sh), whose sentence embeddings must
// be within 1e-4 cosine distance of sentence-transformers' on every backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "backends/equivalence.hpp"
#include "backends/reference/reference_backend.hpp"
#include "io/safetensors.hpp"
#include "models/bert.hpp"
#include "models/pretrained.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

const std::string kFixtures = std::string(QKV_SOURCE_DIR) + "/tests/fixtures/hf";

/// The encoder's inputs: ids, mask and types from the fixture, positions 0..T-1.
backend::TensorMap encoder_inputs(const models::Pretrained& m, const io::TensorFile& hf) {
  backend::TensorMap in(m.weights.begin(), m.weights.end());
  const Tensor& ids = hf.at("input_ids");
  in["input_ids"] = ids;
  in["attention_mask"] = hf.at("attention_mask");
  Tensor types(DType::i32, ids.shape()), positions(DType::i32, ids.shape());
  for (std::int64_t i = 0; i < ids.numel(); ++i) positions.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % ids.shape()[1]);
  in["token_type_ids"] = hf.contains("token_type_ids") ? hf.at("token_type_ids") : types;
  in["position_ids"] = positions;
  return in;
}

/// Largest cosine distance between rows of a and b [n, E].
double worst_cosine_distance(const Tensor& a, const Tensor& b) {
  const std::int64_t n = a.shape()[0], e = a.shape()[1];
  double worst = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    double ab = 0, aa = 0, bb = 0;
    for (std::int64_t i = 0; i < e; ++i) {
      ab += a.at(r * e + i) * b.at(r * e + i);
      aa += a.at(r * e + i) * a.at(r * e + i);
      bb += b.at(r * e + i) * b.at(r * e + i);
    }
    worst = std::max(worst, 1 - ab / std::sqrt(aa * bb));
  }
  return worst;
}

TEST(Bert, ParametersCarryTransformersNames) {
  const models::Pretrained m = models::load_pretrained(kFixtures + "/bert-tiny");
  EXPECT_EQ(m.parameters[0].first, "embeddings.word_embeddings.weight");
  EXPECT_EQ(m.parameters[3].first, "embeddings.LayerNorm.weight");
  EXPECT_EQ(m.parameters[5].first, "encoder.layer.0.attention.self.query.weight");
  EXPECT_EQ(m.parameters.back().first, "pooler.dense.bias");
}

class BertBackends : public ::testing::TestWithParam<std::string> {};

TEST_P(BertBackends, PaddedBatchMatchesTransformers) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  const models::Pretrained m = models::load_pretrained(kFixtures + "/bert-tiny");
  const io::TensorFile hf = io::read_safetensors(kFixtures + "/bert-tiny/expected.safetensors");
  const backend::TensorMap in = encoder_inputs(m, hf);
  auto oracle = backend::make_reference_backend({backend::Precision::f64, true})->compile(m.graph)->run(in);
  auto plain = backend::make_reference_backend({backend::Precision::f32, true})->compile(m.graph)->run(in);
  auto got = b->compile(m.graph)->run(in);
  // transformers in float64 computes what qkv's float64 reference does; padded rows included.
  const Tensor& hf64 = hf.at("last_hidden_state_f64");
  double worst64 = 0;
  for (std::int64_t i = 0; i < hf64.numel(); ++i) worst64 = std::max(worst64, std::abs(oracle.at("last_hidden_state").at(i) - hf64.at(i)));
  EXPECT_LT(worst64, 1e-9);
  for (const char* out : {"last_hidden_state", "pooler_output", "sentence_embedding"}) {
    SCOPED_TRACE(out);
    const auto torch_vs_f64 = backend::compare_output(out, hf.at(out), oracle.at(out), plain.at(out));
    EXPECT_TRUE(torch_vs_f64.pass) << "transformers' " << torch_vs_f64.max_abs_error << ", budget " << torch_vs_f64.budget;
    const auto ours = backend::compare_output(out, got.at(out), oracle.at(out), plain.at(out));
    EXPECT_TRUE(ours.pass) << GetParam() << "'s " << ours.max_abs_error << ", budget " << ours.budget;
  }
}

TEST_P(BertBackends, MiniLmSentenceEmbeddingsMatchSentenceTransformers) {
  QKV_MINILM_OR_SKIP(minilm);
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  const models::Pretrained m = models::load_pretrained(minilm);
  EXPECT_EQ(m.parameters.size(), 103u);
  const io::TensorFile st = io::read_safetensors(kFixtures + "/minilm/expected.safetensors");
  auto got = b->compile(m.graph)->run(encoder_inputs(m, st));
  EXPECT_LT(worst_cosine_distance(got.at("sentence_embedding"), st.at("sentence_embedding")), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(All, BertBackends, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

}  // namespace
}  // namespace qkv
